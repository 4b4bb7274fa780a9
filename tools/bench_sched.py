#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/bench_sched.py - fleet-aware scheduling (issues 18 and 29): the
four [routing] balance policies over a fleet of engine-mode mocks.

    python3 tools/bench_sched.py [--bin build/default/bin] [--quick]
        [--workload a|b|c|c0|d|d70|d110|e[,...]] [--modes M[,...]]
        [--reps 1] [--seed 1] [--set KEY=VALUE]... [--out FILE]

What it measures.  Open-loop streamed chat completions through one
gateway in front of SERVERS (4) mocks in engine mode (docs/MOCK_UPSTREAM.md
"Engine mode"), once per policy -- round_robin, least_inflight, prefix,
least_load -- each with a fresh gateway and fresh mocks (so every prefix
cache starts cold) and the same arrivals (seeded).  Workloads:

  a  two of the four servers also take streams sent straight to them by
     another client, which the gateway's own open-call count cannot see;
  b  outputs of 10 and 500 tokens mixed 80/20;
  c  two tenants: b floods at 3x the fleet's capacity with 500-token
     outputs, a sends 10% of it in 10-token ones, both from 0 s, both
     measured from 10 s on, once the flood holds the fleet (its first
     answers take 9 s to end);
  c0 the same measured from 0 s (not in the default set: the flood's
     start, on a fleet and a gateway that know nothing yet -- where a
     light tenant's calls used to time out, issue 29);
  d  12 groups of requests sharing long system prompts (2-4 KB, the rest
     of each prompt short and distinct), at 70% and at 110% of capacity;
  e  LoRA adapters: 16 by Zipf popularity on 4 servers of --max-loras 4,
     at 70%, for round_robin and least_load with and without its LoRA
     rule (issue 29; not in the default set; tools/bench_lora.py has it
     all, --modes does not apply).

How.  Capacity comes from the mock's model: a step lasts step_ms +
step_per_seq_ms x running and gives every running sequence one token, so
with the batch full (max_running) a sequence of T output tokens holds one
of max_running slots for T full steps.  A server's capacity is
max_running / (T x full step) requests per second; the load of a stream
of requests is its rate x its mean slot time / the slots it may use (the
prefills of the prompts are left out: a few ms here, and in d the cold
prefill is what the prefix cache saves).  Arrivals are Poisson at the
target rates.  Each request is a fresh connection with "stream": true,
"max_tokens" and "temperature": 1 (so nothing coalesces), driven by one
thread's selector loop (no thread per request, so the client keeps up;
its lag behind the schedule is reported).  Per request: TTFT, from the
scheduled arrival to the first content event ("delta":{"content":),
end-to-end time, output tokens, status; an error is any status but 200
(and a 503 or 429 without Retry-After is told apart), a stream without
its clean end ([DONE] and the last chunk), or one still open when the
run gives up (GIVE_UP_S after the window).

Per class (a tenant, or the direct streams of a), over the requests
scheduled in its measured window: sent, completed, errors by kind (the
status code, "cut", "connect", "unfinished"; those before the window are
reported apart), and TTFT p50/p90/p99 and e2e p99 with every error and
unfinished request counted as a miss (infinite: a percentile that falls
on one prints "miss"), so a tenant whose calls fail does not look fast;
the TTFT p99 of the completed ones alone too; output tokens/s over the
window.  Per run: the prefix cache hit rate
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, summed
over the servers, deltas over the run), the largest vLLM queue one mock
showed (vllm:num_requests_waiting, every mock read every 100 ms), the
largest gateway queue (the calls waiting, summed over
infergw_tenant_queued, which counts each once; read every 250 ms), the
calls per upstream, the client's lag and CPU and the machine's CPU.
With --reps N every number is the median of N runs (the modes
interleaved), but errors, which are summed.  BENCH_SCHED_TRACE=1 in the
environment prints every request's "trace MODE CLASS ARRIVAL_S TTFT_S"
(or "... error KIND") to stderr, and each mock's read as "engine T_S
MOCK running N waiting N".  The targets of issues 18 and 29 are checked
and printed, met or not; the script never fails on them
(docs/BENCHMARKS.md).  --out writes every number as JSON (a miss as the
string "miss").

