/* timing_lock.c: see timing_lock.h. */
#include "harness/core/timing_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "harness/core/exitcode.h"

static int g_fd = -1, g_gate = -1; /* FILE and FILE.gate, open for the process's life */
static int g_held;                  /* KVB_LOCK_* held on FILE */
static char g_path[4096];

int kvb_timing_lock_open(const char *path)
{
    char gate[sizeof g_path + 8];
    snprintf(g_path, sizeof g_path, "%s", path);
    snprintf(gate, sizeof gate, "%s.gate", path);
    const char *names[2] = {path, gate};
    int *fds[2] = {&g_fd, &g_gate};
    for (int i = 0; i < 2; i++) {
        if (*fds[i] >= 0) close(*fds[i]);
        *fds[i] = open(names[i], O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (*fds[i] < 0) return kvb_fail(KVB_EIO, "cannot open %s: %s", names[i], strerror(errno));
    }
    return KVB_OK;
}

int kvb_run_timing_exclusive(const kvb_run *r)
{
    if (kvb_run_wall_timed(r)) return 1;
    for (int i = 0; i < r->nt; i++)
        if (r->t[i].flags & KVB_T_HOST_MAPPED) return 1;
    kvb_cost cost;
    memset(&cost, 0, sizeof cost);
    if (r->op && r->op->cost) r->op->cost(r, &cost);
    return cost.bytes_h2d > 0;
}

/* flock(fd, op) waited for by polling: 0, 1 when interrupted, -1 on an error */
static int take(int fd, int op, const char *what)
{
    const struct timespec pause = {0, 5000000}; /* 5 ms: short against a case's timing, cheap to poll */
    for (;;) {
        if (flock(fd, op | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            kvb_fail(KVB_EIO, "--timing-lock: flock on %s%s: %s", g_path, what, strerror(errno));
            return -1;
        }
        if (kvb_interrupted()) return 1;
        nanosleep(&pause, NULL);
    }
}

int kvb_timing_lock_acquire(int exclusive, int *mode)
{
    *mode = KVB_LOCK_NONE;
    if (g_fd < 0) return 0;
    kvb_timing_lock_release();
    int rc = take(g_gate, LOCK_EX, ".gate");
    if (rc) return rc;
    rc = take(g_fd, exclusive ? LOCK_EX : LOCK_SH, "");
    flock(g_gate, LOCK_UN);
    if (rc) return rc;
    g_held = *mode = exclusive ? KVB_LOCK_EXCLUSIVE : KVB_LOCK_SHARED;
    return 0;
}

void kvb_timing_lock_release(void)
{
    if (g_fd < 0 || !g_held) return;
    flock(g_fd, LOCK_UN);
    g_held = KVB_LOCK_NONE;
}
