"""test_gap_report.py — tools/gap-report and the minite-logprobs format (tools/logprobs.py) on
small log-prob files that each test writes: metrics against values computed by hand, the RL
frameworks' ones too, under their names (the per-sequence ones on sequences of unequal lengths,
where a mean over tokens differs; inf and nan null in --json), truncated and corrupt lines
skipped and counted, refusals (tokens that differ, a wrong header, a newer version, swapped
files, different models) with exit status 3, usage errors with 2, --json that parses, a PNG
(magic bytes) for one run and for several; lines nested too deep, headers without a spec,
log-probs far apart (exp and sums beyond a double) and above 0, a checksum beyond a double.
"""
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import harness  # noqa: E402
import logprobs  # noqa: E402

GAP_REPORT = os.path.join(ROOT, "tools", "gap-report")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = {"name": "test", "layers": 2, "seed": 0, "checksum": 123.25}
TMP = harness.temp_dir("mt-gap-report-")
DROP = object()                   # a header field left out

# Two sequences of two tokens. Sampler log-probs -1..-4; the learner's differ by
# r = lp_learner - lp_sampler = 0, ln 1.5, -ln 4, ln 3, so the importance ratios are
# 1, 1.5, 1/4, 3 (none near the bounds 2 and 1/2, where rounding would decide).
LN15, LN3, LN4 = math.log(1.5), math.log(3.0), math.log(4.0)
TOKENS = {0: [11, 12], 1: [13, 14]}
PROMPTS = {0: [1, 2, 3], 1: [4, 5, 6]}
LP_SAMPLER = {0: [-1.0, -2.0], 1: [-3.0, -4.0]}
R = {0: [0.0, LN15], 1: [-LN4, LN3]}
LP_LEARNER = {k: [s + r for s, r in zip(LP_SAMPLER[k], R[k])] for k in TOKENS}

W = [1.0, 1.5, 0.25, 3.0]
W_MEAN = sum(W) / 4                                           # 1.4375
EXPECTED = {
    "tokens": 4,
    "abs_dlogp_mean": (LN15 + LN3 + LN4) / 4,
    "abs_dlogp_p50": (LN15 + LN3) / 2,                        # |r| sorted: 0, ln1.5, ln3, ln4
    "abs_dlogp_p99": LN3 + 0.97 * (LN4 - LN3),                # position 2.97 of 0..3
    "abs_dlogp_max": LN4,
    "dlogp_mean": (LN15 - LN4 + LN3) / 4,
    "kl": -(LN15 - LN4 + LN3) / 4,                            # mean(lp_s - lp_l)
    "k3_kl": (0.0 + (1.5 - LN15 - 1) + (0.25 + LN4 - 1) + (3 - LN3 - 1)) / 4,  # mean(w - r - 1)
    "ratio_mean": W_MEAN,
    "ratio_std": math.sqrt(sum((w - W_MEAN) ** 2 for w in W) / 4),
    "ratio_min": 0.25,
    "ratio_max": 3.0,
    "ess": W_MEAN ** 2 / (sum(w * w for w in W) / 4),         # 1 / mean((w / mean w)^2)
    "ratio_above_2": 0.25,                                    # 3
    "ratio_below_half": 0.25,                                 # 1/4
}


