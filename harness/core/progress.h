/* progress.h: the progress of long check and bench runs ("case i of n, elapsed, about what is left"), on
 * stderr: one line rewritten in place on a terminal; off a terminal (a pipe, a log) a plain line every
 * KVB_PROGRESS_EVERY_S seconds, so a piped run shows it is alive without a line per case. */
#ifndef KVB_PROGRESS_H
#define KVB_PROGRESS_H

/* Show "<what> i/n, elapsed: id" (i counts from 1) in place of the previous line; the clock starts at
 * the first call. */
void kvb_progress(const char *what, int i, int n, const char *id);
/* The same with an estimate of what is left: done_cost of total_cost of the run's estimated cost
 * (kvb_selection_costs: the estimate, or --durations' wall times) is finished; the elapsed time scaled
 * by that share. */
void kvb_progress_cost(const char *what, int i, int n, const char *id, double done_cost, double total_cost);
/* Monotonic seconds (the phases' clock). */
double kvb_wall_now(void);
/* Erase the line before the case's own output is printed. */
void kvb_progress_clear(void);

#endif
