// gbench_shim.cc: Google Benchmark behind a C interface (gbench_shim.h). The only C++ file.
#include "harness/core/gbench_shim.h"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

extern "C" const char *kvb_last_error(void);

namespace {

std::vector<kvb_bench> g_benches;
int g_prepared = -1; // index of the case whose state is live
int g_errors = 0;
constexpr int MIN_SAMPLES = 3; // what compare needs to judge a change (a median and a noise)

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
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    if (b.loop_begin) b.loop_begin(b.ctx);
    for (auto _ : state) {
        double s = b.iterate(b.ctx);
        if (s < 0) { // a failed launch or CUDA call: this case fails, the run goes on
            state.SkipWithError(kvb_last_error());
            g_errors++;
            break;
        }
        state.SetIterationTime(s);
        samples.push_back(s);
    }
    if (state.error_occurred()) return;
    // A case slower than the minimum time runs one iteration; its statistics (median, noise) need at least
    // MIN_SAMPLES samples, taken the same way after Google Benchmark's loop (its own time stays its loop's).
    while (samples.size() < static_cast<size_t>(MIN_SAMPLES)) {
        double s = b.iterate(b.ctx);
        if (s < 0) {
            state.SkipWithError(kvb_last_error());
            g_errors++;
            return;
        }
        samples.push_back(s);
    }
    if (b.label && b.label(b.ctx)[0]) state.SetLabel(b.label(b.ctx));
    kvb_counter counters[KVB_MAX_COUNTERS];
    int n = 0;
    if (b.finish(b.ctx, samples.data(), static_cast<int>(samples.size()), counters, &n) != 0) {
        state.SkipWithError(kvb_last_error());
        g_errors++;
        return;
    }
    for (int i = 0; i < n; i++) state.counters[counters[i].name] = benchmark::Counter(counters[i].value);
}

} // namespace

extern "C" void kvb_gbench_context(const char *key, const char *value) { benchmark::AddCustomContext(key, value); }

extern "C" void kvb_gbench_add(const kvb_bench *b) { g_benches.push_back(*b); }

extern "C" int kvb_gbench_run(int argc, char **argv)
{
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    for (size_t i = 0; i < g_benches.size(); i++) {
        int index = static_cast<int>(i);
        benchmark::RegisterBenchmark(g_benches[i].name, [index](benchmark::State &st) { run_case(st, index); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RunSpecifiedBenchmarks();
    release_current();
    benchmark::Shutdown();
    return g_errors;
}