# verl's metrics of the same files, worked out here from verl's definitions. Per sequence: mean
# log-probs (learner's, sampler's) (-3 + ln1.5)/2, -1.5 and (-7 - ln4 + ln3)/2, -3.5, so
# d = mean lp_sampler - mean lp_learner = -ln1.5/2, (ln4 - ln3)/2; sums of r ln1.5, ln(3/4).
# The TIS weights truncated at 2 are 1, 1.5, 1/4, 2.
MEAN_L = [(-3 + LN15) / 2, (-7 - LN4 + LN3) / 2]
D = [-LN15 / 2, (LN4 - LN3) / 2]
W_TIS = [1.0, 1.5, 0.25, 2.0]
P_LEARNER = [math.exp(x) for k in TOKENS for x in LP_LEARNER[k]]
P_SAMPLER = [math.exp(x) for k in TOKENS for x in LP_SAMPLER[k]]
PROB_DIFFS = [abs(a - b) for a, b in zip(P_LEARNER, P_SAMPLER)]
EXPECTED_VERL = {
    "rollout_corr/kl": EXPECTED["kl"],
    "rollout_corr/k3_kl": EXPECTED["k3_kl"],
    "rollout_corr/training_log_ppl": -(MEAN_L[0] + MEAN_L[1]) / 2,
    "rollout_corr/training_ppl": (math.exp(-MEAN_L[0]) + math.exp(-MEAN_L[1])) / 2,
    "rollout_corr/rollout_log_ppl": 2.5,
    "rollout_corr/rollout_ppl": (math.exp(1.5) + math.exp(3.5)) / 2,
    "rollout_corr/log_ppl_diff": (D[0] + D[1]) / 2,
    "rollout_corr/log_ppl_abs_diff": (-D[0] + D[1]) / 2,
    "rollout_corr/log_ppl_diff_max": D[1],
    "rollout_corr/log_ppl_diff_min": D[0],
    "rollout_corr/ppl_ratio": (1.5 ** -0.5 + (4 / 3) ** 0.5) / 2,     # mean of exp(d)
    "rollout_corr/chi2_token": (1 + 2.25 + 1 / 16 + 9) / 4 - 1,        # mean(w^2) - 1
    "rollout_corr/chi2_seq": (1.5 ** 2 + 0.75 ** 2) / 2 - 1,           # mean(exp(2 sum r)) - 1
    "rollout_corr/rollout_is_mean": 4.75 / 4,
    "rollout_corr/rollout_is_max": 2.0,
    "rollout_corr/rollout_is_min": 0.25,
    "rollout_corr/rollout_is_std": statistics.pstdev(W_TIS),
    "rollout_corr/rollout_is_eff_sample_size":
        1 / (sum((w / (4.75 / 4 + 1e-8)) ** 2 for w in W_TIS) / 4),
    "rollout_corr/rollout_is_ratio_fraction_high": 0.25,              # 3 before truncation
    "rollout_corr/rollout_is_ratio_fraction_low": 0.25,               # 1/4
    "training/rollout_probs_diff_max": max(PROB_DIFFS),
    "training/rollout_probs_diff_mean": sum(PROB_DIFFS) / 4,
    "training/rollout_probs_diff_std": statistics.stdev(PROB_DIFFS),  # n - 1, as torch.std
    "training/rollout_actor_probs_pearson_corr": statistics.correlation(P_LEARNER, P_SAMPLER),
}

# NeMo-RL's, from its definitions (its GRPO guide, "Metrics"); the Jensen-Shannon term the
# plain way, against the mixture of the two probabilities
RS = [x for k in TOKENS for x in R[k]]


def js_plain(p, q):
    m = math.log((p + q) / 2)
    return (math.exp(math.log(p) - m) - (math.log(p) - m) - 1 +
            math.exp(math.log(q) - m) - (math.log(q) - m) - 1) / 2


EXPECTED_NEMO_RL = {
    "train/token_mult_prob_error": (1 + 1.5 + 4 + 3) / 4,             # mean(exp(|r|))
    "train/gen_kl_error": EXPECTED["k3_kl"],
    "train/policy_kl_error": sum(math.exp(-x) - 1 + x for x in RS) / 4,
    "train/js_divergence_error": sum(js_plain(p, q) for p, q in zip(P_LEARNER, P_SAMPLER)) / 4,
}
EXPECTED_SLIME = {"train/train_rollout_logprob_abs_diff": (LN15 / 2 + (LN4 + LN3) / 2) / 2}


def path(name):
    return os.path.join(TMP, name)


def write(name, role, lps, tokens=TOKENS, model=MODEL, spec="nvfp4-row", extra_lines=(),
          header=None):
    with open(path(name), "w") as f:
        if header is not None:
            f.write(header + "\n")
        else:
            logprobs.write_header(f, role, spec, model, 0)
        for seq in sorted(lps):
            logprobs.write_seq(f, seq, tokens[seq], lps[seq], prompt=PROMPTS.get(seq, [0]))
        for line in extra_lines:
            f.write(line)
    return path(name)


def gap_report(*args):
    res = subprocess.run([sys.executable, GAP_REPORT] + [str(a) for a in args],
                         capture_output=True, text=True)
    return res.returncode, res.stdout, res.stderr


def report_json(*args):
    rc, out, err = gap_report("--json", *args)
    harness.check(rc == 0, f"gap-report --json exit {rc}: {err}")
    return json.loads(out) if rc == 0 else None


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def pair():
    return (write("learner.jsonl", "learner", LP_LEARNER),
            write("sampler.jsonl", "sampler", LP_SAMPLER))


