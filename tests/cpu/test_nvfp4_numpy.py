"""test_nvfp4_numpy.py — the CPU reference (ref/nvfp4.c) against an independent implementation:
numpy float32 arithmetic in Transformer Engine's order of operations, with ml_dtypes'
float8_e4m3fn and float4_e2m1fn casts doing the rounding. Codes, block scales and outer scales must
agree bit for bit; the reference GEMM must equal numpy's float64 matmul of the dequantized operands
bit for bit (for K <= 1024 every partial sum is exact in float64, so summation order cannot matter).

The C side is reached through $MT_BUILD/tests/cpu/nvfp4_tool (built by `make test`).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import harness  # noqa: E402

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # CI installs them; a silent skip would hide the whole cross-check
    MISSING = str(e)
    np = ml_dtypes = None
else:
    MISSING = None

BUILD = os.environ.get("MT_BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "cpu", "nvfp4_tool")

# ---- the C reference, through the helper program ------------------------------------------


def tool(args, data=b""):
    res = subprocess.run([TOOL] + [str(a) for a in args], input=data, capture_output=True)
    if res.returncode != 0:
        raise RuntimeError(f"{TOOL} {' '.join(map(str, args))}: exit {res.returncode}: "
                           f"{res.stderr.decode(errors='replace')}")
    return res.stdout


def c_scalar(cmd, x, dtype):
    x = np.ascontiguousarray(x, dtype=np.float32)
    return np.frombuffer(tool([cmd, x.size], x.tobytes()), dtype=dtype)


def c_quantize(x, outer, block):
    rows, cols = x.shape
    out = tool(["quantize", rows, cols, outer, block],
               np.ascontiguousarray(x, dtype=np.float32).tobytes())
    n_outer = rows if outer == "row" else 1
    s = np.frombuffer(out[:4 * n_outer], dtype=np.float32)
    scales = np.frombuffer(out[4 * n_outer:4 * n_outer + rows * cols // 16], dtype=np.uint8)
    codes = np.frombuffer(out[4 * n_outer + rows * cols // 16:], dtype=np.uint8)
    return s, scales.reshape(rows, cols // 16), codes.reshape(rows, cols // 2)


def c_gemm(xa, xw, a_outer, w_outer, w_block, alpha, beta, c=None, bias=None):
    m, k = xa.shape
    n = xw.shape[0]
    data = xa.astype(np.float32).tobytes() + xw.astype(np.float32).tobytes()
    if c is not None:
        data += c.astype(np.float32).tobytes()
    if bias is not None:
        data += bias.astype(np.float32).tobytes()
    out = tool(["gemm", m, n, k, a_outer, w_outer, w_block, float(np.float32(alpha)).hex(),
                float(np.float32(beta)).hex(), int(c is not None), int(bias is not None)], data)
    return np.frombuffer(out, dtype=np.float64).reshape(m, n)


# ---- the independent implementation ---------------------------------------------------------

ONE_SIXTH = None if np is None else np.float32(float.fromhex("0x1.555556p-3"))
FLT_MAX = None if np is None else np.finfo(np.float32).max


def e4m3_rne_satfinite(v):
    """float32 array -> E4M3 bytes. ml_dtypes rounds to nearest even but overflows to NaN past
    464, so clip to +-448 first (satfinite); NaN is 0x7f whatever its sign."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        out = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy()
    out[np.isnan(v)] = 0x7F
    return out


