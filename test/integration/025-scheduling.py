# SPDX-License-Identifier: MIT
"""025 - fleet-aware scheduling (docs/UPSTREAMS.md, pool.h, engine.h):
the gateway reads each upstream's GET /metrics and balances on its
engine's own load; work the fleet cannot take waits in the gateway, where
tenants share the free places fairly and a sheddable tenant is refused;
an upstream without metrics, or with stale ones, is balanced on its open
calls; and one hung upstream delays no other's beat.

The upstreams are the mock in engine mode (docs/MOCK_UPSTREAM.md "Engine
mode"): continuous batching over a FIFO, vLLM's /metrics.  Bounds are
loose (a loaded 2-core machine, sanitizer builds) but only reachable by
the rule under test: each test's mutant (named in its docstring) fails it.
"""

import socket
import threading
import time

from gwtest import (JSON_HEADERS, Connection, assert_error, budget,
                    chat_body, has_metric, metric, metric_at_least,
                    metric_value, parse_metrics, request, wait_for)

CHAT = "/v1/chat/completions"
CONTENT = b'"delta":{"content":'    # a content chunk, not the role chunk
KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-0123456789"
KEY_S = "tenant-s-key-0123456789"


def auth(key):
    h = dict(JSON_HEADERS)
    h["Authorization"] = "Bearer " + key
    return h


def engine(t, **params):
    """A mock in engine mode with these -E parameters."""
    spec = ",".join("%s=%s" % kv for kv in sorted(params.items()))
    return t.mock("-E", spec) if spec else t.mock("-e")


def fleet(t, mocks, routing=None, extra=""):
    conf = {"routing": dict(routing or {})}
    for i, m in enumerate(mocks):
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % m.port}
    return t.gateway(None, conf, extra=extra)


def control(m, **kw):
    q = "&".join("%s=%s" % kv for kv in kw.items())
    r = request(m.port, "POST", "/control?" + q)
    assert r.status == 200, r


class Load:
    """Streams held open on a port (the mock's, from outside the gateway,
    or the gateway's as one tenant), each read to its end in a thread."""

    def __init__(self, port, n, tokens, headers=None, tag="load"):
        self.threads = []
        self.ttft = [None] * n
        self.status = [None] * n
        for i in range(n):
            body = chat_body("%s %d" % (tag, i), stream=True,
                             max_tokens=tokens, temperature=1)
            th = threading.Thread(target=self._run,
                                  args=(port, i, body, headers),
                                  daemon=True)
            th.start()
            self.threads.append(th)

    def _run(self, port, i, body, headers):
        t0 = time.monotonic()
        conn = Connection(port, timeout=budget(60))
        try:
            s = conn.stream("POST", CHAT, headers or JSON_HEADERS, body)
            self.status[i] = s.resp.status
            for ev in s.events():
                if self.ttft[i] is None and CONTENT in ev:
                    self.ttft[i] = time.monotonic() - t0
        except Exception:       # noqa: BLE001 (cut at the test's end)
            pass
        finally:
            conn.close()

    def join(self, timeout):
        for th in self.threads:
            th.join(timeout)


def first_token(port, headers, prompt, tokens=2):
    """Seconds to the first content token of one streamed request."""
    t0 = time.monotonic()
    conn = Connection(port, timeout=budget(60))
    try:
        s = conn.stream("POST", CHAT, headers, chat_body(
            prompt, stream=True, max_tokens=tokens, temperature=1))
        assert s.resp.status == 200, s.resp.status
        for ev in s.events():
            if CONTENT in ev:
                return time.monotonic() - t0
    finally:
        conn.close()
    raise AssertionError("no body")


# ---- balancing on the engines' load -----------------------------------------

def test_a_server_loaded_from_outside_gets_fewer_calls(t):
    """Another client keeps u0's engine busy (4 running, 4 waiting); the
    gateway's own open calls are 0 on both, so only the engine's numbers
    tell them apart.  (Mutant: balance = least_inflight, or a score
    without the engine: about half go to u0.)"""
    a = engine(t, max_running=4, step_ms=20)
    b = engine(t, max_running=4, step_ms=20)
    g = fleet(t, [a, b], {"max_waiting": 1000})
    outside = Load(a.port, 8, 400)
    wait_for(lambda: metric_at_least(g, "infergw_upstream_engine_waiting", 4,
                                     upstream="u0"),
             budget(10), msg="the gateway reads u0's queue")
    before = [a.stats()["completions"], b.stats()["completions"]]
    for i in range(10):
        r = g.post(CHAT, chat_body("mine %d" % i, max_tokens=1,
                                   temperature=1))
        assert r.status == 200, r
    got = [a.stats()["completions"] - before[0],
           b.stats()["completions"] - before[1]]
    assert got[1] >= 9, "calls per upstream %r: the loaded one got them" \
        % got
    del outside


