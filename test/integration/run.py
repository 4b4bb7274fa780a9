#!/usr/bin/env python3
"""Run infergw's integration tests.

    python3 test/integration/run.py --bin build/default/bin [-k SUBSTR] [-v]

Discovers test/integration/NNN-topic.py, runs every test_* function of each
file in file order, each with a fresh temp dir and a hard timeout, and
prints one line per test and a final "N passed, N failed".  Every process
a test started is killed afterwards, pass, fail or timeout.

INFERGW_TEST_SLOW_FACTOR (default 1) scales every time budget, including
the per-test timeout (sanitizer builds set 3).
"""

import argparse
import importlib.util
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gwtest  # noqa: E402

TEST_TIMEOUT = 60.0


def discover():
    files = sorted(f for f in os.listdir(HERE)
                   if re.match(r"^\d{3}-[A-Za-z0-9_-]+\.py$", f))
    tests = []
    for fname in files:
        name = "it_" + re.sub(r"\W", "_", fname[:-3])
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(HERE, fname))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        # A module's dict keeps definition order (generated tests too).
        for attr, fn in list(vars(mod).items()):
            if attr.startswith("test_") and callable(fn):
                tests.append((fname, attr, fn))
    return tests


def failure_text(exc, tb, verbose):
    if isinstance(exc, AssertionError):
        msg = str(exc) or "assertion failed"
    else:
        msg = "%s: %s" % (type(exc).__name__, exc)
    frames = traceback.extract_tb(tb)
    # The innermost frame in a test file says where it failed.
    where = ""
    for fr in reversed(frames):
        if re.match(r"^\d{3}-", os.path.basename(fr.filename)):
            where = "%s:%d" % (os.path.basename(fr.filename), fr.lineno)
            break
    lines = msg.split("\n")
    if where:
        lines[0] = "%s (at %s)" % (lines[0], where)
    if verbose:
        lines += "".join(traceback.format_exception(
            type(exc), exc, tb)).rstrip().split("\n")
    return lines


def run_one(fn, ctx, timeout):
    """Run fn(ctx) in a thread; returns (exc, tb) or (None, None)."""
    result = {}

    def body():
        try:
            fn(ctx)
        except BaseException as e:          # noqa: B902 - report it all
            result["exc"] = (e, e.__traceback__)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return TimeoutError("test timed out after %.0fs" % timeout), None
    return result.get("exc", (None, None))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="directory holding infergw and mock_upstream")
    ap.add_argument("-k", dest="substr", default=None,
                    help="run only tests whose FILE::NAME contains this")
    ap.add_argument("-v", action="store_true", help="verbose failures")
    ap.add_argument("--keep", action="store_true",
                    help="keep every test's temp dir")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)

    def on_signal(signum, frame):
        gwtest.Ctx.cleanup()
        sys.stdout.write("interrupted\n")
        sys.stdout.flush()
        os._exit(1)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    tests = discover()
    if args.substr:
        tests = [t for t in tests if args.substr in "%s::%s" % (t[0], t[1])]
    timeout = gwtest.budget(TEST_TIMEOUT)
    passed = failed = 0
    for fname, name, fn in tests:
        label = "%s::%s" % (fname, name)
        if args.v:
            sys.stdout.write("...  %s\n" % label)
            sys.stdout.flush()
        tmp = tempfile.mkdtemp(prefix="infergw-it-")
        ctx = gwtest.Ctx(bin_dir, tmp)
        t0 = time.monotonic()
        reports = []
        try:
            exc, tb = run_one(fn, ctx, timeout)
            try:
                reports = ctx.finish()
            except Exception as e:              # never mask the result
                reports = ["harness: finish failed: %r" % (e,)]
        finally:
            diag = ctx.diagnostics()
            gwtest.Ctx.cleanup()
        if exc is None and reports:
            exc = AssertionError("sanitizer report(s):\n" +
                                 "\n".join(reports[:20]))
            tb = None
        ms = (time.monotonic() - t0) * 1000
        if exc is None:
            passed += 1
            print("ok   %s (%d ms)" % (label, ms))
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            failed += 1
            print("FAIL %s (%d ms)" % (label, ms))
            for line in failure_text(exc, tb, args.v):
                print("     " + line)
            for line in diag:
                print("     " + line)
            print("     (files kept in %s)" % tmp)
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    sys.stdout.flush()
    gwtest.Ctx.cleanup()
    # Threads of timed-out tests may still be blocked: do not wait.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