def test_metrics_match_hand_computed_values():
    doc = report_json(*pair())
    run = doc["runs"][0]
    for key, want in EXPECTED.items():
        got = run["metrics"][key]
        harness.check(close(got, want), f"{key}: got {got!r}, expected {want!r}")
    harness.check(run["label"] == "nvfp4-row", f"label {run['label']!r}")
    harness.check(run["counts"]["sequences"] == 2, str(run["counts"]))
    harness.check(all(v == 0 for k, v in run["counts"].items() if k != "sequences"),
                  f"nothing should be skipped: {run['counts']}")


def check_framework(run, key, expected, rel_tol=1e-12):
    got = (run or {}).get(key) or {}
    harness.check(set(got) == set(expected),
                  f"{key} keys: missing {sorted(set(expected) - set(got))}, "
                  f"unexpected {sorted(set(got) - set(expected))}")
    for name, want in expected.items():
        value = got.get(name)
        harness.check(isinstance(value, float) and
                      math.isclose(value, want, rel_tol=rel_tol, abs_tol=1e-15),
                      f"{key} {name}: got {value!r}, expected {want!r}")


def test_verl_metrics_match_hand_computed_values():
    run = report_json(*pair())["runs"][0]
    check_framework(run, "verl", EXPECTED_VERL)
    # the untruncated ratio rows are not verl's rollout_is_* (truncated at 2)
    ratio_max = run["metrics"]["ratio_max"]
    harness.check(close(ratio_max, 3.0), f"ratio max {ratio_max}")


def test_nemo_rl_and_slime_metrics_match_hand_computed_values():
    run = report_json(*pair())["runs"][0]
    check_framework(run, "nemo_rl", EXPECTED_NEMO_RL)
    check_framework(run, "slime", EXPECTED_SLIME)


def test_per_sequence_metrics_keep_sequence_boundaries():
    # one sequence of 1 token and one of 3: a mean over sequences is not the mean over tokens
    tokens = {0: [21], 1: [22, 23, 24]}
    lp_s = {0: [-0.5], 1: [-1.0, -1.0, -1.0]}
    lp_l = {0: [-0.2], 1: [-1.0, -1.0, -1.6]}                # r = 0.3; 0, 0, -0.6
    files = (write("learner-lens.jsonl", "learner", lp_l, tokens=tokens),
             write("sampler-lens.jsonl", "sampler", lp_s, tokens=tokens))
    run = report_json(*files)["runs"][0]
    verl = run["verl"]
    d = [-0.3, 0.2]                                          # mean lp_s - mean lp_l per sequence
    want = {
        "rollout_corr/rollout_log_ppl": (0.5 + 1.0) / 2,     # tokens: 3.5 / 4
        "rollout_corr/training_log_ppl": (0.2 + 3.6 / 3) / 2,
        "rollout_corr/training_ppl": (math.exp(0.2) + math.exp(1.2)) / 2,
        "rollout_corr/log_ppl_diff": sum(d) / 2,
        "rollout_corr/log_ppl_diff_max": 0.2,
        "rollout_corr/ppl_ratio": (math.exp(-0.3) + math.exp(0.2)) / 2,
        "rollout_corr/chi2_seq": (math.exp(0.6) + math.exp(-1.2)) / 2 - 1,
        "rollout_corr/kl": 0.3 / 4,                          # a mean over tokens
    }
    for name, value in want.items():
        harness.check(math.isclose(verl.get(name, math.nan), value, rel_tol=1e-9),
                      f"{name}: got {verl.get(name)!r}, expected {value!r}")
    slime = run["slime"]["train/train_rollout_logprob_abs_diff"]      # tokens: 0.9 / 4
    harness.check(math.isclose(slime, (0.3 + 0.6 / 3) / 2, rel_tol=1e-9), f"slime {slime!r}")


def test_table_names_every_metric():
    rc, out, err = gap_report(*pair(), "--label", "mine")
    harness.check(rc == 0, f"exit {rc}: {err}")
    for title in ("|dlogp| mean", "|dlogp| p99", "|dlogp| max", "KL", "k3 KL", "ratio mean",
                  "ratio std", "ratio min", "ratio max", "ESS", "ratio > 2 share", "mine"):
        harness.check(title in out, f"table lacks {title!r}:\n{out}")
    harness.check("0.25" in out, f"ratio > 2 share 0.25 not shown:\n{out}")
    for name in (*EXPECTED_VERL, *EXPECTED_NEMO_RL, *EXPECTED_SLIME):
        harness.check(any(line.split()[:1] == [name] for line in out.splitlines()),
                      f"table lacks {name}:\n{out}")
    for title in ("verl:", "NeMo-RL:", "slime:"):
        harness.check(title in out.splitlines(), f"table lacks the section {title}\n{out}")


