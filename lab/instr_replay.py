#!/usr/bin/env python3
"""instr_replay.py — one MoE block captured in a CUDA graph and replayed, nothing else: the
launches for Nsight Compute to pick the instruments' kernels from (lab/ncu_pick.sh), without the
PyTorch profiler that lab/instr_cost.py uses (both would take CUPTI). Layer 0's sparse block of the
demo model (demo/demo_model.py) on its grouped_mm experts at T random hidden states, warmed up on a
side stream, captured, then replayed; the shim and its settings come from the environment.

    python3 lab/instr_replay.py [--tokens 128] [--replays 5]

On the device machine: `tests/gpu/session.sh instrncu` (the shim appended to the LD_PRELOAD
that ncu sets for its own injection; INSTR_T tokens, INSTR_NCU_KERNEL the kernel).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demo"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--replays", type=int, default=5)
    args = p.parse_args()
    import torch
    import demo_model
    import demo_profile
    model = demo_model.build(layers=1)
    model.set_experts_implementation("grouped_mm")
    block = model.model.layers[0].mlp
    x = demo_profile.hidden_states(torch, model, args.tokens)
    with torch.no_grad():
        graph = demo_profile.capture(torch, lambda: block(x))
    for _ in range(args.replays):
        graph.replay()
    torch.cuda.synchronize()
    print(f"instr_replay: T = {args.tokens}, {args.replays} replays on "
          f"{torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
