// gbench_shim.cc: Google Benchmark behind a C interface (gbench_shim.h). The only C++ file.
#include "harness/core/gbench_shim.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

extern "C" const char *kvb_last_error(void);

namespace {

std::vector<kvb_bench> g_benches;
int g_prepared = -1; // index of the case whose state is live
int g_errors = 0;
// at least what compare needs to judge a change (a median and a noise, 3 samples) with room to spare
constexpr size_t MIN_SAMPLES = 10, MAX_SAMPLES = 100000;
double g_sample_time_s = 0.25; // wall seconds of sampling per case (kvbench bench --sample-time)

void release_current()
{
    if (g_prepared >= 0 && g_benches[g_prepared].release) g_benches[g_prepared].release(g_benches[g_prepared].ctx);
    g_prepared = -1;
}

void run_case(benchmark::State &state, int index)
{
    kvb_bench &b = g_benches[index];
    if (g_prepared != index) {
        release_current();
        if (b.prepare(b.ctx) != 0) {
            state.SkipWithError(kvb_last_error());
            g_errors++;
            b.release(b.ctx);
            return;
        }
        g_prepared = index;
    }
    // The timed loop is the shim's, not Google Benchmark's: one Google Benchmark iteration (Iterations(1))
    // holds samples taken until the case's wall-time budget is spent (at least MIN_SAMPLES, at most
    // MAX_SAMPLES), and reports their median as its time. Google Benchmark's own loop stops on the summed
    // device time alone, while a sample of a short kernel costs many times its device time in wall time
    // (the reset, the L2 flush, the sync): short kernels took seconds each.
    std::vector<double> samples;
    if (b.loop_begin) b.loop_begin(b.ctx);
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
            const double s = b.iterate(b.ctx);
            if (s < 0) { // a failed launch or CUDA call: this case fails, the run goes on
                state.SkipWithError(kvb_last_error());
                g_errors++;
                break;
            }
            samples.push_back(s);
            const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (samples.size() >= MAX_SAMPLES || (samples.size() >= MIN_SAMPLES && spent >= g_sample_time_s)) break;
        }
        if (state.error_occurred()) break;
        std::vector<double> sorted(samples);
        std::sort(sorted.begin(), sorted.end());
        const size_t n = sorted.size();
        state.SetIterationTime(n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]));
    }
    if (state.error_occurred()) return;
    kvb_counter counters[KVB_MAX_COUNTERS];
    int n = 0;
    if (b.finish(b.ctx, samples.data(), static_cast<int>(samples.size()), counters, &n) != 0) {
        state.SkipWithError(kvb_last_error());
        g_errors++;
        return;
    }
    // after finish, which appends the stage times in run order (the JSON's counters are sorted by name)
    if (b.label && b.label(b.ctx)[0]) state.SetLabel(b.label(b.ctx));
    for (int i = 0; i < n; i++) state.counters[counters[i].name] = benchmark::Counter(counters[i].value);
}

} // namespace

extern "C" void kvb_gbench_context(const char *key, const char *value) { benchmark::AddCustomContext(key, value); }

extern "C" void kvb_gbench_set_sample_time(double seconds) { g_sample_time_s = seconds; }

extern "C" void kvb_gbench_add(const kvb_bench *b) { g_benches.push_back(*b); }

extern "C" int kvb_gbench_run(int argc, char **argv)
{
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    for (size_t i = 0; i < g_benches.size(); i++) {
        int index = static_cast<int>(i);
        benchmark::RegisterBenchmark(g_benches[i].name, [index](benchmark::State &st) { run_case(st, index); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RunSpecifiedBenchmarks();
    release_current();
    benchmark::Shutdown();
    return g_errors;
}
