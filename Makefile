# kvbench: one entry point.
#   make            build kvbench and the tests (CUDA parts when nvcc is found)
#   make test       unit + GPU tests, KVB_TEST_JOBS parts at a time (default: the number of processors);
#                   ends with "N passed, N failed, N skipped"
#   make check      kvbench check (CUDA vs reference; references only without a GPU)
#   make bench      kvbench bench over the bench tier, JSON + summary under results/local/
#   make step-report STEP_RESULTS=dir [GPU=H200]  decode_step tables.md + stages.png from dir/*bench.json (each file a run)
#   make plots [PLOT_RESULTS="a.json b.json"] [PLOT_OUT=dir]  % of ceiling per case, with its peers: dir/pct_of_ceiling.png
#   make publish ROUND=dir   a GPU round (harness/scripts/gpu_round.sh OUT) becomes the canonical results/h200/
#   make headline   README.md's headline table and the family notes' figures, regenerated from results/h200/
#   make sanitize [SANITIZE_OUT=dir] [FILTER=..]  compute-sanitizer memcheck, racecheck, initcheck, synccheck over the sanitize tier (GPU)
#   make run [GPUS=N] [SHARDS=M] [HOST_MEM_LIMIT_GB=G]  the main job: deps, build, check, bench (what can run on this machine);
#                   GPUS=N: a process per GPU, each tier in M shards (default N), merged into one result
#   make bundle     relocatable bundle/ (binaries + non-system libraries, rpath $ORIGIN/../lib)
#   make bundle-variant  bundle-variant/: this build's bin/, cases/ and lib/libkvbench.so only (~7 MB
#                   packed): B of an A/B, laid over a whole bundle A by profiles/ab_round.sh
#   make deps       install the Debian packages the build needs (or print the command)
#   make ptxas      the compiler's resource report for every kernel (registers, smem, spills)
#   make sass       SASS of the kernels into build/sass/
#   make fuzz       libFuzzer over the case parser and the options (FUZZ_SECONDS=600); make fuzz-smoke: a short run
#   make gpu-sweep  random shapes of every kernel and impl through kvbench check (SWEEP_PER_KERNEL=8,
#                   SWEEP_SEED=1; tests/fuzz/gpu_sweep.py): every accepted line must pass, none may crash
#   make leak-check LeakSanitizer over check (smoke + sanitize tiers, CPU path); make alloc-fault: each host
#                   allocation site failed in turn (tests/alloc_fault.sh)
#   make clean
#   make KVB_TRACE=1 [all|bundle]  the diagnostic build of int2_decode_attn v3 with its per-block trace, in build/trace/
#                   (bundle: build/trace/bundle; profiles/int2_v3_round.sh trace reads it)
# Variables: NVCC (path or empty to build without CUDA), GENCODE (target architectures),
#            FILTER (case filter for check/bench), TIER.

CC      ?= gcc
CXX     ?= g++
NVCC    ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
GENCODE ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90

# KVB_TRACE=1: int2_decode_attn v3's per-block trace compiled in (-DKVB_INT2_TRACE=1), a build of its own
# (build/trace/) so that its objects never mix with a production build's, which carries no trace code
KVB_TRACE ?=
# KVB_CPU_ONLY=1: the CPU parts alone (no nvcc), a build of its own (build/cpu/): `make run` on a machine
# without a GPU, which compiles no kernel it could not run
KVB_CPU_ONLY ?=
ifeq ($(KVB_CPU_ONLY),1)
  NVCC :=
endif
BUILD   := $(if $(filter 1,$(KVB_TRACE)),build/trace,$(if $(filter 1,$(KVB_CPU_ONLY)),build/cpu,build))
BUNDLE  := $(if $(filter 1,$(KVB_TRACE)),$(BUILD)/bundle,bundle)
OBJ     := $(BUILD)/obj
GIT_REV := $(shell git describe --always --dirty 2>/dev/null || echo unknown)

