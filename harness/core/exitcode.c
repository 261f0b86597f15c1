/* exitcode.c: see exitcode.h. */
#include "harness/core/exitcode.h"

#include <signal.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t g_signal;
static struct timespec g_first; /* when the first signal came */

/* The first SIGINT/SIGTERM asks the run to stop between cases. A second one a second or more later ends
 * the process at once; one sooner is the same interrupt delivered twice (timeout(1) signals the command
 * and then its process group), not a second request. Only async-signal-safe calls here. */
static void on_signal(int sig)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!g_signal) {
        g_first = now;
        g_signal = sig;
        return;
    }
    if ((now.tv_sec - g_first.tv_sec) + (now.tv_nsec - g_first.tv_nsec) * 1e-9 < 1.0) return;
    signal(sig, SIG_DFL);
    raise(sig);
}

void kvb_interrupt_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* restart interrupted reads and writes */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int kvb_interrupted(void) { return (int)g_signal; }

int kvb_interrupt_exit_code(void) { return g_signal ? 128 + (int)g_signal : 0; }

void kvb_interrupt_raise(int sig) { g_signal = sig; }
