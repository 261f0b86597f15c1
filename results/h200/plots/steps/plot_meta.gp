# written by harness/plot_report.py with plot.dat; loaded by harness/plots.gp
gpu = "NVIDIA H200"
runs = "run1 0c146e0 2026-11-26 00:33; run2 0c146e0 2026-11-26 00:41; run3 0c146e0 2026-11-26 00:44; run4_128k 0c146e0 2026-11-26 00:54; run4_244k 0c146e0 2026-11-26 00:51; run5 0c146e0 2026-11-26 00:59; run6_dense 0c146e0 2026-11-26 01:11; run6_filter 0c146e0 2026-11-26 01:07; run6_sparse 0c146e0 2026-11-26 01:09"
array run_lines[3]
run_lines[1] = "run1 0c146e0 2026-11-26 00:33; run2 0c146e0 2026-11-26 00:41; run3 0c146e0 2026-11-26 00:44"
run_lines[2] = "run4_128k 0c146e0 2026-11-26 00:54; run4_244k 0c146e0 2026-11-26 00:51; run5 0c146e0 2026-11-26 00:59"
run_lines[3] = "run6_dense 0c146e0 2026-11-26 01:11; run6_filter 0c146e0 2026-11-26 01:07; run6_sparse 0c146e0 2026-11-26 01:09"
n_cases = 37
max_pct = 91.94
n_over = 0
n_skipped = 0
n_panels = 2
array panel_title[2]
array panel_rows[2]
array panel_cols[2]
panel_title[1] = "decode_step: whole steps, device read, pinned H2D overlapped bound (measured: read 4619-4632 GB/s, H2D 55-56 GB/s)"
panel_rows[1] = 6
panel_cols[1] = "6"
panel_title[2] = "decode_step: whole steps, device read bound (measured: read 4619-4632 GB/s)"
panel_rows[2] = 31
panel_cols[2] = "6 7 8 9"
n_cols = 4
array col_name[4]
array col_inside[4]
col_name[1] = "impl=eager"
col_inside[1] = 1
col_name[2] = "torch_block_cudnn_eager"
col_inside[2] = 0
col_name[3] = "torch_block_cudnn_graph"
col_inside[3] = 0
col_name[4] = "torch_block_flash_graph"
col_inside[4] = 0
