/* shard.h: splitting the selected cases among processes (`--shard K/N`: one process per GPU, or shards
 * run one after another), and the estimate of a case's wall time that balances the split.
 *
 * The split is greedy longest-processing-time over shapes: the cases that differ only in impl= form one
 * group (the summary's in-suite ratios are measured in one run), the groups sorted by cost, descending
 * (ties: the group of the earlier case first), each given to the shard with the least cost so far (ties:
 * the lowest shard). A case's cost is its estimate, or with --durations FILE its wall time measured in
 * an earlier run's result file (kvb_case_costs). Counted in the two-GPU main job's measured case times
 * (results/h200/two-gpus), two bench shards split by the estimate hold 333 and 478 s (1.18x an even
 * split), split by the one-GPU job's durations 407 and 405 s. The split is
 * a function of the selected cases, their order, N and the durations file alone, so N processes given
 * the same command line, case files and durations agree on it without talking to each other. A shard's
 * cases keep their order in the selection. The largest shard's cost is at most the ideal share (the
 * total / N) plus the largest group.
 */
#ifndef KVB_SHARD_H
#define KVB_SHARD_H

#include "harness/core/case.h"

#define KVB_SHARD_MAX 64

/* The estimated wall seconds of case c in check (timed = 0: set-up, reference, one validated launch)
 * or in bench (timed = 1: the same plus its timing loops). An estimate to balance work, not a
 * prediction to report as a measurement. */
double kvb_case_cost_estimate(const kvb_case *c, int timed);

/* cost[i] for each case i of l: its estimate (kvb_case_cost_estimate), or with durations (a kvbench
 * check or bench result file of an earlier run, --durations) its measured wall time there (the sum of
 * its phases), the estimate of a case the file lacks scaled by the file's measured / estimated over the
 * cases it holds. KVB_OK; KVB_EIO / KVB_EINVAL (kvb_last_error) for a file that cannot be read, is not
 * a result file, or holds none of the cases; KVB_ENOMEM. */
int kvb_case_costs(const kvb_case_list *l, int timed, const char *durations, double *cost);

/* "K/N", as --shard takes it and the JSON context records it (a static buffer) */
const char *kvb_shard_name(int k, int n);
/* "K/N" with 1 <= K <= N <= KVB_SHARD_MAX, digits only: 0 with *k, *n set, else -1. */
int kvb_shard_parse(const char *s, int *k, int *n);

/* shard_of[i] = the shard (0 .. n-1) of case i of l, for n in [1, KVB_SHARD_MAX], balancing cost[i]
 * (kvb_case_costs). KVB_OK, or KVB_ENOMEM /
 * KVB_EINVAL with kvb_last_error() set. */
int kvb_shard_assign(const kvb_case_list *l, int n, const double *cost, int *shard_of);

/* Keep in l only the cases of shard k (1 .. n), in their order. KVB_OK, or an error with l unchanged. */
int kvb_shard_keep(kvb_case_list *l, int k, int n, const double *cost);

#endif