ifneq ($(strip $(NVCC)),)
  HAVE_CUDA := 1
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  CUDA_INC  := -I$(CUDA_HOME)/include
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcusolver -lcublas -lcudart_static -lrt -ldl -lpthread
else
  HAVE_CUDA := 0
endif

CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -fPIC -Wall -Wextra -Wno-unused-parameter -fopenmp -DKVB_HAVE_CUDA=$(HAVE_CUDA) \
            -DKVB_GIT_REV=\"$(GIT_REV)\" -I. $(CUDA_INC)
CXXFLAGS ?= -O2 -g
CXXFLAGS += -std=c++17 -fPIC -Wall -Wextra -I.
NVFLAGS  ?= -O3 -lineinfo
# -no-compress: the device code is stored as built, not compressed by nvcc; a bundle travels xz-packed,
# and xz packs the plain cubins and PTX to 5.7 MB where it packed nvcc's compressed ones to 8.4 MB
NVFLAGS  += -std=c++17 $(GENCODE) -no-compress -DKVB_HAVE_CUDA=1 -I. -Xcompiler -Wall,-fPIC
NVFLAGS  += $(if $(filter 1,$(KVB_TRACE)),-DKVB_INT2_TRACE=1)
LDFLAGS  += -fopenmp -Wl,-rpath,'$$ORIGIN/../lib' -Wl,-rpath,/usr/local/cuda/lib64
# -llapacke -lblas: reference/shadowkv.c (the prefill SVD, LAPACKE_dgesdd; the error's product U * SV,
# cblas_dgemm). libblas is Debian's alternative (OpenBLAS here, as under liblapacke), and `make bundle`
# carries it and the rest of the stack with rpath $ORIGIN (patchelf, in DEB_PKGS).
LAPACK_LIBS := -llapacke -lblas
LDLIBS   := $(CUDA_LIBS) -lbenchmark $(LAPACK_LIBS) -lstdc++ -lm