def test_truncated_and_corrupt_lines_are_skipped_and_counted():
    bad = [
        '{"seq": 5, "tokens": [1, 2], "logprobs": [-1.0\n',            # truncated
        "\xff\xfe not json at all\n",                                  # garbage
        '{"seq": 6, "tokens": [1, 2], "logprobs": [-1.0]}\n',          # lengths differ
        '{"seq": 7, "tokens": "12", "logprobs": [-1.0, -2.0]}\n',      # tokens not a list
        '{"seq": -1, "tokens": [1], "logprobs": [-1.0]}\n',            # bad seq
        '[1, 2, 3]\n',                                                 # not an object
        '{"seq": 8, "tokens": [1], "logprobs": ["x"]}\n',              # logprob not a number
        '{"seq": 0, "tokens": [11, 12], "logprobs": [-9.0, -9.0]}\n',  # duplicate: first kept
        '{"seq": 9, "tokens": [1], "logprobs": [-1.0]',                # last line cut short
    ]
    learner = write("learner-bad.jsonl", "learner", LP_LEARNER, extra_lines=bad)
    sampler = write("sampler-more.jsonl", "sampler", {**LP_SAMPLER, 3: [-1.0]},
                    tokens={**TOKENS, 3: [7]})
    doc = report_json(learner, sampler)
    run = doc["runs"][0]
    c = run["counts"]
    harness.check(c["corrupt_lines_learner"] == 8, f"corrupt lines counted: {c}")
    harness.check(c["duplicate_lines"] == 1, f"duplicates counted: {c}")
    harness.check(c["corrupt_lines_sampler"] == 0, f"sampler corrupt: {c}")
    harness.check(c["sequences_only_sampler"] == 1 and c["sequences_only_learner"] == 0,
                  f"missing sequences counted: {c}")
    for key, want in EXPECTED.items():
        harness.check(close(run["metrics"][key], want),
                      f"{key} changed by skipped lines: {run['metrics'][key]!r} vs {want!r}")
    rc, out, err = gap_report(learner, sampler)
    harness.check(rc == 0 and "corrupt lines learner 8" in out, f"table notes skips:\n{out}")
    harness.check("line" in err and "truncated or corrupt" in err, f"stderr names lines: {err}")


def test_reader_never_raises_on_bad_lines():
    junk = ["{}\n", "null\n", "\n", "{\"seq\":\n", "\x00\x01\x02\n", "1e999\n"]
    name = write("junk.jsonl", "sampler", {}, extra_lines=junk)
    f = logprobs.read(name)
    harness.check(f.seqs == {}, f"no sequence should be read: {f.seqs}")
    harness.check(f.corrupt == 5, f"5 corrupt lines (the blank one is ignored), got {f.corrupt}")


def test_nonfinite_logprobs_are_counted_not_used():
    lps = {0: [LP_LEARNER[0][0], float("nan")], 1: LP_LEARNER[1]}
    learner = write("learner-nan.jsonl", "learner", lps)
    with open(learner) as f:
        harness.check("null" in f.read(), "a NaN log-prob is written as null")
    doc = report_json(learner, path("sampler.jsonl"))
    run = doc["runs"][0]
    harness.check(run["counts"]["nonfinite_tokens"] == 1, f"counts {run['counts']}")
    harness.check(run["metrics"]["tokens"] == 3, f"3 finite pairs, got {run['metrics']['tokens']}")


def test_mismatched_tokens_are_refused():
    learner = write("learner-other.jsonl", "learner", LP_LEARNER, tokens={0: [11, 99], 1: [13, 14]})
    rc, out, err = gap_report(learner, path("sampler.jsonl"))
    harness.check(rc == 3, f"exit {rc}, expected 3")
    harness.check("sequence 0" in err and "position 1" in err, f"message names the place: {err}")
    harness.check("--logprobs" in err, f"message says what to do: {err}")
    shorter = write("learner-short.jsonl", "learner", {0: [-1.0], 1: LP_LEARNER[1]},
                    tokens={0: [11], 1: [13, 14]})
    rc, out, err = gap_report(shorter, path("sampler.jsonl"))
    harness.check(rc == 3 and "1 tokens in the learner's" in err, f"exit {rc}: {err}")


