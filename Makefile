# minite — `make` builds build/libminite.so (the preloaded shim) and build/minite (the CLI).
#
#   make test          what CI runs, and the one command a fresh machine needs: makes build/venv
#                      (tests/requirements.txt), checks the format, builds the library, the tests,
#                      the benchmarks and the lab probes, compiles the fuzz harnesses, runs the
#                      CPU tests; closes with
#                      "tests: N passed, N failed, N skipped"
#   make test SAN=1    the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build-san/;
#                      the lab probes, CUDA only, are left to the plain build)
#   make fuzz          libFuzzer targets of lab/fuzz.mk (spec parser, environment, Lt descriptors)
#   make gputest       GPU tests (device machine: H200, sm_90); without a GPU it says so and fails
#   make bench         kernel benchmarks (device machine); writes build/bench*.json
#   make bench-build   the benchmarks, built and not run; make lab: the lab probes, likewise
#
# The shim links no cuBLAS and no CUDA runtime: it finds cuBLAS already loaded in the process and
# reaches the GPU through the driver API (libcuda.so.1 via dlopen), with its kernels embedded as
# sm_90a fatbins. docs/design.md ("Why the driver API and not cudart") says why.

CUDA_HOME    ?= /usr/local/cuda
NVCC         ?= $(CUDA_HOME)/bin/nvcc
CLANG        ?= clang
SAN          ?= 0

# PYTHON runs the Python tests and tools. Unset, the CPU tests get the interpreter of build/venv
# (made on first use from tests/requirements.txt, brought up to date when that changes; shared by
# build/ and build-san/), and the GPU tests and `make run` get python3: the device machine's, where
# torch is.
VENV := build/venv
ifeq ($(origin PYTHON),undefined)
PYTHON := python3
TEST_PYTHON := $(abspath $(VENV))/bin/python3
TEST_VENV := $(VENV)/requirements.txt
else
TEST_PYTHON := $(PYTHON)
endif

