"""test_minite_compare.py — tools/minite-compare on small statistics files that each test writes
with known digests: identical rows (100% equal), rows scaled by a known factor (estimated exactly),
rows perturbed in a random direction by a known relative amount (the median estimate within 10%),
refusals with exit status 3 (fingerprints that differ, no start record, not a statistics file,
disagreeing start records), unreadable files and usage errors with 2, truncated and corrupt lines
skipped and counted, keys inconsistent within one file, unknown fields ignored, an empty join,
--json with its documented fields, sketch values beyond FP32 and routes beyond uint32 counted as
corrupt, the message for an unknown digest scheme, a FIFO or a device refused at once (never
waited on), and values of the files shown with control characters escaped and long ones
shortened.
"""
import importlib.machinery
import importlib.util
import json
import math
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness  # noqa: E402

COMPARE = os.path.join(ROOT, "tools", "minite-compare")
_loader = importlib.machinery.SourceFileLoader("minite_compare", COMPARE)
_spec = importlib.util.spec_from_loader("minite_compare", _loader)
mc = importlib.util.module_from_spec(_spec)
_loader.exec_module(mc)

TMP = harness.temp_dir("mt-compare-")
FP = "0123456789abcdef"
FP_OTHER = "fedcba9876543210"
ROUTE, N = "256x128", 256          # small rows keep the pure-Python sketches fast
ROUTE2, N2 = "64x32", 64
DROP = object()                    # a field left out of a record


def path(name):
    return os.path.join(TMP, name)


def start(role="learner", fingerprint=FP, spec="nvfp4-row", pid=100, **extra):
    rec = {"event": "start", "time": 1.5, "pid": pid, "host": "h", "rank": 0, "role": role,
           "spec": spec, "fingerprint": fingerprint, "routes": [ROUTE2, ROUTE], "version": "t"}
    rec.update(extra)
    return json.dumps(rec)


def digest(key, hash_, row, route=ROUTE, **extra):
    rec = {"event": "digest", "scheme": mc.SCHEME, "route": route, "key": f"{key:016x}",
           "hash": f"{hash_:016x}", "n": len(row), "sketch": mc.sketch(row)}
    rec.update(extra)
    return json.dumps(rec)


def write(name, lines, starts=None, summary=True, tail=""):
    with open(path(name), "w") as f:
        for s in ([start()] if starts is None else starts):
            f.write(s + "\n")
        for line in lines:
            f.write(line + "\n")
        if summary:
            f.write('{"event": "summary", "time": 2.0, "gemm_calls": 10, "routed": 5}\n')
        f.write(tail)
    return path(name)


def compare(*args):
    """Exit status, stdout and stderr; status 124 when the tool runs past 60 s (a hang)."""
    try:
        res = subprocess.run([sys.executable, COMPARE] + [str(a) for a in args],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out"
    return res.returncode, res.stdout, res.stderr


def compare_json(*args):
    rc, out, err = compare("--json", *args)
    harness.check(rc == 0, f"minite-compare --json exit {rc}: {err}")
    return json.loads(out) if rc == 0 else None


def rows(count, seed, n=N):
    rng = random.Random(seed)
    return [[rng.gauss(0.0, 1.0) for _ in range(n)] for _ in range(count)]


def perturb(row, rel, rng):
    """row + a random direction of norm rel * ||row||: relative L2 difference exactly rel."""
    u = [rng.gauss(0.0, 1.0) for _ in row]
    scale = rel * math.sqrt(sum(v * v for v in row)) / math.sqrt(sum(v * v for v in u))
    return [y + scale * v for y, v in zip(row, u)]


def test_identical_rows_are_all_equal():
    ys = rows(20, 1)
    lines = [digest(1000 + i, 5000 + i, y) for i, y in enumerate(ys)]
    a = write("same-a.jsonl", lines)
    b = write("same-b.jsonl", lines[::-1], starts=[start("sampler", pid=200)])
    doc = compare_json(a, b)
    t = doc["total"]
    harness.check(t["rows_a"] == 20 and t["rows_b"] == 20 and t["matched"] == 20, str(t))
    harness.check(t["equal"] == 20 and t["equal_pct"] == 100.0 and t["differing"] == 0, str(t))
    harness.check(t["diff_p50"] is None and t["diff_max"] is None, f"no differing row: {t}")
    harness.check(doc["common"] is True, "common")
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and "100.00" in out and ROUTE in out and "total" in out,
                  f"table:\n{out}{err}")
    harness.check("no digest keys in common" not in out, out)


