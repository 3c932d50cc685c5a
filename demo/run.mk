# demo/run.mk — `make run`: the demo learner and sampler (HF Qwen3-MoE with Qwen3-30B-A3B's
# geometry, as many layers as fit the GPU) without the shim and under bf16 and nvfp4-row, on HF's
# default grouped_mm experts (RUN_ARGS="--eager-specs none,nvfp4-row" adds rows on its eager ones),
# transformers' continuous-batching server without the shim and under nvfp4-row, then tables of
# throughput (median of 3 with its spread), routed calls, the learner-sampler log-prob gap and the
# instruments, one MoE layer's time per token count, the server and the decode step by component.
# The driver is demo/run_demo.py; pass its options through RUN_ARGS (make run RUN_ARGS="--quick").
# It is held to 10 minutes on an H100 (docs/performance.md, "Targets not met yet"). Everything
# lands in build/run/. On a machine without a GPU it says so and succeeds.
.PHONY: run
run: all
	@if [ "$(SAN)" = 1 ]; then \
	    echo "make run: use the normal build (an ASan shim in Python needs libasan preloaded)"; \
	    exit 2; fi
	@$(PYTHON) demo/run_demo.py --lib $(abspath $(B)/libminite.so) --out $(B)/run $(RUN_ARGS)