# How `make gputest` tells whether the machine has a GPU (the tests' own skips would pass it
# vacuously): the driver's nvidia-smi lists one. Override it to fake either answer.
GPU_CHECK ?= nvidia-smi -L 2>/dev/null | grep -q '^GPU '

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
# statistics). ref/ is the CPU reference of the numerics: tests and tools link it,
# the library never.
LIB_OBJ  := $(patsubst %.c,$(B)/%.o,$(wildcard base/*.c spec/*.c kernels/*.c shim/*.c))
KERN_CU  := $(wildcard kernels/*.cu)
FATBIN_OBJ := $(patsubst kernels/%.cu,$(B)/kernels/%.fatbin.o,$(KERN_CU))
LIB_OBJ  += $(FATBIN_OBJ)
REF_OBJ  := $(patsubst %.c,$(B)/%.o,$(wildcard ref/*.c))

CPU_TESTS := $(patsubst tests/cpu/%.c,$(B)/tests/cpu/%,$(wildcard tests/cpu/test_*.c))
# C++20 tests that run a kernel file's CUDA C++ on the CPU (tests/cpu/cuda_emu.h)
EMU_TESTS := $(patsubst tests/cpu/%.cc,$(B)/tests/cpu/%,$(wildcard tests/cpu/test_*.cc))
GPU_TESTS := $(patsubst tests/gpu/%.c,$(B)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))
PY_CPU_TESTS := $(wildcard tests/cpu/test_*.py)
SH_CPU_TESTS := $(wildcard tests/cpu/test_*.sh)

.PHONY: all test gputest gputest-run bench bench-build lab clean format format-check
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

# Everything the library holds, as an archive the tests link against (they pull only what they use),
# but the shim's exported dlsym and dlvsym (shim/dl.c): a program that calls dlsym would take them
# from the archive instead of the loader's.
$(B)/libmt.a: $(filter-out $(B)/shim/dl.o,$(LIB_OBJ))
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

# An emulator test includes the kernel file it runs; the kernels' headers may leave helpers unused.
$(EMU_TESTS): $(B)/tests/cpu/%: tests/cpu/%.cc tests/cpu/cuda_emu.h tests/harness.h \
              $(wildcard kernels/*.cu kernels/*.h kernels/*.cuh)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-unused-function \
	    -D_GNU_SOURCE -I. -I$(CUDA_HOME)/include $(SANFLAGS) -pthread -o $@ $<

# Rules of test fixtures and tools that need more than one object (fake cuBLAS libraries, ...):
# each area keeps its own fragment (tests/cpu/<area>.mk, tests/gpu/<area>.mk, bench/, demo/, lab/),
# adding what `make test` needs to TEST_FIXTURES.
-include $(wildcard tests/cpu/*.mk tests/gpu/*.mk bench/*.mk demo/*.mk lab/*.mk)

# The venv's stamp is a copy of the requirements it was made from.
$(VENV)/requirements.txt: tests/requirements.txt
	@echo "making $(VENV) for the Python tests (tests/requirements.txt)"
	@python3 -m venv $(VENV) || { rm -rf $(VENV); echo "make test: python3 -m venv failed:" \
	    "install Python's venv module (Debian/Ubuntu: apt-get install python3-venv)," \
	    "or pass PYTHON=/path/to/python3 that has tests/requirements.txt"; exit 1; }
	@$(VENV)/bin/python3 -m pip install --quiet --disable-pip-version-check -r $< || { \
	    rm -rf $(VENV); echo "make test: pip could not install tests/requirements.txt into" \
	    "$(VENV) (no network? a proxy needs PIP_INDEX_URL or pip.conf): fix that, or pass" \
	    "PYTHON=/path/to/python3 that has those packages"; exit 1; }
	@cp $< $@

# The lab probes are CUDA alone, the same in both builds: only the plain one compiles them.
TEST_BUILD := all $(CPU_TESTS) $(EMU_TESTS) $(TEST_FIXTURES) bench-build $(FUZZ_CHECKS) \
              $(if $(filter 1,$(SAN)),,lab)

# MT_TEST_TIMEOUT: seconds each test program may run (tests/run; default 600).
test: format-check $(TEST_BUILD) $(TEST_VENV)
	@MT_BUILD=$(B) MT_SAN=$(SAN) PYTHON=$(TEST_PYTHON) tests/run $(CPU_TESTS) $(EMU_TESTS) \
	    $(foreach t,$(PY_CPU_TESTS),'$(TEST_PYTHON) $(t)') $(foreach t,$(SH_CPU_TESTS),'bash $(t)')

# GPUTEST_PY picks the Python GPU tests (default: all), e.g. GPUTEST_PY=tests/gpu/test_routed.py.
# Without a GPU nothing is built: the GPU tests would only skip.
GPUTEST_PY ?= $(wildcard tests/gpu/test_*.py)
gputest:
	@$(GPU_CHECK) || { echo "make gputest: no GPU found (nvidia-smi lists none): the GPU tests" \
	    "need the device machine (H200, sm_90)"; exit 1; }
	@$(MAKE) --no-print-directory gputest-run

gputest-run: all $(GPU_TESTS) $(TEST_FIXTURES)
	@MT_BUILD=$(B) PYTHON=$(PYTHON) tests/run $(GPU_TESTS) \
	    $(foreach t,$(GPUTEST_PY),'$(PYTHON) $(t)')

# C, C++ and CUDA sources follow .clang-format (one style, 100 columns, for every folder);
# `make test` runs format-check. Outside a git checkout, every such file but the build folders'.
FORMAT_SRC = $(shell git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || \
    find . -path ./build -prune -o -path ./build-san -prune -o \
        \( -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
CLANG_FORMAT ?= clang-format
format:
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

format-check:
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "format-check: $(CLANG_FORMAT) not found:" \
	    "install it (Debian/Ubuntu: apt-get install clang-format) or pass" \
	    "CLANG_FORMAT=/path"; exit 1; }
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC) && \
	    echo "format-check: $(words $(FORMAT_SRC)) files follow .clang-format"

clean:
	rm -rf build build-san

-include $(shell find $(B) -path $(VENV) -prune -o -name '*.d' -print 2>/dev/null)