def test_scaled_rows_are_estimated_exactly():
    # y_b = (1 + d) y_a: the sketch is linear, so s_b = (1 + d) s_a and the estimate is d exactly.
    ys = rows(10, 2)
    rels = [0.001 * (i + 1) for i in range(10)]
    a = write("scaled-a.jsonl", [digest(i, 7, y) for i, y in enumerate(ys)])
    b = write("scaled-b.jsonl", [digest(i, 8 + i, [(1 + r) * v for v in y])
                                 for i, (y, r) in enumerate(zip(ys, rels))])
    doc = compare_json(a, b)
    r = doc["routes"][0]
    harness.check(r["matched"] == 10 and r["equal"] == 0 and r["differing"] == 10, str(r))
    srt = sorted(rels)
    want_p50 = (srt[4] + srt[5]) / 2
    want_p99 = srt[8] + 0.91 * (srt[9] - srt[8])      # position 8.91 of 0..9
    for key, want in (("diff_p50", want_p50), ("diff_p99", want_p99), ("diff_max", srt[9])):
        harness.check(math.isclose(r[key], want, rel_tol=1e-6), f"{key} {r[key]} vs {want}")


def test_random_perturbation_median_within_tolerance():
    # A difference in a random direction: each row's estimate is the true d times sqrt(F(8, 8))
    # (module docstring), whose median is 1 and whose 1st..99th percentiles are 0.41..2.46. The
    # median of 400 such rows has a standard deviation of about 0.02 d (measured over 20 seeds
    # at 500 rows: 0.018 d), so 10% is 5 of them; the seed is fixed, so the test is repeatable.
    # 100 equal rows are added: they count in the equal % and stay out of the percentiles.
    rng = random.Random(3)
    rel = 0.01
    ys = rows(500, 4)
    a_lines = [digest(i, i, y) for i, y in enumerate(ys)]
    b_lines = [digest(i, i if i < 100 else 10**6 + i, y if i < 100 else perturb(y, rel, rng))
               for i, y in enumerate(ys)]
    doc = compare_json(write("pert-a.jsonl", a_lines), write("pert-b.jsonl", b_lines))
    t = doc["total"]
    harness.check(t["matched"] == 500 and t["equal"] == 100 and t["differing"] == 400, str(t))
    harness.check(math.isclose(t["equal_pct"], 20.0), str(t))
    harness.check(abs(t["diff_p50"] / rel - 1) < 0.10, f"median estimate {t['diff_p50']} vs {rel}")
    harness.check(1.5 < t["diff_p99"] / rel < 4.0, f"p99 {t['diff_p99']} (sketch spread ~2.5x)")
    harness.check(t["diff_max"] >= t["diff_p99"] >= t["diff_p50"] > 0, str(t))


def test_several_routes_and_total():
    ys, small = rows(6, 5), rows(4, 6, n=N2)
    a = write("routes-a.jsonl", [digest(i, i, y) for i, y in enumerate(ys)] +
              [digest(100 + i, i, y, route=ROUTE2) for i, y in enumerate(small)])
    b = write("routes-b.jsonl", [digest(i, i, y) for i, y in enumerate(ys[:4])] +
              [digest(100 + i, 50 + i, [2 * v for v in y], route=ROUTE2)
               for i, y in enumerate(small)] + [digest(999, 1, ys[0])])
    doc = compare_json(a, b)
    by = {r["route"]: r for r in doc["routes"]}
    harness.check([r["route"] for r in doc["routes"]] == [ROUTE2, ROUTE], "routes by (out, in)")
    big, sm = by[ROUTE], by[ROUTE2]
    harness.check((big["rows_a"], big["rows_b"], big["matched"], big["equal"]) == (6, 5, 4, 4),
                  str(big))
    harness.check((sm["matched"], sm["equal"], sm["differing"]) == (4, 0, 4), str(sm))
    harness.check(math.isclose(sm["diff_max"], 1.0, rel_tol=1e-9), f"2y vs y: {sm}")
    t = doc["total"]
    harness.check((t["rows_a"], t["rows_b"], t["matched"], t["equal"]) == (10, 9, 8, 4), str(t))
    harness.check(math.isclose(t["equal_pct"], 50.0) and t["differing"] == 4, str(t))


