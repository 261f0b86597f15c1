/* progress.h: a one-line progress report on long check and bench runs ("case i of n, elapsed"), on
 * stderr and only when stderr is a terminal: logs, pipes and CI output stay as they were. */
#ifndef KVB_PROGRESS_H
#define KVB_PROGRESS_H

/* Show "<what> i/n, elapsed: id" (i counts from 1) in place of the previous line; the clock starts at
 * the first call. */
void kvb_progress(const char *what, int i, int n, const char *id);
/* Erase the line before the case's own output is printed. */
void kvb_progress_clear(void);

#endif
