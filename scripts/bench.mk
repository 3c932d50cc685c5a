# scripts/bench.mk — `make bench` (device machine): the engine's GEMM and quantization kernels
# against cuBLAS BF16; prints a table and writes $(B)/bench.json. The benchmark links the CUDA
# runtime and cuBLAS for its own setup and baseline; the engine it measures uses neither.
BENCH_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

$(B)/scripts/bench_kernels: $(B)/scripts/bench_kernels.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

bench: $(B)/scripts/bench_kernels
	$(B)/scripts/bench_kernels $(B)/bench.json
