/* timing.c: see timing.h. */
#include "harness/core/timing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"

static kvb_timer *g_timer;

double kvb_time_once(const kvb_timed *t)
{
    if (!g_timer) g_timer = kvb_timer_create();
    if (t->prepare) t->prepare(t->ctx);
    kvb_l2_flush(t->stream);
    kvb_sync(t->stream);
    if (!t->wall) kvb_stream_block(t->stream);
    kvb_timer_start(g_timer, t->stream);
    t->work(t->ctx);
    kvb_timer_stop(g_timer, t->stream);
    if (!t->wall) kvb_stream_release();
    return kvb_timer_seconds(g_timer);
}

void kvb_time_samples(const kvb_timed *t, int n, double *samples)
{
    for (int i = 0; i < n; i++) samples[i] = kvb_time_once(t);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void kvb_stats(const double *samples, int n, kvb_sample_stats *st)
{
    memset(st, 0, sizeof *st);
    if (n <= 0) return;
    double *s = kvb_xalloc((size_t)n, sizeof(double), "the timing samples' sort");
    if (!s) kvb_guard_fail(); /* the case fails by name (inside its guard) */
    memcpy(s, samples, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    st->n = n;
    st->min = s[0];
    st->max = s[n - 1];
    st->median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    st->mean = sum / n;
    for (int i = 0; i < n; i++) sq += (s[i] - st->mean) * (s[i] - st->mean);
    st->stddev = n > 1 ? sqrt(sq / (n - 1)) : 0;
    st->noise = st->mean > 0 ? st->stddev / st->mean : 0;
    kvb_xfree(s);
}

/* n samples of t, summarized */
static kvb_sample_stats time_stats(const kvb_timed *t, int n)
{
    double *s = kvb_xalloc((size_t)n, sizeof(double), "timing samples");
    if (!s) kvb_guard_fail();
    kvb_time_samples(t, n, s);
    kvb_sample_stats st;
    kvb_stats(s, n, &st);
    kvb_xfree(s);
    return st;
}

double kvb_time_median(const kvb_timed *t, int n) { return time_stats(t, n).median; }
double kvb_time_best(const kvb_timed *t, int n) { return time_stats(t, n).min; }