def test_wrong_headers_are_refused():
    sampler = path("sampler.jsonl")
    cases = {
        "other-format.jsonl": '{"format": "something-else", "version": 1, "role": "learner"}',
        "csv.jsonl": "seq,token,logprob",
        "no-version.jsonl": '{"format": "minite-logprobs", "role": "learner"}',
        "bad-role.jsonl": '{"format": "minite-logprobs", "version": 1, "role": "critic"}',
    }
    for name, header in cases.items():
        f = write(name, "learner", LP_LEARNER, header=header)
        rc, out, err = gap_report(f, sampler)
        harness.check(rc == 3, f"{name}: exit {rc}, expected 3")
        harness.check(name in err, f"{name}: message names the file: {err}")
    rc, out, err = gap_report(path("other-format.jsonl"), sampler)
    harness.check("not a minite-logprobs file" in err, f"message: {err}")
    newer = write("newer.jsonl", "learner", LP_LEARNER,
                  header='{"format": "minite-logprobs", "version": 2, "role": "learner"}')
    rc, out, err = gap_report(newer, sampler)
    harness.check(rc == 3 and "newer" in err, f"exit {rc}: {err}")
    with open(path("empty.jsonl"), "w"):
        pass
    rc, out, err = gap_report(path("empty.jsonl"), sampler)
    harness.check(rc == 3 and "empty" in err, f"exit {rc}: {err}")
    rc, out, err = gap_report(path("does-not-exist.jsonl"), sampler)
    harness.check(rc == 3 and "cannot read" in err, f"exit {rc}: {err}")


def test_swapped_files_and_different_models_are_refused():
    learner, sampler = pair()
    rc, out, err = gap_report(sampler, learner)
    harness.check(rc == 3 and "swap" in err, f"swapped: exit {rc}: {err}")
    other = write("learner-4layers.jsonl", "learner", LP_LEARNER, model=dict(MODEL, layers=4))
    rc, out, err = gap_report(other, sampler)
    harness.check(rc == 3 and "different models" in err and "layers" in err,
                  f"models: exit {rc}: {err}")
    drift = write("learner-drift.jsonl", "learner", LP_LEARNER, model=dict(MODEL, checksum=124.0))
    rc, out, err = gap_report(drift, sampler)
    harness.check(rc == 3 and "checksum" in err, f"checksum: exit {rc}: {err}")


def test_no_token_in_common_is_refused():
    learner = write("learner-disjoint.jsonl", "learner", {5: [-1.0]}, tokens={5: [1]})
    rc, out, err = gap_report(learner, path("sampler.jsonl"))
    harness.check(rc == 3 and "no finite token in common" in err, f"exit {rc}: {err}")


def test_usage_errors_exit_2():
    learner, sampler = pair()
    for args in ([], [learner], [learner, sampler, sampler],
                 ["--runs", "no-colons"], ["--runs", f"a:{learner}"],
                 [learner, sampler, "--runs", f"a:{learner}:{sampler}"],
                 ["--runs", f"a:{learner}:{sampler}", f"a:{learner}:{sampler}"]):
        rc, out, err = gap_report(*args)
        harness.check(rc == 2, f"{args}: exit {rc}, expected 2 ({err.strip()[-120:]})")


def test_several_runs_in_one_report():
    learner, sampler = pair()
    same = write("learner-same.jsonl", "learner", LP_SAMPLER)
    doc = report_json("--runs", f"gap:{learner}:{sampler}", f"zero:{same}:{sampler}")
    labels = [r["label"] for r in doc["runs"]]
    harness.check(labels == ["gap", "zero"], f"labels {labels}")
    zero = doc["runs"][1]["metrics"]
    harness.check(zero["abs_dlogp_max"] == 0 and zero["kl"] == 0 and zero["ess"] == 1.0,
                  f"identical files: {zero}")
    harness.check(close(doc["runs"][0]["metrics"]["kl"], EXPECTED["kl"]), "first run's KL")
    rc, out, err = gap_report("--runs", f"gap:{learner}:{sampler}", f"zero:{same}:{sampler}")
    header = out.splitlines()[0] if out else ""
    harness.check(rc == 0 and "gap" in header and "zero" in header, f"table columns:\n{out}")


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        harness.check(False, "matplotlib is missing: pip install -r tests/requirements.txt")
        return False
    return True


def is_png(name):
    try:
        with open(name, "rb") as f:
            return f.read(8) == PNG_MAGIC
    except OSError:
        return False


