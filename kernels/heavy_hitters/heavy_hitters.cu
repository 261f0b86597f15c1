// heavy_hitters.cu: MiniKV heavy hitters and SnapKV++'s selection, composed from the selection family
// (select.h: the top-k, on the split plans where a workspace is given; max-pooling; the gather of the kept rows).
#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/heavy_hitters/heavy_hitters.h"
#include "kernels/select/select.h"

static_assert(SNAPKV_MAX_KS == MAXPOOL_MAX_KS, "SnapKV's pooling kernels are max-pooling's");

// The top-k's workspace (0 where every token is kept: one launch writes every index)
extern "C" size_t heavy_hitters_keep_workspace_bytes(int rows, int L, int n_hh, int n_rw)
{
    if (rows < 1 || L < 1 || n_hh < 0 || n_rw < 0 || n_rw > L || (int64_t)n_hh + n_rw >= L) return 0;
    return topk_workspace_bytes(rows, L - n_rw);
}

extern "C" size_t snapkv_keep_workspace_bytes(int rows, int L, int W, int n_keep)
{
    if (rows < 1 || L < 1 || W < 1 || W > L || n_keep >= L) return 0;
    return topk_workspace_bytes(rows, L - W);
}

extern "C" int heavy_hitters_keep(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep,
                                  void *workspace, cudaStream_t stream)
{
    int rc = select_check_rows("heavy_hitters_keep", rows, L);
    if (rc) return rc;
    if (n_hh < 0 || n_hh > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_hh=%d out of range [0, L = %d]", n_hh, L);
    if (n_rw < 0 || n_rw > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_rw=%d out of range [0, L = %d]", n_rw, L);
    if ((int64_t)n_hh + n_rw >= L) return topk_rows(scores, rows, L, L, L, 0, 0, keep, L, nullptr, stream); /* keep all */
    return topk_rows(scores, rows, L, L - n_rw, n_hh, L - n_rw, n_rw, keep, n_hh + n_rw, workspace, stream);
}

extern "C" int snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep, void *workspace,
                           cudaStream_t stream)
{
    int rc = select_check_rows("snapkv_keep", rows, L);
    if (rc) return rc;
    if (W < 1 || W > L) return kvb_fail(KVB_EINVAL, "snapkv_keep: W=%d out of range [1, L = %d]", W, L);
    if (n_keep < W || n_keep > L) return kvb_fail(KVB_EINVAL, "snapkv_keep: n_keep=%d out of range [W = %d, L = %d]", n_keep, W, L);
    if (n_keep == L) return topk_rows(pooled, rows, L, L, L, 0, 0, keep, L, nullptr, stream);
    return topk_rows(pooled, rows, L, L - W, n_keep - W, L - W, W, keep, n_keep, workspace, stream);
}
