"""test_demo_server.py — demo/demo_server.py where there is no GPU: it rejects bad arguments
(exit 2) and says what to install without torch; the workload drawing, the cache sizing, the
round figures, the spread over rounds and the failure verdict, on made-up engine results; the GPU
busy window on a made-up profile (merged kernel intervals, its start and end, its table cell); the
command line run_demo.py would give it parses. Where torch and transformers are installed (not in
CI: build/venv has neither), transformers' continuous-batching engine runs for real on the CPU
with a tiny geometry: requests of mixed lengths come back whole with a log-prob per token, and
demo/demo_learner.py scores the file (mixed lengths and equal) and tools/gap-report finds the
engine's log-probs equal to a full forward's (a wrong position, cache block or mask moves them by
O(1)).
"""
import json
import os
import subprocess
import sys
import types

from demo_cpu import SCRIPTS, gap_within, have_torch, tiny_driver
import demo_server  # tests/, demo/ and tools/ are on the path: demo_cpu put them there
import harness
import logprobs
import run_demo

TMP = harness.temp_dir("mt-server-")


def server(*args, driver=None):
    script = driver or os.path.join(SCRIPTS, "demo_server.py")
    res = subprocess.run([sys.executable, script] + [str(a) for a in args],
                         capture_output=True, text=True, cwd=TMP, timeout=600)
    return res.returncode, res.stdout, res.stderr


def test_bad_arguments_exit_2():
    cases = [(), ("--out", "x.jsonl", "--requests", "0"),
             ("--out", "x.jsonl", "--prompt-len", "0:8"),
             ("--out", "x.jsonl", "--prompt-len", "9:8"),
             ("--out", "x.jsonl", "--new-tokens", "8:x"),
             ("--out", "x.jsonl", "--new-tokens", "1:2:3"),
             ("--out", "x.jsonl", "--concurrency", "0"),
             ("--out", "x.jsonl", "--block-size", "2"),
             ("--out", "x.jsonl", "--attn", "flash"),
             ("--out", "x.jsonl", "--cuda-graph", "maybe"),
             ("--out", "x.jsonl", "--sampling", "beam")]
    for args in cases:
        rc, out, err = server(*args)
        harness.check(rc == 2, f"{args}: exit {rc}, expected 2 ({err.strip()[-150:]})")
    rc, out, err = server("--help")
    harness.check(rc == 0 and "usage" in out, f"--help: exit {rc}")


def test_defaults_and_the_run_demo_command_line():
    args = demo_server.parse_args(["--out", "x.jsonl"])
    harness.check((args.requests, args.prompt_len, args.new_tokens, args.repeats) ==
                  (256, (32, 256), (16, 256), 3), f"defaults {vars(args)}")
    harness.check(args.concurrency is None and demo_server.in_flight(args) == 256,
                  "concurrency all: every request in flight")
    harness.check(args.sampling == "sample" and args.attn == "sdpa" and
                  args.cuda_graph == "auto" and args.experts == "grouped_mm", str(vars(args)))
    argv = demo_server.child_argv("python3", "o.jsonl", requests=8, prompt_len="16",
                                  new_tokens="4:8", repeats=2, extra=["--concurrency", "4"])
    harness.check(argv[1].endswith("demo/demo_server.py"), f"the script itself: {argv}")
    child = demo_server.parse_args(argv[2:])
    harness.check((child.out, child.requests, child.prompt_len, child.new_tokens, child.repeats,
                   child.concurrency) == ("o.jsonl", 8, (16, 16), (4, 8), 2, 4),
                  f"child_argv parses: {vars(child)}")
    harness.check(demo_server.in_flight(child) == 4, "at most 4 in flight")
    harness.check(demo_server.length_range("7") == (7, 7), "N is N:N")


def test_workload_drawing_and_cache_size():
    a = demo_server.draw_requests(200, (3, 9), (1, 4), 50, seed=5)
    b = demo_server.draw_requests(200, (3, 9), (1, 4), 50, seed=5)
    c = demo_server.draw_requests(200, (3, 9), (1, 4), 50, seed=6)
    same = [(r.prompt, r.new_tokens) for r in a] == [(r.prompt, r.new_tokens) for r in b]
    harness.check(same, "one seed, one workload")
    harness.check([r.prompt for r in a] != [r.prompt for r in c], "another seed, another one")
    harness.check({len(r.prompt) for r in a} == set(range(3, 10)) and
                  {r.new_tokens for r in a} == set(range(1, 5)),
                  "lengths cover their ranges, bounds included")
    harness.check(all(0 <= t < 50 for r in a for t in r.prompt), "tokens in the vocabulary")
    fixed = demo_server.draw_requests(4, (6, 6), (2, 2), 50, seed=0)
    harness.check(all(len(r.prompt) == 6 and r.new_tokens == 2 for r in fixed), "N:N is fixed")
    # 8 tokens a block: the longest two hold 2 + 2 blocks, over the 15% margin -> 5, + 1
    reqs = [demo_server.Request([0] * p, n) for p, n in ((3, 2), (10, 6), (8, 1), (4, 4))]
    harness.check(demo_server.default_num_blocks(reqs, 8, 2) == 6,
                  f"{demo_server.default_num_blocks(reqs, 8, 2)} blocks for 2 in flight")
    harness.check(demo_server.default_num_blocks(reqs, 8, 4) == 9, "6 blocks / 0.85 -> 8, + 1")