def test_png_is_written():
    if not require_matplotlib():
        return
    learner, sampler = pair()
    one = path("one.png")
    rc, out, err = gap_report(learner, sampler, "--png", one)
    harness.check(rc == 0, f"exit {rc}: {err}")
    harness.check(is_png(one), f"{one} is not a PNG")
    several = path("several.png")
    same = write("learner-same.jsonl", "learner", LP_SAMPLER)
    doc = report_json("--png", several, "--runs", f"gap:{learner}:{sampler}",
                      f"zero:{same}:{sampler}")
    harness.check(is_png(several), f"{several} is not a PNG")
    harness.check(doc is not None and doc.get("png") == several, f"JSON names the PNG: {doc}")
    rc, out, err = gap_report(learner, sampler, "--png", path("no-such-dir/x.png"))
    harness.check(rc == 4, f"unwritable PNG: exit {rc}, expected 4 ({err})")


def test_writer_and_reader_round_trip():
    name = path("round.jsonl")
    with open(name, "w") as f:
        logprobs.write_header(f, "sampler", None, MODEL, 7, sizes={"batch": 1})
        logprobs.write_seq(f, 3, [5, 6, 7], [-0.5, float("-inf"), -1.25], prompt=[1, 2])
    got = logprobs.read(name)
    harness.check(got.header["spec"] == "none" and got.header["seed"] == 7, str(got.header))
    harness.check(got.header["sizes"] == {"batch": 1}, "extra header keys kept")
    s = got.seqs.get(3)
    harness.check(s is not None and s.tokens == [5, 6, 7] and s.prompt == [1, 2], "sequence")
    harness.check(s.logprobs[0] == -0.5 and math.isnan(s.logprobs[1]) and
                  s.logprobs[2] == -1.25, f"log-probs {s.logprobs}")
    harness.check(got.corrupt == 0 and got.duplicates == 0, "nothing skipped")


def strict_json(text):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(word):
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_deeply_nested_lines_are_not_json():
    nested = write("nested.jsonl", "sampler", LP_SAMPLER, extra_lines=["[" * 100000 + "\n"])
    f = logprobs.read(nested)
    harness.check(f.corrupt == 1 and sorted(f.seqs) == [0, 1], f"corrupt {f.corrupt}")
    header = write("nested-header.jsonl", "learner", LP_LEARNER, header="[" * 100000)
    rc, out, err = gap_report(header, path("sampler.jsonl"))
    harness.check(rc == 3 and "not JSON" in err and "Traceback" not in err,
                  f"exit {rc}: {err[-300:]}")


def test_headers_without_spec_get_a_label():
    pair()
    bare = {"format": "minite-logprobs", "version": 1, "model": MODEL, "seed": 0}
    for name, specs in (("none", (DROP, DROP)), ("list", (["a"], ["a"])), ("one", (DROP, "x"))):
        files = []
        for role, lps, spec in (("learner", LP_LEARNER, specs[0]),
                                ("sampler", LP_SAMPLER, specs[1])):
            head = dict(bare, role=role) if spec is DROP else dict(bare, role=role, spec=spec)
            files.append(write(f"{role}-spec-{name}.jsonl", role, lps, header=json.dumps(head)))
        rc, out, err = gap_report(*files)
        harness.check(rc == 0 and "Traceback" not in err and "ratio mean" in out,
                      f"{name}: exit {rc}:\n{out}{err[-300:]}")
        doc = report_json(*files)
        label = doc["runs"][0]["label"] if doc else None
        harness.check(isinstance(label, str) and label, f"{name}: label {label!r}")
        if name == "none":
            harness.check(label == "run", f"no spec at all: label {label!r}")
    if require_matplotlib():
        rc, out, err = gap_report(*files, "--png", path("no-spec.png"))
        harness.check(rc == 0 and is_png(path("no-spec.png")), f"--png: exit {rc}: {err[-300:]}")


