"""jax_child.py OUT — an unmodified JAX MoE program, run in a process of its own by
tests/gpu/test_jax_moe.py (which sets LD_PRELOAD, the MINITE_* variables and XLA_FLAGS). Writes
OUT.npz with its results and inputs. Nothing here knows whether libminite.so is preloaded. Not a
test by itself.

Three expert layers of 8 experts, weight 256 x 512 each (out x in, as the routes name it), BF16:
  capacity   an einsum over the expert axis, x [E, C, 512] . W [E, 256, 512] -> [E, C, 256]
             (a batched dot: a strided batch, or an Lt matmul with a batch count)
  ragged     jax.lax.ragged_dot of tokens sorted by expert [T, 512] with W^T [E, 512, 256] and the
             group sizes (XLA rewrites it into dense dots)
  per-expert one dot per expert, x_e [C, 512] . W_e^T
and the same two forms as a Flax user writes them, the kernels stored [in, out] (W_io [E, 512, 256],
the same weights transposed into an array of their own):
  capacity_io    jnp.einsum("eck,ekn->ecn", x, W_io)    (cuBLAS NN, m = out, k = in, batched)
  per_expert_io  x_e @ W_io[e]                           (one NN dot per expert)
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp

E, C, N, K = 8, 32, 256, 512


def main(path):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (E, C, K), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(keys[1], (E, N, K), jnp.float32).astype(jnp.bfloat16)
    sizes = jnp.array([40, 0, 17, 33, 1, 64, 20, 25], jnp.int32)
    tokens = jax.random.normal(keys[2], (int(sizes.sum()), K), jnp.float32).astype(jnp.bfloat16)

    capacity = jax.jit(lambda x, w: jnp.einsum("eck,enk->ecn", x, w))
    ragged = jax.jit(lambda t, w, s: jax.lax.ragged_dot(t, jnp.swapaxes(w, 1, 2), s))
    per_expert = jax.jit(lambda x, w: jnp.stack([x[e] @ w[e].T for e in range(E)]))

    w_io = jnp.asarray(np.ascontiguousarray(np.swapaxes(np.asarray(w), 1, 2)))
    capacity_io = jax.jit(lambda x, w: jnp.einsum("eck,ekn->ecn", x, w))
    per_expert_io = jax.jit(lambda x, w: jnp.stack([x[e] @ w[e] for e in range(E)]))

    out = {"capacity": capacity(x, w), "ragged": ragged(tokens, w, sizes),
           "per_expert": per_expert(x, w), "capacity_io": capacity_io(x, w_io),
           "per_expert_io": per_expert_io(x, w_io)}
    out["x"], out["w"] = x, w  # the inputs, for the parent's reference GEMM
    out = {k: np.asarray(v.astype(jnp.float32)) for k, v in out.items()}
    out["backend"] = np.array([jax.default_backend() == "gpu"])
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
