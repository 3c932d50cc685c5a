# bench/bench.mk — `make bench` (device machine): the engine's kernels against cuBLAS BF16.
# bench_kernels: one GEMM a call (mt_gemm) and the quantization kernels, into $(B)/bench.json;
# bench_moe: one MoE layer's expert GEMMs, grouped (mt_gemm_grouped against
# cublasGemmGroupedBatchedEx), into $(B)/bench_moe.json. `make bench-build` (and so `make test`)
# builds them without running them: no GPU needed. The benchmarks link the CUDA runtime and cuBLAS
# for their own setup and baselines; the engine they measure uses neither.
BENCH_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

$(B)/bench/bench_kernels: $(B)/bench/bench_kernels.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

$(B)/bench/bench_moe: $(B)/bench/bench_moe.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

bench: $(B)/bench/bench_kernels $(B)/bench/bench_moe
	$(B)/bench/bench_kernels $(B)/bench.json
	$(B)/bench/bench_moe $(B)/bench_moe.json

bench-build: $(B)/bench/bench_kernels $(B)/bench/bench_moe
