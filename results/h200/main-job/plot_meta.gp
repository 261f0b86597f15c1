# written by harness/report/plot_report.py with plot.dat; loaded by harness/report/plots.gp
gpu = "NVIDIA H200"
runs = "bench 0d048c6 2026-12-01 22:27"
array run_lines[1]
run_lines[1] = "bench 0d048c6 2026-12-01 22:27"
n_cases = 218
max_pct = 98.12
n_over = 0
n_skipped = 8
n_panels = 6
array panel_title[6]
array panel_rows[6]
array panel_cols[6]
panel_title[1] = "device copy (measured: copy 4281 GB/s)"
panel_rows[1] = 44
panel_cols[1] = "6"
panel_title[2] = "device read (measured: read 4536 GB/s)"
panel_rows[2] = 109
panel_cols[2] = "6 7 8 9 10 11 12 13 14 15 27 28 29"
panel_title[3] = "decode_step: whole steps, device read bound (measured: read 4536 GB/s)"
panel_rows[3] = 31
panel_cols[3] = "14 30 31 32"
panel_title[4] = "decode_step: whole steps, device read, pinned H2D overlapped bound (measured: read 4536 GB/s, H2D 55 GB/s)"
panel_rows[4] = 6
panel_cols[4] = "14"
panel_title[5] = "pinned H2D copy (measured: H2D 55 GB/s)"
panel_rows[5] = 23
panel_cols[5] = "16 17 18 19 20"
panel_title[6] = "bf16 matrix rate (measured: GEMM 800 TFLOP/s)"
panel_rows[6] = 5
panel_cols[6] = "21 22 23 24 25 26 33 34"
n_cols = 29
array col_name[29]
array col_inside[29]
col_name[1] = "impl=cublas_composed"
col_inside[1] = 1
col_name[2] = "impl=steps2"
col_inside[2] = 1
col_name[3] = "impl=dense_bf16"
col_inside[3] = 1
col_name[4] = "impl=v2"
col_inside[4] = 1
col_name[5] = "impl=v1"
col_inside[5] = 1
col_name[6] = "impl=dequant_dense"
col_inside[6] = 1
col_name[7] = "impl=score_only"
col_inside[7] = 1
col_name[8] = "impl=dense"
col_inside[8] = 1
col_name[9] = "impl=eager"
col_inside[9] = 1
col_name[10] = "impl=one_block"
col_inside[10] = 1
col_name[11] = "impl=memcpy_chunks"
col_inside[11] = 1
col_name[12] = "impl=cpu_gather"
col_inside[12] = 1
col_name[13] = "impl=tma"
col_inside[13] = 1
col_name[14] = "impl=ce_batch"
col_inside[14] = 1
col_name[15] = "impl=memcpy_rows"
col_inside[15] = 1
col_name[16] = "impl=fwd_only"
col_inside[16] = 1
col_name[17] = "impl=colsum_only"
col_inside[17] = 1
col_name[18] = "impl=cublas"
col_inside[18] = 1
col_name[19] = "impl=kernel_mma"
col_inside[19] = 1
col_name[20] = "impl=fwd_only_mma"
col_inside[20] = 1
col_name[21] = "impl=colsum_only_mma"
col_inside[21] = 1
col_name[22] = "torch_sdpa_cudnn"
col_inside[22] = 0
col_name[23] = "torch_sdpa_flash"
col_inside[23] = 0
col_name[24] = "torch_topk"
col_inside[24] = 0
col_name[25] = "torch_block_cudnn_eager"
col_inside[25] = 0
col_name[26] = "torch_block_cudnn_graph"
col_inside[26] = 0
col_name[27] = "torch_block_flash_graph"
col_inside[27] = 0
col_name[28] = "torch_sdpa_cudnn_fwd"
col_inside[28] = 0
col_name[29] = "torch_sdpa_flash_fwd"
col_inside[29] = 0
