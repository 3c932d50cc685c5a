# minite — `make` builds build/libminite.so (the preloaded shim) and build/minite (the CLI).
#
#   make test          CPU tests (what CI runs); closes with "tests: N passed, N failed, N skipped"
#   make test SAN=1    the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build-san/)
#   make fuzz          libFuzzer targets of lab/fuzz.mk (spec parser, environment, Lt descriptors)
#   make gputest       GPU tests (device machine: H200, sm_90)
#   make bench         kernel benchmarks (device machine); writes build/bench.json
#
# The shim links no cuBLAS and no CUDA runtime: it finds cuBLAS already loaded in the process and
# reaches the GPU through the driver API (libcuda.so.1 via dlopen), with its kernels embedded as
# sm_90a fatbins. README.md says why.

CUDA_HOME    ?= /usr/local/cuda
NVCC         ?= $(CUDA_HOME)/bin/nvcc
PYTHON       ?= python3
CLANG        ?= clang
SAN          ?= 0

B := build
ifeq ($(SAN),1)
B := build-san
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif

CFLAGS  := -std=c11 -O2 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -fPIC \
           -fvisibility=hidden -D_GNU_SOURCE -I. -I$(CUDA_HOME)/include $(SANFLAGS)
LDLIBS  := -ldl -lpthread -lm
NVFLAGS := -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --Werror all-warnings -I.

# The library's parts, bottom up (each includes only those before it): base/ (log, environment,
# process), spec/ (the execution spec), kernels/ (the NVFP4 engine), shim/ (interposition and
# statistics). ref/ is the CPU reference of the numerics: tests and tools link it, the library never.
LIB_OBJ  := $(patsubst %.c,$(B)/%.o,$(wildcard base/*.c spec/*.c kernels/*.c shim/*.c))
KERN_CU  := $(wildcard kernels/*.cu)
FATBIN_OBJ := $(patsubst kernels/%.cu,$(B)/kernels/%.fatbin.o,$(KERN_CU))
LIB_OBJ  += $(FATBIN_OBJ)
REF_OBJ  := $(patsubst %.c,$(B)/%.o,$(wildcard ref/*.c))

CPU_TESTS := $(patsubst tests/cpu/%.c,$(B)/tests/cpu/%,$(wildcard tests/cpu/test_*.c))
GPU_TESTS := $(patsubst tests/gpu/%.c,$(B)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))
PY_CPU_TESTS := $(wildcard tests/cpu/test_*.py)
SH_CPU_TESTS := $(wildcard tests/cpu/test_*.sh)

.PHONY: all test gputest bench clean format format-check
.PRECIOUS: $(B)/kernels/%.fatbin
all: $(B)/libminite.so $(B)/minite

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# One fatbin per kernel file, embedded as the bytes of a hidden symbol mt_fatbin_<file>.
$(B)/kernels/%.fatbin: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -fatbin -o $@ $<

$(B)/kernels/%.fatbin.o: $(B)/kernels/%.fatbin kernels/fatbin.S
	$(CC) -c -x assembler-with-cpp -DMT_FATBIN_PATH='"$<"' -DMT_FATBIN_SYM=mt_fatbin_$* \
	    kernels/fatbin.S -o $@

# Everything the library holds, as an archive the tests link against (they pull only what they use).
$(B)/libmt.a: $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(B)/libref.a: $(REF_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(B)/libminite.so: $(LIB_OBJ)
	$(CC) -shared $(SANFLAGS) -Wl,-z,defs -Wl,--exclude-libs,ALL -o $@ $^ $(LDLIBS)

$(B)/minite: $(B)/tools/minite.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/cpu/%: $(B)/tests/cpu/%.o $(B)/libmt.a $(B)/libref.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/gpu/%: $(B)/tests/gpu/%.o $(B)/libmt.a $(B)/libref.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

# Rules of test fixtures and tools that need more than one object (fake cuBLAS libraries, ...):
# each area keeps its own fragment (tests/cpu/<area>.mk, tests/gpu/<area>.mk, bench/, demo/, lab/),
# adding what `make test` needs to TEST_FIXTURES.
-include $(wildcard tests/cpu/*.mk tests/gpu/*.mk bench/*.mk demo/*.mk lab/*.mk)

test: all $(CPU_TESTS) $(TEST_FIXTURES)
	@MT_BUILD=$(B) MT_SAN=$(SAN) PYTHON=$(PYTHON) tests/run $(CPU_TESTS) \
	    $(foreach t,$(PY_CPU_TESTS),'$(PYTHON) $(t)') $(foreach t,$(SH_CPU_TESTS),'bash $(t)')

# GPUTEST_PY picks the Python GPU tests (default: all), e.g. GPUTEST_PY=tests/gpu/test_routed.py
GPUTEST_PY ?= $(wildcard tests/gpu/test_*.py)
gputest: all $(GPU_TESTS) $(TEST_FIXTURES)
	@MT_BUILD=$(B) PYTHON=$(PYTHON) tests/run $(GPU_TESTS) \
	    $(foreach t,$(GPUTEST_PY),'$(PYTHON) $(t)')

# C and CUDA sources follow .clang-format (kernels/ and lab/ have their own, 120 columns wide).
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)

format-check:
	@clang-format --dry-run --Werror $(FORMAT_SRC) && echo "format-check: $(words $(FORMAT_SRC)) files follow .clang-format"

clean:
	rm -rf build build-san

-include $(shell find $(B) -name '*.d' 2>/dev/null)
