# Spillway build.
#
# Conventions (so adding a file never needs a Makefile edit):
#   DIR/*.c                 library code of that directory -> build/lib/libsw_DIR.a
#   DIR/spillway-NAME.c     a program                      -> build/bin/spillway-NAME
#   sdk/spillway.c          the CLI                        -> build/bin/spillway
#   tools/spillway-NAME.c   a tool (no library of its own) -> build/bin/spillway-NAME
#   worker-gpu/*.cu         CUDA code, only when nvcc is found
#   tests/unit/test_*.c     unit test programs             -> build/tests/test_*
#
# make SANITIZE=1 builds everything with ASan+UBSan into build-san/;
# make TSAN=1 with ThreadSanitizer into build-tsan/.

SANITIZE ?= 0
TSAN ?= 0
ifeq ($(TSAN),1)
B ?= build-tsan
# libgomp is not built with TSan, so its barriers look like races to it:
# tests/tsan.supp names them (tests/run.sh points TSAN_OPTIONS at it).
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
OPT ?= -O1
else ifeq ($(SANITIZE),1)
B ?= build-san
# float-cast-overflow: GCC leaves it out of "undefined" (a float to int
# conversion out of range is undefined behaviour all the same)
SANFLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined,float-cast-overflow
# -O1, as ASan's own docs advise: at -O2 the instrumented SIMD kernels took
# GCC 134 s (kernels_avx512.c) against 40 s, and the sanitized suite ran
# only ~10% slower for it (200 s against 182 s, the same 284 tests).
OPT ?= -O1
else
B ?= build
SANFLAGS :=
endif

