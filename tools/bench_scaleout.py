#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/bench_scaleout.py - the tutorial's stretch test through HAProxy
in front of three gateways, against one gateway alone (issue 11).

    python3 tools/bench_scaleout.py [--bin build/default/bin] [--reps 3]
        [--clients 50] [--seconds 10] [--out FILE]

Each run starts a fresh mock upstream with the demo timing (-n 16 -f 100
-d 45: about 800 ms per streamed response) and then either
  one    a gateway, the clients straight at it, or
  three  three gateways behind HAProxy with etc/haproxy/infergw.cfg (its
         frontend on a socket bound here to port 0 and passed as fd@N;
         HAProxy 2.6 cannot bind port 0 itself),
and tools/loadgen runs CLIENTS clients looping the identical streaming
request for SECONDS.  It reads the mock's upstream calls and loadgen's
latencies.  The ideal is SECONDS / the response time of one request
alone (measured first, through the same path); the target is upstream
calls <= ideal + 1 for both.  The two setups alternate, REPS times; the
table shows medians.  About 30 s per run.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHIPPED = os.path.join(ROOT, "etc", "haproxy", "infergw.cfg")
BODY = (b'{"model":"mock-model","messages":[{"role":"user","content":'
        b'"Explain request coalescing"}],"stream":true}')
PATH = "/v1/chat/completions"


def wait_line(path, rx, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                m = re.search(rx, f.read())
            if m:
                return m
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    sys.exit("bench_scaleout: no /%s/ in %s" % (rx, path))


class Procs:
    """The processes of one run; stop() ends them all."""

    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []

    def start(self, name, argv, **kw):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return os.path.join(self.tmp, name + ".log")

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs = []


def mock(ps, bindir):
    log = ps.start("mock", [os.path.join(bindir, "mock_upstream"), "-l",
                            "127.0.0.1:0", "-q", "-n", "16", "-f", "100",
                            "-d", "45"])
    return int(wait_line(log, r"listening port=(\d+)").group(1))


def gateway(ps, bindir, name, up_port):
    conf = os.path.join(ps.tmp, name + ".conf")
    with open(conf, "w") as f:
        f.write("[server]\nlisten = 127.0.0.1:0\n"
                "access_log = off\n[upstream]\nurl = http://127.0.0.1:%d\n"
                % up_port)
    log = ps.start(name, [os.path.join(bindir, "infergw"), "-c", conf])
    return int(wait_line(log, r"server: listening.*\bport=(\d+)").group(1))


def haproxy(ps, ports):
    """HAProxy with the shipped config over 'ports'; its frontend port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    with open(SHIPPED) as f:
        text = f.read()
    text = text.replace("bind 127.0.0.1:8090", "bind fd@%d" % sock.fileno())
    assert text.count("bind fd@") == 1, "the shipped frontend's bind moved"
    servers = "".join("    server gw%d 127.0.0.1:%d check\n" % (i + 1, p)
                      for i, p in enumerate(ports))
    text = re.sub(r"(    server gw\d 127\.0\.0\.1:\d+ check\n)+", servers,
                  text)
    cfg = os.path.join(ps.tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(text)
    ps.start("haproxy", ["haproxy", "-db", "-f", cfg],
             pass_fds=(sock.fileno(),))
    port = sock.getsockname()[1]
    sock.close()                # haproxy has its own copy
    # Ready when a request goes through (the checks need a moment).
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port,
                                        timeout=2) as r:
                if r.status == 200:
                    return port
        except OSError:
            time.sleep(0.05)
    sys.exit("bench_scaleout: haproxy did not come up")


def one_request_ms(port):
    t0 = time.monotonic()
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, PATH),
                                 data=BODY, headers={
                                     "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return (time.monotonic() - t0) * 1000.0


def calls(up_port):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % up_port) as r:
        return json.load(r)["completions"]


def run(bindir, setup, clients, seconds):
    tmp = tempfile.mkdtemp(prefix="bench-scaleout-")
    ps = Procs(tmp)
    try:
        up = mock(ps, bindir)
        if setup == "one":
            port = gateway(ps, bindir, "gw1", up)
        else:
            port = haproxy(ps, [gateway(ps, bindir, "gw%d" % i, up)
                                for i in (1, 2, 3)])
        resp = one_request_ms(port)
        before = calls(up)
        out = subprocess.run(
            [os.path.join(bindir, "loadgen"), "-c", str(clients), "--loop",
             str(seconds), "-t", "60", "-u",
             "http://127.0.0.1:%d%s" % (port, PATH), "-d", BODY.decode()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True,
            timeout=seconds + 120)
        lg = json.loads(out.stdout)
        return {"setup": setup, "response_ms": resp,
                "upstream_calls": calls(up) - before, "ok": lg["ok"],
                "errors": lg["errors"] + lg["non_2xx"],
                "ttfb_p50": lg["ttfb_ms"]["all"]["p50"],
                "ttfb_p99": lg["ttfb_ms"]["all"]["p99"],
                "done_p50": lg["complete_ms"]["all"]["p50"],
                "done_p99": lg["complete_ms"]["all"]["p99"]}
    finally:
        ps.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "default",
                                                  "bin"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    if shutil.which("haproxy") is None:
        subprocess.run(["sh", os.path.join(ROOT, "tools", "install-deps.sh"),
                        "haproxy"], check=True)
    rows = []
    for rep in range(a.reps):
        for setup in ("one", "three"):
            r = run(a.bin, setup, a.clients, a.seconds)
            print("bench_scaleout: rep %d %-5s %s" % (rep + 1, setup,
                  json.dumps(r)), file=sys.stderr)
            rows.append(r)
    med = statistics.median
    lines = ["| setup | client requests | errors | upstream calls | ideal "
             "| ideal + 1 met | TTFB p50 / p99 (ms) | completion p50 / p99 "
             "(ms) |", "|---|---|---|---|---|---|---|---|"]
    for setup, name in (("one", "one gateway"),
                        ("three", "HAProxy + 3 gateways")):
        rs = [r for r in rows if r["setup"] == setup]
        ideal = a.seconds / (med(r["response_ms"] for r in rs) / 1000.0)
        lines.append("| %s | %g | %d | %g (runs: %s) | %.1f | %s | "
                     "%.0f / %.0f | %.0f / %.0f |" % (
                         name, med(r["ok"] for r in rs),
                         sum(r["errors"] for r in rs),
                         med(r["upstream_calls"] for r in rs),
                         ", ".join(str(r["upstream_calls"]) for r in rs),
                         ideal,
                         "yes" if max(r["upstream_calls"] for r in rs)
                         <= ideal + 1 else "**no**",
                         med(r["ttfb_p50"] for r in rs),
                         med(r["ttfb_p99"] for r in rs),
                         med(r["done_p50"] for r in rs),
                         med(r["done_p99"] for r in rs)))
    table = "\n".join(lines) + "\n"
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
