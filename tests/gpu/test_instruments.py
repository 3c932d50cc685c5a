"""test_instruments.py — the mismatch instruments of routed calls on the GPU
(shim/instr.c, kernels/instr.cu; docs/design.md, "The mismatch instruments").

    make && make build/tests/cpu/nvfp4_tool && python3 tests/gpu/test_instruments.py     (H200)

Each case runs tests/gpu/instr_child.py (or routed_child.py) under LD_PRELOAD=build/libminite.so
with the child's weight routed (256x512) and reads the statistics file:
- invariance probe: 0 of the probed rows differ under nvfp4-row (a row's bits never depend on its
  batch), with the weight requantized and kept (whose rows alone read the call's dequantized copy),
  some differ under nvfp4-tensor (the per-tensor activation scale does);
- row digests: the same 64 rows through process A (one batch of 64, requantize) and process B
  (batches of 7 and 1, last rows first, kept weights: frozen-sampled under nvfp4-row, frozen under
  nvfp4-tensor) join in tools/minite-compare with every row matched and 100% bitwise equal under
  nvfp4-row (the weight's identity is the same whether summed per call or read from the
  frozen-sampled cache's stored hash); at rate 1/4 both pick the same rows, those whose lead hash
  (of the first 128 elements, kernels/instr.h) is below 2^62, where every call is looked at
  (MINITE_DIGEST_CALLS=all); by default 64 calls of 1 row each are digested at every 4th (16
  calls, 48 passed over), keeping the rows among them that the rate picks;
- shadow error: under nvfp4-row the relative L2 of the routed output against cuBLAS's BF16 GEMM
  is what the CPU reference (ref/nvfp4.c via nvfp4_tool) gives for the same operands, within
  0.01, and in the range NVFP4 W4A4 implies for Gaussian operands: 0.10 .. 0.17 (each operand's
  quantization error is about 0.095 of its RMS with 1x16 E4M3-scaled blocks, so the product's is
  about sqrt(2) x 0.095 = 0.134; the CPU reference gives 0.130 .. 0.139 at M = 7 .. 300); under
  bf16 (routed calls are cuBLAS's, and the shadow reruns cuBLAS) exactly 0;
- the digest records the GPU wrote are the definitions of kernels/instr.h and tools/minite-compare
  (its scheme), recomputed here in Python from the child's operands: every key, every output hash,
  and every sketch (against minite-compare's sketch(), within FP32 summation error), without and
  with a bias;
- a CUDA graph capturing a routed call with every instrument on replays correctly; its digests are
  captured with it and published at each replay (read or counted missed; at one in 2 under
  MINITE_DIGEST_REPLAYS=1/2), joining the eager call's on the same inputs; its probe and shadow
  are skipped with the reason "capture".
Skips (not passes) without torch or a GPU.
"""
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import (COMPARE, ROOT, compare, harness, need_gpu,  # noqa: E402
                        reference_gemm, route_stats, run_child)

CHILD = os.path.join(ROOT, "tests", "gpu", "instr_child.py")
ROUTED_CHILD = os.path.join(ROOT, "tests", "gpu", "routed_child.py")
TMP = tempfile.mkdtemp(prefix="mt_instr_")
N, K = 256, 512
ROUTE = f"{N}x{K}"


def child(case, tag, spec="nvfp4-row", cache="requantize", shadow=0, probe=0, digest=0,
          replays="1", extra=None, script=CHILD):
    """Run a case; returns (arrays, statistics file path, its summary record)."""
    minite = dict(MINITE_SPEC=spec, MINITE_ROUTE=ROUTE, MINITE_WEIGHT_CACHE=cache,
                  MINITE_SHADOW=str(shadow), MINITE_PROBE=str(probe), MINITE_DIGEST=str(digest),
                  MINITE_DIGEST_REPLAYS=replays)
    extra = dict({"MT_BATCHES": None, "MT_REVERSE": None}, **(extra or {}))
    arrays, files, summary = run_child(script, case, tag, TMP, minite, extra)
    harness.check(len(files) == 1, f"{tag}: {len(files)} statistics files")
    harness.check(summary is not None, f"{tag}: no statistics summary")
    return arrays, files[0] if files else None, summary or {}