def test_mismatched_fingerprints_are_refused():
    y = rows(1, 7)[0]
    a = write("fp-a.jsonl", [digest(1, 1, y)])
    b = write("fp-b.jsonl", [digest(1, 1, y)],
              starts=[start("sampler", fingerprint=FP_OTHER, spec="nvfp4-tensor")])
    rc, out, err = compare(a, b)
    harness.check(rc == 3, f"exit {rc}, expected 3")
    for word in (FP, FP_OTHER, "nvfp4-row", "nvfp4-tensor", "fp-a.jsonl", "fp-b.jsonl",
                 "MINITE_SPEC"):
        harness.check(word in err, f"message lacks {word!r}: {err}")
    harness.check(out == "", f"nothing on stdout: {out}")


def test_no_start_record_and_foreign_files_are_refused():
    y = rows(1, 8)[0]
    good = write("ok.jsonl", [digest(1, 1, y)])
    nostart = write("nostart.jsonl", [digest(1, 1, y)], starts=[])
    rc, out, err = compare(good, nostart)
    harness.check(rc == 3 and "no start record" in err and "nostart.jsonl" in err,
                  f"exit {rc}: {err}")
    cases = {
        "logprobs.jsonl": ('{"format": "minite-logprobs", "version": 1, "role": "learner"}\n',
                           "a minite-logprobs file"),
        "csv.jsonl": ("seq,token,logprob\n1,2,3\n", "not a minite statistics file"),
        "empty.jsonl": ("", "empty"),
        "objects.jsonl": ('{"a": 1}\n[1, 2]\n', "not a minite statistics file"),
    }
    for name, (text, word) in cases.items():
        with open(path(name), "w") as f:
            f.write(text)
        rc, out, err = compare(path(name), good)
        harness.check(rc == 3 and word in err and name in err, f"{name}: exit {rc}: {err}")
    badfp = write("badfp.jsonl", [digest(1, 1, y)], starts=[start(fingerprint="xyz")])
    rc, out, err = compare(good, badfp)
    harness.check(rc == 3 and "no start record" in err, f"start without fingerprint: {err}")


def test_several_start_records_must_agree():
    ys = rows(2, 9)
    agree = write("agree.jsonl", [digest(1, 1, ys[0]), digest(2, 2, ys[1])],
                  starts=[start(pid=1), start(pid=2)])
    doc = compare_json(agree, agree)
    harness.check(doc is not None and len(doc["a"]["starts"]) == 2, "two starts kept")
    harness.check(doc is not None and doc["total"]["equal_pct"] == 100.0, "a file against itself")
    disagree = write("disagree.jsonl", [digest(1, 1, ys[0])],
                     starts=[start(pid=1), start(pid=2, fingerprint=FP_OTHER, spec="other")])
    rc, out, err = compare(agree, disagree)
    harness.check(rc == 3 and "2 start records of different specs" in err and FP_OTHER in err
                  and "%p" in err, f"exit {rc}: {err}")


def test_unreadable_files_and_usage_errors_exit_2():
    good = write("ok2.jsonl", [])
    for args in ([], [good], [good, good, good], [good, good, "--no-such-flag"]):
        rc, out, err = compare(*args)
        harness.check(rc == 2, f"{args}: exit {rc}, expected 2 ({err.strip()[-100:]})")
    rc, out, err = compare(good, path("does-not-exist.jsonl"))
    harness.check(rc == 2 and "cannot read" in err and "does-not-exist" in err, f"{rc}: {err}")
    rc, out, err = compare(TMP, good)
    harness.check(rc == 2 and "cannot read" in err, f"a directory: {rc}: {err}")
    rc, out, err = compare("--help")
    harness.check(rc == 0 and "Exit status" in out and "3 refused" in out, f"--help: {out}")