def e2m1_rne_satfinite(v):
    """float32 array -> E2M1 codes. ml_dtypes saturates on its own but turns NaN into -0 (0x8);
    the hardware conversion's NaN is +6 (0x7)."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        out = np.clip(v, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).copy()
    out[np.isnan(v)] = 0x7
    return out


def e4m3_value(b):
    return np.asarray(b, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def e2m1_value(codes):
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def outer_scale(amax):
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = np.float32(2688) / amax
    s = np.minimum(s, FLT_MAX).astype(np.float32)
    s[amax == 0] = 1
    s[~np.isfinite(amax)] = np.nan
    return s


def quantize(x, outer, block):
    """-> (S, scales [rows, cols/16], unpacked codes [rows, cols]); numpy float32 throughout."""
    x = np.asarray(x, dtype=np.float32)
    rows, cols = x.shape
    ax = np.abs(x)
    amax = ax.max(axis=1) if outer == "row" else ax.max(keepdims=True).reshape(1)
    s = outer_scale(amax)  # numpy's max propagates NaN, Inf gives Inf: both -> NaN
    s_rows = s if outer == "row" else np.repeat(s, rows)
    amax_b = ax.reshape(rows, cols // 16, 16).max(axis=2)
    if block == "16x16":
        tiles = ax.reshape(rows // 16, 16, cols // 16, 16).max(axis=(1, 3))
        amax_b = np.repeat(tiles, 16, axis=0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s_over_6 = s_rows * ONE_SIXTH                        # rounded to FP32 first
        scales = e4m3_rne_satfinite(amax_b * s_over_6[:, None])
        inv = np.float32(1) / s_rows
        decode = e4m3_value(scales) * inv[:, None]
        coef = np.where(scales == 0, np.float32(0), np.float32(1) / decode).astype(np.float32)
        v = x * np.repeat(coef, 16, axis=1)
    codes = e2m1_rne_satfinite(v)
    bad = np.isnan(s_rows)  # a domain with NaN or Inf: all codes and scales 0
    scales[bad] = 0
    codes[bad] = 0
    return s, scales, codes


def pack(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def dequant(scales, codes):
    return e2m1_value(codes) * np.repeat(e4m3_value(scales), 16, axis=1)


def gemm(xa, xw, a_outer, w_outer, w_block, alpha, beta, c=None, bias=None):
    sa, scales_a, codes_a = quantize(xa, a_outer, "1x16")
    sw, scales_w, codes_w = quantize(xw, w_outer, w_block)
    xa_hat = dequant(scales_a, codes_a).astype(np.float64)
    xw_hat = dequant(scales_w, codes_w).astype(np.float64)
    acc = xa_hat @ xw_hat.T
    m, n = acc.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_a = np.broadcast_to(np.float32(1) / sa, (m,))
        inv_w = np.broadcast_to(np.float32(1) / sw, (n,))
        s = (inv_a[:, None] * inv_w[None, :]).astype(np.float32)
        y = acc * s.astype(np.float64) * np.float64(np.float32(alpha))
    if beta != 0 and c is not None:
        y = y + np.float64(np.float32(beta)) * c.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
    return y


# ---- data -----------------------------------------------------------------------------------

RNG = None if np is None else np.random.default_rng(20261129)


def bf16(v):
    return np.asarray(v, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def dist(name, shape):
    if name == "normal":
        return bf16(RNG.standard_normal(shape))
    if name == "heavy":  # Student t with 1.5 degrees of freedom: outliers of 100x and more
        return bf16(RNG.standard_t(1.5, shape))
    if name == "tiny":  # around the bottom of FP32 and BF16, subnormals included
        return bf16(RNG.standard_normal(shape) * np.float32(2.0 ** -128))
    if name == "mixed":  # every element its own magnitude, 2^-140 .. 2^120
        e = RNG.integers(-140, 120, shape)
        return bf16(RNG.standard_normal(shape) * np.exp2(e.astype(np.float64)))
    if name == "small":
        return bf16(RNG.standard_normal(shape) * np.float32(1e-20))
    raise ValueError(name)


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a, b):
    return a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b))


def compare_quantize(x, outer, block, what):
    cs, cscales, ccodes = c_quantize(x, outer, block)
    ps, pscales, pcodes = quantize(x, outer, block)
    harness.check(same(bits(cs), bits(ps)), f"{what} {outer} {block}: S differs "
                  f"{cs[:4]} vs {ps[:4]}")
    diff = np.argwhere(cscales != pscales)
    harness.check(diff.size == 0, f"{what} {outer} {block}: {len(diff)} scales differ, first at "
                  f"{diff[:1].tolist()}")
    diff = np.argwhere(ccodes != pack(pcodes))
    harness.check(diff.size == 0, f"{what} {outer} {block}: {len(diff)} code bytes differ, first "
                  f"at {diff[:1].tolist()}")


# ---- tests ----------------------------------------------------------------------------------


def ml_dtypes_boundaries():
    """What ml_dtypes does on its own at the edges, which the implementation above relies on."""
    f8 = np.array([448, 464, 464.5, 2.0 ** -10, 3 * 2.0 ** -10, 15 * 2.0 ** -10], np.float32)
    got = f8.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    # 464 is the tie 448 | 480: even -> 448; past it ml_dtypes gives NaN (hence the clip);
    # subnormal ties go to even quanta: 0, 2, 8 (= 2^-6)
    harness.check(got.tolist() == [0x7E, 0x7E, 0x7F, 0x00, 0x02, 0x08], f"e4m3 {got}")
    f4 = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7, -0.0, np.nan], np.float32)
    got = f4.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    # ties to even; saturates by itself; -0 -> 0x8; NaN -> 0x8 (not the hardware's +6)
    harness.check(got.tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 8], f"e2m1 {got}")


def scalar_e2m1():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6], np.float32)
    probes = [ties, np.nextafter(ties, 0), np.nextafter(ties, 100)]
    probes += [-p for p in probes]
    sweep = bits(np.arange(0, 2 ** 32, 3001, dtype=np.uint64).astype(np.uint32).view(np.float32))
    x = np.concatenate(probes + [sweep.view(np.float32),
                                 np.array([0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)])
    c = c_scalar("e2m1", x, np.uint8)
    p = e2m1_rne_satfinite(x)
    bad = np.flatnonzero(c != p)
    harness.check(bad.size == 0, f"{bad.size} differ, e.g. {x[bad[:4]]}: {c[bad[:4]]} vs "
                  f"{p[bad[:4]]}")


def scalar_e4m3():
    values = e4m3_value(np.arange(127, dtype=np.uint8)).astype(np.float64)
    mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)  # exact: few significant bits
    probes = [mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9), values.astype(np.float32)]
    probes.append(np.array([448, 464, 480, 500, 1e30, np.inf, 2.0 ** -9, 2.0 ** -10, 2.0 ** -11,
                            1e-40, np.nan], np.float32))
    probes += [-p for p in probes]
    sweep = np.arange(0, 2 ** 32, 3001, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate(probes + [sweep])
    c = c_scalar("e4m3", x, np.uint8)
    p = e4m3_rne_satfinite(x)
    bad = np.flatnonzero(c != p)
    harness.check(bad.size == 0, f"{bad.size} differ, e.g. {x[bad[:4]]}: {c[bad[:4]]} vs "
                  f"{p[bad[:4]]}")
    dec = np.frombuffer(tool(["e4m3dec"]), dtype=np.float32)
    want = e4m3_value(np.arange(256, dtype=np.uint16).astype(np.uint8))
    nan = np.isnan(want)
    harness.check(same(np.isnan(dec), nan) and same(bits(dec[~nan]), bits(want[~nan])), "decode")


def scalar_bf16_fp16():
    sweep = np.arange(0, 2 ** 32, 3001, dtype=np.uint64).astype(np.uint32).view(np.float32)
    finite = sweep[~np.isnan(sweep)]
    c = c_scalar("bf16", finite, np.uint16)
    p = finite.astype(ml_dtypes.bfloat16).view(np.uint16)
    harness.check(same(c, p), f"bf16: {np.count_nonzero(c != p)} differ")
    c = c_scalar("fp16", finite, np.uint16)
    with np.errstate(over="ignore"):
        p = finite.astype(np.float16).view(np.uint16)
    harness.check(same(c, p), f"fp16: {np.count_nonzero(c != p)} differ")
    nans = sweep[np.isnan(sweep)]
    harness.check(np.all(np.isnan(c_scalar("bf16", nans, np.uint16).view(ml_dtypes.bfloat16)
                                  .astype(np.float32))), "bf16 NaN lost")
    harness.check(np.all(np.isnan(c_scalar("fp16", nans, np.uint16).view(np.float16))),
                  "fp16 NaN lost")


def outer_scales():
    amax = np.concatenate([np.array([0, 1, 2688, 6, 7.8e-36, 7.9e-36, 1e-38, 1e-45, 3e38,
                                     np.inf, np.nan], np.float32),
                           np.abs(dist("mixed", 4000))])
    c = c_scalar("outer", amax, np.float32)
    p = outer_scale(amax)
    nan = np.isnan(p)
    harness.check(same(np.isnan(c), nan) and same(bits(c[~nan]), bits(p[~nan])),
                  f"outer scale differs at {np.flatnonzero(bits(c) != bits(p))[:4]}")


def quantize_e2m1_ties():
    """Blocks whose x * c_b lands exactly on every E2M1 tie and its FP32 and BF16 neighbours
    (S = 2^k, s_b = 256: see quantize_e2m1_ties_exactly in test_nvfp4.c)."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], np.float32)
    near = np.concatenate([ties, np.nextafter(ties, 0), np.nextafter(ties, 10),
                           bf16(ties * np.float32(1 - 2.0 ** -8)),
                           bf16(ties * np.float32(1 + 2.0 ** -7))])
    for k in (0, 5, -33, 40):
        rows = []
        for start in range(0, len(near), 15):
            v = near[start:start + 15]
            v = np.concatenate([v, np.zeros(15 - len(v), np.float32)])
            sign = np.where(np.arange(15) % 2 == 1, -1, 1).astype(np.float32)
            block = np.concatenate([[1536], sign * v * np.float32(256)]).astype(np.float32)
            head = np.zeros(16, np.float32)
            head[0] = 2688
            rows.append(np.ldexp(np.concatenate([head, block]), -k).astype(np.float32))
        x = np.stack(rows)
        s, scales, codes = quantize(x, "row", "1x16")
        harness.check(np.all(s == np.float32(2.0 ** k)) and np.all(scales[:, 1] == 0x78),
                      f"k {k}: construction broken (S {s[0]}, s_b {scales[0, 1]:#x})")
        compare_quantize(x, "row", "1x16", f"e2m1 ties k={k}")
        compare_quantize(x, "tensor", "1x16", f"e2m1 ties k={k}")


