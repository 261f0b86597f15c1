/* timing_lock.h: `bench --timing-lock FILE`, for several kvbench processes timing on one host, each on
 * its own GPU. A case's timing (from its warm-up until the case is released: Google Benchmark may run
 * its loop several times, and only the release knows the last one; the per-stage timings after it are
 * timed launches too) holds flock(2) on FILE: exclusive for a case whose timing reads pinned host
 * memory (kvb_run_timing_exclusive: the host link and the host's memory are shared by every GPU),
 * shared for one that reads device memory only. So a host-bound case is timed while no other process
 * is timing, and device-only cases time together. The ceilings' measurement at the start of a bench
 * (pinned copies among them) holds it exclusively too. The other processes' set-up and validation are not
 * held off: their input draws and references on the host's cores, their copies over their own GPU's link
 * (staged through pinned buffers at up to ~50 GB/s, gpu.c) run beside a host-bound timing.
 * Fairness: flock lets shared holders overlap without end, so an exclusive request could wait for as
 * long as the others keep timing. Every request first takes FILE.gate exclusively and holds it until
 * it has FILE: while an exclusive request waits, no new shared one is granted.
 * Waiting polls, so that SIGINT/SIGTERM (exitcode.h) end the wait; the lock is released by
 * kvb_timing_lock_release on every path, and by the kernel when the process ends.
 */
#ifndef KVB_TIMING_LOCK_H
#define KVB_TIMING_LOCK_H

#include "harness/core/op.h"

/* Open (creating them, mode 0666) FILE and FILE.gate. KVB_OK, or KVB_EIO naming the file. Without
 * it, every call below is a no-op that reports no lock. */
int kvb_timing_lock_open(const char *path);
/* 1 when run r's timing reads pinned host memory: an input the kernel reads in place from pinned host
 * memory (KVB_T_HOST_MAPPED), bytes that cross from host memory (kvb_cost.bytes_h2d > 0), or an impl
 * timed on the wall clock (kvb_impl.wall_timed: host work and host copies). Needs no lock. */
int kvb_run_timing_exclusive(const kvb_run *r);

enum { KVB_LOCK_NONE = 0, KVB_LOCK_SHARED = 1, KVB_LOCK_EXCLUSIVE = 2 };
/* Take the lock, waiting for it: 0 with *mode the lock now held (KVB_LOCK_NONE without --timing-lock);
 * 1 when an interrupt came while waiting (nothing held); -1 on an error (kvb_last_error()). */
int kvb_timing_lock_acquire(int exclusive, int *mode);
/* Release what is held (nothing: a no-op). */
void kvb_timing_lock_release(void);

#endif
