# bench/bench.mk — `make bench` (device machine): the engine's kernels against cuBLAS BF16 and
# PyTorch. bench_kernels: one GEMM a call (mt_gemm) and the quantization kernels, into
# $(B)/bench.json; bench_moe: one MoE layer's expert GEMMs, grouped (mt_gemm_grouped against
# cublasGemmGroupedBatchedEx), into $(B)/bench_moe.json; bench_moe_torch.py: the same layer against
# torch._grouped_mm in one process (PYTHON's torch; the engine through libmt_bench.so), into
# $(B)/bench_moe_torch.json. `make bench-build` (and so `make test`) builds them without running
# them: no GPU needed. The benchmarks link the CUDA runtime and cuBLAS for their own setup and
# baselines; the engine they measure uses neither.
BENCH_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

$(B)/bench/bench_kernels: $(B)/bench/bench_kernels.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

$(B)/bench/bench_moe: $(B)/bench/bench_moe.o $(B)/libmt.a
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(BENCH_LIBS)

# The engine for the Python bench's ctypes: bench/moe_torch.c's mtb_* functions exported, the
# library's own symbols hidden as in libminite.so.
$(B)/bench/libmt_bench.so: $(B)/bench/moe_torch.o $(B)/libmt.a
	$(CC) -shared $(SANFLAGS) -Wl,-z,defs -Wl,--exclude-libs,ALL -o $@ $^ $(LDLIBS)

bench: $(B)/bench/bench_kernels $(B)/bench/bench_moe $(B)/bench/libmt_bench.so
	$(B)/bench/bench_kernels $(B)/bench.json
	$(B)/bench/bench_moe $(B)/bench_moe.json
	$(PYTHON) bench/bench_moe_torch.py --lib $(B)/bench/libmt_bench.so $(B)/bench_moe_torch.json

bench-build: $(B)/bench/bench_kernels $(B)/bench/bench_moe $(B)/bench/libmt_bench.so

# vLLM's Triton MoE kernel (the real source: `make vllm-sources`) against the engine as the launch
# door runs it, into $(B)/bench_moe_vllm.json (device machine; PYTHON's torch and triton).
.PHONY: bench-vllm
bench-vllm: $(B)/bench/libmt_bench.so
	$(PYTHON) bench/bench_moe_vllm.py --lib $(B)/bench/libmt_bench.so $(B)/bench_moe_vllm.json