def quantize_e4m3_ties():
    """Blocks whose amax_b * fl(S/6) lands on each E4M3 midpoint (subnormal ties and the 464
    saturation tie included) or 1 ulp either side: found by searching amax_b near the target."""
    values = e4m3_value(np.arange(127, dtype=np.uint8)).astype(np.float64)
    mids = np.concatenate([(values[:-1] + values[1:]) / 2, [464, 500]]).astype(np.float32)
    k = 3
    s = np.float32(2.0 ** k)  # row amax 2688 * 2^-k
    s6 = s * ONE_SIXTH
    amaxes, hits = [], 0
    for t in mids:
        a = np.float32(np.float64(t) / np.float64(s6))
        for _ in range(3):  # start 3 ulps below the quotient, walk 7 ulps up
            a = np.nextafter(a, np.float32(0))
        for _ in range(7):
            p = a * s6
            hits += int(p == t)
            if abs(float(p) - float(t)) <= 4 * float(np.spacing(t)):
                amaxes.append(a)
            a = np.nextafter(a, np.float32(1e9))
    amaxes = np.array(sorted(set(amaxes)), np.float32)
    amaxes = amaxes[amaxes <= np.float32(2688 * 2.0 ** -k)]
    harness.check(hits >= 20, f"only {hits} exact E4M3 ties reached")
    n = len(amaxes)
    x = np.zeros((n, 32), np.float32)
    x[:, 0] = np.float32(2688 * 2.0 ** -k)
    x[:, 16] = amaxes
    x[:, 17:] = bf16(RNG.uniform(-1, 1, (n, 15))) * amaxes[:, None]
    compare_quantize(x, "row", "1x16", "e4m3 ties")


