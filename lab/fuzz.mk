# lab/fuzz.mk — libFuzzer targets (clang; AddressSanitizer and UndefinedBehaviorSanitizer on):
#
#   make fuzz                      each target for FUZZ_SECONDS (default 60), corpora in build/fuzz/
#   make fuzz FUZZ_TARGETS=spec FUZZ_RUNS=10000000    one target for a number of executions
#
#   spec  the spec parser (spec/parse.c, spec/spec.c): lab/fuzz_spec.c, seeds in lab/fuzz-seeds
#   env   the environment's parsing (base/params.c, base/proc.c path templates, MINITE_ROUTE lists)
#         and the JSON strings of the statistics (base/json.c): lab/fuzz_env.c
#   lt    the reading of cuBLASLt descriptors into a call record and the routing decision on it
#         (shim/norm.c, shim/router.c), attribute answers chosen by the input: lab/fuzz_lt.c
#
# Not part of `make test`: a lab target, run by hand on a machine with cores to spare.

FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?=
FUZZ_TARGETS ?= spec env lt
FUZZ_FLAGS   := -std=c11 -g -O1 -D_GNU_SOURCE -I. -I$(CUDA_HOME)/include \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all

FUZZ_SRC_spec := spec/parse.c spec/spec.c
FUZZ_SRC_env  := base/params.c base/proc.c base/log.c base/files.c base/json.c spec/parse.c \
                 spec/spec.c
FUZZ_SRC_lt   := shim/norm.c shim/router.c shim/real.c base/log.c base/files.c base/proc.c \
                 spec/parse.c spec/spec.c

$(B)/fuzz/fuzz_%: lab/fuzz_%.c $(wildcard base/*.c base/*.h spec/*.c spec/*.h shim/norm.c \
                                          shim/router.c shim/real.c shim/*.h)
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_FLAGS) $< $(FUZZ_SRC_$*) -o $@ -ldl -lpthread

FUZZ_LIMIT = $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS),-max_total_time=$(FUZZ_SECONDS))

# The harnesses compiled (not linked: libFuzzer brings main) by `make test` with the library's
# compiler and flags, so that an API change cannot leave them broken until someone fuzzes.
FUZZ_CHECKS := $(patsubst lab/%.c,$(B)/fuzz/%.o,$(wildcard lab/fuzz_*.c))

$(B)/fuzz/%.o: lab/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

.PHONY: fuzz
fuzz: $(foreach t,$(FUZZ_TARGETS),$(B)/fuzz/fuzz_$(t))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(B)/fuzz/corpus-$$t; \
	  seeds=; [ -d lab/fuzz-seeds/$$t ] && seeds=lab/fuzz-seeds/$$t; \
	  echo "fuzz_$$t:"; \
	  $(B)/fuzz/fuzz_$$t $(FUZZ_LIMIT) -max_len=4096 -print_final_stats=1 \
	    $(B)/fuzz/corpus-$$t $$seeds || exit 1; \
	done
