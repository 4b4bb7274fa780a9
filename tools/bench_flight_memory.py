#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_flight_memory - what a long coalesced stream costs in memory.

    python3 tools/bench_flight_memory.py [--bin build/default/bin] [--reps 3]
                                         [--chunks 320]

One flight of three clients (a leader and two followers joined before
the first byte) streams about 21 MB: 320 chunks of 64 KiB padding
("mock_pad") from the mock, 5 ms apart (--chunks 1600: about 105 MB).
Two client mixes:

  fast   all three read as fast as they can;
  slow   one of them reads 64 KiB every 20 ms (about 3 MB/s) through a
         64 KiB receive buffer, so it falls behind by megabytes.

Each mix runs against a gateway with [coalesce] max_flight_bytes = 1k
(the flight frees what every client has been sent) and = 1g (nothing is
ever freed: the behaviour before the bound covered memory), both with
the default max_reader_lag (32m); the slow mix also with
max_flight_bytes = 1k and max_reader_lag = 4m, which cuts the slow
client once it is 4 MiB behind.  Reported, medians over the runs: the
gateway's peak RSS growth over its VmHWM after a warm-up stream of the
same shape; the slowest client's peak backlog, sampled every 10 ms as
(bytes the fastest client had received) - (bytes the slowest client
still reading had received): what the flight must keep for it, plus
what sits in kernel socket buffers (not in RSS); and how many clients
were cut (an SSE error event "client_too_slow" at the end).

The claims it checks: with max_flight_bytes, peak RSS grows by about
the slowest reader's backlog at most, and without it by the whole
stream (issue 8); with max_reader_lag, by about max_flight_bytes +
max_reader_lag at most, however slow the slowest reader (issue 16).
Python 3 standard library only; reuses the integration tests' process
helpers (test/integration/gwtest.py).
"""

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "integration"))

import gwtest  # noqa: E402

PAD = 65536


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError("no %s for pid %d" % (field, pid))


def body(tag, content, chunks):
    return gwtest.chat_body(content, stream=True, mock_chunks=chunks,
                            mock_pad=PAD, mock_delay_ms=5, mock_hold=tag)


class Client:
    """A raw client socket that counts the bytes it receives."""

    def __init__(self, port, slow):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if slow:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.connect(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = s
        self.slow = slow
        self.got = 0
        self.head = b""             # the response head, to subtract
        self.head_len = None
        self.clean = False          # the last chunk came
        self.cut = False            # an error event "client_too_slow"
        self.done = False
        self.tail = b""

    def send(self, data):
        self.sock.sendall(gwtest.build_request(
            "POST", "/v1/chat/completions", gwtest.JSON_HEADERS, data))

    def run(self):
        self.sock.settimeout(60)
        while True:
            piece = self.sock.recv(65536)
            if not piece:
                break
            self.got += len(piece)
            if self.head_len is None:
                self.head += piece
                end = self.head.find(b"\r\n\r\n")
                if end >= 0:
                    self.head_len = end + 4
            self.tail = (self.tail + piece)[-1024:]
            if self.tail.endswith(b"0\r\n\r\n"):
                self.clean = True
                break
            if self.slow:
                time.sleep(0.02)
        self.cut = b'"code":"client_too_slow"' in self.tail
        self.done = True
        self.sock.close()


def wait(pred, what, timeout=10):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.01)


def one_run(bin_dir, tmp, max_bytes, max_lag, mix, n, chunks):
    m = gwtest.Mock(bin_dir, (), os.path.join(tmp, "mock.log"))
    g = gwtest.Gateway(bin_dir, tmp, m.port,
                       {"coalesce": {"max_flight_bytes": max_bytes,
                                     "max_reader_lag": max_lag},
                        "server": {"access_log": "off"}},
                       name="gw-%s-%s-%s-%d" % (max_bytes, max_lag, mix, n))
    try:
        warm = Client(g.port, False)
        warm.send(gwtest.chat_body("warm", stream=True, mock_chunks=8,
                                   mock_pad=PAD))
        warm.run()
        base = status_kib(g.proc.pid, "VmHWM")
        tag = "mem-" + os.urandom(6).hex()
        data = body(tag, "memory %s %s %s %d" % (max_bytes, max_lag, mix, n),
                    chunks)
        clients = [Client(g.port, mix == "slow" and i == 2)
                   for i in range(3)]
        clients[0].send(data)
        wait(lambda: m.stats()["held"] == 1, "the leader's call")
        for c in clients[1:]:
            c.send(data)
        wait(lambda: gwtest.metric(g.metrics(),
                                   "infergw_coalesce_followers_total") == 2,
             "two followers")
        threads = [threading.Thread(target=c.run, daemon=True)
                   for c in clients]
        for t in threads:
            t.start()
        m.release(tag)
        backlog = 0
        while not all(c.done for c in clients):
            got = [c.got for c in clients]
            reading = [c.got for c in clients if not c.done]
            if reading:
                backlog = max(backlog, max(got) - min(reading))
            time.sleep(0.01)
        for t in threads:
            t.join()
        peak = status_kib(g.proc.pid, "VmHWM")
        whole = [c for c in clients if not c.cut]
        bodies = {c.got - (c.head_len or 0) for c in whole}
        return {"grew_kib": peak - base, "backlog_kib": backlog // 1024,
                "stream_kib": max(bodies) // 1024 if bodies else 0,
                "cut": len(clients) - len(whole),
                "same": len(bodies) == 1 and all(c.clean for c in whole)}
    finally:
        g.stop()
        m.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/default/bin")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=320)
    args = ap.parse_args()
    rows = []
    configs = [("fast", "1k", "32m"), ("fast", "1g", "32m"),
               ("slow", "1k", "32m"), ("slow", "1g", "32m"),
               ("slow", "1k", "4m")]
    with tempfile.TemporaryDirectory() as tmp:
        for mix, max_bytes, max_lag in configs:
            runs = [one_run(args.bin, tmp, max_bytes, max_lag, mix, i,
                            args.chunks)
                    for i in range(args.reps)]
            rows.append((mix, max_bytes, max_lag, runs))
            gwtest.Ctx.cleanup()
    print("| clients | max_flight_bytes | max_reader_lag | stream | peak "
          "RSS growth (median; per run) | slowest reading client's peak "
          "backlog (median) | clients cut (per run) | every other client "
          "got the whole body, cleanly ended |")
    print("|---|---|---|---|---|---|---|---|")
    for mix, max_bytes, max_lag, runs in rows:
        grew = [r["grew_kib"] for r in runs]
        print("| %s | %s | %s | %d KiB | %d KiB; %s | %d KiB | %s | %s |" % (
            "3 fast" if mix == "fast" else "2 fast, 1 at 3 MB/s",
            max_bytes, max_lag, runs[0]["stream_kib"],
            statistics.median(grew), ", ".join(str(x) for x in grew),
            statistics.median(r["backlog_kib"] for r in runs),
            ", ".join(str(r["cut"]) for r in runs),
            "yes" if all(r["same"] for r in runs) else "NO"))


if __name__ == "__main__":
    main()