class Output:
    """What the engine's GenerationOutput carries that the script reads."""

    def __init__(self, tokens, lps, created=10.0, first=None, error=None):
        self.generated_tokens, self.logprobs, self.error = tokens, lps, error
        self.created_time = created
        self.timestamps = None if first is None else [first]


def test_round_figures_and_spread_on_made_up_results():
    outs = [Output([1, 2, 3], [-1.0, -2.0, -3.0], first=10.5),
            Output([4], [-0.5], first=11.0), Output([5, 6], [-1.0], first=10.25)]
    f = demo_server.round_figures({"outputs": outs, "wall_s": 2.0, "steps": 7})
    harness.check(f["generated_tokens"] == 6 and f["tokens_per_s"] == 3.0 and f["steps"] == 7 and
                  f["failed"] == 0, f"6 tokens in 2 s: {f}")
    harness.check(abs(f["ttft_mean_ms"] - 1000 * (0.5 + 1.0 + 0.25) / 3) < 1e-9,
                  f"mean of first token minus submission: {f}")
    seqs, missing = demo_server.sequences([demo_server.Request([9], 3)] * 3, outs)
    harness.check(missing == 1 and [s[0] for s in seqs] == [0, 1],
                  f"the request with 2 tokens and 1 log-prob is not written: {seqs}")
    failed = Output([], [], error="boom")
    g = demo_server.round_figures({"outputs": [failed, outs[1]], "wall_s": 0.5, "steps": 1})
    harness.check(g["failed"] == 1 and g["ttft_mean_ms"] == 1000.0, f"a failed request: {g}")
    rounds = [dict(f, tokens_per_s=r, wall_s=6 / r, ttft_mean_ms=t)
              for r, t in ((3.0, 40.0), (5.0, 20.0), (4.0, 30.0))]
    s = demo_server.timing_summary(rounds)
    harness.check(s["tokens_per_s"] == 4.0 and s["generated_tokens_per_s"]["min"] == 3.0 and
                  s["generated_tokens_per_s"]["max"] == 5.0 and
                  s["generated_tokens_per_s"]["all"] == [3.0, 5.0, 4.0],
                  f"median with min/max over rounds: {s}")
    harness.check(s["ttft_mean_ms"]["median"] == 30.0 and s["steps"] == [7, 7, 7] and
                  s["requests_failed"] == 0, str(s))
    ok = {"requests_failed": 0, "logprobs_missing": 0, "logprobs_finite": True}
    harness.check(demo_server.problems(ok) == [], "a clean run")
    bad = dict(ok, requests_failed=2, logprobs_missing=1, logprobs_finite=False,
               first_error="boom")
    words = "; ".join(demo_server.problems(bad))
    harness.check("2 requests failed" in words and "boom" in words and "without a log-prob" in
                  words and "not finite" in words, words)


class FakeProfile:
    """torch.profiler.profile's part that BusyWindow uses: device events at fixed µs."""

    def __init__(self, activities):
        self.activities, self.state = activities, "new"

    def start(self):
        self.state = "started"

    def stop(self):
        self.state = "stopped"

    def events(self):
        ev = lambda kind, a, b: types.SimpleNamespace(  # noqa: E731
            device_type=kind, name="k", time_range=types.SimpleNamespace(start=a, end=b))
        # two overlapping kernels (500 µs covered), a host event, one more kernel (100 µs)
        return [ev("cuda", 0, 300), ev("cuda", 200, 500), ev("cpu", 0, 10_000),
                ev("cuda", 900, 1000)]


def test_busy_window_on_a_made_up_profile():
    import demo_profile
    harness.check(demo_profile.added_us([(a, b, "k") for a, b in
                                         ((5, 6), (0, 2), (1, 3), (5.5, 5.7), (7, 7))]) == 4.0,
                  "union of intervals")
    torch = types.SimpleNamespace(
        autograd=types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA="cuda")),
        profiler=types.SimpleNamespace(profile=FakeProfile,
                                       ProfilerActivity=types.SimpleNamespace(CUDA="CUDA")))
    manager = types.SimpleNamespace(current_batch=10)
    w = demo_server.BusyWindow(torch, manager, after=1.0, length=2.0)
    w.tick(0.5)
    harness.check(w.prof is None and w.result is None, "nothing before its first second")
    w.tick(1.0)
    prof = w.prof
    harness.check(prof is not None and prof.state == "started" and prof.activities == ["CUDA"],
                  "the profiler on at 1 s, CUDA activity only")
    manager.current_batch = 17
    w.tick(2.5)
    harness.check(w.prof is prof, "still on before 3 s")
    w.tick(3.0)
    r = w.result
    harness.check(prof.state == "stopped" and r is not None and r["steps"] == 7 and
                  abs(r["busy_s"] - 600e-6) < 1e-12 and r["share"] == r["busy_s"] / r["window_s"],
                  f"off at 3 s: 600 µs of kernels merged, 7 steps: {r}")
    w.tick(5.0)
    w.stop()
    harness.check(w.prof is None and w.result is r, "once only, and stop() after the end is idle")
    cell = run_demo.busy_cell(dict(r, share=0.25, steps_per_s=10.0, timed_steps_per_s=12.5))
    harness.check(cell == "25% (10.0 / 12.5)" and run_demo.busy_cell(None) == "-",
                  f"the table's cell: {cell}")