REF_SRC     := $(wildcard reference/*.c reference/*/*.c)
HARNESS_SRC := $(filter-out harness/core/main.c,$(wildcard harness/*/*.c))
SHIM_SRC    := harness/core/gbench_shim.cc
KERNEL_SRC  := $(if $(filter 1,$(HAVE_CUDA)),$(wildcard kernels/*/*.cu) harness/core/gpu_util.cu)
# host C in kernels/ (the step compositions, the gather baselines): plain C over the kernels' headers
COMPOSE_SRC := $(if $(filter 1,$(HAVE_CUDA)),$(wildcard kernels/*/*.c))
HEADERS     := $(wildcard reference/*.h reference/*/*.h harness/*/*.h kernels/*/*.h kernels/*/*.cuh)

REF_OBJ     := $(REF_SRC:%.c=$(OBJ)/%.o)
HARNESS_OBJ := $(HARNESS_SRC:%.c=$(OBJ)/%.o) $(SHIM_SRC:%.cc=$(OBJ)/%.o)
KERNEL_OBJ  := $(KERNEL_SRC:%.cu=$(OBJ)/%.o) $(COMPOSE_SRC:%.c=$(OBJ)/%.o)
LIB_OBJ     := $(REF_OBJ) $(HARNESS_OBJ) $(KERNEL_OBJ)

KVBENCH     := $(BUILD)/bin/kvbench
TEST_SRC    := $(wildcard tests/test_*.c)
TEST_BIN    := $(TEST_SRC:tests/%.c=$(BUILD)/bin/%)

.PHONY: all test check bench step-report plots sanitize run bundle bundle-variant deps ptxas sass clean
# objects built through a pattern rule only (the tests') are kept; not .SECONDARY: for every target,
# under which a deleted library or program was not rebuilt while what uses it was newer
.PRECIOUS: $(OBJ)/%.o
all: $(KVBENCH) $(TEST_BIN)

# -MMD -MP: each object's header dependencies, as the compiler saw them, in a .d beside it
$(OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(OBJ)/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(OBJ)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

# an object without its .d (built before the .d files existed) cannot be judged: removed, so it is rebuilt
$(foreach o,$(shell find $(OBJ) -name '*.o' 2>/dev/null),$(if $(wildcard $(o:.o=.d)),,$(shell rm -f $(o))))
-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)

# One shared library holds the references, the harness and every kernel (the device code is
# stored once, not in every test program); binaries find it through rpath $ORIGIN/../lib.
KVBLIB := $(BUILD)/lib/libkvbench.so
# rpath $ORIGIN: in a bundle, libkvbench.so finds the libraries copied beside it without patchelf
$(KVBLIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -fopenmp -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,/usr/local/cuda/lib64 $^ -o $@ $(LDLIBS)

# A CUPTI timeline of one profiled launch, for machines without Nsight Systems (profiles/kernel_trace.c,
# profiles/trace.sh); built where the toolkit has CUPTI, loaded by the CUDA driver, linked by no binary.
TRACE_LIB := $(if $(and $(filter 1,$(HAVE_CUDA)),$(wildcard $(CUDA_HOME)/include/cupti.h)),$(BUILD)/lib/kernel_trace.so)
$(BUILD)/lib/kernel_trace.so: profiles/kernel_trace.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -shared -fPIC $(CUDA_INC) $< -o $@ -Wl,-rpath,'$$ORIGIN' -L$(CUDA_HOME)/lib64 -lcupti
all: $(TRACE_LIB)

# the revision is compiled into main.o: rebuild it when the revision changes
$(BUILD)/git_rev: FORCE
	@mkdir -p $(BUILD)
	@echo '$(GIT_REV)' | cmp -s - $@ || echo '$(GIT_REV)' > $@
$(OBJ)/harness/core/main.o $(OBJ)/harness/core/report.o $(OBJ)/harness/core/bench.o $(OBJ)/harness/core/shard.o: $(BUILD)/git_rev
.PHONY: FORCE
FORCE:

$(KVBENCH): $(OBJ)/harness/core/main.o $(KVBLIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< -o $@ -L$(BUILD)/lib -lkvbench $(LDLIBS)

$(BUILD)/bin/test_%: $(OBJ)/tests/test_%.o $(OBJ)/tests/testlib.o $(KVBLIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o,$^) -o $@ -L$(BUILD)/lib -lkvbench -lcmocka $(LDLIBS)


# ---- running ----
TIER   ?=
FILTER ?=
KV_ARGS = $(if $(TIER),--tier $(TIER)) $(FILTER)

# like `make run`, `make test` sets up a fresh machine itself (make deps)
test: deps
	@$(MAKE) --no-print-directory all
	@bash tests/run_tests.sh $(BUILD)/bin

check: $(KVBENCH)
	$(KVBENCH) check $(KV_ARGS)

RESULTS ?= results/local
bench: $(KVBENCH)
	@mkdir -p $(RESULTS)
	$(KVBENCH) bench $(KV_ARGS) --json $(RESULTS)/bench.json --summary $(RESULTS)/summary.md

# decode_step tables and stage plot from a finished run (no build: python3 + gnuplot)
STEP_RESULTS ?= $(RESULTS)
GPU          ?= H200
step-report:
	python3 harness/report/step_report.py $(sort $(wildcard $(STEP_RESULTS)/*bench.json)) $(STEP_RESULTS)
	gnuplot -e "datafile='$(STEP_RESULTS)/stages.dat'; outfile='$(STEP_RESULTS)/stages.png'; gpu='$(GPU)'" harness/report/step_stages.gp

# ---- sanitize: compute-sanitizer's four tools over the sanitize tier (every kernel and impl) ----
SANITIZE_OUT ?= results/local
sanitize: $(KVBENCH)
	bash profiles/sanitize.sh $(SANITIZE_OUT) $(FILTER)

# ---- the canonical results (results/<gpu>/, results/README.md) ----
#   make publish ROUND=dir [GPU=h200]  a finished gpu_round.sh OUT becomes results/GPU/: plot, headline, index
#   make headline [GPU=h200]           README.md's headline table and the notes' figures from results/GPU/
#   make plots [PLOT_RESULTS="a.json b.json"] [PLOT_OUT=dir]   % of ceiling per case, with its peers
GPU_DIR      ?= h200
PLOT_RESULTS ?= results/$(GPU_DIR)/bench.json
PLOT_OUT     ?= results/$(GPU_DIR)
.PHONY: publish headline
publish:
	@test -n "$(ROUND)" || { echo "usage: make publish ROUND=<gpu_round.sh OUT> [GPU_DIR=h200]"; exit 2; }
	bash harness/report/publish.sh $(ROUND) $(GPU_DIR)
headline:
	python3 harness/report/headline.py results/$(GPU_DIR) --write
plots:
	python3 harness/report/plot_report.py $(PLOT_RESULTS) $(PLOT_OUT)
	gnuplot -e "datadir='$(PLOT_OUT)'" harness/report/plots.gp
	@echo "plots: $(PLOT_OUT)/pct_of_ceiling.png"

# GPUS=N: one process per GPU, each tier split into SHARDS (default N) shards and merged (main_job.sh)
GPUS   ?= 1
SHARDS ?=
HOST_MEM_LIMIT_GB ?=
run:
	@if [ -e /dev/nvidia0 ]; then \
	  $(MAKE) --no-print-directory deps && $(MAKE) --no-print-directory all && \
	  GPUS=$(GPUS) SHARDS=$(SHARDS) HOST_MEM_LIMIT_GB=$(HOST_MEM_LIMIT_GB) bash harness/scripts/main_job.sh $(BUILD)/bin/kvbench $(RESULTS); \
	else \
	  echo "run: no NVIDIA GPU on this machine (no /dev/nvidia0): the CPU parts alone are built (build/cpu/), then the C references over the smoke tier; nothing is timed (exit 3)"; \
	  $(MAKE) --no-print-directory deps && $(MAKE) --no-print-directory KVB_CPU_ONLY=1 all && \
	  GPUS=$(GPUS) SHARDS=$(SHARDS) HOST_MEM_LIMIT_GB=$(HOST_MEM_LIMIT_GB) bash harness/scripts/main_job.sh build/cpu/bin/kvbench $(RESULTS); \
	fi

# ---- bundle for the GPU machine ----
bundle: all
	@KERNEL_TRACE_LIB=$(TRACE_LIB) bash harness/scripts/make_bundle.sh $(BUNDLE) $(KVBENCH) $(TEST_BIN)

bundle-variant: bundle
	@rm -rf bundle-variant && mkdir -p bundle-variant/lib && cp -r $(BUNDLE)/bin $(BUNDLE)/cases bundle-variant/ && \
	  cp $(BUNDLE)/lib/libkvbench.so bundle-variant/lib/ && du -sh bundle-variant | sed 's/^/bundle-variant: /'

# ---- dependencies ----
DEB_PKGS := build-essential libbenchmark-dev libcmocka-dev liblapacke-dev libopenblas-dev patchelf gnuplot-nox python3-numpy
deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all present ($(DEB_PKGS))"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "deps: installing $$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: missing $$missing; install with:"; echo "  sudo apt-get update && sudo apt-get install -y $$missing"; exit 1; fi
	@if [ -z "$(NVCC)" ]; then echo "deps: nvcc not found: building the CPU parts only (install the CUDA toolkit for the kernels)"; fi

# ---- reading the compiler's output (no device needed) ----
ptxas:
	@for f in $(wildcard kernels/*/*.cu); do echo "== $$f"; $(NVCC) $(NVFLAGS) -Xptxas -v -c $$f -o /dev/null 2>&1 | grep -E "Compiling|registers|spill|smem" ; done

# cuobjdump and the nvdisasm it calls: the toolkit's, else CUOBJDUMP / NVDISASM_DIR (the toolkit images
# without them: `pip download nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, then unzip the wheels)
CUOBJDUMP ?= cuobjdump
sass: $(KERNEL_OBJ)
	@mkdir -p $(BUILD)/sass
	@for o in $(KERNEL_SRC:%.cu=$(OBJ)/%.o); do PATH="$$PATH:$(NVDISASM_DIR)" $(CUOBJDUMP) --dump-sass $$o > $(BUILD)/sass/$$(basename $$o .o).sass || exit 1; done
	@echo "SASS in $(BUILD)/sass/"

# ---- fuzzing: libFuzzer targets over the case parser, the ops' shape checks and the options ----
#   make fuzz [FUZZ_SECONDS=600]  every target for FUZZ_SECONDS, in parallel; new inputs go to build/fuzz/corpus/,
#                                 crashes to build/fuzz/artifacts/ (not the repo); usage in tests/fuzz/RUN.md
#   make fuzz-smoke               every target from tests/fuzz/corpus/<target>/, a bounded run each; ends with
#                                 "fuzz: N passed, N failed", or "fuzz: ... N skipped" without clang's libFuzzer
# CPU-only objects (no CUDA, no OpenMP: its pragmas are ignored) under ASan and UBSan, in an archive so that a
# target links only what it reaches.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS  := -std=gnu11 -O1 -g -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -fsanitize=fuzzer-no-link \
                $(FUZZ_SAN) -DKVB_HAVE_CUDA=0 -DKVB_GIT_REV=\"$(GIT_REV)\" -I.
FUZZ_TARGETS := $(basename $(notdir $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_BIN     := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)
FUZZ_ARGS    := -max_len=8192 -timeout=10 -close_fd_mask=3 -dict=tests/fuzz/kvb.dict

$(FUZZ_DIR)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
.PRECIOUS: $(FUZZ_DIR)/obj/%.o

$(FUZZ_DIR)/libkvb.a: $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(REF_SRC) $(HARNESS_SRC))
	rm -f $@ && ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/tests/fuzz/fuzz_%.o $(FUZZ_DIR)/libkvb.a
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) $^ -o $@ $(LAPACK_LIBS) -lm