def probe_row_is_batch_invariant_tensor_is_not():
    need_gpu()
    # frozen: the rows alone read the dequantized copy of the kept weight that the call wrote
    cases = (("nvfp4-row", True, "requantize"), ("nvfp4-tensor", False, "requantize"),
             ("nvfp4-row", True, "frozen"))
    for spec, want_zero, cache in cases:
        _, _, summary = child("probe", f"probe_{spec}_{cache}", spec=spec, probe=1, cache=cache)
        p = route_stats(summary, ROUTE, "probe")
        print(f"    {spec} {cache}: probe {p}")
        harness.check(p.get("calls") == 9 and p.get("rows") == 36,
                      f"{spec}: probe calls {p.get('calls')} rows {p.get('rows')}, want 9 and 36 "
                      f"(skipped: {summary.get('instruments', {}).get('probe')})")
        if want_zero:
            harness.check(p.get("differing") == 0 and p.get("max_abs") == 0,
                          f"{spec}: {p.get('differing')} rows differ alone "
                          f"(max {p.get('max_abs')})")
        else:
            harness.check((p.get("differing") or 0) > 0,
                          f"{spec}: no probed row differs alone: the per-tensor scale should")


def digests_of_two_batchings_join_equal():
    need_gpu()
    for spec in ("nvfp4-row", "nvfp4-tensor"):
        ya, fa, sa = child("batch", f"join_a_{spec}", spec=spec, digest=1,
                           extra={"MT_BATCHES": "64"})
        cache = "frozen-sampled" if spec == "nvfp4-row" else "frozen"
        yb, fb, sb = child("batch", f"join_b_{spec}", spec=spec, digest=1, cache=cache,
                           extra={"MT_BATCHES": "7,1", "MT_REVERSE": "1"})
        doc = compare(fa, fb)
        total = doc["total"]
        print(f"    {spec}: matched {total['matched']}, equal {total['equal_pct']}%, "
              f"diff p50 {total['diff_p50']}; outputs bitwise equal: "
              f"{np.array_equal(ya['y'], yb['y'])}")
        for tag, s in (("A", sa), ("B", sb)):
            harness.check(s.get("digests", {}).get("written") == 64 and
                          s.get("digests", {}).get("dropped") == 0,
                          f"{spec} {tag}: digests {s.get('digests')}")
        harness.check(total["matched"] == 64, f"{spec}: {total['matched']} of 64 rows matched")
        if spec == "nvfp4-row":
            harness.check(total["equal_pct"] == 100.0,
                          f"nvfp4-row: {total['equal_pct']}% of matched rows bitwise equal")
            harness.check(np.array_equal(ya["y"], yb["y"]),
                          "nvfp4-row: the two batchings' outputs differ (the digests said equal?)")
    # at rate 1/4, both processes digest the same rows: chosen by content, not by count, where
    # every call is looked at (B's calls of 1 row would otherwise be sampled: below)
    got, fa, sa = child("batch", "rate_a", digest="1/4", extra={"MT_BATCHES": "64"})
    _, fb, sb = child("batch", "rate_b", digest="1/4",
                      extra={"MT_BATCHES": "7,1", "MT_REVERSE": "1", "MINITE_DIGEST_CALLS": "all"})
    total = compare(fa, fb)["total"]
    print(f"    rate 1/4: rows A {total['rows_a']}, B {total['rows_b']}, "
          f"matched {total['matched']}")
    harness.check(0 < total["matched"] < 64
                  and total["rows_a"] == total["rows_b"] == total["matched"],
                  f"rate 1/4: rows A {total['rows_a']}, B {total['rows_b']}, "
                  f"matched {total['matched']}")
    if fa is not None and "x" in got:
        want = lead_chosen_keys(got, 1 / 4)
        keys = {json.loads(line)["key"] for line in open(fa) if '"event": "digest"' in line}
        print(f"    rate 1/4: {len(want)} rows' lead hashes below 2^62, {len(keys & want)} of "
              f"{len(keys)} digested among them")
        harness.check(keys == want, f"rate 1/4: digested {len(keys)} rows, {len(keys & want)} of "
                                    f"the {len(want)} whose lead hash is below the rate")
    # by default, calls of 1 row at 1/4 are digested where the route's rows reach a multiple of 4:
    # rows 0, 4, ..., 60, 16 calls of 64, keeping those of their rows that the rate picks
    _, fc, sc = child("batch", "rate_sampled", digest="1/4", extra={"MT_BATCHES": "1"})
    dig = sc.get("instruments", {}).get("digest", {})
    print(f"    calls of 1 row: digest {dig}")
    harness.check(dig.get("calls") == 16 and dig.get("passed") == 48,
                  f"calls of 1 row at 1/4: digest {dig}, want 16 calls and 48 passed over")
    if fc is not None and "x" in got:
        want = lead_chosen_keys(got, 1 / 4, rows=range(0, 64, 4))
        keys = {json.loads(line)["key"] for line in open(fc) if '"event": "digest"' in line}
        harness.check(keys == want, f"calls of 1 row: digested {len(keys)} rows, "
                                    f"{len(keys & want)} of the {len(want)} wanted")