def test_fifo_and_devices_are_refused_at_once():
    good = write("ok3.jsonl", [])
    fifo = path("stats.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    for other, kind in ((fifo, "a FIFO or pipe"), ("/dev/zero", "a character device")):
        rc, out, err = compare(good, other)
        harness.check(rc == 2 and "cannot read" in err and kind in err and
                      "not a statistics file" in err, f"{other}: exit {rc}: {err}")


def test_values_are_escaped_and_shortened():
    ys = rows(2, 12)
    forged = "x\nminite-compare: forged line\x1b[31m\x9b"
    a = write("roles_a.jsonl", [digest(i, i, y) for i, y in enumerate(ys)],
              starts=[start(role=forged, spec="s" * 5000)])
    b = write("roles_b.jsonl", [digest(i, i, y) for i, y in enumerate(ys)],
              starts=[start(role="r" * 100000, spec="s" * 5000)])
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and err == "", f"exit {rc}: {err}")
    harness.check("role x\\nminite-compare: forged line\\x1b[31m\\x9b pid" in out and
                  "\x1b" not in out and "\x9b" not in out and
                  not any(line.startswith("minite-compare: forged") for line in out.split("\n")),
                  out[:600])
    harness.check(len(out) < 3000 and "(100000 characters)" in out and
                  "(5000 characters)" in out, f"{len(out)} characters: {out[:600]}")
    other = write("roles_c.jsonl", [], starts=[start(spec="t" * 5000, fingerprint=FP_OTHER)])
    rc, out, err = compare(a, other)
    harness.check(rc == 3 and len(err) < 2000 and "(5002 characters)" in err,
                  f"exit {rc}: {len(err)} characters: {err[:600]}")


def test_truncated_and_corrupt_lines_are_skipped_and_counted():
    ys = rows(4, 10)
    clean = [digest(i, i, y) for i, y in enumerate(ys)]
    good = json.loads(clean[0])

    def bad(**change):
        rec = dict(good, key="00000000deadbeef")
        rec.update(change)
        return json.dumps({k: v for k, v in rec.items() if v is not DROP})

    corrupt = [
        "\xff\xfe not json at all",
        '{"event": "digest", "scheme": 2, "route": "256x128", "key": "00',   # cut short
        "[1, 2, 3]",
        '{"no_event": 1}',
        bad(key=DROP), bad(hash=DROP), bad(sketch=DROP), bad(route=DROP), bad(n=DROP),
        bad(scheme=DROP),
        bad(key="12345"), bad(hash="zzzzzzzzzzzzzzzz"), bad(key=12), bad(route="256*128"),
        bad(n=255), bad(n=True), bad(n="256"), bad(sketch=[1.0] * 7), bad(sketch="12345678"),
        bad(sketch=[1.0] * 7 + ["x"]), bad(sketch=[1.0] * 7 + [True]), bad(scheme="1"),
        '{"event": "start", "fingerprint": 5}',
    ]
    nonfinite = [
        bad(sketch=[1.0] * 7 + [None]),
        json.dumps(dict(good, key="00000000deadbee1")).replace(
            json.dumps(good["sketch"][3]), "NaN"),
        json.dumps(dict(good, key="00000000deadbee2")).replace(
            json.dumps(good["sketch"][5]), "-Infinity"),
    ]
    nonfinite += [bad(sketch=[1.0] * 7 + [10 ** 400]),                     # beyond a double
                  bad(sketch=[1.0] * 7 + ["1e999"]).replace('"1e999"', "1e999")]
    unknown = [bad(scheme=mc.SCHEME + 1)]
    a = write("corrupt-a.jsonl", clean[:2] + corrupt + clean[2:] + nonfinite + unknown,
              tail='{"event": "digest", "scheme": 2, "route": "256x1')      # truncated last line
    b = write("clean-b.jsonl", clean)
    doc = compare_json(a, b)
    sk = doc["a"]["skipped"]
    harness.check(sk["corrupt"] == len(corrupt) + 1, f"corrupt {sk['corrupt']}, "
                  f"expected {len(corrupt) + 1}")
    harness.check(sk["nonfinite_sketch"] == 5 and sk["unknown_scheme"] == 1, str(sk))
    harness.check(doc["b"]["skipped"] == {"corrupt": 0, "nonfinite_sketch": 0,
                                          "unknown_scheme": 0}, str(doc["b"]))
    t = doc["total"]
    harness.check((t["rows_a"], t["matched"], t["equal_pct"]) == (4, 4, 100.0),
                  f"skipped lines change nothing: {t}")
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and "A: skipped lines:" in out and "corrupt or truncated" in out
                  and "non-finite sketch" in out, f"table notes skips:\n{out}")
    harness.check("line 4: not valid JSON" in err and "more skipped lines" in err,
                  f"stderr names lines: {err}")