SWEEP_PER_KERNEL ?= 8
SWEEP_SEED       ?= 1
.PHONY: gpu-sweep
gpu-sweep: all
	python3 tests/fuzz/gpu_sweep.py $(KVBENCH) $(BUILD)/gpu_sweep --per-kernel $(SWEEP_PER_KERNEL) --seed $(SWEEP_SEED)

.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_BIN)
	@pids=""; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s, log in $(FUZZ_DIR)/$$t.log"; \
	  $(FUZZ_DIR)/$$t $(FUZZ_ARGS) -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t >$(FUZZ_DIR)/$$t.log 2>&1 & \
	  pids="$$pids $$!"; done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for t in $(FUZZ_TARGETS); do echo "== $$t"; grep -E '^(#[0-9]+[[:space:]]+DONE|Done|stat::|==[0-9]+==|SUMMARY|artifact_prefix)' $(FUZZ_DIR)/$$t.log | tail -n 12; done; \
	exit $$rc

# the toolchain probe decides between running and skipping (said so): never a silent no-op
fuzz-smoke:
	@mkdir -p $(FUZZ_DIR)
	@if echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
	    $(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -x c - -o $(FUZZ_DIR)/probe >/dev/null 2>&1; then \
	  if ! $(MAKE) --no-print-directory $(FUZZ_BIN) >$(FUZZ_DIR)/build.log 2>&1; then \
	    tail -n 20 $(FUZZ_DIR)/build.log; echo "fuzz: 0 passed, $(words $(FUZZ_TARGETS)) failed (build)"; exit 1; fi; \
	  bash tests/fuzz/smoke.sh $(FUZZ_DIR) "$(FUZZ_ARGS)" $(FUZZ_TARGETS); \
	else echo "fuzz: no $(FUZZ_CC) with libFuzzer (Debian: clang libclang-rt-14-dev), $(words $(FUZZ_TARGETS)) skipped"; fi

# ---- host memory under AddressSanitizer, on the CPU path (no device): leaks and allocation failures ----
#   make leak-check        kvbench check over the smoke and sanitize tiers under LeakSanitizer, one process per
#                          case, KVB_TEST_JOBS at a time (default: the number of processors); ends
#                          "leak: N passed, N failed" (or "leak: ... skipped" without the toolchain)
#   make alloc-fault       each checked host allocation site of every sanitize-tier case failed in turn
#                          (tests/alloc_fault.sh; ALLOC_FAULT_ARGS=--every: each allocation); never a crash or a
#                          leak; ends "alloc-fault: N injections over N cases, N crashes, N leaks, N unnamed"
#   make alloc-fault-smoke the bounded run of tests/run_tests.sh: the first smoke case of each kernel
# A CPU build of its own in $(BUILD)/san (gcc's ASan and libgomp: the references keep their threads).
SAN_CC     ?= gcc
SAN_CXX    ?= g++
SAN_DIR    := $(BUILD)/san
SAN_FLAGS  := -fsanitize=address -fno-omit-frame-pointer
SAN_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -fopenmp $(SAN_FLAGS) -DKVB_HAVE_CUDA=0 \
              -DKVB_GIT_REV=\"$(GIT_REV)\" -I.
SAN_KVBENCH := $(SAN_DIR)/kvbench
ALLOC_FAULT_ARGS ?=

$(SAN_DIR)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_CFLAGS) -c $< -o $@

