/* exitcode.h: kvbench's exit statuses, and the SIGINT/SIGTERM flag that ends a run between cases.
 *
 *   0    everything selected ran and passed (compare: the gate passes)
 *   1    a case failed (check: a verdict; bench: validation or setup; compare: a regression, a missing
 *        or a failed case), or the device failed outside a case
 *   2    usage or input refused: a bad option, case line, case file, filter or result file; nothing ran
 *   3    nothing was measured: no usable CUDA device (every case skipped; profile, ceilings, bench)
 *   130  interrupted by SIGINT, 143 by SIGTERM (128 + the signal): the result files hold the cases
 *        finished before it
 */
#ifndef KVB_EXITCODE_H
#define KVB_EXITCODE_H

enum { KVB_EXIT_OK = 0, KVB_EXIT_FAILED = 1, KVB_EXIT_USAGE = 2, KVB_EXIT_NOTHING_MEASURED = 3 };

/* Catch SIGINT and SIGTERM: the first sets the flag (the run stops at the next case boundary and
 * writes what it has); a second signal a second or more later ends the process at once (exitcode.c). */
void kvb_interrupt_install(void);
/* The signal that interrupted the run (SIGINT, SIGTERM), or 0. Cheap: call between cases or samples. */
int kvb_interrupted(void);
/* 128 + the signal, the shell's status for a process ended by it (130, 143); 0 when not interrupted. */
int kvb_interrupt_exit_code(void);
/* Set the flag as a signal would (tests). */
void kvb_interrupt_raise(int sig);

/* "s" unless n is 1: "1 case", "2 cases" */
#define KVB_PLURAL(n) ((n) == 1 ? "" : "s")

#endif
