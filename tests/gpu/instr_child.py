"""instr_child.py CASE OUT — one workload of tests/gpu/test_instruments.py, run in a process of its
own (the parent sets LD_PRELOAD and the MINITE_* variables). Writes OUT.npz. Not a test by itself.

Cases (weight 256 x 512, BF16, Gaussian):
  probe   F.linear for M in 7, 64, 300, three times each (every call with M > 1: probed)
  batch   the same 64 rows (seed 11) through F.linear in the batches MT_BATCHES ("64" or "7,1"),
          from the last row backwards when MT_REVERSE=1; the outputs gathered in row order; x, w
          and y saved
  shadow  one F.linear of 64 rows; x, w and y saved for the parent's reference
  bias    one F.linear of 64 rows with a bias (cublasLtMatmul, BIAS epilogue); x, w, b, y saved
"""
import os

import torch
import torch.nn.functional as F

from shim_child import child_main, f32, rand

N, K = 256, 512


def case_probe():
    w = rand(N, K, seed=1)
    for rep in range(3):
        for m in (7, 64, 300):
            F.linear(rand(m, K, seed=100 * rep + m), w)
    return {}


def case_batch():
    w, x = rand(N, K, seed=10), rand(64, K, seed=11)
    sizes = [int(v) for v in os.environ.get("MT_BATCHES", "64").split(",")]
    reverse = os.environ.get("MT_REVERSE") == "1"
    y = torch.empty(64, N, device="cuda", dtype=torch.bfloat16)
    done, i = 0, 0
    while done < 64:
        n = min(sizes[i % len(sizes)], 64 - done)
        lo = 64 - done - n if reverse else done
        y[lo:lo + n] = F.linear(x[lo:lo + n].contiguous(), w)
        done, i = done + n, i + 1
    return {"x": f32(x), "w": f32(w), "y": f32(y)}


def case_shadow():
    w, x = rand(N, K, seed=20), rand(64, K, seed=21)
    return {"x": f32(x), "w": f32(w), "y": f32(F.linear(x, w))}


def case_bias():
    w, x, b = rand(N, K, seed=30), rand(64, K, seed=31), rand(N, seed=32)
    return {"x": f32(x), "w": f32(w), "b": f32(b), "y": f32(F.linear(x, w, b))}


CASES = {"probe": case_probe, "batch": case_batch, "shadow": case_shadow, "bias": case_bias}

if __name__ == "__main__":
    child_main(CASES)