def test_extreme_logprobs_do_not_overflow():
    # finite log-probs far apart: exp(r) beyond a double makes k3 KL inf (null in --json), the
    # others stay finite; sums beyond a double are still averaged
    top = sys.float_info.max
    cases = {
        "exp overflow": ({0: [-1.0, -1.0]}, {0: [-750.0, -1.0]}),
        "sum overflow": ({0: [-1.7e308, -1.7e308]}, {0: [-0.5, -0.5]}),
        "max of a double": ({0: [-top] * 3}, {0: [0.0] * 3}),
    }
    for name, (lp_l, lp_s) in cases.items():
        tokens = {0: list(range(11, 11 + len(lp_l[0])))}
        files = (write(f"learner-{name[:3]}.jsonl", "learner", lp_l, tokens=tokens),
                 write(f"sampler-{name[:3]}.jsonl", "sampler", lp_s, tokens=tokens))
        rc, out, err = gap_report("--json", *files)
        harness.check(rc == 0 and "Traceback" not in err, f"{name}: exit {rc}: {err[-300:]}")
        try:
            m = strict_json(out)["runs"][0]["metrics"]
        except (ValueError, KeyError, IndexError) as e:
            harness.check(False, f"{name}: --json is not JSON ({e}): {out[:300]}")
            continue
        r = [a - b for a, b in zip(lp_l[0], lp_s[0])]
        ratio_max = math.exp(min(max(max(r), -20.0), 20.0))
        kl = -math.fsum(x / 4 for x in r) / len(r) * 4          # quarters: no sum overflows
        harness.check(close(m["kl"], kl) and
                      close(m["abs_dlogp_max"], max(map(abs, r))) and
                      close(m["ratio_max"], ratio_max), f"{name}: {m}")
        if name == "exp overflow":
            harness.check(m["k3_kl"] is None, f"k3 KL of exp(749) is not finite: {m['k3_kl']}")
            rc, out, err = gap_report(*files)
            k3 = [line for line in out.splitlines() if line.startswith("k3 KL")]
            harness.check(rc == 0 and k3 and k3[0].split()[-1] == "inf", f"table:\n{out}{err}")
        else:
            harness.check(close(m["k3_kl"], -r[0]), f"{name}: k3 KL {m['k3_kl']}")


def table_rows(out):
    """The framework rows of a one-run table: {metric name: the value as printed}."""
    return {line.split()[0]: line.split()[-1] for line in out.splitlines()
            if line.startswith("  ") and len(line.split()) == 2}


def test_framework_metrics_beyond_a_double_are_null():
    # the learner gives its tokens the lowest log-prob a double holds, the sampler 0: the
    # learner's perplexity, ppl_ratio, exp(|r|) and exp(-r) leave a double (inf in the table,
    # null in --json); probabilities that do not vary have no correlation (nan, null); the rest
    # stay finite
    top = sys.float_info.max
    tokens = {0: [11, 12, 13]}
    files = (write("learner-top.jsonl", "learner", {0: [-top] * 3}, tokens=tokens),
             write("sampler-top.jsonl", "sampler", {0: [0.0] * 3}, tokens=tokens))
    rc, out, err = gap_report("--json", *files)
    harness.check(rc == 0 and "Traceback" not in err, f"exit {rc}: {err[-300:]}")
    run = strict_json(out)["runs"][0] if rc == 0 else {}
    verl, nemo = run.get("verl", {}), run.get("nemo_rl", {})
    for name in ("rollout_corr/training_ppl", "rollout_corr/ppl_ratio",
                 "training/rollout_actor_probs_pearson_corr"):
        harness.check(name in verl and verl[name] is None, f"{name}: {verl.get(name)!r}")
    for name in ("train/token_mult_prob_error", "train/policy_kl_error"):
        harness.check(name in nemo and nemo[name] is None, f"{name}: {nemo.get(name)!r}")
    # exp(-top) - 1 + top; the mixture is 1/2, the learner's term top - ln 2 - 1 about top
    harness.check(close(nemo.get("train/gen_kl_error") or 0.0, top) and
                  close(nemo.get("train/js_divergence_error") or 0.0, top / 2), f"{nemo}")
    harness.check(run.get("slime", {}).get("train/train_rollout_logprob_abs_diff") == top,
                  f"slime {run.get('slime')}")
    harness.check(verl.get("rollout_corr/rollout_ppl") == 1.0 and
                  verl.get("training/rollout_probs_diff_std") == 0.0, f"finite ones: {verl}")
    # the sequence's sum of r, 3 x -top, leaves a double too and clamps to -20
    harness.check(close(verl.get("rollout_corr/chi2_seq", 0.0), math.exp(-40.0) - 1.0),
                  f"chi2_seq {verl.get('rollout_corr/chi2_seq')!r}")
    rc, out, err = gap_report(*files)
    rows = table_rows(out)
    harness.check(rc == 0 and rows.get("rollout_corr/training_ppl") == "inf" and
                  rows.get("train/token_mult_prob_error") == "inf" and
                  rows.get("training/rollout_actor_probs_pearson_corr") == "nan",
                  f"table:\n{out}{err}")
    one = (write("learner-one.jsonl", "learner", {0: [-1.0]}, tokens={0: [11]}),
           write("sampler-one.jsonl", "sampler", {0: [-2.0]}, tokens={0: [11]}))
    rc, out, err = gap_report("--json", *one)
    verl = strict_json(out)["runs"][0]["verl"] if rc == 0 else {}
    harness.check("training/rollout_probs_diff_std" in verl and
                  verl["training/rollout_probs_diff_std"] is None,
                  f"the std of one token (n - 1 = 0) is not defined: {verl}")


