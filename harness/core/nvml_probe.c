/* nvml_probe.c: see nvml_probe.h.
 *
 * Why dlopen: NVML (libnvidia-ml.so.1) ships with the driver, not with the toolkit this suite builds
 * against (no nvml.h, no link-time stub), and a machine without a driver (CI) must still build and run
 * kvbench. So the library is loaded at run time and the few functions and constants used are declared
 * here, as NVML's public API documents them; when it is absent every sample is simply invalid. */
#include "harness/core/nvml_probe.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "harness/core/gpu.h"

/* ---- reason names and the flag (pure) ---- */

static const struct {
    unsigned long long bit;
    const char *name;
} g_reasons[] = {
    {KVB_CLOCKS_GPU_IDLE, "GPU idle"},
    {KVB_CLOCKS_APPLICATIONS_SETTING, "applications clocks setting"},
    {KVB_CLOCKS_SW_POWER_CAP, "SW power cap"},
    {KVB_CLOCKS_HW_SLOWDOWN, "HW slowdown"},
    {KVB_CLOCKS_SYNC_BOOST, "sync boost"},
    {KVB_CLOCKS_SW_THERMAL, "SW thermal slowdown"},
    {KVB_CLOCKS_HW_THERMAL, "HW thermal slowdown"},
    {KVB_CLOCKS_HW_POWER_BRAKE, "HW power brake slowdown"},
    {KVB_CLOCKS_DISPLAY_SETTING, "display clock setting"},
    {0x200ULL, "board limit"},
    {0x400ULL, "reliability"},
};

const char *kvb_clock_reason_names(unsigned long long reasons, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    unsigned long long named = 0;
    for (size_t i = 0; i < sizeof g_reasons / sizeof g_reasons[0]; i++)
        if (reasons & g_reasons[i].bit) {
            named |= g_reasons[i].bit;
            if (len < n) len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", g_reasons[i].name);
        }
    for (int b = 0; b < 64; b++) {
        const unsigned long long bit = 1ULL << b;
        if ((reasons & bit) && !(named & bit) && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%sreason 0x%llx", len ? ", " : "", bit);
    }
    if (!reasons) snprintf(buf, n, "none");
    return buf;
}

int kvb_clock_flag(const kvb_clock_record *c, char *note, size_t n)
{
    char tmp[8];
    if (!note) note = tmp, n = sizeof tmp;
    note[0] = '\0';
    const kvb_clock_sample *a = &c->start, *z = &c->end;
    if (!a->valid || !z->valid) return 0;
    size_t len = 0;
    int flagged = 0;
#define NOTE(...) (flagged = 1, len += len < n ? (size_t)snprintf(note + len, n - len, __VA_ARGS__) : 0)
    if (a->sm_mhz > 0 && z->sm_mhz > 0 && z->sm_mhz < a->sm_mhz * (1 - KVB_CLOCK_DROP_PCT / 100))
        NOTE("SM clock fell from %.0f to %.0f MHz during the loop (%.1f%%)", a->sm_mhz, z->sm_mhz,
             100 * (z->sm_mhz / a->sm_mhz - 1));
    /* the end sample: taken just after the last timed launch, when the clock is the loaded one (the
     * start one may still be rising from an idle moment between loops) */
    if (c->sm_max_mhz > 0 && z->sm_mhz > 0 && z->sm_mhz < c->sm_max_mhz * KVB_CLOCK_MIN_PCT_OF_MAX / 100)
        NOTE("%sSM clock %.0f MHz at the end, below %.0f%% of its max %.0f MHz", len ? "; " : "", z->sm_mhz,
             KVB_CLOCK_MIN_PCT_OF_MAX, c->sm_max_mhz);
    const unsigned long long ra = a->have_reasons ? a->reasons & ~KVB_CLOCKS_BENIGN : 0;
    const unsigned long long rz = z->have_reasons ? z->reasons & ~KVB_CLOCKS_BENIGN : 0;
    char names[256];
    if (ra && ra == rz) NOTE("%sclocks limited at the start and the end: %s", len ? "; " : "", kvb_clock_reason_names(ra, names, sizeof names));
    else {
        if (ra) NOTE("%sclocks limited at the start: %s", len ? "; " : "", kvb_clock_reason_names(ra, names, sizeof names));
        if (rz) NOTE("%sclocks limited at the end: %s", len ? "; " : "", kvb_clock_reason_names(rz, names, sizeof names));
    }
#undef NOTE
    return flagged;
}

/* ---- NVML, loaded at run time ---- */

/* nvml.h's declarations of what is used: nvmlReturn_t (NVML_SUCCESS = 0) and the enums are ints */
typedef struct kvb_nvml_device_st *kvb_nvml_device;
enum { NVML_SUCCESS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_TEMPERATURE_GPU = 0 };

static struct {
    void *lib;
    kvb_nvml_device dev;
    int initialized, ok;
    char reason[256];
    int (*shutdown)(void);
    int (*clock)(kvb_nvml_device, int, unsigned *);
    int (*max_clock)(kvb_nvml_device, int, unsigned *);
    int (*temperature)(kvb_nvml_device, int, unsigned *);
    int (*power)(kvb_nvml_device, unsigned *);       /* mW */
    int (*power_limit)(kvb_nvml_device, unsigned *); /* mW */
    int (*reasons)(kvb_nvml_device, unsigned long long *);
    const char *(*error_string)(int);
} g_nvml;

const char *kvb_nvml_unavailable_reason(void) { return g_nvml.reason; }

static int unavailable(const char *what, int rc)
{
    snprintf(g_nvml.reason, sizeof g_nvml.reason, "%s%s%s", what, rc ? ": " : "",
             rc ? (g_nvml.error_string ? g_nvml.error_string(rc) : "error") : "");
    kvb_nvml_close();
    return 0;
}

int kvb_nvml_open(int cuda_device)
{
    if (g_nvml.ok) return 1;
#if KVB_HAVE_CUDA
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess) {
        (void)cudaGetLastError();
        return unavailable("no CUDA device to sample", 0);
    }
    g_nvml.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_nvml.lib) return unavailable("libnvidia-ml.so.1 not found (it comes with the NVIDIA driver)", 0);
    int (*init)(void) = (int (*)(void))dlsym(g_nvml.lib, "nvmlInit_v2");
    int (*by_bus)(const char *, kvb_nvml_device *) =
        (int (*)(const char *, kvb_nvml_device *))dlsym(g_nvml.lib, "nvmlDeviceGetHandleByPciBusId_v2");
    g_nvml.shutdown = (int (*)(void))dlsym(g_nvml.lib, "nvmlShutdown");
    g_nvml.error_string = (const char *(*)(int))dlsym(g_nvml.lib, "nvmlErrorString");
    g_nvml.clock = (int (*)(kvb_nvml_device, int, unsigned *))dlsym(g_nvml.lib, "nvmlDeviceGetClockInfo");
    g_nvml.max_clock = (int (*)(kvb_nvml_device, int, unsigned *))dlsym(g_nvml.lib, "nvmlDeviceGetMaxClockInfo");
    g_nvml.temperature = (int (*)(kvb_nvml_device, int, unsigned *))dlsym(g_nvml.lib, "nvmlDeviceGetTemperature");
    g_nvml.power = (int (*)(kvb_nvml_device, unsigned *))dlsym(g_nvml.lib, "nvmlDeviceGetPowerUsage");
    g_nvml.power_limit = (int (*)(kvb_nvml_device, unsigned *))dlsym(g_nvml.lib, "nvmlDeviceGetEnforcedPowerLimit");
    /* the current name (drivers from R535), then the older one */
    g_nvml.reasons = (int (*)(kvb_nvml_device, unsigned long long *))dlsym(g_nvml.lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!g_nvml.reasons)
        g_nvml.reasons =
            (int (*)(kvb_nvml_device, unsigned long long *))dlsym(g_nvml.lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!init || !by_bus || !g_nvml.shutdown || !g_nvml.clock)
        return unavailable("libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetClockInfo", 0);
    int rc = init();
    if (rc != NVML_SUCCESS) return unavailable("nvmlInit_v2", rc);
    g_nvml.initialized = 1;
    if ((rc = by_bus(bus, &g_nvml.dev)) != NVML_SUCCESS) return unavailable("nvmlDeviceGetHandleByPciBusId_v2", rc);
    g_nvml.ok = 1;
    g_nvml.reason[0] = '\0';
    return 1;
