/* progress.c: see progress.h. */
#include "harness/core/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int shown;        /* a progress line is on the terminal */
static double started_s; /* monotonic time of the first call */

static int enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("KVB_PROGRESS"); /* 0: never, 1: even off a terminal (tests) */
        on = env && *env ? atoi(env) != 0 : isatty(STDERR_FILENO);
    }
    return on;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void kvb_progress(const char *what, int i, int n, const char *id)
{
    if (!enabled()) return;
    if (started_s == 0) started_s = now_s();
    const double el = now_s() - started_s;
    /* one terminal line: the id is cut to what is left of 100 columns */
    char head[96];
    int len = snprintf(head, sizeof head, "%s %d/%d, %.0f s: ", what, i, n, el);
    int room = 100 - len;
    if (room < 10) room = 10;
    fprintf(stderr, "\r\033[K%s%.*s%s", head, room, id, (int)strlen(id) > room ? "..." : "");
    fflush(stderr);
    shown = 1;
}

void kvb_progress_clear(void)
{
    if (!shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    shown = 0;
}
