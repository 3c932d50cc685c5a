# demo/run.mk — `make run`: the demo learner and sampler (HF Qwen3-MoE with Qwen3-30B-A3B's
# expert geometry) without the shim and under bf16, nvfp4-tensor and nvfp4-row, on HF's default
# grouped_mm experts and on eager ones, then a table of throughput (median of 3 with its spread),
# routed calls, the learner-sampler log-prob gap and the instruments, and a table of one MoE
# layer's GPU time per token count. The driver is demo/run_demo.py; pass its options through
# RUN_ARGS (make run RUN_ARGS="--quick"). About 4-6 minutes on an H200 after the build; --quick
# about 2. Everything lands in build/run/. On a machine without a GPU it says so and succeeds.
.PHONY: run
run: all
	@if [ "$(SAN)" = 1 ]; then \
	    echo "make run: use the normal build (an ASan shim in Python needs libasan preloaded)"; \
	    exit 2; fi
	@$(PYTHON) demo/run_demo.py --lib $(abspath $(B)/libminite.so) --out $(B)/run $(RUN_ARGS)