def test_without_torch_says_what_to_install():
    if have_torch():
        harness.skip("torch and transformers are installed here")
    rc, out, err = server("--out", "s.jsonl")
    harness.check(rc == 1 and "torch is not installed" in err, f"exit {rc}: {err}")
    harness.check(not os.path.exists(os.path.join(TMP, "s.jsonl")), "nothing written")


def test_tiny_model_through_the_engine_on_cpu():
    if not have_torch():
        harness.skip("torch/transformers not installed (build/venv has neither; run this file "
                     "with a Python that has torch and transformers 5 to exercise the engine)")
    driver = tiny_driver(TMP)

    def tiny(*args):
        rc, out, err = server(*args, driver=driver)
        harness.check(rc == 0, f"{args[0]}: exit {rc}: {err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
    small = ["--block-size", 8, "--max-batch-tokens", 48, "--busy-window", 0]  # no GPU to watch
    s = tiny("server", "--out", "mixed.jsonl", "--requests", 10, "--prompt-len", "2:17",
             "--new-tokens", "1:9", "--repeats", 2, "--concurrency", 4, *small)
    if s is None:
        return
    harness.check(s["requests_finished"] == 10 and s["requests_failed"] == 0 and
                  s["logprobs_missing"] == 0 and s["logprobs_finite"] and s["tokens_per_s"] > 0,
                  f"every request back whole: {s}")
    harness.check(s["experts"] == "grouped_mm" and s["attn_implementation"] == "paged|sdpa" and
                  s["cuda_graph"] == {"setting": "auto", "varlen": False, "decode": False} and
                  len(s["generated_tokens_per_s"]["all"]) == 2 and s["ttft_mean_ms"] is not None,
                  f"the engine left the experts alone, paged sdpa, no graph on CPU: {s}")
    served = logprobs.read(os.path.join(TMP, "mixed.jsonl"))
    want = demo_server.draw_requests(10, (2, 17), (1, 9), 512, 2)
    harness.check(sorted(served.seqs) == list(range(10)) and served.role == "sampler",
                  f"one sequence per request: {sorted(served.seqs)}")
    harness.check(all(served.seqs[i].prompt == r.prompt and len(served.seqs[i].tokens) ==
                      r.new_tokens for i, r in enumerate(want)),
                  "each request's prompt and its number of tokens")
    harness.check(sum(len(x.tokens) for x in served.seqs.values()) == s["generated_tokens"],
                  "the summary counts the tokens of the file")
    harness.check(all(-20 < v < 0 for x in served.seqs.values() for v in x.logprobs),
                  "log-probs of a 512-token vocabulary are negative and finite")
    learned = tiny("learner", "--logprobs", "mixed.jsonl", "lmixed.jsonl", "--score-batch", 3)
    m = gap_within("lmixed.jsonl", "mixed.jsonl", TMP) if learned else None
    harness.check(learned is None or learned["scored_tokens"] == s["generated_tokens"],
                  f"the learner scores requests of mixed lengths, each token once: {learned}")
    harness.check(m is None or m["tokens"] == s["generated_tokens"],
                  f"gap-report compares every token: {m}")
    for sampling in ("sample", "greedy"):
        name = f"fixed-{sampling}.jsonl"
        s = tiny("server", "--out", name, "--requests", 6, "--prompt-len", 7, "--new-tokens", 5,
                 "--repeats", 2, "--sampling", sampling, *small)
        learned = tiny("learner", "--logprobs", name, "l" + name)
        if s is None or learned is None:
            return
        if sampling == "greedy":
            harness.check(s["repeats_identical"], f"argmax gives the same tokens each round: {s}")
        m = gap_within("l" + name, name, TMP)
        harness.check(m is None or m["tokens"] == 30, f"6 requests of 5 tokens compared: {m}")


for t in (test_bad_arguments_exit_2, test_defaults_and_the_run_demo_command_line,
          test_workload_drawing_and_cache_size, test_round_figures_and_spread_on_made_up_results,
          test_busy_window_on_a_made_up_profile, test_without_torch_says_what_to_install,
          test_tiny_model_through_the_engine_on_cpu):
    harness.run(t)
sys.exit(harness.done())
