"""test_demo_learner.py — the HF learner (demo/demo_learner.py: Qwen3-MoE with Qwen3-30B-A3B's
expert geometry, AdamW) under the shim with MINITE_SPEC=nvfp4-row and MINITE_WEIGHT_CACHE=
requantize, on HF's default grouped_mm experts and on eager ones: the expert GEMMs are routed (the
shim's summary record counts them) and the backward ones are not, the loss and the gradient norms
are finite, and the loss of step 0 (same weights, same batch) is within 2% of the BF16 loss
without the shim.
Skipped without torch, transformers or a GPU.
"""
import math
import sys

import demo_common as dc
import harness

TRAIN = ["--train", "--steps", 2, "--repeats", 1, "--warmup", 0, "--batch", 4, "--seq", 256,
         "--layers", 2]
REQUANTIZE = {"MINITE_WEIGHT_CACHE": "requantize"}
LOSS_RTOL = 0.02


def nvfp4_row_loss_within_2_percent_of_bf16(experts):
    dc.require_gpu()
    train = TRAIN + ["--experts", experts]
    rc, base, _, _ = dc.run_demo("demo_learner.py", train)
    harness.check(rc == 0 and base is not None, f"learner without the shim: exit {rc}")
    rc, shim, stats, err = dc.run_demo("demo_learner.py", train, spec="nvfp4-row",
                                       tag=f"learner-{experts}", extra=REQUANTIZE)
    harness.check(rc == 0 and shim is not None, f"learner under nvfp4-row: exit {rc}")
    if base is None or shim is None:
        return
    harness.check(shim["spec"] == "nvfp4-row" and shim["shim"], f"shim loaded: {shim['shim']}")
    for name, s in (("bf16", base), ("nvfp4-row", shim)):
        harness.check(s["finite"] and all(math.isfinite(x) for x in s["losses"] + s["grad_norms"]),
                      f"{name}: losses {s['losses']}, gradient norms {s['grad_norms']}")
        harness.check(all(x > 0 for x in s["grad_norms"]), f"{name}: zero gradient")
    rel = abs(shim["first_loss"] - base["first_loss"]) / base["first_loss"]
    print(f"    {experts}: step-0 loss: bf16 {base['first_loss']:.6f}, "
          f"nvfp4-row {shim['first_loss']:.6f} "
          f"(relative difference {rel:.3g}); gradient norm {base['grad_norms'][0]:.4g} vs "
          f"{shim['grad_norms'][0]:.4g}; train tokens/s {base['train_tokens_per_s']:.0f} vs "
          f"{shim['train_tokens_per_s']:.0f}")
    harness.check(rel <= LOSS_RTOL, f"loss differs by {rel:.3%} > {LOSS_RTOL:.0%}")
    harness.check(stats is not None, "the shim wrote no summary record to MINITE_STATS")
    if stats is not None:
        print(f"    shim: {stats.get('gemm_calls')} GEMM calls, {stats.get('routed')} routed, "
              f"fallbacks {stats.get('fallbacks')}")
        harness.check(stats.get("routed", 0) > 0, f"no GEMM routed: {stats.get('fallbacks')}")
        backward = sum(v for k, v in (stats.get("fallbacks") or {}).items()
                       if k.startswith("backward"))
        harness.check(backward > 0, f"backward calls not counted as such: {stats.get('fallbacks')}")


def test_grouped_mm_nvfp4_row_loss_within_2_percent_of_bf16():
    nvfp4_row_loss_within_2_percent_of_bf16("grouped_mm")


def test_eager_nvfp4_row_loss_within_2_percent_of_bf16():
    nvfp4_row_loss_within_2_percent_of_bf16("eager")


harness.run(test_grouped_mm_nvfp4_row_loss_within_2_percent_of_bf16)
harness.run(test_eager_nvfp4_row_loss_within_2_percent_of_bf16)
sys.exit(harness.done())
