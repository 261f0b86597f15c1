# written by harness/plot_report.py with plot.dat; loaded by harness/plots.gp
gpu = "NVIDIA H200"
runs = "bench1 9949ff6-dirty 2026-11-25 03:37; bench2 9949ff6-dirty 2026-11-25 03:45; bench3_topk 140ba2f-dirty 2026-11-25 04:05"
array run_lines[1]
run_lines[1] = "bench1 9949ff6-dirty 2026-11-25 03:37; bench2 9949ff6-dirty 2026-11-25 03:45; bench3_topk 140ba2f-dirty 2026-11-25 04:05"
n_cases = 63
max_pct = 98.67
n_over = 0
n_skipped = 0
n_panels = 4
array panel_title[4]
array panel_rows[4]
array panel_cols[4]
panel_title[1] = "device read (measured: read 4527-4624 GB/s)"
panel_rows[1] = 23
panel_cols[1] = "6 7 8 9 10 19 20 21"
panel_title[2] = "bf16 matrix rate (measured: GEMM 810-823 TFLOP/s)"
panel_rows[2] = 5
panel_cols[2] = "11 12 13 22 23"
panel_title[3] = "pinned H2D copy (measured: H2D 55 GB/s)"
panel_rows[3] = 23
panel_cols[3] = "14 15 16 17 18"
panel_title[4] = "device copy (measured: copy 4247-4275 GB/s)"
panel_rows[4] = 12
panel_cols[4] = ""
n_cols = 18
array col_name[18]
array col_inside[18]
col_name[1] = "impl=steps2"
col_inside[1] = 1
col_name[2] = "impl=dense_bf16"
col_inside[2] = 1
col_name[3] = "impl=kernel_v1"
col_inside[3] = 1
col_name[4] = "impl=dequant_dense"
col_inside[4] = 1
col_name[5] = "impl=one_block"
col_inside[5] = 1
col_name[6] = "impl=fwd_only"
col_inside[6] = 1
col_name[7] = "impl=colsum_only"
col_inside[7] = 1
col_name[8] = "impl=cublas"
col_inside[8] = 1
col_name[9] = "impl=memcpy_chunks"
col_inside[9] = 1
col_name[10] = "impl=cpu_gather"
col_inside[10] = 1
col_name[11] = "impl=tma"
col_inside[11] = 1
col_name[12] = "impl=ce_batch"
col_inside[12] = 1
col_name[13] = "impl=memcpy_rows"
col_inside[13] = 1
col_name[14] = "torch_sdpa_cudnn"
col_inside[14] = 0
col_name[15] = "torch_sdpa_flash"
col_inside[15] = 0
col_name[16] = "torch_topk"
col_inside[16] = 0
col_name[17] = "torch_sdpa_cudnn_fwd"
col_inside[17] = 0
col_name[18] = "torch_sdpa_flash_fwd"
col_inside[18] = 0
