"""harness.py — the Python tests' harness, the twin of tests/harness.h.

check() records a failure and goes on; a test that raises counts as failed with its traceback;
skip() ends a test as skipped with a reason. Arguments on a test program's command line, or the
words of MT_TEST_ONLY (as in tests/harness.h), pick its tests by a part of their name
(`python3 tests/gpu/test_reliability.py sanitizers`); the others do not run and are not counted.
done() prints "#mt-counts P F S" for tests/run and returns the exit status. temp_dir() gives a test
program a temporary directory that is removed when the program exits.
"""
import atexit
import os
import shutil
import sys
import tempfile
import traceback

_passed = _failed = _skipped = 0
_cur_failures = 0


class Skip(Exception):
    pass


def skip(reason):
    raise Skip(reason)


def check(cond, msg=""):
    global _cur_failures
    if not cond:
        _cur_failures += 1
        if _cur_failures <= 8:
            frame = traceback.extract_stack(limit=2)[0]
            print(f"    {frame.filename}:{frame.lineno}: check failed: {msg}")
    return cond


def temp_dir(prefix):
    """A new directory under $TMPDIR (or /tmp), removed with its contents when the program exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def run(fn):
    global _passed, _failed, _skipped, _cur_failures
    only = sys.argv[1:] + os.environ.get("MT_TEST_ONLY", "").split()
    if only and not any(a in fn.__name__ for a in only):
        return
    _cur_failures = 0
    try:
        fn()
    except Skip as s:
        print(f"    skipped: {s}")
        _skipped += 1
        print(f"skip {fn.__name__}", flush=True)
        return
    except Exception:
        _cur_failures += 1
        traceback.print_exc(file=sys.stdout)
    if _cur_failures:
        _failed += 1
        print(f"FAIL {fn.__name__} ({_cur_failures} failed checks)", flush=True)
    else:
        _passed += 1
        print(f"ok   {fn.__name__}", flush=True)


def done():
    print(f"#mt-counts {_passed} {_failed} {_skipped}", flush=True)
    return 1 if _failed else 0
