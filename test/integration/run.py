#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run infergw's integration tests.

    python3 test/integration/run.py --bin build/default/bin [-k SUBSTR]...
        [--repeat N] [-v]

Discovers test/integration/NNN-topic.py, runs every test_* function of each
file in file order, each with a fresh temp dir and a hard timeout, and
prints one line per test ("ok", "FAIL" or "skip" with its reason) and a
final "N passed, N failed, N skipped".  Every process a test started is
killed afterwards, pass, fail, skip or timeout.

A test that cannot run here raises gwtest.Skip: gwtest.skip(reason), or
gwtest.tool(name) when a program is missing.  With INFERGW_TEST_NO_SKIP=1
(make check sets it, after its install step) a skip for a program whose
Debian package tools/install-deps.sh installs is a failure, so that CI
cannot pass without having run the test; other skips stay skips.

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
INSTALL_DEPS = os.path.join(gwtest.REPO_ROOT, "tools", "install-deps.sh")


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
        # Where it is stuck: the test thread's stack, innermost last.
        frame = sys._current_frames().get(t.ident)
        where = "".join(traceback.format_stack(frame)[-6:]) if frame else ""
        return TimeoutError("test timed out after %.0fs, in:\n%s"
                            % (timeout, where.rstrip())), None
    return result.get("exc", (None, None))


def provided_packages(script=INSTALL_DEPS):
    """The Debian packages the install step installs: the words of
    tools/install-deps.sh's pkgs="..." line (up to its "$*")."""
    with open(script) as f:
        m = re.search(r'^pkgs="([^"$]*)', f.read(), re.M)
    assert m and m.group(1).split(), \
        "%s: no pkgs=\"...\" line, so no strict skip rule" % script
    return set(m.group(1).split())


def strict_from_env():
    return os.environ.get("INFERGW_TEST_NO_SKIP", "") not in ("", "0")


class Results:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def summary(self):
        return "%d passed, %d failed, %d skipped" % (
            self.passed, self.failed, self.skipped)


def run_tests(tests, bin_dir, timeout, strict=False, provided=(),
              verbose=False, keep=False, out=sys.stdout):
    """Run (file, name, fn) tests in order, print a line for each, and
    return their Results.  'strict': a skip for a package in 'provided'
    fails."""
    res = Results()

    def say(line):
        out.write(line + "\n")
        out.flush()

    for fname, name, fn in tests:
        label = "%s::%s" % (fname, name)
        if verbose:
            say("...  %s" % label)
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
        if reports and (exc is None or isinstance(exc, gwtest.Skip)):
            exc = AssertionError("sanitizer report(s):\n" +
                                 "\n".join(reports[:20]))
            tb = None
        if isinstance(exc, gwtest.Skip) and strict \
                and exc.package in provided:
            exc = AssertionError(
                "skipped: %s; but tools/install-deps.sh installs %s, and "
                "INFERGW_TEST_NO_SKIP=1 makes that skip a failure"
                % (exc.reason, exc.package))
            tb = None
        ms = (time.monotonic() - t0) * 1000
        if exc is None or isinstance(exc, gwtest.Skip):
            if exc is None:
                res.passed += 1
                say("ok   %s (%d ms)" % (label, ms))
            else:
                res.skipped += 1
                say("skip %s (%d ms): %s" % (label, ms, exc.reason))
            if not keep:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            res.failed += 1
            say("FAIL %s (%d ms)" % (label, ms))
            for line in failure_text(exc, tb, verbose):
                say("     " + line)
            for line in diag:
                say("     " + line)
            say("     (files kept in %s)" % tmp)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="directory holding infergw and mock_upstream")
    ap.add_argument("-k", dest="substr", action="append", default=[],
                    help="run only tests whose FILE::NAME contains this "
                    "(repeatable: any of them)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the chosen tests N times over (a test that "
                    "fails by the machine shows here)")
    ap.add_argument("-v", action="store_true", help="verbose failures")
    ap.add_argument("--keep", action="store_true",
                    help="keep every test's temp dir")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    strict = strict_from_env()
    provided = provided_packages() if strict else set()

    def on_signal(signum, frame):
        gwtest.Ctx.cleanup()
        sys.stdout.write("interrupted\n")
        sys.stdout.flush()
        os._exit(1)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    tests = discover()
    if args.substr:
        tests = [t for t in tests
                 if any(k in "%s::%s" % (t[0], t[1]) for k in args.substr)]
    tests = tests * max(1, args.repeat)
    res = run_tests(tests, bin_dir, gwtest.budget(TEST_TIMEOUT), strict,
                    provided, args.v, args.keep)
    print(res.summary())
    sys.stdout.flush()
    gwtest.Ctx.cleanup()
    # Threads of timed-out tests may still be blocked: do not wait.
    os._exit(1 if res.failed else 0)


if __name__ == "__main__":
    main()
