#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/bench_sched.py - fleet-aware scheduling (issue 18): the four
[routing] balance policies over a fleet of engine-mode mocks.

    python3 tools/bench_sched.py [--bin build/default/bin] [--quick]
        [--workload a|b|c|d|e[,...]] [--modes M[,...]] [--reps 1]
        [--seed 1] [--out FILE]

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
  c0 the same measured from 0 s (not in the default set: the cold start
     of a fleet and a gateway that know nothing yet);
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
end-to-end time, output tokens, status; an error is any status but 200,
a stream without its clean end ([DONE] and the last chunk), or one still
open when the run gives up.  Per run: TTFT p50/p90/p99, e2e p99, output
tokens/s over the arrival window, errors, the prefix cache hit rate
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, summed
over the servers, deltas over the run), the largest vLLM queue one mock
showed (vllm:num_requests_waiting, every mock read every 100 ms), the
largest gateway queue (the calls waiting, summed over
infergw_tenant_queued, which counts each once; read every 250 ms), the
calls per upstream, the client's lag and CPU and the machine's CPU.
With --reps N every number is the median of N runs (the modes
interleaved).  BENCH_SCHED_TRACE=1 in the environment prints each
measured request's "trace MODE CLASS ARRIVAL_S TTFT_S" to stderr (how
the cold start of c0 was read), and each mock's read as "engine T_S
MOCK running N waiting N".  The targets of issue 18 are checked and printed, met or
not; the script never fails on them (docs/BENCHMARKS.md).

Gateway settings: the defaults, except [routing] balance, queue_timeout =
120s (the flood of c waits in the gateway's queue for tens of seconds)
and first_byte_timeout = 120s (under round_robin and least_inflight the
same flood waits in vLLM's queue, before its first byte).

A full run (4 workloads x 4 modes, one repetition) takes about 13
minutes on 2 cores, c alone with --reps 3 about 18;
--quick (shorter windows, long outputs capped at 100 tokens) about
2 minutes, a smoke run whose numbers are not the targets'.  Python 3
standard library only; reuses the integration tests' process helpers
(test/integration/gwtest.py).
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
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "integration"))

import gwtest  # noqa: E402

import bench_lora  # noqa: E402