def test_keys_inconsistent_within_one_file():
    ys = rows(3, 11)
    a = write("dup-a.jsonl", [digest(1, 10, ys[0]), digest(1, 10, ys[0]),      # seen twice, agree
                              digest(2, 20, ys[1]), digest(2, 21, ys[1]),      # disagree
                              digest(3, 30, ys[2])])
    b = write("dup-b.jsonl", [digest(1, 10, ys[0]), digest(2, 20, ys[1]), digest(3, 30, ys[2]),
                              digest(3, 31, ys[2])])
    doc = compare_json(a, b)
    t = doc["total"]
    harness.check(t["inconsistent_a"] == 1 and t["inconsistent_b"] == 1, str(t))
    harness.check((t["rows_a"], t["rows_b"], t["matched"], t["equal"]) == (2, 2, 1, 1),
                  f"inconsistent keys left out of the join: {t}")
    harness.check(doc["a"]["digests"] == 5 and doc["b"]["digests"] == 4, "digests counted")
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and "incons. A" in out, f"table:\n{out}")


def test_unknown_fields_and_records_are_ignored():
    ys = rows(2, 12)
    a = write("extra-a.jsonl", [digest(1, 1, ys[0], dtype="bf16", future={"x": [1, 2]}),
                                digest(2, 2, ys[1], norm=3.5),
                                '{"event": "shadow", "route": "256x128", "rel_l2": 0.01}',
                                '{"event": "probe", "rows": 4, "differ": 0}'],
              starts=[start(extra_field=[1, 2], shim={"a": 1})])
    b = write("extra-b.jsonl", [digest(1, 1, ys[0]), digest(2, 3, [-v for v in ys[1]])])
    doc = compare_json(a, b)
    t = doc["total"]
    harness.check((t["matched"], t["equal"], t["differing"]) == (2, 1, 1), str(t))
    harness.check(math.isclose(t["diff_max"], 2.0, rel_tol=1e-9), f"-y vs y is 2: {t}")
    harness.check(doc["a"]["other_records"] == 3 and sum(doc["a"]["skipped"].values()) == 0,
                  f"shadow, probe, summary read past: {doc['a']}")


def test_digests_dropped_by_the_shim_are_reported():
    ys = rows(2, 16)
    lines = [digest(i, i, y) for i, y in enumerate(ys)]
    summary = '{"event": "summary", "digests": {"written": %d, "dropped": %d}}'
    a = write("drop-a.jsonl", lines + [summary % (2, 7), summary % (0, 1),
                                       '{"event": "summary", "digests": {"dropped": -1}}'],
              summary=False)
    b = write("drop-b.jsonl", lines)
    doc = compare_json(a, b)
    harness.check(doc["a"]["shim_digests"] == {"written": 2, "dropped": 8}, str(doc["a"]))
    harness.check(doc["b"]["shim_digests"] is None, "no counts in B's summary")
    harness.check(doc["total"]["equal"] == 2, "the join is unchanged")
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and "the shim dropped 8 digests" in out, f"table:\n{out}")


def test_empty_join_is_reported_not_an_error():
    ys = rows(2, 13)
    a = write("join-a.jsonl", [digest(1, 1, ys[0])])
    b = write("join-b.jsonl", [digest(2, 2, ys[1])])
    rc, out, err = compare(a, b)
    harness.check(rc == 0 and "no digest keys in common" in out, f"exit {rc}:\n{out}{err}")
    harness.check("MINITE_DIGEST" not in out, "both files have digests")
    doc = compare_json(a, b)
    harness.check(doc["common"] is False and doc["total"]["matched"] == 0
                  and doc["total"]["equal_pct"] is None, str(doc["total"]))
    none = write("join-none.jsonl", [])
    rc, out, err = compare(a, none)
    harness.check(rc == 0 and "no digest keys in common" in out and "MINITE_DIGEST" in out,
                  f"no digests at all:\n{out}")