def shadow_error_in_nvfp4_range_and_zero_under_bf16():
    need_gpu()
    got, path, summary = child("shadow", "shadow_row", shadow=1, digest=1)
    check_scheme("no bias", got, path)  # the same run's digests, against the scheme
    s = route_stats(summary, ROUTE, "shadow")
    x, w = got["x"].astype(np.float64), got["w"].astype(np.float64)
    exact = x @ w.T
    expected = float(np.linalg.norm(reference_gemm(got["x"], got["w"]) - exact)
                     / np.linalg.norm(exact))
    print(f"    nvfp4-row: shadow {s}; CPU reference {expected:.4f}")
    harness.check(s.get("calls") == 1, f"shadow calls {s.get('calls')} "
                  f"(skipped: {summary.get('instruments', {}).get('shadow')})")
    rel = s.get("rel_l2_mean")
    harness.check(rel is not None and abs(rel - expected) <= 0.01,
                  f"shadow rel-L2 {rel}, the CPU reference gives {expected:.4f}")
    harness.check(rel is not None and 0.10 <= rel <= 0.17,
                  f"shadow rel-L2 {rel} outside 0.10 .. 0.17")
    records = [json.loads(line) for line in open(path) if '"event": "shadow"' in line]
    harness.check(len(records) == 1 and records[0]["m"] == 64, f"shadow records {records}")
    _, _, summary = child("shadow", "shadow_bf16", spec="bf16", shadow=1, probe=1)
    s, p = route_stats(summary, ROUTE, "shadow"), route_stats(summary, ROUTE, "probe")
    print(f"    bf16: shadow {s}, probe {p}")
    harness.check(s.get("calls") == 1 and s.get("rel_l2_max") == 0 and s.get("max_abs") == 0,
                  f"bf16: shadow {s}: cuBLAS against cuBLAS must be exactly 0")


# ---- the scheme in Python (kernels/instr.h), to check what the GPU wrote ----------------------

MASK = (1 << 64) - 1
_loader = importlib.machinery.SourceFileLoader("minite_compare", COMPARE)
MC = importlib.util.module_from_spec(importlib.util.spec_from_loader("minite_compare", _loader))
_loader.exec_module(MC)