CC      ?= cc
OPT     ?= -O2
# The user-facing targets build in parallel on every core.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CFLAGS  := $(OPT) -g -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
           -fopenmp -pthread -I. -I$(B)/gen -MMD -MP $(SANFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := -fopenmp -pthread $(SANFLAGS)
SYSLIBS := -lzmq -lsodium -lprotobuf-c -lyaml -lmicrohttpd -lcjson -lpcre2-8 -lm

# CUDA: located through nvcc on PATH, never a hard-coded path.
NVCC := $(shell command -v nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
CUDA_LIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcudart -lstdc++
NVCCFLAGS := -O3 -std=c++17 -I. -I$(B)/gen -MMD -MP -Xcompiler -fPIC,-Wall \
             -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_89,code=sm_89 \
             -gencode=arch=compute_90a,code=compute_90a
CFLAGS_GPU := -DSW_HAVE_CUDA=1
else
CUDA_LIBS :=
CFLAGS_GPU :=
endif

PROTO_GEN := $(B)/gen/spillway.pb-c.c $(B)/gen/spillway.pb-c.h

DIRS := llm proto worker-cpu worker-gpu gateway sdk
libsrc = $(filter-out $(1)/spillway-%.c $(1)/spillway.c,$(wildcard $(1)/*.c))
libobj = $(patsubst %.c,$(B)/obj/%.o,$(call libsrc,$(1)))

LIB_llm        := $(B)/lib/libsw_llm.a
LIB_proto      := $(B)/lib/libsw_proto.a
LIB_worker-cpu := $(B)/lib/libsw_cpu.a
LIB_worker-gpu := $(B)/lib/libsw_gpu.a
LIB_gateway    := $(B)/lib/libsw_gateway.a
LIB_sdk        := $(B)/lib/libsw_sdk.a
# Link order: users before what they use.
LIBS := $(LIB_gateway) $(LIB_sdk) $(LIB_worker-gpu) $(LIB_worker-cpu) $(LIB_proto) $(LIB_llm)

CU_SRC := $(if $(NVCC),$(wildcard worker-gpu/*.cu))
CU_OBJ := $(patsubst %.cu,$(B)/obj/%.cu.o,$(CU_SRC))

PROG_SRC := $(foreach d,$(DIRS) tools,$(wildcard $(d)/spillway-*.c)) $(wildcard sdk/spillway.c)
PROGS    := $(foreach s,$(PROG_SRC),$(B)/bin/$(basename $(notdir $(s))))
TEST_SRC := $(wildcard tests/unit/test_*.c) $(wildcard tests/fuzz/fuzz_*.c)
TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRC))

# Programs and tests that need the CUDA runtime when it is compiled in.
NEEDS_CUDA = $(if $(findstring gpu,$(notdir $@)),$(CUDA_LIBS))

# Keep intermediate objects (tests are built through a pattern chain).
.SECONDARY:

.PHONY: all deps run test test-isa soak unit-tests bench bench-peers bench-gateway clean check-cuda
all: $(PROGS) $(TESTS)
	@[ -n "$(NVCC)" ] || echo "note: nvcc not found: worker-gpu built with the emulation backend only"

deps:
	@bash ops/deps.sh

# one protoc-c run makes both files (a grouped target, so -j never runs it twice)
$(B)/gen/spillway.pb-c.c $(B)/gen/spillway.pb-c.h &: proto/spillway.proto
	@mkdir -p $(B)/gen
	protoc-c --c_out=$(B)/gen -Iproto proto/spillway.proto

# Every object may include the generated header.
$(B)/obj/%.o: %.c $(B)/gen/spillway.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(findstring worker-gpu,$<),$(CFLAGS_GPU)) -c $< -o $@

$(B)/obj/gen/spillway.pb-c.o: $(B)/gen/spillway.pb-c.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/obj/%.cu.o: %.cu $(B)/gen/spillway.pb-c.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

define LIBRULE
$(LIB_$(1)): $(call libobj,$(1)) $(if $(filter proto,$(1)),$(B)/obj/gen/spillway.pb-c.o) $(if $(filter worker-gpu,$(1)),$(CU_OBJ))
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach d,$(DIRS),$(eval $(call LIBRULE,$(d))))

# The dashboard's files (gateway/dashboard/) go into libsw_gateway as byte
# arrays, so the gateway serves GET /dashboard from its own binary;
# embed.sh needs only sh and od.
DASH_FILES := $(sort $(wildcard gateway/dashboard/*.html gateway/dashboard/*.js gateway/dashboard/*.css))
$(B)/gen/dashboard_assets.c: $(DASH_FILES) gateway/dashboard/embed.sh
	@mkdir -p $(dir $@)
	sh gateway/dashboard/embed.sh $@ $(DASH_FILES)
$(B)/obj/gen/dashboard_assets.o: $(B)/gen/dashboard_assets.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(LIB_gateway): $(B)/obj/gen/dashboard_assets.o

define PROGRULE
$(B)/bin/$(basename $(notdir $(1))): $(patsubst %.c,$(B)/obj/%.o,$(1)) $(LIBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) $$< $$(LIBS) $$(SYSLIBS) $$(NEEDS_CUDA) -o $$@
endef
$(foreach s,$(PROG_SRC),$(eval $(call PROGRULE,$(s))))
# `spillway ops` talks HTTP to the admin API (sdk/ops.c)
$(B)/bin/spillway: SYSLIBS += -lcurl

$(B)/tests/%: $(B)/obj/tests/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(LIBS) $(SYSLIBS) $(NEEDS_CUDA) -o $@

# ---- user-facing targets -------------------------------------------------

run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash ops/run.sh

# Under TSan, the suites where threads meet: the gateway (HTTP threads and
# the broker), the workers (link and compute threads) and the SDK.
TSAN_TESTS := tests/test_gateway_api.py tests/test_gateway_failures.py tests/test_gateway_overflow.py \
              tests/test_gateway_reload.py tests/test_gateway_affinity.py tests/test_worker_protocol.py \
              tests/test_sdk.py tests/test_e2e.py tests/test_unit_c.py tests/test_ops.py tests/test_choices.py \
              -k "not fuzz and not test_register_fields_and_heartbeats and not test_kernels and not test_forward"
# (that test times the first heartbeat after registering, 1 s of silence,
# to within 0.3 s; under TSan the registration itself arrives late. The
# kernel and forward-pass programs are one thread's arithmetic, 6 of TSan's
# 10 minutes; the plain, sanitizer and forced-ISA runs check them.)
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@SPILLWAY_BUILD=$(B) bash tests/run.sh $(if $(filter 1,$(TSAN)),--only $(TSAN_TESTS))

# The kernel, attention, forward-pass and golden-logit tests again with each
# lower ISA path forced (SPILLWAY_ISA), so a host with AVX-512 keeps the AVX2
# and scalar paths honest; on a host without AVX2 the avx2 run is the scalar
# path again. (make test itself runs the programs on CPUs that lack AVX-512
# or AVX2, emulated by qemu-x86_64: tests/test_isa_emulated.py.)
ISA_TESTS := tests/test_golden.py tests/test_unit_c.py -k "(golden or kernels or attention or forward or quant) and not emulated"
test-isa: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@for isa in avx2 scalar; do echo "== SPILLWAY_ISA=$$isa"; \
	  SPILLWAY_ISA=$$isa SPILLWAY_BUILD=$(B) bash tests/run.sh $(ISA_TESTS) || exit 1; done

# make soak: many clients for SOAK_MINUTES against real CPU workers and
# test-mode workers killed and restarted at random (tests/soak.py says what
# it checks); SANITIZE=1 runs it under ASan/UBSan.
SOAK_MINUTES ?= 10
soak: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@SPILLWAY_SOAK_MINUTES=$(SOAK_MINUTES) SPILLWAY_BUILD=$(B) bash tests/run.sh --only tests/soak.py -s

bench: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash ops/bench.sh

bench-peers: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash ops/bench-peers.sh

bench-gateway: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash ops/bench-gateway.sh

# ---- coverage-guided fuzzing (libFuzzer) ---------------------------------
# make fuzz builds the project's libraries and each tests/fuzz/fuzz_*.c entry
# point (-DSW_LIBFUZZER) with clang and -fsanitize=fuzzer,address,undefined
# into $(FUZZ_B), then tests/fuzz/run.sh runs each FUZZ_SECONDS from its seed
# corpus tests/fuzz/corpus/NAME/ (copied to a scratch folder, so the repo is
# never written), FUZZ_JOBS at a time, prints the executions per target and
# fails on any crash. fuzz_model is left out: its inputs are whole model
# files that make test's mutation run covers.
FUZZ_B       ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_TARGETS ?= $(filter-out fuzz_model,$(basename $(notdir $(wildcard tests/fuzz/fuzz_*.c))))
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
.PHONY: fuzz fuzz-build
fuzz: deps
	@$(MAKE) --no-print-directory -j$(JOBS) fuzz-build B=$(FUZZ_B) CC=clang OPT=-O1 \
	  SANFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link"
	@bash tests/fuzz/run.sh $(FUZZ_B)/fuzz $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_TARGETS)
# (run in the sub-make above, where B and CC are the fuzz build's). Only the
# libraries the harnesses use: the CPU worker's SIMD kernels rely on GCC's
# target pragmas, which clang does not take.
FUZZ_LIBS := $(LIB_gateway) $(LIB_proto) $(LIB_llm)
fuzz-build: $(patsubst %,$(B)/fuzz/%,$(FUZZ_TARGETS))
$(B)/fuzz/%: tests/fuzz/%.c $(FUZZ_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSW_LIBFUZZER -fsanitize=fuzzer $< $(FUZZ_LIBS) $(SYSLIBS) -o $@
-include $(wildcard $(B)/fuzz/*.d)

clean:
	rm -rf build build-san build-tsan

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