def test_without_engine_metrics_it_is_least_inflight(t):
    """u0 answers /metrics 404: it is scored by its open calls (logged
    once), so with u1's engine loaded from outside the calls go to u0.
    When its metrics come back, that is logged too."""
    a = engine(t, max_running=4, step_ms=20)
    b = engine(t, max_running=4, step_ms=20)
    control(a, metrics="off")
    g = fleet(t, [a, b], {"max_waiting": 1000})
    g.wait_log(r"scrape: upstream u0 has no engine load \(GET /metrics: "
               r"status 404\): balancing on its open calls")
    outside = Load(b.port, 8, 400)
    wait_for(lambda: metric_at_least(g, "infergw_upstream_engine_waiting", 4,
                                     upstream="u1"),
             budget(10), msg="the gateway reads u1's queue")
    before = a.stats()["completions"]
    for i in range(10):
        r = g.post(CHAT, chat_body("mine %d" % i, max_tokens=1,
                                   temperature=1))
        assert r.status == 200, r
    assert a.stats()["completions"] - before >= 9
    assert not has_metric(g.metrics(), "infergw_upstream_engine_waiting",
                          upstream="u0"), "u0 was never read"
    control(a, metrics="on")
    g.wait_log(r"scrape: upstream u0 reports its engine load")
    del outside


def test_a_slow_scrape_goes_stale_and_falls_back(t):
    """A /metrics answer slower than load_timeout is no answer: after one
    good read, u0's load goes stale and it is balanced on open calls."""
    a = engine(t, max_running=4, step_ms=20)
    g = fleet(t, [a], {"load_timeout": "150ms", "load_stale": "400ms"})
    wait_for(lambda: has_metric(g.metrics(),
                                "infergw_upstream_engine_load_age_seconds",
                                upstream="u0"), budget(5),
             msg="u0 read once")
    control(a, metrics_delay_ms=1000)
    g.wait_log(r"scrape: upstream u0 has no engine load \(GET /metrics: "
               r"total timeout\)", timeout=budget(5))
    r = g.post(CHAT, chat_body("still served", max_tokens=1))
    assert r.status == 200, r


# ---- the gateway's queue ---------------------------------------------------

TENANTS = ("[tenant a]\napi_key = %s\n"
           "[tenant b]\napi_key = %s\n"
           "[tenant s]\napi_key = %s\npriority = -1\n"
           % (KEY_A, KEY_B, KEY_S))


def test_a_flooding_tenant_does_not_delay_another(t):
    """Tenant b floods one small engine (2 running at once, 16 streams of
    about 1.5 s each: 12 s of work).  Tenant a's one request must not wait
    behind that flood in vLLM's FIFO: the gateway holds the excess, and
    the next free place is a's (fewer open calls).  (Mutant:
    balance = least_inflight, which sends b's flood on to vLLM: a waits
    some 10 s.)"""
    m = engine(t, max_running=2, step_ms=15, step_per_seq_ms=0)
    g = t.gateway(m, {"routing": {"max_waiting": 1, "queue_timeout": "60s"}},
                  extra=TENANTS)
    # Before the first scrape's answer nothing says the engine is full,
    # so a flood sent then goes on to vLLM (under ASan 9 of 16 did, and
    # never 8 waited here): flood a gateway that knows the engine's load.
    g.wait_log(r"scrape: upstream default reports its engine load")
    flood = Load(g.port, 16, 100, auth(KEY_B), tag="flood")
    wait_for(lambda: metric_at_least(g, "infergw_tenant_queued", 8,
                                     tenant="b"),
             budget(10), msg="b's flood waits in the gateway")
    ttft = first_token(g.port, auth(KEY_A), "a short one")
    assert ttft < budget(4), "tenant a waited %.1f s behind b's flood" % ttft
    # vLLM's own queue stayed short: the flood waited here.
    ms = parse_metrics(request(m.port, "GET", "/metrics").text)
    assert has_metric(ms, "vllm:num_requests_waiting")
    assert metric(ms, "vllm:num_requests_waiting") <= 2, \
        "vLLM's queue: %r" % metric(ms, "vllm:num_requests_waiting")
    flood.join(budget(60))
    assert all(s == 200 for s in flood.status), flood.status
    assert metric_value(g, "infergw_tenant_queue_waits_total",
                        tenant="b") >= 8