def quantize_random():
    for name in ("normal", "heavy", "tiny", "mixed", "small"):
        for outer, block in (("row", "1x16"), ("tensor", "1x16"), ("tensor", "16x16")):
            x = dist(name, (64, 256))
            compare_quantize(x, outer, block, name)


def quantize_special_rows():
    x = dist("normal", (48, 64))
    x[0] = 0                      # all zero
    x[1, :] = 1
    x[1, 3] = bf16(3e38)          # one huge value
    x[2, 5] = np.nan
    x[3, 63] = -np.inf
    x[4, :] = -0.0                # negative zeros
    x[5, :] = dist("tiny", 64)    # the coefficient overflows to Inf here
    x[6, 10:20] = 0
    x[7] = dist("mixed", 64)
    compare_quantize(x, "row", "1x16", "special rows")
    finite = x[:32].copy()
    finite[2:4] = dist("normal", (2, 64))
    compare_quantize(finite, "tensor", "16x16", "special rows (finite)")
    compare_quantize(finite, "tensor", "1x16", "special rows (finite)")
    compare_quantize(x[:32], "tensor", "16x16", "special rows (NaN tensor)")
    compare_quantize(x, "tensor", "1x16", "special rows (NaN tensor)")


def gemm_random():
    cases = [("row", "tensor", "1x16", 16, 32, 256), ("row", "row", "1x16", 9, 24, 128),
             ("tensor", "tensor", "16x16", 7, 48, 1024), ("row", "tensor", "16x16", 33, 16, 512)]
    for a_outer, w_outer, w_block, m, n, k in cases:
        for name in ("normal", "heavy", "mixed"):
            xa = dist(name, (m, k))
            xw = dist("normal", (n, k)) * np.float32(0.02)
            c = dist("normal", (m, n))
            bias = dist("normal", (n,))
            epilogues = ((1.0, 0.0, None, None), (0.5, 2.0, c, bias), (1.0, 0.0, c, None))
            for alpha, beta, cc, bb in epilogues:
                got = c_gemm(xa, xw, a_outer, w_outer, w_block, alpha, beta, cc, bb)
                want = gemm(xa, xw, a_outer, w_outer, w_block, alpha, beta, cc, bb)
                harness.check(same(got.view(np.uint64), want.view(np.uint64)),
                              f"{a_outer}/{w_outer}/{w_block} {name} alpha {alpha} beta {beta}: "
                              f"max diff {np.nanmax(np.abs(got - want))}")


