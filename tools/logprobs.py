"""logprobs.py — the per-token log-prob file ("minite-logprobs", version 1): written by the demo
sampler and learner (demo/demo_sampler.py, demo/demo_learner.py), read by tools/gap-report.
Standard library only, so that gap-report runs anywhere.

The format, JSON lines in UTF-8:

  line 1, the header:
    {"format": "minite-logprobs", "version": 1, "role": "sampler" | "learner",
     "spec": "<MINITE_SPEC of the run, or \"none\" when the shim was not loaded>",
     "model": {...what identifies the weights...}, "seed": <int, the model's init seed>}
  then one line per sequence:
    {"seq": <int >= 0>, "prompt": [<token id>, ...], "tokens": [<token id>, ...],
     "logprobs": [<float or null>, ...]}

"tokens" holds the generated tokens only; "logprobs"[i] is the natural-log probability of
"tokens"[i] given the prompt and "tokens"[:i], computed as log_softmax in FP32 over the full
vocabulary (no top-k/top-p truncation), so at most 0 (LOGPROB_MAX allows for rounding); null
stands for a value that was not finite (a reader also takes NaN and Infinity, and an integer
below a double's range as -inf: not finite either). "prompt" is what the learner needs to
teacher-force the sequence; a reader that only compares log-probs does not need it. Readers
ignore keys they do not know, so writers may add some (the demos add "shim", "source", sizes).

Reading never raises on a bad sequence line: a line that is not JSON (a truncated last line, a
corrupt byte, nesting deeper than the parser goes), lacks a field, has fields of the wrong type,
holds a finite log-prob above LOGPROB_MAX (a probability above 1), or whose "tokens" and
"logprobs" differ in length is skipped and counted, and so is a second line for a seq already
read. Only a file that cannot be opened, is empty, or does not start with a minite-logprobs
header of a known version raises FormatError.
"""
import json
import math

FORMAT = "minite-logprobs"
VERSION = 1
ROLES = ("sampler", "learner")
# FP32 rounding leaves a log-prob near 0 a few units of 2^-23 (1.2e-7) above it at most; 1e-4 is
# far above that and still refuses a probability above 1.0001. It also bounds exp(log-prob).
LOGPROB_MAX = 1e-4


class FormatError(Exception):
    """The file is not a readable minite-logprobs file; the message says why and what to do."""


class Sequence:
    __slots__ = ("seq", "prompt", "tokens", "logprobs")

    def __init__(self, seq, prompt, tokens, logprobs):
        self.seq, self.prompt, self.tokens, self.logprobs = seq, prompt, tokens, logprobs


class LogprobFile:
    """One file read: its header, its sequences by seq number, and what was skipped."""

    def __init__(self, path, header):
        self.path = path
        self.header = header
        self.seqs = {}
        self.corrupt = 0        # lines skipped: not JSON, missing or mistyped fields
        self.duplicates = 0     # lines skipped: a seq number seen before
        self.problems = []      # the first few skipped lines: "line N: reason"

    @property
    def role(self):
        return self.header.get("role")

    @property
    def spec(self):
        return self.header.get("spec")

    def skip(self, lineno, reason, duplicate=False):
        if duplicate:
            self.duplicates += 1
        else:
            self.corrupt += 1
        if len(self.problems) < 5:
            self.problems.append(f"line {lineno}: {reason}")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _logprob(v):
    """A logprob entry as float: NaN for null, -inf for an integer below a double's range; None
    when it is not a number or a finite one above LOGPROB_MAX."""
    if v is None:
        return math.nan
    if not _is_number(v) or LOGPROB_MAX < v < math.inf:
        return None
    try:
        return float(v)
    except OverflowError:  # only a negative integer gets here: a probability of 0 to a double
        return -math.inf