def test_a_flood_starting_on_an_unknown_fleet_leaves_a_tenant_room(t):
    """Tenant b's flood starts on a fleet no read has yet shown full (two
    engines of 4 places; its calls are 2000 tokens, 20 s each): tenant
    a's short calls that follow must each start at once, never wait out
    queue_timeout (2 s) for one of b's to end.  b, ahead of its share,
    learns the room on u0 alone; u0's known, u1 is presumed alike and b
    takes there only what a's reserve leaves.  (Mutants: b goes past
    the places proven on every engine, or the reserve is off
    (headroom = 0%): b holds all 8 places, and a's call gets 503.)"""
    mocks = [engine(t, max_running=4, step_ms=10, step_per_seq_ms=0)
             for _ in range(2)]
    g = fleet(t, mocks, {"queue_timeout": "2s"}, extra=TENANTS)
    for up in ("u0", "u1"):
        wait_for(lambda up=up: has_metric(
            g.metrics(), "infergw_upstream_engine_load_age_seconds",
            upstream=up), budget(5), msg="%s read" % up)
    # a has just been served: it is active, with a recent demand.
    assert first_token(g.port, auth(KEY_A), "before the flood") \
        < budget(2)
    flood = Load(g.port, 16, 2000, auth(KEY_B), tag="flood")
    # u0 learned (b's calls past its 4 places wait in its engine), and
    # b has taken places on u1 as well, and waits for more.
    wait_for(lambda: metric_value(g, "infergw_upstream_open_calls",
                                  upstream="u0") >= 5
             and metric_value(g, "infergw_upstream_open_calls",
                              upstream="u1") >= 2
             and metric_at_least(g, "infergw_tenant_queued", 1,
                                 tenant="b"),
             budget(10), msg="b holds all it may")
    for i in range(5):
        ttft = first_token(g.port, auth(KEY_A), "short %d" % i)
        assert ttft < budget(1.5), \
            "tenant a's call %d waited %.1f s behind b's flood" % (i, ttft)
    assert metric_value(g, "infergw_tenant_queue_timeouts_total",
                        tenant="a") == 0
    del flood


def test_a_sheddable_tenant_gets_429_at_saturation(t):
    """priority = -1: served while the fleet has room, 429 with
    Retry-After at once when it is saturated, never queued."""
    m = engine(t, max_running=1, step_ms=20, step_per_seq_ms=0)
    g = t.gateway(m, {"routing": {"max_waiting": 1}}, extra=TENANTS)
    r = g.post(CHAT, chat_body("room", max_tokens=1), headers=auth(KEY_S))
    assert r.status == 200, r
    wait_for(lambda: has_metric(g.metrics(), "infergw_model_saturated",
                                model="mock-model"), budget(5),
             msg="the upstream's models known")
    assert metric_value(g, "infergw_model_saturated",
                        model="mock-model") == 0
    busy = Load(g.port, 3, 200, auth(KEY_A), tag="busy")
    wait_for(lambda: metric_value(g, "infergw_upstream_saturated",
                           upstream="default") == 1,
             budget(10), msg="saturated")
    assert metric_value(g, "infergw_model_saturated",
                        model="mock-model") == 1
    t0 = time.monotonic()
    r = g.post(CHAT, chat_body("no room", max_tokens=1),
               headers=auth(KEY_S))
    assert time.monotonic() - t0 < budget(1), "it waited"
    assert_error(r, 429, "upstreams_saturated")
    assert int(r.headers.get("Retry-After")) >= 1
    assert metric_value(g, "infergw_tenant_shed_total", tenant="s") == 1
    g.wait_log(r"pool: upstream default saturated waiting=")
    busy.join(budget(30))


# ---- beats -----------------------------------------------------------------

def test_a_hung_upstream_delays_no_other_beat(t):
    """u0 accepts connections and never answers (its /health and
    /metrics hang); u1's /v1/models must still be known at once, not
    after u0's probe times out (5 s, when the beat was one thread)."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)                     # connects succeed, nobody answers
    m = t.mock("-m", "only-on-u1")
    conf = {"upstream u0": {"url": "http://127.0.0.1:%d"
                            % hung.getsockname()[1]},
            "upstream u1": {"url": "http://127.0.0.1:%d" % m.port}}
    t0 = time.monotonic()
    g = t.gateway(None, conf)
    wait_for(lambda: b"only-on-u1" in g.get("/v1/models").body,
             budget(4), msg="u1's models, while u0 hangs")
    assert time.monotonic() - t0 < budget(4)
    hung.close()