def test_json_has_the_documented_fields():
    ys = rows(3, 14)
    a = write("fields-a.jsonl", [digest(i, i, y) for i, y in enumerate(ys)])
    b = write("fields-b.jsonl", [digest(i, i + (i == 2), y) for i, y in enumerate(ys)] +
              [digest(7, 7, [0.0] * N)])
    zero_a = write("fields-zero.jsonl", [digest(7, 8, [0.0] * N)])
    doc = compare_json(a, b)
    harness.check(doc["format"] == "minite-compare" and doc["version"] == 1, str(doc)[:200])
    harness.check(doc["fingerprint"] == FP and doc["spec"] == "nvfp4-row", "fingerprint, spec")
    for side in ("a", "b"):
        want = {"path", "spec", "fingerprint", "starts", "digests", "skipped", "other_records",
                "shim_digests"}
        harness.check(set(doc[side]) == want, f"{side}: {sorted(doc[side])}")
        harness.check(set(doc[side]["starts"][0]) == {"role", "pid", "host", "rank"}, "starts")
    stats = {"rows_a", "rows_b", "matched", "equal", "equal_pct", "differing", "diff_p50",
             "diff_p99", "diff_max", "inconsistent_a", "inconsistent_b"}
    harness.check(set(doc["total"]) == stats, f"total: {sorted(doc['total'])}")
    harness.check(all(set(r) == stats | {"route"} for r in doc["routes"]), "route fields")
    # a zero row in A against a nonzero one: the estimate is infinite, null in JSON, inf in text
    doc = compare_json(zero_a, write("fields-nonzero.jsonl", [digest(7, 9, [1.0] * N)]))
    harness.check(doc["total"]["diff_max"] is None and doc["total"]["differing"] == 1,
                  f"infinite estimate: {doc['total']}")
    rc, out, err = compare(zero_a, path("fields-nonzero.jsonl"))
    harness.check(rc == 0 and "inf" in out, f"table:\n{out}")


def test_sketch_reference():
    # mix64 is splitmix64's finalizer: splitmix64 seeded with 0 first returns mix64(golden gamma)
    harness.check(mc.mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF, "splitmix64's first output")
    signs = mc.sketch_signs(1024)
    harness.check(len(signs) == 8 and all(len(s) == 1024 for s in signs), "8 x n signs")
    plus = sum(v == 1 for s in signs for v in s)
    harness.check(abs(plus - 4096) < 4 * 45, f"balanced signs: {plus} of 8192 (sd 45)")
    harness.check(signs[0][0] == (-1 if mc.mix64(mc.SKETCH_SEED) >> 63 else 1), "sign(0, 0)")
    harness.check(signs[3][5] == (-1 if mc.mix64(mc.SKETCH_SEED ^ 5) >> 60 & 1 else 1),
                  "sign(3, 5): bit 60 of element 5's hash")
    # the eight signs of an element come from one hash, yet differ from row to row
    harness.check(len({tuple(s[j] for s in signs) for j in range(1024)}) > 200,
                  "an element's eight signs vary with the element")
    e = [1.0 if j == 5 else 0.0 for j in range(1024)]
    harness.check(mc.sketch(e) == [s[5] / 32.0 for s in signs], "sketch of a unit vector")
    # E||s||^2 = (8 / n) ||y||^2: the sketch has the scale of the row's RMS
    ys = rows(200, 15, n=128)
    ratio = sum(sum(v * v for v in mc.sketch(y)) / sum(v * v for v in y) for y in ys) / 200
    harness.check(abs(ratio / (8 / 128) - 1) < 0.1, f"E||s||^2 / ||y||^2 = {ratio}, 8/128")


