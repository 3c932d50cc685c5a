"""test_minite_merge.py — tools/minite-merge on statistics files that each test writes as the shim
would for the ranks of one job: totals, fallbacks, one census and the instruments summed over
ranks with a per-rank breakdown; a shared file holding two processes; missing and repeated ranks
and a process without a summary reported; refusals with exit status 3 (fingerprints that differ,
no start record), unreadable files and usage errors with 2; the table; shadow figures that are
not finite kept so; records of wrong types and lines nested too deep skipped and counted, with
--json still JSON; a file given twice read once; a FIFO or a device refused at once (never waited
on); values of the files shown in the table with control characters escaped and long ones
shortened.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness  # noqa: E402

MERGE = os.path.join(ROOT, "tools", "minite-merge")
TMP = harness.temp_dir("mt-merge-")
FP = "0123456789abcdef"


def ident(rank, pid, world, device):
    return {"pid": pid, "host": "h", "rank": rank, "local_rank": rank, "world_size": world,
            "device": device, "pci_bus": f"0000:{0x19 + rank:02X}:00.0", "role": "learner",
            "spec": "nvfp4-row", "fingerprint": FP}


def start(rank, pid, world=2, device=None, **extra):
    rec = {"event": "start", "time": 1.0, **ident(rank, pid, world, rank if device is None
                                                     else device),
           "routes": ["256x512"], "version": "t"}
    rec.update(extra)
    return json.dumps(rec)


def census_row(m, n, count, entry="cublasGemmEx", **extra):
    row = {"entry": entry, "ops": "TN", "m": m, "n": n, "k": 512, "types": "bf16*bf16->bf16",
           "count": count}
    row.update(extra)
    return row


def summary(rank, pid, routed, passed, fallbacks, census, world=2, shadow=None, probe=None,
            digests=0, suggested=("route 256x512",)):
    route = {"shadow": shadow or {"calls": 0, "rel_l2_mean": None, "rel_l2_max": None,
                                  "max_abs": None, "nonfinite": 0},
             "probe": probe or {"calls": 0, "rows": 0, "differing": 0, "max_abs": None},
             "digest": {"calls": digests, "written": digests, "dropped": 0}}
    rec = {"event": "summary", "time": 2.0, **ident(rank, pid, world, rank),
           "gemm_calls": routed + passed, "routed": routed, "passthrough": passed,
           "fallbacks": fallbacks, "census": census, "census_overflow": 0,
           "suggested_routes": list(suggested),
           "engine": {"weight_cache": "frozen", "device_bytes": 1000 + rank, "frozen_weights": 4,
                      "cache_full": rank, "captured_calls": 0,
                      "contexts": [{"device": rank, "pci_bus": f"0000:{0x19 + rank:02X}:00.0",
                                    "routed": routed, "device_bytes": 1000 + rank}]},
             "instruments": {"routes": {"256x512": route}},
             "digests": {"written": digests, "dropped": rank, "dropped_calls": 0}}
    return json.dumps(rec)


def digest_line(i):
    return json.dumps({"event": "digest", "scheme": 2, "route": "256x512", "key": f"{i:016x}",
                       "hash": f"{i:016x}", "n": 256, "sketch": [0.0] * 8})


def write(name, lines):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        for line in lines:
            f.write(line + "\n")
    return path


def merge(*args):
    """Exit status, stdout and stderr; status 124 when the tool runs past 60 s (a hang)."""
    try:
        res = subprocess.run([sys.executable, MERGE] + [str(a) for a in args],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out"
    return res.returncode, res.stdout, res.stderr


def merge_json(*args):
    rc, out, err = merge("--json", *args)
    harness.check(rc == 0, f"minite-merge --json exit {rc}: {err}")
    return json.loads(out) if rc == 0 else None


def two_ranks():
    r0 = write("stats.0.jsonl", [
        start(0, 100),
        digest_line(1), digest_line(2),
        summary(0, 100, 30, 10, {"backward dgrad": 6, "capture": 1},
                [census_row(256, 8, 20), census_row(1024, 8, 20)],
                shadow={"calls": 2, "rel_l2_mean": 0.10, "rel_l2_max": 0.12, "max_abs": 1.0,
                        "nonfinite": 0},
                probe={"calls": 3, "rows": 6, "differing": 0, "max_abs": 0.0}, digests=2)])
    r1 = write("stats.1.jsonl", [
        start(1, 101),
        digest_line(3),
        summary(1, 101, 50, 5, {"backward dgrad": 4, "other context": 2},
                [census_row(256, 8, 15), census_row(256, 16, 40)],
                shadow={"calls": 6, "rel_l2_mean": 0.20, "rel_l2_max": 0.30, "max_abs": 0.5,
                        "nonfinite": 1},
                probe={"calls": 1, "rows": 2, "differing": 1, "max_abs": 0.25}, digests=1,
                suggested=("route 256x512", "route 1024x512"))])
    return r0, r1


def test_ranks_are_summed_with_a_breakdown():
    doc = merge_json(*two_ranks())
    t = doc["total"]
    harness.check(t == {"gemm_calls": 95, "routed": 80, "passthrough": 15}, str(t))
    harness.check(doc["fallbacks"] == {"backward dgrad": 10, "capture": 1, "other context": 2},
                  str(doc["fallbacks"]))
    harness.check(doc["processes"] == 2 and doc["world_size"] == 2 and doc["missing_ranks"] == []
                  and doc["repeated_ranks"] == [] and doc["without_summary"] == [], str(doc))
    ranks = doc["ranks"]
    harness.check([r["rank"] for r in ranks] == [0, 1], str(ranks))
    harness.check(ranks[1]["routed"] == 50 and ranks[1]["fallbacks"] == 6 and
                  ranks[1]["device"] == 1 and ranks[1]["pci_bus"] == "0000:1A:00.0" and
                  ranks[1]["probe_differing"] == 1 and ranks[1]["digests_written"] == 1,
                  str(ranks[1]))
    harness.check(ranks[0]["contexts"][0]["routed"] == 30, str(ranks[0]["contexts"]))
    harness.check(doc["engine"]["device_bytes"] == 2001 and doc["engine"]["cache_full"] == 1
                  and doc["engine"]["frozen_weights"] == 8, str(doc["engine"]))
    harness.check(doc["digests"] == {"written": 3, "dropped": 1, "dropped_calls": 0,
                                     "records": 3}, str(doc["digests"]))


def test_one_census_over_ranks():
    doc = merge_json(*two_ranks())
    c = doc["census"]
    harness.check([(r["m"], r["n"], r["count"]) for r in c] ==
                  [(256, 16, 40), (256, 8, 35), (1024, 8, 20)], str(c))
    harness.check(all("batch" not in r for r in c), "batch 1 is not shown")
    harness.check(doc["suggested_routes"] == [{"route": "route 256x512", "processes": 2},
                                              {"route": "route 1024x512", "processes": 1}],
                  str(doc["suggested_routes"]))


def test_census_role_is_carried():
    a = write("role.0.jsonl", [start(0, 300), summary(0, 300, 5, 1, {}, [
        census_row(256, 8, 5, role="forward"), census_row(512, 8, 2, ops="NN", role="dgrad")])])
    b = write("role.1.jsonl", [start(1, 301), summary(1, 301, 5, 1, {}, [
        census_row(256, 8, 3), census_row(64, 4, 1)])])
    doc = merge_json(a, b)
    roles = {(r["m"], r["ops"]): r.get("role") for r in doc["census"]}
    harness.check(roles == {(256, "TN"): "forward", (512, "NN"): "dgrad", (64, "TN"): None},
                  f"a row's role from the file that names one, none where none does: {roles}")
    rc, out, err = merge(a, b)
    harness.check(rc == 0 and "m=256 n=8 k=512 bf16*bf16->bf16  (forward)" in out, out + err)


def test_instruments_over_ranks():
    doc = merge_json(*two_ranks())
    r = doc["routes"]["256x512"]
    sh, pr = r["shadow"], r["probe"]
    harness.check(sh["calls"] == 8 and abs(sh["rel_l2_mean"] - (2 * 0.10 + 6 * 0.20) / 8) < 1e-12
                  and sh["rel_l2_max"] == 0.30 and sh["max_abs"] == 1.0 and sh["nonfinite"] == 1,
                  f"shadow weighted by calls, maxima kept: {sh}")
    harness.check(pr == {"calls": 4, "rows": 8, "differing": 1, "max_abs": 0.25}, str(pr))
    harness.check(r["digest"]["written"] == 3, str(r["digest"]))


def test_shared_file_missing_and_repeated_ranks():
    # one path for every rank (no %r): processes appended; world 4, rank 2 absent, rank 1 twice,
    # rank 3 without a summary (killed)
    shared = write("shared.jsonl", [
        start(0, 200, world=4), start(1, 201, world=4),
        summary(1, 201, 5, 0, {}, [census_row(256, 8, 5)], world=4),
        summary(0, 200, 7, 1, {}, [census_row(256, 8, 8)], world=4),
        start(3, 203, world=4), "{\"event\": \"summ",  # a truncated line
    ])
    other = write("late.jsonl", [start(1, 301, world=4),
                                 summary(1, 301, 2, 0, {}, [census_row(256, 8, 2)], world=4)])
    doc = merge_json(shared, other)
    harness.check(doc["processes"] == 4 and doc["world_size"] == 4, str(doc["processes"]))
    harness.check(doc["missing_ranks"] == [2] and doc["repeated_ranks"] == [1] and
                  doc["without_summary"] == [3], str(doc))
    harness.check(doc["total"]["routed"] == 14 and doc["census"][0]["count"] == 15, str(doc))
    harness.check(doc["skipped_lines"][shared] == 1, str(doc["skipped_lines"]))
    rc, out, err = merge(shared, other)
    harness.check(rc == 0 and "missing ranks (1): 2" in out and "several processes: 1" in out and
                  "no summary" in out and "1 lines skipped" in out, out + err)


def test_a_world_of_a_billion_ranks():
    # a launcher's WORLD_SIZE may be anything the shim reads (9 digits): the first 1000 missing
    # ranks listed and their number, at once
    path = write("billion.jsonl", [start(0, 500, world=999999999),
                                   summary(0, 500, 1, 0, {}, [], world=999999999)])
    doc = merge_json(path)
    harness.check(doc["missing_rank_count"] == 999999998 and
                  doc["missing_ranks"] == list(range(1, 1001)), str(doc["missing_rank_count"]))
    rc, out, err = merge(path)
    harness.check(rc == 0 and "missing ranks (999999998): 1, 2," in out and
                  "1000 and 999998998 more" in out, out + err)


def test_refusals_and_usage():
    r0, _ = two_ranks()
    other = write("other-fp.jsonl", [start(1, 400, fingerprint="fedcba9876543210",
                                           spec="nvfp4-tensor")])
    rc, out, err = merge(r0, other)
    harness.check(rc == 3 and "nvfp4-tensor" in err and "fedcba9876543210" in err and FP in err,
                  f"exit {rc}: {err}")
    nostart = write("nostart.jsonl", [summary(0, 1, 1, 0, {}, [])])
    rc, out, err = merge(nostart)
    harness.check(rc == 3 and "no start record" in err, f"exit {rc}: {err}")
    rc, out, err = merge(os.path.join(TMP, "absent.jsonl"))
    harness.check(rc == 2 and "cannot read" in err, f"exit {rc}: {err}")
    rc, out, err = merge()
    harness.check(rc == 2, f"no file: exit {rc}")


def test_fifo_and_devices_are_refused_at_once():
    r0, _ = two_ranks()
    fifo = os.path.join(TMP, "stats.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    for other, kind in ((fifo, "a FIFO or pipe"), ("/dev/zero", "a character device"),
                        (TMP, "a directory")):
        rc, out, err = merge(r0, other)
        harness.check(rc == 2 and "cannot read" in err and kind in err,
                      f"{other}: exit {rc}: {err}")


def test_values_are_escaped_and_shortened_in_the_table():
    forged = "x\nrank  forged\x1b[31m\x9b"
    hostile = {"role": forged, "spec": "s" * 5000, "host": "h" * 3000}
    summ = dict(json.loads(summary(0, 500, 1, 0, {"r\neason\x1b" + "e" * 3000: 1},
                                   [census_row(256, 8, 1, entry="e\x1b[2J" + "n" * 3000)])),
                **hostile)
    lines = [start(0, 500, **hostile), json.dumps(summ)]
    path = write("hostile.jsonl", lines)
    rc, out, err = merge(path)
    harness.check(rc == 0 and err == "", f"exit {rc}: {err}")
    harness.check("\x1b" not in out and "\x9b" not in out and "x\\nrank" in out and
                  "fallback r\\neason\\x1b" in out and "e\\x1b[2J" in out, out[:800])
    harness.check(len(out) < 4000 and "(5000 characters)" in out and
                  "(3008 characters)" in out and "(3005 characters)" in out,
                  f"{len(out)} characters: {out[:800]}")
    harness.check(not any(line.startswith("rank  forged") for line in out.split("\n")), out[:800])


def test_table():
    rc, out, err = merge(*two_ranks())
    harness.check(rc == 0 and err == "", f"exit {rc}: {err}")
    harness.check("2 processes, world size 2" in out and "total: 95 GEMM calls, 80 routed" in out
                  and "fallback backward dgrad: 10" in out and "0000:1A:00.0" in out and
                  "census (all ranks)" in out and "route 256x512: shadow 8 calls" in out, out)


def strict_json(text):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(word):
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_not_finite_shadow_figures_stay_not_finite():
    # the shim writes rel_l2_mean and rel_l2_max as null when they are not finite (an infinite
    # relative error): over calls > 0 the merged figure is not finite too, whatever the order
    inf_shadow = {"calls": 2, "rel_l2_mean": None, "rel_l2_max": None, "max_abs": None,
                  "nonfinite": 0}
    finite = {"calls": 6, "rel_l2_mean": 0.20, "rel_l2_max": 0.30, "max_abs": 0.5,
              "nonfinite": 0}
    idle = {"calls": 0, "rel_l2_mean": None, "rel_l2_max": None, "max_abs": None,
            "nonfinite": 0}
    for order, shadows in (("null first", (inf_shadow, finite)),
                           ("null last", (finite, inf_shadow))):
        paths = [write(f"inf-{order[5:]}.{rank}.jsonl",
                       [start(rank, 500 + rank), summary(rank, 500 + rank, 1, 0, {}, [],
                                                        shadow=sh)])
                 for rank, sh in enumerate(shadows)]
        doc = merge_json(*paths)
        sh = doc["routes"]["256x512"]["shadow"] if doc else {}
        harness.check(sh.get("calls") == 8 and sh.get("rel_l2_mean") is None and
                      sh.get("rel_l2_max") is None and sh.get("max_abs") is None,
                      f"{order}: not finite stays null: {sh}")
        rc, out, err = merge(*paths)
        harness.check(rc == 0 and "rel_l2 mean not finite max not finite" in out,
                      f"{order}: table:\n{out}{err}")
    # a process without shadow calls adds nothing, null or not; the mean weights calls
    paths = [write(f"idle.{rank}.jsonl", [start(rank, 600 + rank),
                                          summary(rank, 600 + rank, 1, 0, {}, [], shadow=sh)])
             for rank, sh in enumerate((idle, finite, dict(finite, calls=2, rel_l2_mean=0.1)))]
    doc = merge_json(*paths)
    sh = doc["routes"]["256x512"]["shadow"] if doc else {}
    harness.check(sh.get("calls") == 8 and abs(sh["rel_l2_mean"] - (6 * 0.2 + 2 * 0.1) / 8) < 1e-12
                  and sh["rel_l2_max"] == 0.30, f"idle process: {sh}")


def test_mistyped_records_are_skipped_and_counted():
    # each a record the shim does not write: skipped and counted with the lines, never a
    # traceback, and --json stays JSON; rank 0 (good) is merged alone
    good = summary(1, 701, 5, 0, {}, [census_row(256, 8, 5)])
    cases = {
        "fallbacks list": good.replace('"fallbacks": {}', '"fallbacks": [3]'),
        "route null": json.dumps(dict(json.loads(good),
                                      instruments={"routes": {"1536x2048": None}})),
        "census types list": summary(1, 701, 5, 0, {}, [census_row(256, 8, 5, types=["bf16"])]),
        "suggested list": summary(1, 701, 5, 0, {}, [], suggested=(["route 256x512"],)),
        "gemm_calls NaN": good.replace('"gemm_calls": 5', '"gemm_calls": NaN'),
        "count Infinity": summary(1, 701, 5, 0, {}, [census_row(256, 8, 5)]).replace(
            '"count": 5', '"count": Infinity'),
        "calls 10**400": good.replace('"gemm_calls": 5', '"gemm_calls": 1' + "0" * 400),
    }
    for i, (name, bad) in enumerate(cases.items()):
        harness.check(bad != good, f"{name}: the case changes the record")
        shared = write(f"mistyped.{i}.jsonl", [start(0, 700), summary(0, 700, 7, 1, {}, []),
                                               start(1, 701), bad])
        rc, out, err = merge("--json", shared)
        harness.check(rc == 0 and "Traceback" not in err, f"{name}: exit {rc}: {err[-300:]}")
        try:
            doc = strict_json(out)
        except ValueError as e:
            harness.check(False, f"{name}: --json is not JSON ({e}): {out[:200]}")
            continue
        harness.check(doc["skipped_lines"][shared] == 1 and doc["without_summary"] == [1] and
                      doc["total"]["gemm_calls"] == 8, f"{name}: {doc['skipped_lines']} "
                      f"{doc['without_summary']} {doc['total']}")
    # a start record of a wrong type: that process is not read (its summary neither)
    host_list = write("mistyped-host.jsonl", [
        start(0, 710), summary(0, 710, 7, 1, {}, []),
        start(1, 711, host=["h"]), summary(1, 711, 5, 0, {}, []).replace('"host": "h"',
                                                                          '"host": ["h"]')])
    rc, out, err = merge("--json", host_list)
    harness.check(rc == 0 and "Traceback" not in err, f"host list: exit {rc}: {err[-300:]}")
    doc = strict_json(out) if rc == 0 else {}
    harness.check(doc.get("processes") == 1 and doc.get("skipped_lines") == {host_list: 2},
                  f"host list: {doc}")
    rc, out, err = merge(host_list)
    harness.check(rc == 0 and "2 lines skipped (not JSON, or fields of a wrong type)" in out,
                  f"table:\n{out}{err}")


def test_deeply_nested_line_is_skipped():
    nested = write("nested.jsonl", [start(0, 800, world=1), "[" * 100000,
                                    summary(0, 800, 3, 0, {}, [], world=1)])
    rc, out, err = merge("--json", nested)
    harness.check(rc == 0 and "Traceback" not in err, f"exit {rc}: {err[-300:]}")
    doc = json.loads(out) if rc == 0 else {}
    harness.check(doc.get("skipped_lines") == {nested: 1} and doc["total"]["routed"] == 3,
                  str(doc)[:300])


def test_the_same_file_twice_is_read_once():
    r0, r1 = two_ranks()
    link = os.path.join(TMP, "stats.0.link.jsonl")
    if not os.path.lexists(link):
        os.symlink(r0, link)
    again = os.path.join(TMP, ".", os.path.basename(r0))
    rc, out, err = merge("--json", r0, r1, again, link, r1)
    harness.check(rc == 0, f"exit {rc}: {err}")
    doc = json.loads(out) if rc == 0 else {}
    harness.check(doc.get("processes") == 2 and doc["total"]["gemm_calls"] == 95 and
                  doc["repeated_ranks"] == [] and list(doc["skipped_lines"]) == [r0, r1],
                  f"one read each: {str(doc)[:300]}")
    harness.check(err.count("minite-merge: ") == 1 and again in err and link in err and
                  "read once" in err, f"one note on stderr: {err}")
    rc, out, err = merge(r0, r1)
    harness.check(rc == 0 and err == "", f"distinct files: no note: {err}")


for t in (test_ranks_are_summed_with_a_breakdown, test_one_census_over_ranks,
          test_census_role_is_carried, test_instruments_over_ranks,
          test_shared_file_missing_and_repeated_ranks,
          test_refusals_and_usage, test_fifo_and_devices_are_refused_at_once,
          test_values_are_escaped_and_shortened_in_the_table, test_table,
          test_not_finite_shadow_figures_stay_not_finite,
          test_mistyped_records_are_skipped_and_counted, test_deeply_nested_line_is_skipped,
          test_the_same_file_twice_is_read_once, test_a_world_of_a_billion_ranks):
    harness.run(t)
sys.exit(harness.done())
