/* exitcode.c: see exitcode.h. */
#include "harness/core/exitcode.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

void kvb_interrupt_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* restart interrupted reads and writes; a second signal gets the default action (ends the process) */
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int kvb_interrupted(void) { return (int)g_signal; }

int kvb_interrupt_exit_code(void) { return g_signal ? 128 + (int)g_signal : 0; }

void kvb_interrupt_raise(int sig) { g_signal = sig; }