#else
    (void)cuda_device;
    return unavailable("a build without CUDA", 0);
#endif
}

void kvb_nvml_close(void)
{
#if KVB_HAVE_CUDA
    if (g_nvml.initialized && g_nvml.shutdown) g_nvml.shutdown();
    if (g_nvml.lib) dlclose(g_nvml.lib);
#endif
    char reason[sizeof g_nvml.reason];
    memcpy(reason, g_nvml.reason, sizeof reason);
    memset(&g_nvml, 0, sizeof g_nvml);
    memcpy(g_nvml.reason, reason, sizeof reason);
}

/* one unsigned reading, or -1 when the function is missing or fails */
static double read_u(int (*f)(kvb_nvml_device, int, unsigned *), int what, double scale)
{
    unsigned v = 0;
    return f && f(g_nvml.dev, what, &v) == NVML_SUCCESS ? v * scale : -1;
}

static double read_u1(int (*f)(kvb_nvml_device, unsigned *), double scale)
{
    unsigned v = 0;
    return f && f(g_nvml.dev, &v) == NVML_SUCCESS ? v * scale : -1;
}

void kvb_nvml_sample(kvb_clock_sample *s)
{
    memset(s, 0, sizeof *s);
    if (!g_nvml.ok) return;
    s->valid = 1;
    s->sm_mhz = read_u(g_nvml.clock, NVML_CLOCK_SM, 1);
    s->mem_mhz = read_u(g_nvml.clock, NVML_CLOCK_MEM, 1);
    s->temp_c = read_u(g_nvml.temperature, NVML_TEMPERATURE_GPU, 1);
    s->power_w = read_u1(g_nvml.power, 1e-3);
    s->have_reasons = g_nvml.reasons && g_nvml.reasons(g_nvml.dev, &s->reasons) == NVML_SUCCESS;
}

double kvb_nvml_max_sm_mhz(void) { return g_nvml.ok ? read_u(g_nvml.max_clock, NVML_CLOCK_SM, 1) : -1; }

double kvb_nvml_power_limit_w(void) { return g_nvml.ok ? read_u1(g_nvml.power_limit, 1e-3) : -1; }
