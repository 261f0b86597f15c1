/* nvml_probe.h: what a timing was taken under. The GPU's SM and memory clocks, temperature, power and
 * NVML's clock-event (throttle) reasons, sampled just before and just after a case's timing loop
 * (bench.c), and the rule that flags a loop timed under a falling or throttled clock.
 *
 * NVML is the driver's library: it is loaded at run time (nvml_probe.c says why); without it, or
 * without a device, every sample is invalid and the bench says so once.
 */
#ifndef KVB_NVML_PROBE_H
#define KVB_NVML_PROBE_H

#include <stddef.h>

/* NVML's clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*) */
#define KVB_CLOCKS_GPU_IDLE 0x1ULL
#define KVB_CLOCKS_APPLICATIONS_SETTING 0x2ULL
#define KVB_CLOCKS_SW_POWER_CAP 0x4ULL
#define KVB_CLOCKS_HW_SLOWDOWN 0x8ULL
#define KVB_CLOCKS_SYNC_BOOST 0x10ULL
#define KVB_CLOCKS_SW_THERMAL 0x20ULL
#define KVB_CLOCKS_HW_THERMAL 0x40ULL
#define KVB_CLOCKS_HW_POWER_BRAKE 0x80ULL
#define KVB_CLOCKS_DISPLAY_SETTING 0x100ULL
/* reasons that do not slow a timed loop: the GPU idle between loops, clocks the operator chose */
#define KVB_CLOCKS_BENIGN (KVB_CLOCKS_GPU_IDLE | KVB_CLOCKS_APPLICATIONS_SETTING)

/* a loop is flagged when its SM clock fell by more than this during the loop (percent of the start) */
#define KVB_CLOCK_DROP_PCT 2.0
/* or ended below this percent of the device's max SM clock: nvbench's throttle threshold (it discards
 * a measurement whose clock rate falls under 80% of cudaDevAttrClockRate) */
#define KVB_CLOCK_MIN_PCT_OF_MAX 80.0

typedef struct kvb_clock_sample {
    int valid;        /* NVML answered: the fields below are the device's (a field it could not read is < 0) */
    double sm_mhz, mem_mhz, temp_c, power_w;
    int have_reasons;
    unsigned long long reasons; /* KVB_CLOCKS_* bits active at the sample */
} kvb_clock_sample;

typedef struct kvb_clock_record {
    kvb_clock_sample start, end; /* just before the first and just after the last timed sample */
    double sm_max_mhz;           /* the device's max SM clock (<= 0 unknown) */
} kvb_clock_record;

/* Load NVML and find the CUDA device in use (by its PCI bus id). 1 when samples will be valid; 0 with
 * kvb_nvml_unavailable_reason() saying why. */
int kvb_nvml_open(int cuda_device);
const char *kvb_nvml_unavailable_reason(void);
void kvb_nvml_sample(kvb_clock_sample *s);
double kvb_nvml_max_sm_mhz(void);  /* <= 0 unknown */
double kvb_nvml_power_limit_w(void); /* the enforced power limit; <= 0 unknown */
void kvb_nvml_close(void);

/* ---- pure functions (tested without a device) ---- */
/* The reason bits as names, ", "-separated ("none" for 0; an unnamed bit as its hex value). Returns buf. */
const char *kvb_clock_reason_names(unsigned long long reasons, char *buf, size_t n);
/* 1 when the loop's timing is suspect: its SM clock fell by more than KVB_CLOCK_DROP_PCT, ended below
 * KVB_CLOCK_MIN_PCT_OF_MAX of the max, or a reason other than KVB_CLOCKS_BENIGN was active at the
 * start or the end; note (may be NULL) says which, or is "" when not flagged. 0 when either sample is
 * invalid. */
int kvb_clock_flag(const kvb_clock_record *c, char *note, size_t n);

#endif