$(SAN_DIR)/obj/%.o: %.cc harness/core/gbench_shim.h
	@mkdir -p $(dir $@)
	$(SAN_CXX) -std=c++17 -O1 -g $(SAN_FLAGS) -I. -c $< -o $@

$(SAN_KVBENCH): $(patsubst %.c,$(SAN_DIR)/obj/%.o,$(REF_SRC) $(HARNESS_SRC) harness/core/main.c) $(SAN_DIR)/obj/$(SHIM_SRC:.cc=.o)
	$(SAN_CC) $(SAN_FLAGS) -fopenmp $^ -o $@ -lbenchmark $(LAPACK_LIBS) -lstdc++ -lm -lpthread

.PHONY: leak-check alloc-fault alloc-fault-smoke
# the toolchain probe decides between running and skipping (said so): never a silent no-op
SAN_PROBE = { mkdir -p $(SAN_DIR) && echo 'int main(void) { return 0; }' | $(SAN_CC) $(SAN_FLAGS) -x c - -o $(SAN_DIR)/probe >/dev/null 2>&1; }
SAN_NONE  = no $(SAN_CC) with AddressSanitizer (Debian: gcc and its libasan)
SAN_BUILD = { $(MAKE) --no-print-directory $(SAN_KVBENCH) >$(SAN_DIR)/build.log 2>&1 || { tail -n 20 $(SAN_DIR)/build.log; false; }; }

leak-check:
	@if ! $(SAN_PROBE); then echo "leak: skipped: $(SAN_NONE)"; \
	elif ! $(SAN_BUILD); then echo "leak: 0 passed, 1 failed (the AddressSanitizer build)"; exit 1; \
	else bash tests/leak_check.sh $(SAN_KVBENCH); fi

alloc-fault:
	@if ! $(SAN_PROBE); then echo "alloc-fault: skipped: $(SAN_NONE)"; \
	elif ! $(SAN_BUILD); then echo "alloc-fault: 0 injections, 1 failed (the AddressSanitizer build)"; exit 1; \
	else bash tests/alloc_fault.sh $(ALLOC_FAULT_ARGS) $(SAN_KVBENCH); fi

alloc-fault-smoke:
	@if ! $(SAN_PROBE); then echo "alloc-fault: skipped: $(SAN_NONE)"; \
	elif ! $(SAN_BUILD); then echo "alloc-fault: 0 injections, 1 failed (the AddressSanitizer build)"; exit 1; \
	else bash tests/alloc_fault.sh --first-per-op --tier smoke $(SAN_KVBENCH); fi

clean:
	rm -rf $(BUILD) bundle
