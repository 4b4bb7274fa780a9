#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""metrics_check - is a /metrics text valid Prometheus text exposition?

    python3 test/integration/metrics_check.py < metrics.txt

Parses the text with prometheus_client's own parser (Debian's
python3-prometheus-client, which `make check`'s install step installs) and
then checks what that parser lets through: every family has a TYPE and a
HELP, no series (name and labels) appears twice, counters only have
_total (and _created) samples that are not negative, and every
histogram's buckets are cumulative, end in le="+Inf", and that bucket
equals _count.  Prints "ok: F families, S samples" and exits 0, or prints
the first problem and exits 1.  Run as a script (with the system python
when the test's own has no prometheus_client), or import check(), or
validate(), which picks the python itself.

promtool_check() runs Prometheus's own linter, `promtool check metrics`
(Debian's prometheus package), over the text: naming conventions
(counters end in _total, base units), HELP text, and what its parser
refuses.
"""

import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def check(text):
    """Raise AssertionError naming the first problem; return (F, S)."""
    from prometheus_client.parser import text_string_to_metric_families

    seen = set()
    families = samples = 0
    for fam in text_string_to_metric_families(text):
        families += 1
        assert fam.type in ("counter", "gauge", "histogram", "summary",
                            "untyped", "info", "stateset", "gaugehistogram"), \
            "%s: type %r" % (fam.name, fam.type)
        assert fam.type != "untyped", "%s has no # TYPE line" % fam.name
        assert fam.documentation, "%s has no # HELP text" % fam.name
        buckets = {}
        counts = {}
        for s in fam.samples:
            samples += 1
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, "series twice: %r" % (key,)
            seen.add(key)
            assert not math.isnan(s.value), "%r is NaN" % (key,)
            if fam.type == "counter":
                assert s.name in (fam.name + "_total", fam.name + "_created"), \
                    "counter %s has sample %s" % (fam.name, s.name)
                assert s.value >= 0, "counter %r is negative" % (key,)
            if fam.type == "histogram":
                rest = tuple(sorted((k, v) for k, v in s.labels.items()
                                    if k != "le"))
                if s.name == fam.name + "_bucket":
                    buckets.setdefault(rest, []).append(
                        (float(s.labels["le"]), s.value))
                elif s.name == fam.name + "_count":
                    counts[rest] = s.value
        for rest, bs in buckets.items():
            les = [le for le, _ in bs]
            assert les == sorted(les), "%s%r: le out of order" % (
                fam.name, rest)
            assert les[-1] == math.inf, "%s%r: no +Inf bucket" % (
                fam.name, rest)
            vals = [v for _, v in bs]
            assert all(a <= b for a, b in zip(vals, vals[1:])), \
                "%s%r: buckets not cumulative" % (fam.name, rest)
            assert rest in counts and counts[rest] == vals[-1], \
                "%s%r: +Inf bucket %r, _count %r" % (
                    fam.name, rest, vals[-1], counts.get(rest))
    assert families > 0, "no metric families"
    return families, samples


def validate(text):
    """check() here, or with the system python: Debian's
    python3-prometheus-client is where `make check` installs it, and the
    python running the tests may be another one.  Returns "ok: F
    families, S samples"; raises AssertionError naming the problem."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        py = "/usr/bin/python3"
        assert os.access(py, os.X_OK), \
            "no prometheus_client: apt-get install python3-prometheus-client"
        p = subprocess.run([py, os.path.join(HERE, "metrics_check.py")],
                           input=text.encode(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout.decode("utf-8", "replace")
        assert p.returncode == 0, out
        return out
    return "ok: %d families, %d samples" % check(text)


def promtool_check(promtool, text):
    """`promtool check metrics` over 'text' (promtool: the program's
    path).  Returns its findings, "" when it has none; raises
    AssertionError when it cannot parse the text at all."""
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    out = p.stdout.decode("utf-8", "replace").strip()
    assert p.returncode == 0 or out, "promtool failed, saying nothing"
    return out


if __name__ == "__main__":
    try:
        f, s = check(sys.stdin.read())
    except (AssertionError, ValueError) as e:
        print("invalid: %s" % e)
        sys.exit(1)
    print("ok: %d families, %d samples" % (f, s))