def test_sketch_values_beyond_fp32_are_corrupt():
    # the shim writes FP32: a finite sketch value beyond FP32's max is a corrupt record (skipped
    # and counted, never squared into an OverflowError); FP32's max itself, as %.9g writes it,
    # is compared, with either sign
    fp32_max = 3.40282347e38
    big = [fp32_max] * 8
    a = write("fp32-a.jsonl", [digest(1, 1, [0.0] * N, sketch=big),
                               digest(2, 2, [0.0] * N, sketch=big)])
    b = write("fp32-b.jsonl", [digest(1, 3, [0.0] * N, sketch=[-v for v in big]),
                               digest(2, 4, [0.0] * N, sketch=[1e200] * 8),
                               digest(5, 5, [0.0] * N, sketch=[1.0] * 7 + [-3.5e38])])
    rc, out, err = compare("--json", a, b)
    harness.check(rc == 0 and "Traceback" not in err, f"exit {rc}: {err[-300:]}")
    doc = json.loads(out) if rc == 0 else {}
    t = doc.get("total", {})
    harness.check(doc and doc["b"]["skipped"]["corrupt"] == 2 and doc["a"]["skipped"]["corrupt"]
                  == 0 and t["matched"] == 1 and math.isclose(t["diff_max"], 2.0, rel_tol=1e-9),
                  f"{str(doc)[:400]}")
    harness.check("beyond FP32" in err, f"stderr names the reason: {err}")


def test_routes_are_uint32():
    ys = rows(1, 17)
    long_route = "1" * 5000 + "x2"
    a = write("route-a.jsonl", [digest(1, 1, ys[0]), digest(2, 2, ys[0], route=long_route),
                                digest(3, 3, ys[0], route="12345678901x2", n=12345678901),
                                digest(4, 4, ys[0], route="4294967295x4294967295",
                                       n=4294967295)])
    rc, out, err = compare("--json", a, a)
    harness.check(rc == 0 and "Traceback" not in err, f"exit {rc}: {err[-300:]}")
    doc = json.loads(out) if rc == 0 else {}
    harness.check(doc and doc["a"]["skipped"]["corrupt"] == 2 and
                  [r["route"] for r in doc["routes"]] == [ROUTE, "4294967295x4294967295"],
                  f"{str(doc)[:400]}")


def test_unknown_scheme_names_the_tool_to_update():
    ys = rows(1, 18)
    a = write("scheme-a.jsonl", [digest(1, 1, ys[0]), digest(2, 2, ys[0], scheme=mc.SCHEME + 1)])
    rc, out, err = compare(a, a)
    harness.check(rc == 0 and f"scheme {mc.SCHEME + 1}" in err and "tools/minite-compare" in err and
                  "scripts/" not in err, f"exit {rc}: {err}")


def test_older_scheme_says_the_files_do_not_join():
    # scheme 2 keyed weights by another sample of their lines: its keys never equal scheme 3's
    ys = rows(1, 19)
    a = write("old-a.jsonl", [digest(1, 1, ys[0]), digest(2, 2, ys[0], scheme=mc.SCHEME - 1)])
    rc, out, err = compare(a, a)
    harness.check(rc == 0 and f"scheme {mc.SCHEME - 1}, an older shim's" in err and
                  "one minite version" in err, f"exit {rc}: {err}")


for t in (test_identical_rows_are_all_equal, test_scaled_rows_are_estimated_exactly,
          test_random_perturbation_median_within_tolerance, test_several_routes_and_total,
          test_mismatched_fingerprints_are_refused,
          test_no_start_record_and_foreign_files_are_refused,
          test_several_start_records_must_agree, test_unreadable_files_and_usage_errors_exit_2,
          test_fifo_and_devices_are_refused_at_once, test_values_are_escaped_and_shortened,
          test_truncated_and_corrupt_lines_are_skipped_and_counted,
          test_keys_inconsistent_within_one_file, test_unknown_fields_and_records_are_ignored,
          test_digests_dropped_by_the_shim_are_reported,
          test_empty_join_is_reported_not_an_error, test_json_has_the_documented_fields,
          test_sketch_reference, test_sketch_values_beyond_fp32_are_corrupt,
          test_routes_are_uint32, test_unknown_scheme_names_the_tool_to_update,
          test_older_scheme_says_the_files_do_not_join):
    harness.run(t)
sys.exit(harness.done())
