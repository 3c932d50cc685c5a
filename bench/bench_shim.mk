# bench/bench_shim.mk — `make bench-shim`: the shim's added cost per call on the CPU, against the
# fake cuBLAS of tests/cpu/shim.mk (a benchmark, not a test; see bench/bench_shim.c for the method).
# `make bench-build` builds it without running it.

$(B)/bench/bench_shim: bench/bench_shim.c $(FAKE_LIBS) $(B)/tests/cpu/fake/driver/libcuda.so.1 \
                      shim/cuda_api.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -L$(FAKE) -Wl,--disable-new-dtags \
	    -Wl,-rpath,'$$ORIGIN/../tests/cpu/fake' -l:libcublas.so.13 -l:libcublasLt.so.13

.PHONY: bench-shim
bench-shim: $(B)/libminite.so $(B)/bench/bench_shim
	$(B)/bench/bench_shim $(abspath $(B)/libminite.so)

bench-build: $(B)/bench/bench_shim
