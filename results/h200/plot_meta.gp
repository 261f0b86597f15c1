# written by harness/report/plot_report.py with plot.dat; loaded by harness/report/plots.gp
gpu = "NVIDIA H200"
runs = "bench 5f88a19 2026-12-02 01:09"
array run_lines[1]
run_lines[1] = "bench 5f88a19 2026-12-02 01:09"
n_cases = 98
max_pct = 97.94
n_over = 0
n_skipped = 2
n_panels = 6
array panel_title[6]
array panel_rows[6]
array panel_cols[6]
panel_title[1] = "device read (measured: read 4555 GB/s)"
panel_rows[1] = 63
panel_cols[1] = "6 7 8 9 10 11 12 16 17 18"
panel_title[2] = "bf16 matrix rate (measured: GEMM 792 TFLOP/s)"
panel_rows[2] = 2
panel_cols[2] = "13 19 20"
panel_title[3] = "pinned H2D copy (measured: H2D 52 GB/s)"
panel_rows[3] = 3
panel_cols[3] = "14 15"
panel_title[4] = "device copy (measured: copy 4290 GB/s)"
panel_rows[4] = 3
panel_cols[4] = "7"
panel_title[5] = "decode_step: whole steps, device read bound (measured: read 4555 GB/s)"
panel_rows[5] = 23
panel_cols[5] = "21 22 23"
panel_title[6] = "decode_step: whole steps, device read, pinned H2D overlapped bound (measured: read 4555 GB/s, H2D 52 GB/s)"
panel_rows[6] = 4
panel_cols[6] = ""
n_cols = 18
array col_name[18]
array col_inside[18]
col_name[1] = "impl=dense_bf16"
col_inside[1] = 1
col_name[2] = "impl=cublas_composed"
col_inside[2] = 1
col_name[3] = "impl=score_only"
col_inside[3] = 1
col_name[4] = "impl=dense"
col_inside[4] = 1
col_name[5] = "impl=eager"
col_inside[5] = 1
col_name[6] = "impl=one_block"
col_inside[6] = 1
col_name[7] = "impl=steps2"
col_inside[7] = 1
col_name[8] = "impl=fwd_only"
col_inside[8] = 1
col_name[9] = "impl=memcpy_chunks"
col_inside[9] = 1
col_name[10] = "impl=memcpy_rows"
col_inside[10] = 1
col_name[11] = "torch_sdpa_cudnn"
col_inside[11] = 0
col_name[12] = "torch_sdpa_flash"
col_inside[12] = 0
col_name[13] = "torch_topk"
col_inside[13] = 0
col_name[14] = "torch_sdpa_cudnn_fwd"
col_inside[14] = 0
col_name[15] = "torch_sdpa_flash_fwd"
col_inside[15] = 0
col_name[16] = "torch_block_cudnn_eager"
col_inside[16] = 0
col_name[17] = "torch_block_cudnn_graph"
col_inside[17] = 0
col_name[18] = "torch_block_flash_graph"
col_inside[18] = 0
