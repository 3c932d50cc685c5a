# demo/run.mk — `make run`: the demo learner and sampler (HF Qwen3-MoE with Qwen3-30B-A3B's
# expert geometry) under the shim for bf16, nvfp4-tensor and nvfp4-row and once without it, then
# one table of throughput, routed calls and the learner-sampler log-prob gap. The driver is
# demo/run_demo.py; pass its options through RUN_ARGS (make run RUN_ARGS="--layers 4").
# Everything lands in build/run/. On a machine without a GPU it says so and succeeds.
.PHONY: run
run: all
	@if [ "$(SAN)" = 1 ]; then \
	    echo "make run: use the normal build (an ASan shim in Python needs libasan preloaded)"; \
	    exit 2; fi
	@$(PYTHON) demo/run_demo.py --lib $(abspath $(B)/libminite.so) --out $(B)/run $(RUN_ARGS)