def _parse_header(path, line):
    what = f"{path} is not a minite-logprobs file"
    hint = ("the demo programs write it (demo/demo_sampler.py, demo/demo_learner.py); "
            "its first line is a JSON object with \"format\": \"minite-logprobs\"")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        raise FormatError(f"{what}: its first line is not JSON ({hint})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise FormatError(f"{what}: format is {found!r}, not {FORMAT!r} ({hint})")
    version = header.get("version")
    if not _is_int(version) or version < 1:
        raise FormatError(f"{path}: header has no valid version (found {version!r}); "
                          f"version {VERSION} files have \"version\": {VERSION}")
    if version > VERSION:
        raise FormatError(f"{path}: minite-logprobs version {version} is newer than this reader "
                          f"(version {VERSION}); update tools/ (tools/logprobs.py reads the "
                          "format) to a version that reads it")
    if header.get("role") not in ROLES:
        raise FormatError(f"{path}: header role is {header.get('role')!r}; it must be one of "
                          f"{', '.join(ROLES)}")
    return header


def _parse_seq(obj):
    """A Sequence from one decoded line, or a string saying why the line is unusable."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    seq, tokens, lps = obj.get("seq"), obj.get("tokens"), obj.get("logprobs")
    if not _is_int(seq) or seq < 0:
        return "no valid \"seq\" (a non-negative integer)"
    if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
        return f"seq {seq}: \"tokens\" is not a list of token ids"
    if not isinstance(lps, list):
        return f"seq {seq}: \"logprobs\" is not a list"
    if len(lps) != len(tokens):
        return f"seq {seq}: {len(tokens)} tokens but {len(lps)} logprobs"
    values = [_logprob(v) for v in lps]
    if None in values:
        pos = values.index(None)
        if _is_number(lps[pos]):
            return f"seq {seq}: log-prob {pos} is above 0 (a probability above 1)"
        return f"seq {seq}: \"logprobs\" holds something other than numbers and null"
    prompt = obj.get("prompt", [])
    if not isinstance(prompt, list) or not all(_is_int(t) and t >= 0 for t in prompt):
        return f"seq {seq}: \"prompt\" is not a list of token ids"
    return Sequence(seq, prompt, tokens, values)


def read(path):
    """Read a minite-logprobs file. Raises FormatError only for the whole file (see the module
    docstring); bad sequence lines are skipped and counted in the result."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise FormatError(f"cannot read {path}: {e.strerror}") from None
    with f:
        result = None
        for lineno, raw in enumerate(f, 1):
            text = raw.decode("utf-8", errors="replace").strip()
            if result is None:
                if not text:
                    continue  # blank lines before the header are harmless
                result = LogprobFile(path, _parse_header(path, text))
                continue
            if not text:
                continue
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError):
                result.skip(lineno, "not valid JSON (truncated or corrupt)")
                continue
            s = _parse_seq(obj)
            if isinstance(s, str):
                result.skip(lineno, s)
            elif s.seq in result.seqs:
                result.skip(lineno, f"seq {s.seq} appears again; the first one is kept",
                            duplicate=True)
            else:
                result.seqs[s.seq] = s
    if result is None:
        raise FormatError(f"{path} is empty: expected a minite-logprobs header line")
    return result


def _json_logprob(v):
    v = float(v)
    return v if math.isfinite(v) else None


def write_header(f, role, spec, model, seed, **extra):
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    header = {"format": FORMAT, "version": VERSION, "role": role, "spec": spec or "none",
              "model": model, "seed": seed}
    header.update(extra)
    f.write(json.dumps(header, sort_keys=False) + "\n")


def write_seq(f, seq, tokens, logprobs, prompt=None):
    if len(tokens) != len(logprobs):
        raise ValueError(f"seq {seq}: {len(tokens)} tokens but {len(logprobs)} logprobs")
    line = {"seq": int(seq)}
    if prompt is not None:
        line["prompt"] = [int(t) for t in prompt]
    line["tokens"] = [int(t) for t in tokens]
    line["logprobs"] = [_json_logprob(v) for v in logprobs]
    f.write(json.dumps(line, separators=(",", ":")) + "\n")