MODES = ("round_robin", "least_inflight", "prefix", "least_load")
BASELINE = "least_inflight"
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
            self.finish("status %d" % self.status)

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
    """Nearest rank; None for no samples."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100.0 * len(xs)) - 1)]


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
                "routing": {"balance": mode, "queue_timeout": "120s",
                            "first_byte_timeout": "120s"}}
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
        ok = [s for s in mine if s.err is None]
        ttft = [s.t_first - s.t_sched for s in ok if s.t_first]
        if os.environ.get("BENCH_SCHED_TRACE"):
            for s in ok:
                if s.t_first:
                    print("trace %s %s %.3f %.3f" % (mode, c["name"],
                          s.t_sched - loop.t0, s.t_first - s.t_sched),
                          file=sys.stderr)
        e2e = [s.t_end - s.t_sched for s in ok]
        bins = loop.bins.get(c["name"], {})
        in_window = sum(n for b, n in bins.items()
                        if start <= b * BIN_S < window)
        sent = sum(1 for s in mine if s.t_start - loop.t0 < window)
        errs = {}
        for s in mine:
            if s.err is not None:
                errs[s.err] = errs.get(s.err, 0) + 1
        r["classes"][c["name"]] = {
            "requests": len(every), "measured": len(mine),
            "errors": sum(1 for s in every if s.err is not None),
            "error_kinds": errs,
            "target_rate": c["rate"],
            "scheduled_rate": sum(1 for a in arrivals if a.cls is c
                                  and a.t >= start) / span,
            "achieved_rate": sent / span,
            "mean_tokens": mean_tokens(c["mix"]),
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "ttft_p99": pct(ttft, 99), "e2e_p99": pct(e2e, 99),
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


# ---- the report -----------------------------------------------------------

def median_of(runs, path):
    """The median over runs of the number at 'path' (keys), None-safe."""
    vals = []
    for r in runs:
        v = r
        for k in path:
            v = v[k] if v is not None else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def f(v, fmt="%.0f"):
    return "-" if v is None else fmt % v


def ms(v):
    return f(None if v is None else v * 1000.0)


def table(wname, by_mode, cls_names):
    """Markdown table of one workload, rows = modes (medians)."""
    first = cls_names[0]
    lines = []
    if wname in ("c", "c0"):
        lines += ["| mode | a TTFT p50 / p90 / p99 ms | a e2e p99 ms | "
                  "b TTFT p50 / p99 ms | b tokens/s | b tokens/s vs "
                  "least_inflight | errors | prefix hits | max vLLM queue "
                  "| max gateway queue | a TTFT p99 vs least_inflight |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| mode | requests | TTFT p50 / p90 / p99 ms | e2e p99 ms "
                  "| output tokens/s | errors | prefix hits | max vLLM "
                  "queue | max gateway queue | calls per upstream | TTFT "
                  "p99 vs least_inflight |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = by_mode.get(BASELINE)
    base_p99 = median_of(base, ("classes", first, "ttft_p99")) if base \
        else None
    base_b = median_of(base, ("classes", "b", "tokens_per_s")) \
        if base and wname in ("c", "c0") else None
    for mode in MODES:
        runs = by_mode.get(mode)
        if not runs:
            continue
        m = (lambda *p: median_of(runs, p))
        errors = sum(r["classes"][c]["errors"] for r in runs
                     for c in cls_names)
        hit = m("prefix_hit_rate")
        p99 = m("classes", first, "ttft_p99")
        ratio = "%.2f" % (p99 / base_p99) if p99 and base_p99 else "-"
        common = "| %s | %s | %s | %s |" % (
            errors, "-" if hit is None else "%.1f %%" % (100 * hit),
            f(m("max_vllm_waiting")), f(m("max_gateway_queued")))
        if wname in ("c", "c0"):
            bt = m("classes", "b", "tokens_per_s")
            lines.append("| %s | %s / %s / %s | %s | %s / %s | %s | %s %s "
                         "%s |" % (
                             mode, ms(m("classes", "a", "ttft_p50")),
                             ms(m("classes", "a", "ttft_p90")), ms(p99),
                             ms(m("classes", "a", "e2e_p99")),
                             ms(m("classes", "b", "ttft_p50")),
                             ms(m("classes", "b", "ttft_p99")), f(bt),
                             "%.2f" % (bt / base_b) if bt and base_b
                             else "-", common, ratio))
        else:
            calls = [statistics.median(r["calls_per_upstream"][i]
                                       for r in runs)
                     for i in range(SERVERS)]
            lines.append("| %s | %s | %s / %s / %s | %s | %s %s %s | %s |" % (
                mode, f(m("classes", first, "requests")),
                ms(m("classes", first, "ttft_p50")),
                ms(m("classes", first, "ttft_p90")), ms(p99),
                ms(m("classes", first, "e2e_p99")),
                f(m("classes", first, "tokens_per_s")), common,
                " / ".join("%.0f" % c for c in calls), ratio))
    return "\n".join(lines)


def notes(wname, by_mode, window, classes, reps):
    out = []
    for c in classes:
        n = c["name"]
        any_run = next(iter(by_mode.values()))[0]["classes"][n]
        out.append("- %s: target %.2f req/s (load %.2f, mean %g tokens), "
                   "%.2f in the seeded schedule; sent in the window, per "
                   "mode: %s" % (
                       n, c["rate"], c["load"], mean_tokens(c["mix"]),
                       any_run["scheduled_rate"],
                       ", ".join("%s %.2f" % (mo, median_of(
                           rs, ("classes", n, "achieved_rate")))
                           for mo, rs in by_mode.items())))
    if wname in ("c", "c0"):
        for n in ("a", "b"):
            out.append("- tenant %s: output tokens/s %s; gateway queue: "
                       "waits, mean wait s: %s" % (n, ", ".join(
                           "%s %s" % (mo, f(median_of(
                               rs, ("classes", n, "tokens_per_s"))))
                           for mo, rs in by_mode.items()), ", ".join(
                           "%s %s, %s" % (mo, f(median_of(
                               rs, ("classes", n, "gateway_queue_waits"))),
                               f(median_of([{"v": r["classes"][n][
                                   "gateway_queue_wait_s"] / max(1, r[
                                       "classes"][n]["gateway_queue_waits"])}
                                   for r in rs], ("v",)), "%.2f"))
                           for mo, rs in by_mode.items())))
    if wname == "a":
        out.append("- the direct streams' TTFT p99 ms (s0, s1): %s" % (
            ", ".join("%s %s" % (mo, ms(median_of(
                rs, ("classes", "direct", "ttft_p99"))))
                for mo, rs in by_mode.items())))
    allruns = [r for rs in by_mode.values() for r in rs]
    out.append("- client: lag behind the schedule p99 %s ms, max %s ms; "
               "client CPU %s %% of one core (median, max %s %%); gateway "
               "CPU %s s, mocks %s s per run; machine busy %s %% of %d CPUs, "
               "others' share %s %% (medians); %d run(s) per mode, window "
               "%g s" % (
                   f(max(r["lag_p99_ms"] or 0 for r in allruns), "%.1f"),
                   f(max(r["lag_max_ms"] or 0 for r in allruns), "%.1f"),
                   f(median_of(allruns, ("client_cpu_pct",))),
                   f(max(r["client_cpu_pct"] for r in allruns)),
                   f(median_of(allruns, ("gateway_cpu_s",)), "%.1f"),
                   f(median_of(allruns, ("mocks_cpu_s",)), "%.1f"),
                   f(median_of(allruns, ("machine_busy_pct",))),
                   os.cpu_count(),
                   f(median_of(allruns, ("others_busy_pct",))),
                   reps, window))
    kinds = {}
    for r in allruns:
        for cn, cr in r["classes"].items():
            for k, v in cr["error_kinds"].items():
                key = "%s %s: %s" % (r["mode"], cn, k)
                kinds[key] = kinds.get(key, 0) + v
    if kinds:
        out.append("- errors: " + "; ".join("%s (%d)" % kv
                                            for kv in sorted(kinds.items())))
    return "\n".join(out)


def targets(results):
    """Issue 18's targets, from the medians: [(text, met or None, how)]."""
    def med(w, mode, *p):
        rs = results.get(w, {}).get(mode)
        return median_of(rs, p) if rs else None
    out = []
    ll, li = med("a", "least_load", "classes", "gw", "ttft_p99"), \
        med("a", "least_inflight", "classes", "gw", "ttft_p99")
    if ll is not None and li:
        out.append(("(a) least_load TTFT p99 <= 0.35x least_inflight's",
                    ll <= 0.35 * li, "%.0f ms vs %.0f ms: %.2fx" % (
                        ll * 1000, li * 1000, ll / li)))
    a99 = med("c", "least_load", "classes", "a", "ttft_p99")
    bll = med("c", "least_load", "classes", "b", "tokens_per_s")
    bli = med("c", "least_inflight", "classes", "b", "tokens_per_s")
    if a99 is not None:
        out.append(("(c) tenant a TTFT p99 < 3 s with least_load", a99 < 3,
                    "%.0f ms" % (a99 * 1000)))
    if bll is not None and bli:
        out.append(("(c) tenant b tokens/s within 10% of least_inflight's",
                    abs(bll / bli - 1) <= 0.10, "%.0f vs %.0f: %.2fx" % (
                        bll, bli, bll / bli)))
    hit = med("d70", "prefix", "prefix_hit_rate")
    pp, rr = med("d70", "prefix", "classes", "gw", "ttft_p99"), \
        med("d70", "round_robin", "classes", "gw", "ttft_p99")
    if hit is not None:
        out.append(("(d) at 70%, prefix cache hits >= 90% with prefix",
                    hit >= 0.9, "%.1f %%" % (100 * hit)))
    if pp is not None and rr:
        out.append(("(d) at 70%, prefix TTFT p99 <= 1.5x round_robin's",
                    pp <= 1.5 * rr, "%.0f ms vs %.0f ms: %.2fx" % (
                        pp * 1000, rr * 1000, pp / rr)))
    errs = sum(cr["errors"] for w in results.values() for rs in w.values()
               for r in rs for cr in r["classes"].values())
    out.append(("no request errors", errs == 0, "%d errors" % errs))
    return out


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
                                 if k in ("requests", "errors", "ttft_p99",
                                          "tokens_per_s")}
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
            json.dump({"engine": ENGINE, "servers": SERVERS,
                       "quick": args.quick, "reps": args.reps,
                       "seed": args.seed, "wall_s": wall,
                       "results": results,
                       "targets": [{"target": t, "met": m, "numbers": h}
                                   for t, m, h in met_or_not]},
                      fp, indent=1)


if __name__ == "__main__":
    main()