def gemm_nan_rows_and_beta_zero():
    xa = dist("normal", (6, 64))
    xa[2, 9] = np.nan
    xa[4, 0] = np.inf
    xw = dist("normal", (8, 64))
    c = np.full((6, 8), np.nan, np.float32)
    got = c_gemm(xa, xw, "row", "tensor", "1x16", 1.0, 0.0, c, None)
    harness.check(same(np.isnan(got).any(axis=1), np.array([0, 0, 1, 0, 1, 0], bool)) and
                  same(np.isnan(got).all(axis=1), np.array([0, 0, 1, 0, 1, 0], bool)),
                  f"NaN rows {np.isnan(got).any(axis=1)}")
    want = gemm(xa, xw, "row", "tensor", "1x16", 1.0, 0.0, c, None)
    harness.check(same(np.isnan(got), np.isnan(want)) and
                  same(got[~np.isnan(got)], want[~np.isnan(want)]), "values")


def prerequisites():
    harness.check(MISSING is None, f"numpy or ml_dtypes is missing ({MISSING}): run "
                  "`pip install -r tests/requirements.txt`")
    harness.check(os.access(TOOL, os.X_OK), f"{TOOL} is missing: run `make test` (it builds it)")


def main():
    harness.run(prerequisites)
    if MISSING is not None or not os.access(TOOL, os.X_OK):
        return harness.done()
    for fn in (ml_dtypes_boundaries, scalar_e2m1, scalar_e4m3, scalar_bf16_fp16, outer_scales,
               quantize_e2m1_ties, quantize_e4m3_ties, quantize_random, quantize_special_rows,
               gemm_random, gemm_nan_rows_and_beta_zero):
        harness.run(fn)
    return harness.done()


if __name__ == "__main__":
    sys.exit(main())