def test_logprobs_above_zero_are_corrupt():
    # a log-prob above 0 beyond rounding is a probability above 1: its line is skipped and
    # counted; a negative integer beyond a double is a log-prob of -inf (not finite, counted)
    huge = "1" + "0" * 400
    lines = ['{"seq": 2, "tokens": [1], "logprobs": [800.0]}\n',
             '{"seq": 3, "tokens": [1], "logprobs": [%s]}\n' % huge,
             '{"seq": 4, "tokens": [1, 2], "logprobs": [-1.0, 0.5]}\n',
             '{"seq": 5, "tokens": [1], "logprobs": [-%s]}\n' % huge,
             '{"seq": 6, "tokens": [1], "logprobs": [1e-7]}\n']
    f = logprobs.read(write("above-zero.jsonl", "sampler", LP_SAMPLER, extra_lines=lines))
    harness.check(f.corrupt == 3 and sorted(f.seqs) == [0, 1, 5, 6], f"{f.corrupt} {f.problems}")
    harness.check(any("above 0" in p for p in f.problems), f"reason named: {f.problems}")
    harness.check(f.seqs.get(5) and f.seqs[5].logprobs == [-math.inf], "-10^400 is -inf")
    harness.check(f.seqs.get(6) and f.seqs[6].logprobs == [1e-7], "rounding above 0 is kept")
    learner = write("learner-above.jsonl", "learner", {**LP_LEARNER, 2: [-1.0], 5: [-1.0]},
                    tokens={**TOKENS, 2: [1], 5: [1]})
    rc, out, err = gap_report("--json", learner, path("above-zero.jsonl"))
    doc = strict_json(out) if rc == 0 else {}
    c = doc["runs"][0]["counts"] if doc else {}
    harness.check(rc == 0 and c.get("corrupt_lines_sampler") == 3 and
                  c.get("sequences_only_learner") == 1 and c.get("nonfinite_tokens") == 1,
                  f"exit {rc}: {c} {err[-300:]}")


def test_newer_version_names_the_reader_to_update():
    newer = write("newer-2.jsonl", "learner", LP_LEARNER,
                  header='{"format": "minite-logprobs", "version": 2, "role": "learner"}')
    rc, out, err = gap_report(newer, path("sampler.jsonl"))
    harness.check(rc == 3 and "update tools/" in err and "tools/logprobs.py" in err and
                  "scripts/" not in err, f"exit {rc}: {err}")


def test_huge_model_checksum_is_compared():
    # a checksum beyond a double is compared exactly: refused when it differs, never a traceback
    learner, sampler = pair()
    huge = write("learner-huge-sum.jsonl", "learner", LP_LEARNER,
                 model=dict(MODEL, checksum=10 ** 400))
    rc, out, err = gap_report(huge, sampler)
    harness.check(rc == 3 and "checksum" in err and "Traceback" not in err,
                  f"exit {rc}: {err[-300:]}")


for t in (test_metrics_match_hand_computed_values, test_verl_metrics_match_hand_computed_values,
          test_nemo_rl_and_slime_metrics_match_hand_computed_values,
          test_per_sequence_metrics_keep_sequence_boundaries, test_table_names_every_metric,
          test_truncated_and_corrupt_lines_are_skipped_and_counted,
          test_reader_never_raises_on_bad_lines, test_nonfinite_logprobs_are_counted_not_used,
          test_mismatched_tokens_are_refused, test_wrong_headers_are_refused,
          test_swapped_files_and_different_models_are_refused, test_no_token_in_common_is_refused,
          test_usage_errors_exit_2, test_several_runs_in_one_report, test_png_is_written,
          test_writer_and_reader_round_trip, test_deeply_nested_lines_are_not_json,
          test_headers_without_spec_get_a_label, test_extreme_logprobs_do_not_overflow,
          test_framework_metrics_beyond_a_double_are_null,
          test_logprobs_above_zero_are_corrupt, test_newer_version_names_the_reader_to_update,
          test_huge_model_checksum_is_compared):
    harness.run(t)
sys.exit(harness.done())