Gateway settings: the defaults, except [routing] balance,
first_byte_timeout = 120s (under round_robin and least_inflight the
flood of c waits in vLLM's queue, before its first byte) and, but in c
and c0, queue_timeout = 120s (d110's overload waits in the gateway's
queue).  c keeps the default queue_timeout (2 s), as an install would:
the flood's excess is shed with 503 and Retry-After, and a light
tenant's call that waits longer is an error.

A full run (4 workloads x 4 modes, one repetition) takes about 13
minutes on 2 cores; c with --modes least_inflight,least_load --reps 3
about 7 (least_inflight's flood waits a minute in vLLM's queue);
--quick (shorter windows, long outputs capped at 100 tokens) about
2 minutes, a smoke run whose numbers are not the targets'.  Python 3
standard library only; reuses the integration tests' process helpers
(test/integration/gwtest.py); the tables, notes and targets are
tools/bench_sched/report.py's.
"""

import argparse
import errno
import json
import math
import os
import random
import resource
import selectors
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "integration"))

import gwtest  # noqa: E402
# f and ms too: tools/bench_lora.py formats its table with them.
from bench_sched.report import (MODES, f, finite, ms, notes,  # noqa: E402
                                table, targets)

import bench_lora  # noqa: E402

CHAT = "/v1/chat/completions"
CONTENT = b'"delta":{"content":'    # a content event, not the role chunk
LAST_CHUNK = b"\r\n0\r\n\r\n"
KEYS = {"a": "sk-bench-tenant-a-0123456789",
        "b": "sk-bench-tenant-b-0123456789"}
ENGINE = {"max_running": 8, "step_ms": 10, "step_per_seq_ms": 1,
          "prefill_us_per_token": 50, "kv_blocks": 512, "block_tokens": 16}
SERVERS = 4
POLL_S = 0.1            # each mock's /metrics
GW_POLL_S = 0.25        # the gateway's /metrics
BIN_S = 0.25            # output tokens are counted in bins this wide
GIVE_UP_S = 150         # after the window: a request still open is an error
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
         "kilo lima mike november oscar papa quebec romeo sierra tango "
         "uniform victor whiskey xray yankee zulu").split()


# ---- the mock's model: capacity ------------------------------------------

def full_step_s():
    return (ENGINE["step_ms"] + ENGINE["step_per_seq_ms"]
            * ENGINE["max_running"]) / 1000.0


def mean_tokens(mix):
    return sum(p * t for p, t in mix)


def rate_for(load, servers, mix):
    """Requests/s that keep 'servers' servers' slots 'load' busy."""
    slot_s = mean_tokens(mix) * full_step_s()
    return load * ENGINE["max_running"] * servers / slot_s


# ---- workloads ------------------------------------------------------------

def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def short_prompt(rng, cls, i):
    return [{"role": "user",
             "content": "%s %d: %s" % (cls, i, words(rng, 10))}]


def group_prompts(n=12, low=2048, high=4096):
    """n system prompts of low..high bytes, distinct from their start."""
    out = []
    for g in range(n):
        size = low + (high - low) * g // (n - 1)
        rng = random.Random("system-%d" % g)
        text = "You are assistant number %d of the bench. " % g
        while len(text) < size:
            text += rng.choice(WORDS) + " "
        out.append(text[:size])
    return out


def grouped_prompt(systems):
    def make(rng, cls, i):
        g = rng.randrange(len(systems))
        return [{"role": "system", "content": systems[g]},
                {"role": "user", "content": "q%d: %s" % (i, words(rng, 6))}]
    return make


def workloads(quick):
    """name -> (window s, [class]); a class is a dict: name, to ('gw' or
    'direct'), servers (direct: the mocks it hits), load, mix [(p,
    tokens)], key (tenant), prompt (rng, class, i -> messages)."""
    long_t = 100 if quick else 500
    w = (lambda full, q: q if quick else full)
    systems = group_prompts()
    a_mix = [(1.0, 50 if quick else 100)]
    b_mix = [(0.8, 10), (0.2, long_t)]
    d_mix = [(1.0, 32)]
    return {
        "a": (w(25, 4), [
            dict(name="gw", to="gw", load=0.5, mix=a_mix,
                 prompt=short_prompt),
            dict(name="direct", to="direct", servers=(0, 1), load=0.7,
                 mix=a_mix, prompt=short_prompt)]),
        "b": (w(30, 4), [
            dict(name="gw", to="gw", load=0.8, mix=b_mix,
                 prompt=short_prompt)]),
        "c": (w(25, 4), [
            dict(name="a", to="gw", load=0.1, mix=[(1.0, 10)], key="a",
                 prompt=short_prompt, **{"from": w(10, 2)}),
            dict(name="b", to="gw", load=3.0, mix=[(1.0, long_t)],
                 key="b", prompt=short_prompt, **{"from": w(10, 2)})]),
        "c0": (w(15, 2), [
            dict(name="a", to="gw", load=0.1, mix=[(1.0, 10)], key="a",
                 prompt=short_prompt),
            dict(name="b", to="gw", load=3.0, mix=[(1.0, long_t)],
                 key="b", prompt=short_prompt)]),
        "d70": (w(20, 3), [
            dict(name="gw", to="gw", load=0.7, mix=d_mix,
                 prompt=grouped_prompt(systems))]),
        "d110": (w(20, 3), [
            dict(name="gw", to="gw", load=1.1, mix=d_mix,
                 prompt=grouped_prompt(systems))]),
        "e": bench_lora.workload(quick, short_prompt),
    }


def pick(rng, mix):
    x = rng.random()
    for p, t in mix:
        if x < p:
            return t
        x -= p
    return mix[-1][1]


class Arrival:
    __slots__ = ("t", "cls", "port_ix", "tokens", "data")


def schedule(name, window, classes, seed):
    """Every class's Poisson arrivals over 'window', sorted; the same for
    every mode (each class has its own seeded generator)."""
    out = []
    for c in classes:
        rng = random.Random("%d-%s-%s" % (seed, name, c["name"]))
        servers = len(c["servers"]) if c["to"] == "direct" else SERVERS
        rate = rate_for(c["load"], servers, c["mix"])
        c["rate"] = rate
        t, i = c.get("start", 0) + rng.expovariate(rate), 0
        while t < window:
            a = Arrival()
            a.t, a.cls = t, c
            a.port_ix = (rng.choice(c["servers"]) if c["to"] == "direct"
                         else None)
            a.tokens = pick(rng, c["mix"])
            body = gwtest.jbody(model="mock-model",
                                messages=c["prompt"](rng, c["name"], i),
                                stream=True, max_tokens=a.tokens,
                                temperature=1)
            a.data = body
            out.append(a)
            t += rng.expovariate(rate)
            i += 1
    out.sort(key=lambda a: a.t)
    return out


# ---- the client: one selector loop ----------------------------------------

def http_request(port, method, path, body=b"", key=None):
    head = ["%s %s HTTP/1.1" % (method, path), "Host: 127.0.0.1:%d" % port,
            "Connection: close"]
    if body:
        head += ["Content-Type: application/json",
                 "Content-Length: %d" % len(body)]
    if key:
        head.append("Authorization: Bearer %s" % key)
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Exchange:
    """One request on a fresh non-blocking connection."""

    def __init__(self, loop, port, data):
        self.loop, self.out = loop, data
        self.head = b""
        self.status = None
        self.err = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        rc = self.sock.connect_ex(("127.0.0.1", port))
        if rc not in (0, errno.EINPROGRESS):
            self.finish("connect: %s" % os.strerror(rc))
            return
        loop.sel.register(self.sock, selectors.EVENT_WRITE, self)
        loop.open += 1

    def ready(self, mask):
        if mask & selectors.EVENT_WRITE:
            if self.head == b"" and self.status is None:
                e = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if e:
                    self.finish("connect: %s" % os.strerror(e))
                    return
            try:
                n = self.sock.send(self.out)
            except BlockingIOError:
                return
            except OSError as e:
                self.finish("send: %s" % e)
                return
            self.out = self.out[n:]
            if not self.out:
                self.loop.sel.modify(self.sock, selectors.EVENT_READ, self)
            return
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as e:
            self.finish("recv: %s" % e)
            return
        now = time.monotonic()
        if self.status is None:
            if not data:
                self.finish("closed before the response head")
                return
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            data = self.head[end + 4:]
            lines = self.head[:end].split(b"\r\n")
            self.status = int(lines[0].split()[1])
            self.chunked = any(
                l.lower().startswith(b"transfer-encoding:")
                and b"chunked" in l.lower() for l in lines[1:])
            self.retry_after = any(
                l.lower().startswith(b"retry-after:") for l in lines[1:])
            self.started(now)
            if not data:
                return
        self.body(data, now)

    def started(self, now):
        pass

    def finish(self, err=None):
        if self.sock is None:
            return
        if err is not None and self.err is None:
            self.err = err
        try:
            self.loop.sel.unregister(self.sock)
            self.loop.open -= 1
        except (KeyError, ValueError):
            pass
        self.sock.close()
        self.sock = None
        self.done()

    def done(self):
        pass


class Stream(Exchange):
    """A streamed completion: TTFT, tokens, a clean end."""

    def __init__(self, loop, port, a, t_sched):
        self.a, self.t_sched = a, t_sched
        self.t_start = time.monotonic()
        self.t_first = self.t_end = None
        self.tokens = 0
        self.tail = b""
        self.saw_done = self.saw_error = False
        self.bins = loop.bins.setdefault(a.cls["name"], {})
        super().__init__(loop, port, http_request(
            port, "POST", CHAT, a.data, KEYS.get(a.cls.get("key"))))

    def started(self, now):
        if self.status != 200:
            self.finish("status %d%s" % (
                self.status, "" if self.retry_after else
                " without Retry-After"))

    def body(self, data, now):
        if self.sock is None:
            return
        if not data:
            self.finish(None if (not self.chunked and self.saw_done)
                        else "stream cut")
            return
        scan = self.tail + data
        n = scan.count(CONTENT)     # the tail holds no whole pattern
        if n:
            if self.t_first is None:
                self.t_first = now
            self.tokens += n
            b = int((now - self.loop.t0) / BIN_S)
            self.bins[b] = self.bins.get(b, 0) + n
        if b"data: [DONE]" in scan:
            self.saw_done = True
        if b'"error":' in scan:
            self.saw_error = True
        self.tail = scan[-32:]
        if self.chunked and self.saw_done and scan.endswith(LAST_CHUNK):
            self.finish(None)

    def done(self):
        self.t_end = time.monotonic()
        if self.err is None and self.saw_error:
            self.err = "SSE error event"
        self.loop.results.append(self)


class Scrape(Exchange):
    """GET /metrics, read to its end; 'then' gets the parsed samples."""

    def __init__(self, loop, tag, port, key, then):
        self.tag, self.then, self.text = tag, then, b""
        super().__init__(loop, port,
                         http_request(port, "GET", "/metrics", key=key))

    def body(self, data, now):
        if not data:
            self.finish()
            return
        self.text += data

    def done(self):
        self.loop.scraping.discard(self.tag)
        if self.err is None and self.status == 200:
            body = self.text
            if self.chunked:
                body = dechunk(body)
            self.then(gwtest.parse_metrics(body.decode("utf-8", "replace")))


def dechunk(raw):
    out, pos = b"", 0
    while True:
        nl = raw.find(b"\r\n", pos)
        size = int(raw[pos:nl].split(b";")[0], 16)
        if size == 0:
            return out
        out += raw[nl + 2:nl + 2 + size]
        pos = nl + 2 + size + 2


class Loop:
    """Runs one schedule against the gateway and the mocks."""

    def __init__(self, gw_port, mock_ports):
        self.sel = selectors.DefaultSelector()
        self.gw_port, self.mock_ports = gw_port, mock_ports
        self.results = []
        self.bins = {}
        self.open = 0
        self.scraping = set()
        self.engine = []            # (t, [waiting per mock])
        self.waiting_now = [0.0] * len(mock_ports)
        self.kv_max = 0.0
        self.gw_queued_max = 0.0
        self.lags = []

    def scrape(self, tag, port, key, then):
        if tag in self.scraping:    # the last one is still under way
            return
        self.scraping.add(tag)
        Scrape(self, tag, port, key, then)

    def run(self, arrivals, window):
        self.t0 = t0 = time.monotonic()
        next_poll = next_gw_poll = t0
        i = 0
        give_up = t0 + window + GIVE_UP_S
        streams = []
        while True:
            now = time.monotonic()
            while i < len(arrivals) and t0 + arrivals[i].t <= now:
                a = arrivals[i]
                port = (self.gw_port if a.port_ix is None
                        else self.mock_ports[a.port_ix])
                self.lags.append(now - (t0 + a.t))
                streams.append(Stream(self, port, a, t0 + a.t))
                i += 1
            if now >= next_poll:
                for ix, port in enumerate(self.mock_ports):
                    self.scrape(("mock", ix), port, None,
                                lambda ms, ix=ix: self.engine_read(ix, ms))
                next_poll += POLL_S
            if now >= next_gw_poll:
                self.scrape("gw", self.gw_port, gwtest.ADMIN_KEY,
                            self.gw_read)
                next_gw_poll += GW_POLL_S
            if i == len(arrivals) and len(self.results) == len(arrivals):
                break
            if now > give_up:
                break
            until = min(next_poll, next_gw_poll)
            if i < len(arrivals):
                until = min(until, t0 + arrivals[i].t)
            for key, mask in self.sel.select(max(0.0, until - now)):
                key.data.ready(mask)
        for s in streams:
            if s.sock is not None:
                s.finish("still open %d s after the window" % GIVE_UP_S)
        return time.monotonic() - t0

    def engine_read(self, ix, ms):
        self.waiting_now[ix] = gwtest.metric(ms, "vllm:num_requests_waiting")
        if os.environ.get("BENCH_SCHED_TRACE"):
            print("engine %.3f s%d running %g waiting %g" % (
                time.monotonic() - self.t0, ix,
                gwtest.metric(ms, "vllm:num_requests_running"),
                self.waiting_now[ix]), file=sys.stderr)
        self.kv_max = max(self.kv_max,
                          gwtest.metric(ms, "vllm:kv_cache_usage_perc"))
        self.engine.append((time.monotonic() - self.t0,
                            list(self.waiting_now)))

    def gw_read(self, ms):
        self.gw_queued_max = max(self.gw_queued_max,
                                 gwtest.metric(ms, "infergw_tenant_queued"))


# ---- one run --------------------------------------------------------------

def pct(xs, p):
    """Nearest rank; None for no samples.  A miss is math.inf in 'xs', so
    a percentile that falls on one is inf."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100.0 * len(xs)) - 1)]


def kind_of(err):
    """An error's kind, for the per-class counts: the status code ("503";
    "503 without Retry-After" when the answer had none), "cut" (the
    stream ended without its clean end: cut, an SSE error event, closed
    before the head, a reset), "connect" (the connection failed) or
    "unfinished" (still open when the run gave up)."""
    if err.startswith("status "):
        return err[len("status "):]
    if err.startswith("still open"):
        return "unfinished"
    if err.startswith("connect"):
        return "connect"
    return "cut"


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])     # utime + stime


def machine_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, sum(v[:8])


def mock_counters(mocks):
    hits = queries = 0.0
    for m in mocks:
        r = gwtest.request(m.port, "GET", "/metrics")
        ms = gwtest.parse_metrics(r.body.decode())
        hits += gwtest.metric(ms, "vllm:prefix_cache_hits_total")
        queries += gwtest.metric(ms, "vllm:prefix_cache_queries_total")
    return hits, queries


def run_once(args, wname, window, classes, mode, tmp):
    tenants = any(c.get("key") for c in classes)
    spec = ",".join("%s=%s" % kv for kv in sorted(ENGINE.items()))
    mocks, g = [], None
    try:
        for ix in range(SERVERS):
            mocks.append(gwtest.Mock(args.bin, ["-E", spec], os.path.join(
                tmp, "%s-%s-s%d.log" % (wname, mode, ix))))
        conf = {"server": {"access_log": "off"},
                "routing": {"balance": mode, "first_byte_timeout": "120s"}}
        # (c) keeps the default queue_timeout (2 s), as an install would:
        # the flood's excess is shed with 503, and a light tenant's call
        # that waits past it is an error, a miss (issue 29).  Elsewhere
        # a call may wait 120 s (d110's overload waits in the queue).
        if not wname.startswith("c"):
            conf["routing"]["queue_timeout"] = "120s"
        conf["routing"].update(args.routing)
        for ix, m in enumerate(mocks):
            conf["upstream s%d" % ix] = {"url": "http://127.0.0.1:%d"
                                         % m.port}
        if tenants:
            for t, k in sorted(KEYS.items()):
                conf["tenant %s" % t] = {"api_key": k}
        g = gwtest.Gateway(args.bin, tmp, None, conf,
                           admin_key=gwtest.ADMIN_KEY,
                           name="gw-%s-%s" % (wname, mode))
        gwtest.wait_for(lambda: all(gwtest.has_metric(
            g.metrics(), "infergw_upstream_engine_load_age_seconds",
            upstream="s%d" % ix) for ix in range(SERVERS)), 10,
            msg="the gateway reads every engine")
        arrivals = schedule(wname, window, classes, args.seed)
        hits0, queries0 = mock_counters(mocks)
        busy0, all0 = machine_ticks()
        gw0 = cpu_ticks(g.proc.pid)
        mocks0 = sum(cpu_ticks(m.proc.pid) for m in mocks)
        me0 = resource.getrusage(resource.RUSAGE_SELF)
        loop = Loop(g.port, [m.port for m in mocks])
        took = loop.run(arrivals, window)
        me1 = resource.getrusage(resource.RUSAGE_SELF)
        busy1, all1 = machine_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        gw_cpu = (cpu_ticks(g.proc.pid) - gw0) / hz
        mocks_cpu = (sum(cpu_ticks(m.proc.pid) for m in mocks) - mocks0) / hz
        hits1, queries1 = mock_counters(mocks)
        gm = g.metrics()
        calls = [gwtest.metric(gm, "infergw_upstream_calls_total",
                               upstream="s%d" % ix) for ix in range(SERVERS)]
        queue_waits = gwtest.metric(gm, "infergw_upstream_queue_waits_total")
        tenant_waits = {
            t: (gwtest.metric(gm, "infergw_tenant_queue_waits_total",
                              tenant=t),
                gwtest.metric(gm, "infergw_tenant_queue_wait_seconds_total",
                              tenant=t))
            for t in (sorted(KEYS) if tenants else ["default"])}
        errors_log = [l for l in g.log_lines() if "level=error" in l][:5]
    finally:
        if g is not None:
            g.close()
        for m in mocks:
            m.close()
    r = {"workload": wname, "mode": mode, "window_s": window,
         "took_s": took, "classes": {}}
    for c in classes:
        start = c.get("from", c.get("start", 0))
        span = window - start
        every = [s for s in loop.results if s.a.cls is c]
        mine = [s for s in every if s.t_sched - loop.t0 >= start]
        # A request that failed, or never had its first token, is a miss:
        # its TTFT (and e2e) is infinite, so the percentiles cover every
        # request sent, not only those that got through (issue 29).
        ttft = [s.t_first - s.t_sched if s.err is None and s.t_first
                else math.inf for s in mine]
        done = [s.t_first - s.t_sched for s in mine
                if s.err is None and s.t_first]
        if os.environ.get("BENCH_SCHED_TRACE"):
            for s in every:
                print("trace %s %s %.3f %s" % (
                    mode, c["name"], s.t_sched - loop.t0,
                    "%.3f" % (s.t_first - s.t_sched)
                    if s.err is None and s.t_first
                    else "error " + kind_of(s.err or "cut")),
                    file=sys.stderr)
        e2e = [s.t_end - s.t_sched if s.err is None else math.inf
               for s in mine]
        bins = loop.bins.get(c["name"], {})
        in_window = sum(n for b, n in bins.items()
                        if start <= b * BIN_S < window)
        sent = sum(1 for s in mine if s.t_start - loop.t0 < window)
        errs, kinds, before = {}, {}, {}
        for s in every:
            if s.err is None:
                continue
            k = kind_of(s.err)
            if s in mine:
                errs[s.err] = errs.get(s.err, 0) + 1
                kinds[k] = kinds.get(k, 0) + 1
            else:
                before[k] = before.get(k, 0) + 1
        r["classes"][c["name"]] = {
            "requests": len(every), "measured": len(mine),
            "sent": len(mine),
            "completed": sum(1 for s in mine if s.err is None),
            "errors": sum(kinds.values()),
            "errors_by_kind": kinds,
            "errors_before_window": before,
            "error_kinds": errs,
            "target_rate": c["rate"],
            "scheduled_rate": sum(1 for a in arrivals if a.cls is c
                                  and a.t >= start) / span,
            "achieved_rate": sent / span,
            "mean_tokens": mean_tokens(c["mix"]),
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "ttft_p99": pct(ttft, 99), "e2e_p99": pct(e2e, 99),
            "ttft_p99_completed": pct(done, 99),
            "tokens": sum(s.tokens for s in mine),
            "gateway_queue_waits": tenant_waits.get(c.get("key", "default"),
                                                    (0, 0))[0],
            "gateway_queue_wait_s": tenant_waits.get(c.get("key", "default"),
                                                     (0, 0))[1],
            "each": [[round(s.t_sched - loop.t0, 3),
                      round(s.t_first - s.t_sched, 4) if s.t_first else None,
                      round(s.t_end - s.t_sched, 4), s.tokens, s.err]
                     for s in mine],
            "tokens_per_s": in_window / span}
    waits = [w for _, ws in loop.engine for w in ws]
    client_cpu = ((me1.ru_utime + me1.ru_stime)
                  - (me0.ru_utime + me0.ru_stime))
    machine_cpu = (busy1 - busy0) / hz
    r.update({
        "prefix_hit_rate": ((hits1 - hits0) / (queries1 - queries0)
                            if queries1 > queries0 else None),
        "max_vllm_waiting": max(waits) if waits else None,
        "max_fleet_waiting": max((sum(ws) for _, ws in loop.engine),
                                 default=None),
        "max_gateway_queued": loop.gw_queued_max,
        "max_kv_usage": loop.kv_max,
        "calls_per_upstream": calls, "gateway_queue_waits": queue_waits,
        "lag_p99_ms": pct(loop.lags, 99) * 1000.0 if loop.lags else None,
        "lag_max_ms": max(loop.lags) * 1000.0 if loop.lags else None,
        "client_cpu_pct": 100.0 * client_cpu / took,
        "gateway_cpu_s": gw_cpu, "mocks_cpu_s": mocks_cpu,
        "machine_busy_pct": 100.0 * (busy1 - busy0) / max(1, all1 - all0),
        "others_busy_pct": 100.0 * max(0.0, machine_cpu - client_cpu - gw_cpu
                                       - mocks_cpu) / (took * os.cpu_count()),
        "gateway_errors_logged": errors_log})
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "default",
                                                  "bin"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workload", default="a,b,c,d",
                    help="a, b, c, d (d70 and d110), e, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[],
                    metavar="KEY=VALUE",
                    help="a [routing] setting for every gateway (a variant)")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.routing = dict(kv.split("=", 1) for kv in args.set)
    wls = workloads(args.quick)
    names = []
    for w in args.workload.split(","):
        names += ["d70", "d110"] if w == "d" else [w]
    for n in names:
        if n not in wls:
            ap.error("unknown workload %r" % n)
    lora = "e" in names                 # bench_lora.py runs it, its way
    names = [n for n in names if n != "e"]
    modes = args.modes.split(",")
    for mo in modes:
        if mo not in MODES:
            ap.error("unknown mode %r" % mo)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as tmp:
        for rep in range(args.reps):
            for n in names:
                window, classes = wls[n]
                for mo in modes:
                    r = run_once(args, n, window, classes, mo, tmp)
                    results.setdefault(n, {}).setdefault(mo, []).append(r)
                    print("bench_sched: rep %d %s %-14s %s" % (
                        rep + 1, n, mo, json.dumps(
                            {c: {k: (round(v, 4) if isinstance(v, float)
                                     else v) for k, v in cr.items()
                                 if k in ("sent", "completed", "errors",
                                          "ttft_p99", "tokens_per_s")}
                             for c, cr in r["classes"].items()})),
                          file=sys.stderr, flush=True)
                gwtest.Ctx.cleanup()
        if lora:
            lora_text, lora_targets, results["e"] = bench_lora.run(
                sys.modules[__name__], args, args.quick, tmp)
    wall = time.monotonic() - started
    step = full_step_s()
    text = ["Engine (every mock): -E %s; full step %.0f ms, so a server's "
            "capacity is %d / (T x %.3f s) requests/s for T-token outputs "
            "(%.0f output tokens/s), %d servers." % (
                ",".join("%s=%s" % kv for kv in sorted(ENGINE.items())),
                step * 1000, ENGINE["max_running"], step,
                ENGINE["max_running"] / step, SERVERS)]
    for n in names:
        window, classes = wls[n]
        text.append("\n### %s\n" % n)
        text.append(table(n, results[n], [c["name"] for c in classes]))
        text.append("")
        text.append(notes(n, results[n], window, classes, args.reps))
    if lora:
        text.append("\n### e\n")
        text.append(lora_text)
    text.append("\n**Targets** (medians%s):\n" % (
        "; --quick is a smoke run, its numbers are not the targets'"
        if args.quick else ""))
    met_or_not = (targets({n: results[n] for n in names})
                  + (lora_targets if lora else []))
    for what, met, how in met_or_not:
        text.append("- %s: %s (%s)" % (what, "met" if met else "**missed**",
                                       how))
    text.append("\nWall time %.0f s." % wall)
    print("\n".join(text))
    if args.out:
        with open(args.out, "w") as fp:
            json.dump(finite({"engine": ENGINE, "servers": SERVERS,
                       "quick": args.quick, "reps": args.reps,
                       "seed": args.seed, "wall_s": wall,
                       "results": results,
                       "targets": [{"target": t, "met": m, "numbers": h}
                                   for t, m, h in met_or_not]}),
                      fp, indent=1)


if __name__ == "__main__":
    main()
