# bench/bench.mk — `make bench` (device machine): the engine's GEMM and quantization kernels
# against cuBLAS BF16; prints a table and writes $(B)/bench.json. `make bench-build` (and so
# `make test`) builds it without running it: no GPU needed. The benchmark links the CUDA
# runtime and cuBLAS for its own setup and baseline; the engine it measures uses neither.
BENCH_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

$(B)/bench/bench_kernels: $(B)/bench/bench_kernels.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

bench: $(B)/bench/bench_kernels
	$(B)/bench/bench_kernels $(B)/bench.json

bench-build: $(B)/bench/bench_kernels