def piece(i, lo, hi):
    return MC.mix64((lo + 0x9E3779B97F4A7C15 * (2 * i + 1)) & MASK) ^ \
        MC.mix64(hi ^ ((0xD6E8FEB86659FD93 * (i + 1)) & MASK))


def content_sum(data):
    data = bytes(data) + bytes(-len(data) % 16)
    total = 0
    for i in range(len(data) // 16):
        lo = int.from_bytes(data[16 * i:16 * i + 8], "little")
        hi = int.from_bytes(data[16 * i + 8:16 * i + 16], "little")
        total = (total + piece(i, lo, hi)) & MASK
    return total


def sample_step():
    """MT_SAMPLE_STEP, read from kernels/whash.h (the runs a group of the weight's sample spans)."""
    with open(os.path.join(ROOT, "kernels", "whash.h")) as f:
        for line in f:
            if line.startswith("#define MT_SAMPLE_STEP "):
                return int(line.split()[2])
    raise RuntimeError("kernels/whash.h defines no MT_SAMPLE_STEP")


def weight_sum(w_bytes, n, k):
    """weight_sum of an [n][k] 2-byte weight: the 16-byte pieces (numbered row-major) of the
    128-byte lines whose run of 8 is the one its group of MT_SAMPLE_STEP runs samples
    (kernels/whash.h)."""
    step, run_lines, per_row = sample_step(), 8, k // 8
    lines_per_row = (per_row + 7) // 8
    total = 0
    for line in range(n * lines_per_row):
        run = line // run_lines
        g = run // step
        if run % step != ((g * 0x9E3779B97F4A7C15 & MASK) >> 40) % step:
            continue
        r, j0 = divmod(line, lines_per_row)
        j0 *= 8
        for j in range(j0, min(j0 + 8, per_row)):
            at = 2 * (r * k + 8 * j)
            lo = int.from_bytes(w_bytes[at:at + 8], "little")
            hi = int.from_bytes(w_bytes[at + 8:at + 16], "little")
            total = (total + piece(r * per_row + j, lo, hi)) & MASK
    return total


def tag(length, dtype):
    return MC.mix64((length << 4 | (dtype + 1)) & MASK)


def bf16_bytes(a):
    """The BF16 bits of float32 values that are BF16 numbers (the child saved them as float32)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def expected_rows(x, w, y, b=None):
    """{key: (hash, sketch)} of every row, as the scheme defines them (BF16 everywhere, alpha 1)."""
    n, k = w.shape
    wid = MC.mix64(weight_sum(bf16_bytes(w), n, k) ^ tag(n << 28 | k, 0))
    bid = 0 if b is None else MC.mix64(content_sum(bf16_bytes(b)) ^ tag(n, 0))
    rows = {}
    for i in range(x.shape[0]):
        row_hash = MC.mix64(content_sum(bf16_bytes(x[i])) ^ tag(k, 0))
        h = 0x6D696E6974656B31
        for v in (row_hash, wid, 1, 0x3F800000, bid):
            h = MC.mix64(h ^ v)
        out_hash = MC.mix64(content_sum(bf16_bytes(y[i])) ^ tag(n, 0))
        rows[f"{h:016x}"] = (f"{out_hash:016x}", MC.sketch([float(v) for v in y[i]]))
    return rows


def lead_chosen_keys(got, rate, rows=None):
    """The keys of the rows (of `rows`, default all) a digest at `rate` picks: their lead hash, of
    the first 128 elements and the row's length, below rate * 2^64 (the whole row's hash keys
    them)."""
    x, w = got["x"], got["w"]
    keys = list(expected_rows(x, w, got["y"]))  # row order
    k = w.shape[1]
    rows = set(range(len(keys)) if rows is None else rows)
    lead = [MC.mix64(content_sum(bf16_bytes(x[i][:128])) ^ tag(k, 0)) for i in range(len(keys))]
    return {key for i, key in enumerate(keys) if i in rows and lead[i] < rate * 2**64}


def check_scheme(case, got, path):
    """The digest records of a child run with MINITE_DIGEST=1 against the Python definitions."""
    if path is None:
        return
    want = expected_rows(got["x"], got["w"], got["y"], got["b"] if "b" in got else None)
    records = [json.loads(line) for line in open(path) if '"event": "digest"' in line]
    harness.check(len(records) == 64, f"{case}: {len(records)} digest records, want 64")
    keys = hashes = sketches = 0
    for r in records:
        if r["key"] not in want:
            continue
        keys += 1
        want_hash, want_sketch = want[r["key"]]
        hashes += r["hash"] == want_hash
        norm = float(np.sqrt(np.sum(np.square(want_sketch)))) + 1e-30
        sketches += all(abs(a - b) <= 1e-5 * norm for a, b in zip(r["sketch"], want_sketch))
    print(f"    {case}: of {len(records)} records, {keys} keys, {hashes} output hashes and "
          f"{sketches} sketches as defined")
    harness.check(keys == hashes == sketches == 64,
                  f"{case}: keys {keys}, hashes {hashes}, sketches {sketches} of 64 as defined")


def digest_records_with_a_bias_are_scheme_2():
    need_gpu()
    got, path, _ = child("bias", "scheme_bias", digest=1)
    check_scheme("bias", got, path)


def graph_with_instruments_replays():
    """A captured call digests its rows at each replay under MINITE_DIGEST_REPLAYS=1, at one in 2
    under 1/2 (of 3 replays, 1 or 2: the count starts where the device memory left it); the probe
    and shadow are skipped in the capture. Each replay the writer read gives 5 records whose keys
    the eager call on the same inputs also gives, with the same output hash."""
    need_gpu()
    # test_routed.py replays both caches; here: the instruments
    for cache, replays, digesting in (("frozen", "1", (3,)), ("frozen", "1/2", (1, 2))):
        got, path, summary = child("graph", f"graph_{cache}_{replays.replace('/', '-')}",
                                   cache=cache, shadow=1, probe=1, digest=1, replays=replays,
                                   script=ROUTED_CHILD)
        for i in range(3):
            harness.check(np.array_equal(got[f"replay{i}"], got[f"eager{i}"]),
                          f"{cache}: replay {i} differs from the eager call")
        ins = summary.get("instruments", {})
        cap = ins.get("captured", {})
        print(f"    {cache}: captured {cap}")
        harness.check(cap.get("calls", 0) >= 1 and cap.get("replays", 0) >= 1 and
                      cap.get("replays", 0) + cap.get("missed", 0) in digesting,
                      f"{cache}, {replays}: captured {cap}: want {digesting} replays read or "
                      "missed")
        for name in ("probe", "shadow"):
            harness.check(ins.get(name, {}).get("skipped", {}).get("capture", 0) >= 1,
                          f"{cache}: no capture skip of the {name}: {ins.get(name)}")
        harness.check("capture" not in summary.get("fallbacks", {}),
                      f"{cache}: fallbacks {summary.get('fallbacks')}")
        hashes = {}
        for line in open(path) if path else ():
            if '"event": "digest"' in line:
                r = json.loads(line)
                hashes.setdefault(r["key"], []).append(r["hash"])
        joined = sum(1 for h in hashes.values() if len(h) >= 2)
        harness.check(all(len(set(h)) == 1 for h in hashes.values()) and joined >= 5,
                      f"{cache}: {len(hashes)} keys, {joined} digested more than once (a replay "
                      "and the eager call), or one key with two output hashes")


for t in (probe_row_is_batch_invariant_tensor_is_not, digests_of_two_batchings_join_equal,
          shadow_error_in_nvfp4_range_and_zero_under_bf16, digest_records_with_a_bias_are_scheme_2,
          graph_with_instruments_replays):
    harness.run(t)
sys.exit(harness.done())
