#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""run_selftest - run.py's own rules, checked on made-up tests.

    python3 test/integration/run_selftest.py

No gateway is started: each made-up test passes, fails or skips at once.
Checks that a skip is its own state (not a pass, not a failure), that
INFERGW_TEST_NO_SKIP=1 turns a skip for a package the install step
provides into a failure and leaves other skips alone, and that the list
of provided packages really is read from tools/install-deps.sh.  Run by
'make unit'; prints "run_selftest: ok" or raises.
"""

import io
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gwtest  # noqa: E402
import run  # noqa: E402


def t_pass(t):
    pass


def t_fail(t):
    assert False, "made to fail"


def t_skip(t):
    gwtest.skip("not on this machine")


def t_provided(t):
    raise gwtest.Skip("no haproxy here", "haproxy")


def t_unprovided(t):
    raise gwtest.Skip("no groff here", "groff")


TESTS = [("900-self.py", f.__name__, f)
         for f in (t_pass, t_fail, t_skip, t_provided, t_unprovided)]


def run_all(strict):
    out = io.StringIO()
    res = run.run_tests(TESTS, HERE, 10, strict=strict,
                        provided={"haproxy"}, out=out)
    lines = out.getvalue().splitlines()
    # One status line per test, in order: the first word of each.
    status = {l.split()[1]: l.split()[0] for l in lines
              if l.split()[0] in ("ok", "FAIL", "skip")}
    return res, status, out.getvalue()


def check_lenient():
    res, status, text = run_all(strict=False)
    assert res.summary() == "1 passed, 1 failed, 3 skipped", res.summary()
    assert status == {"900-self.py::t_pass": "ok",
                      "900-self.py::t_fail": "FAIL",
                      "900-self.py::t_skip": "skip",
                      "900-self.py::t_provided": "skip",
                      "900-self.py::t_unprovided": "skip"}, status
    assert "t_skip (" in text and "): not on this machine\n" in text, text


def check_strict():
    res, status, text = run_all(strict=True)
    assert res.summary() == "1 passed, 2 failed, 2 skipped", res.summary()
    assert status["900-self.py::t_provided"] == "FAIL", status
    assert status["900-self.py::t_unprovided"] == "skip", status
    assert status["900-self.py::t_skip"] == "skip", status
    assert "tools/install-deps.sh installs haproxy" in text, text


def check_provided_list():
    pkgs = run.provided_packages()
    # The programs the integration tests ask gwtest.tool() for.
    for p in ("haproxy", "mandoc", "curl"):
        assert p in pkgs, "%s not in %s" % (p, sorted(pkgs))
    assert "$*" not in pkgs and "$*\"" not in pkgs, pkgs
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write("#!/bin/sh\napt-get install haproxy\n")
        f.flush()
        try:
            run.provided_packages(f.name)
        except AssertionError:
            pass
        else:
            raise AssertionError("a script without pkgs= was accepted")


def check_tool():
    try:
        gwtest.tool("infergw-no-such-program", "infergw-no-such-package")
    except gwtest.Skip as e:
        assert e.package == "infergw-no-such-package", e.package
        assert "infergw-no-such-program" in e.reason, e.reason
    else:
        raise AssertionError("a missing program did not skip")
    assert os.path.isabs(gwtest.tool("sh"))


def check_env():
    saved = os.environ.get("INFERGW_TEST_NO_SKIP")
    try:
        for value, want in (("1", True), ("", False), ("0", False)):
            os.environ["INFERGW_TEST_NO_SKIP"] = value
            assert run.strict_from_env() is want, (value, want)
        del os.environ["INFERGW_TEST_NO_SKIP"]
        assert run.strict_from_env() is False
    finally:
        if saved is not None:
            os.environ["INFERGW_TEST_NO_SKIP"] = saved


def main():
    check_lenient()
    check_strict()
    check_provided_list()
    check_tool()
    check_env()
    print("run_selftest: ok")


if __name__ == "__main__":
    main()
