/* shard.h: splitting the selected cases among processes (`--shard K/N`: one process per GPU, or shards
 * run one after another), and the estimate of a case's wall time that balances the split.
 *
 * The split is greedy longest-processing-time over shapes: the cases that differ only in impl= form one
 * group (the summary's in-suite ratios are measured in one run), the groups sorted by estimated cost,
 * descending (ties: the group of the earlier case first), each given to the shard with the least
 * estimated cost so far (ties: the lowest shard). It is a function of the selected cases, their order and N alone, so N processes given
 * the same command line and case files agree on it without talking to each other. A shard's cases keep
 * their order in the selection. The largest shard's estimated cost is at most the ideal share (the
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

/* "K/N", as --shard takes it and the JSON context records it (a static buffer) */
const char *kvb_shard_name(int k, int n);
/* "K/N" with 1 <= K <= N <= KVB_SHARD_MAX, digits only: 0 with *k, *n set, else -1. */
int kvb_shard_parse(const char *s, int *k, int *n);

/* shard_of[i] = the shard (0 .. n-1) of case i of l, for n in [1, KVB_SHARD_MAX]. KVB_OK, or KVB_ENOMEM /
 * KVB_EINVAL with kvb_last_error() set. */
int kvb_shard_assign(const kvb_case_list *l, int n, int timed, int *shard_of);

/* Keep in l only the cases of shard k (1 .. n), in their order. KVB_OK, or an error with l unchanged. */
int kvb_shard_keep(kvb_case_list *l, int k, int n, int timed);

#endif
