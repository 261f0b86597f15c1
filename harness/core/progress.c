/* progress.c: see progress.h. */
#include "harness/core/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { KVB_PROGRESS_EVERY_S = 15 };

static int shown;        /* a progress line is on the terminal */
static double started_s; /* monotonic time of the first call */
static double printed_s; /* off a terminal: when the last line was printed */

/* 0: off, 1: a terminal line rewritten in place, 2: plain lines (a pipe or a log) */
static int mode(void)
{
    static int m = -1;
    if (m < 0) {
        const char *env = getenv("KVB_PROGRESS"); /* 0: never, 1: the terminal line even off a terminal (tests) */
        if (env && *env) m = atoi(env) != 0;
        else m = isatty(STDERR_FILENO) ? 1 : 2;
    }
    return m;
}

double kvb_wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void clock_text(double s, char *buf, size_t n)
{
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void kvb_progress_cost(const char *what, int i, int n, const char *id, double done_cost, double total_cost)
{
    const int m = mode();
    if (!m) return;
    const double now = kvb_wall_now();
    if (started_s == 0) started_s = printed_s = now;
    const double el = now - started_s;
    char elapsed[32], left[48] = "";
    clock_text(el, elapsed, sizeof elapsed);
    /* the estimate once a tenth of the run's cost (or a minute) is behind it: earlier it is mostly noise */
    if (i > 1 && total_cost > 0 && done_cost > 0 && (done_cost >= 0.1 * total_cost || el >= 60)) {
        char t[32];
        clock_text(el * (total_cost - done_cost) / done_cost, t, sizeof t);
        snprintf(left, sizeof left, ", about %s left", t);
    }
    if (m == 2) {
        if (now - printed_s < KVB_PROGRESS_EVERY_S) return;
        fprintf(stderr, "%s: case %d of %d, %s elapsed%s: %s\n", what, i, n, elapsed, left, id);
        fflush(stderr);
        printed_s = now;
        return;
    }
    /* one terminal line: the id is cut to what is left of 100 columns */
    char head[128];
    int len = snprintf(head, sizeof head, "%s %d/%d, %s%s: ", what, i, n, elapsed, left);
    int room = 100 - len;
    if (room < 10) room = 10;
    fprintf(stderr, "\r\033[K%s%.*s%s", head, room, id, (int)strlen(id) > room ? "..." : "");
    fflush(stderr);
    shown = 1;
}

void kvb_progress(const char *what, int i, int n, const char *id)
{
    kvb_progress_cost(what, i, n, id, i - 1, n);
}

void kvb_progress_clear(void)
{
    if (!shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    shown = 0;
}
