/* kvb.c: the thread-local error message and the checked host allocation of kvb.h. */
#include "reference/kvb.h"

#include <malloc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char kvb_error_message[4096]; /* room for a list of every kernel or key */

int kvb_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvb_error_message, sizeof kvb_error_message, fmt, ap);
    va_end(ap);
    return code;
}

const char *kvb_last_error(void) { return kvb_error_message; }

void kvb_clear_error(void) { kvb_error_message[0] = '\0'; }

/* ---- host memory ---- */

/* counted by malloc_usable_size, known again at kvb_xfree without a header (so free() stays valid) */
static atomic_size_t g_live, g_peak;
static atomic_long g_calls, g_fail_at, g_fired;
static void (*g_trace)(void *ctx, long n, size_t bytes, const char *what);
static void *g_trace_ctx;

void *kvb_xalloc(size_t n, size_t size, const char *what)
{
    const size_t bytes = size && n > SIZE_MAX / size ? SIZE_MAX : n * size;
    const long call = atomic_fetch_add(&g_calls, 1) + 1;
    const long fail_at = atomic_load(&g_fail_at);
    void *p = NULL;
    if (g_trace) g_trace(g_trace_ctx, call, bytes, what);
    if (fail_at > 0 && call == fail_at) atomic_store(&g_fired, 1);
    else if (bytes < SIZE_MAX) p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        kvb_fail(KVB_ENOMEM, "out of host memory: %zu bytes (%.2f GiB) for %s%s", bytes, bytes / 1073741824.0, what,
                 fail_at > 0 && call == fail_at ? " (failure injected)" : "");
        return NULL;
    }
    const size_t live = atomic_fetch_add(&g_live, malloc_usable_size(p)) + malloc_usable_size(p);
    size_t peak = atomic_load(&g_peak);
    while (live > peak && !atomic_compare_exchange_weak(&g_peak, &peak, live)) {}
    return p;
}

void kvb_xfree(void *p)
{
    if (!p) return;
    atomic_fetch_sub(&g_live, malloc_usable_size(p));
    free(p);
}

size_t kvb_host_bytes_live(void) { return atomic_load(&g_live); }
size_t kvb_host_bytes_peak(void) { return atomic_load(&g_peak); }
void kvb_host_bytes_peak_reset(void) { atomic_store(&g_peak, atomic_load(&g_live)); }

void kvb_xalloc_fail_at(long n)
{
    atomic_store(&g_calls, 0);
    atomic_store(&g_fired, 0);
    atomic_store(&g_fail_at, n);
}

long kvb_xalloc_count(void) { return atomic_load(&g_calls); }
int kvb_xalloc_fault_fired(void) { return (int)atomic_load(&g_fired); }

void kvb_xalloc_trace(void (*fn)(void *ctx, long n, size_t bytes, const char *what), void *ctx)
{
    g_trace_ctx = ctx;
    g_trace = fn;
}

void kvb_par_keep(kvb_par_error *e, int code)
{
#pragma omp critical(kvb_par_error)
    if (!e->code) {
        e->code = code ? code : KVB_EINVAL;
        snprintf(e->msg, sizeof e->msg, "%s", kvb_last_error());
    }
}

int kvb_par_return(const kvb_par_error *e) { return e->code ? kvb_fail(e->code, "%s", e->msg) : KVB_OK; }
