# SPDX-License-Identifier: MIT
"""038 - LoRA adapters (issue 29): the mock's adapters (docs/MOCK_UPSTREAM.md
"LoRA adapters") first, each rule of its model shown talking to it
directly; then the gateway's routing of a request for an adapter
(docs/UPSTREAMS.md "LoRA adapters").

Timings are loose (a loaded 2-core machine, sanitizer builds): what a
test depends on is polled for with a deadline, and a bound on time is
one that only the rule under test can reach.  Each gateway test's mutant
is named in its docstring.
"""

import os
import subprocess
import threading
import time

from gwtest import (JSON_HEADERS, Connection, budget, build_request,
                    chat_body, jbody, metric, metric_value, parse_metrics,
                    request, wait_for)

from metrics_check import validate

CHAT = "/v1/chat/completions"
CONTENT = b'"delta":{"content":'    # a content chunk, not the role chunk
INFO = "vllm:lora_requests_info"


def lora_mock(t, max_loras, loras=None, load_ms=None, **engine):
    """A mock in engine mode with LoRA on."""
    args = ["--max-loras", str(max_loras)]
    if loras:
        args += ["--lora", ",".join(loras)]
    if load_ms is not None:
        args += ["--lora-load-ms", str(load_ms)]
    if engine:
        args += ["-E", ",".join("%s=%s" % kv for kv in sorted(engine.items()))]
    return t.mock(*args)


def ask(port, model, tokens=2, **extra):
    """One non-streamed completion for 'model'; the response."""
    return request(port, "POST", CHAT, JSON_HEADERS,
                   chat_body("hi from %s" % model, model=model,
                             max_tokens=tokens, **extra),
                   timeout=budget(30))


def latest_info(port):
    """The labels of the vllm:lora_requests_info sample with the highest
    value (the state now, as a scraper reads it), and how many samples
    the page has."""
    r = request(port, "GET", "/metrics")
    assert r.status == 200, r
    best, n = None, 0
    for (name, labels), value in parse_metrics(r.text).items():
        if name != INFO:
            continue
        n += 1
        if best is None or value > best[1]:
            best = (dict(labels), value)
    assert best is not None, "no %s in %r" % (INFO, r.text)
    return best[0], n


class Held:
    """A streamed completion kept open (its sequence runs) until close()."""

    def __init__(self, port, model, tokens=400):
        self.conn = Connection(port, timeout=budget(60))
        self.s = self.conn.stream("POST", CHAT, JSON_HEADERS, chat_body(
            "held %s" % model, model=model, stream=True, max_tokens=tokens))
        assert self.s.resp.status == 200, self.s.resp.status

    def first_token(self):
        for ev in self.s.events():
            if CONTENT in ev:
                return
        raise AssertionError("no content")

    def close(self):
        self.conn.close()


# ---- the mock --------------------------------------------------------------

def test_mock_lists_its_adapters_with_their_parent(t):
    m = lora_mock(t, 2, ["sql-lora", "chat-lora"])
    data = m.get("/v1/models").json()["data"]
    by_id = {d["id"]: d for d in data}
    assert [d["id"] for d in data] == ["mock-model", "llama-3-8b",
                                       "sql-lora", "chat-lora"], data
    assert by_id["mock-model"]["parent"] is None
    a = by_id["sql-lora"]
    assert a["parent"] == "mock-model" and a["object"] == "model", a
    assert a["owned_by"] == "vllm" and a["max_model_len"] is None, a
    assert a["root"] == "/adapters/sql-lora", a
    labels, n = latest_info(m.port)
    assert labels == {"max_lora": "2", "running_lora_adapters": "",
                      "waiting_lora_adapters": ""}, labels
    assert n == 1
    assert validate(m.get("/metrics").text).startswith("ok:")
    assert m.stats()["lora_loads"] == 0


def test_mock_without_lora_has_no_gauge(t):
    m = t.mock("-e")
    r = m.get("/metrics")
    assert INFO not in r.text
    assert m.stats()["lora_resident"] == []
    r = request(m.port, "POST", "/v1/load_lora_adapter", JSON_HEADERS,
                jbody(lora_name="x", lora_path="/x"))
    assert r.status == 400, r


def test_mock_loads_an_adapter_once_and_evicts_the_least_recent(t):
    """Two slots: a1, a2 load; a1 again is resident; a3 evicts a2 (the
    least recently used), a2 then evicts a1.  The load's cost is paid by
    the request that needs it."""
    m = lora_mock(t, 2, ["a1", "a2", "a3"], load_ms=400, step_ms=5,
                  step_per_seq_ms=0)
    t0 = time.monotonic()
    assert ask(m.port, "a1").status == 200
    assert time.monotonic() - t0 >= 0.4, "a1's load cost nothing"
    assert ask(m.port, "a2").status == 200
    assert m.stats()["lora_loads"] == 2
    assert ask(m.port, "a1").status == 200
    assert ask(m.port, "mock-model").status == 200      # the base: no load
    st = m.stats()
    assert st["lora_loads"] == 2, st
    assert st["lora_resident"] == ["a2", "a1"], st
    assert ask(m.port, "a3").status == 200
    st = m.stats()
    assert st["lora_loads"] == 3 and st["lora_resident"] == ["a1", "a3"], st
    assert ask(m.port, "a2").status == 200
    st = m.stats()
    assert st["lora_loads"] == 4 and st["lora_resident"] == ["a3", "a2"], st
    m.reset()
    assert m.stats()["lora_loads"] == 0


def test_mock_a_request_waits_while_every_slot_runs(t):
    """One slot, held by a1's running stream: a2's request waits in the
    FIFO although the batch has room (waiting 1), a base-model request
    behind it runs at once (vLLM skips a2, it does not block the
    queue), and a2 runs once a1's stream is gone."""
    m = lora_mock(t, 1, ["a1", "a2"], load_ms=0, step_ms=20)
    held = Held(m.port, "a1")
    held.first_token()
    labels, _ = latest_info(m.port)
    assert labels["running_lora_adapters"] == "a1", labels
    assert labels["waiting_lora_adapters"] == "", labels
    result = {}

    def second():
        result["r"] = ask(m.port, "a2")
    th = threading.Thread(target=second, daemon=True)
    th.start()
    wait_for(lambda: latest_info(m.port)[0]["waiting_lora_adapters"]
             == "a2", budget(5), msg="a2 waits")
    labels, n = latest_info(m.port)
    assert labels["running_lora_adapters"] == "a1", labels
    assert n == 2, "the earlier label set is kept too"
    assert ask(m.port, "mock-model").status == 200, "the base waited"
    assert th.is_alive() and "r" not in result, "a2 ran beside a1"
    held.close()
    th.join(budget(10))
    assert result["r"].status == 200, result
    assert m.stats()["lora_loads"] == 2


def test_mock_loads_and_unloads_at_run_time(t):
    m = lora_mock(t, 2)
    load = (lambda **kw: request(m.port, "POST", "/v1/load_lora_adapter",
                                 JSON_HEADERS, jbody(**kw)))
    r = load(lora_name="late", lora_path="/srv/late")
    assert r.status == 200, r
    assert r.body == b"Success: LoRA adapter 'late' added successfully."
    ids = {d["id"]: d for d in m.get("/v1/models").json()["data"]}
    assert ids["late"]["parent"] == "mock-model"
    assert ids["late"]["root"] == "/srv/late"
    r = load(lora_name="late", lora_path="/srv/late")
    assert r.status == 400 and b"has already been loaded" in r.body, r
    assert load(lora_name="nopath").status == 400
    assert load(lora_name="a,b", lora_path="/x").status == 400
    assert ask(m.port, "late").status == 200
    assert m.stats()["lora_loads"] == 1
    r = request(m.port, "POST", "/v1/unload_lora_adapter", JSON_HEADERS,
                jbody(lora_name="late"))
    assert r.status == 200, r
    assert "late" not in [d["id"] for d in
                          m.get("/v1/models").json()["data"]]
    r = request(m.port, "POST", "/v1/unload_lora_adapter", JSON_HEADERS,
                jbody(lora_name="late"))
    assert r.status == 404, r
    assert m.stats()["requests"] == 1, "a load is a control request"


def test_mock_bad_lora_flags_exit_2(t):
    exe = os.path.join(t.bin, "mock_upstream")
    for args in (["--lora", "a"], ["--max-loras", "257"],
                 ["--max-loras", "x"], ["--max-loras", "1", "--lora", ","],
                 ["--max-loras", "1", "--lora-load-ms", "-1"],
                 ["--max-loras", "1", "--lora", "a,a"]):
        p = subprocess.run([exe, "-l", "127.0.0.1:0"] + args,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=budget(10))
        assert p.returncode == 2, (args, p.returncode, p.stderr)


# ---- the gateway -----------------------------------------------------------

def fleet(t, mocks, routing=None, models=None):
    """A gateway in front of 'mocks' as u0, u1, ..., with an admin
    listener; 'models' is each upstream's configured list (None: what
    its /v1/models says)."""
    conf = {"routing": dict(routing or {}),
            "admin": {"listen": "127.0.0.1:0"}}
    for i, m in enumerate(mocks):
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % m.port}
        if models:
            conf["upstream u%d" % i]["models"] = models
    return t.gateway(None, conf)


def status(g):
    """The gateway's /status.json, from its admin listener."""
    r = request(g.admin_port, "GET", "/status.json",
                {"Authorization": "Bearer %s" % g.admin_key})
    assert r.status == 200, r
    return r.json()


def calls(g, n):
    """infergw_upstream_calls_total of u0..u(n-1)."""
    ms = g.metrics()
    return [metric(ms, "infergw_upstream_calls_total", upstream="u%d" % i)
            for i in range(n)]


def running_seen(g, upstream, n):
    """Does the gateway's last scrape of 'upstream' show n adapters
    running?  (For wait_for.)"""
    ms = g.metrics()
    key = ("infergw_upstream_lora_adapters",
           frozenset({("upstream", upstream), ("state", "running")}))
    return ms.get(key) == n


def test_an_adapter_resident_on_one_of_three_goes_there(t):
    """a1 runs on u1 alone (a stream sent straight to it, which the
    gateway's own counts cannot see), so u1 is the most loaded: every
    call for a1 still goes to u1, and loads nothing anywhere.  A base
    model's calls go by load (to u0 and u2).  (Mutant: lora_aware = off,
    or no grouping in pool_lora.c: the calls go to u0 and u2, each of
    which loads a1.)"""
    mocks = [lora_mock(t, 4, ["a1", "a2"], load_ms=50, step_ms=10)
             for _ in range(3)]
    g = fleet(t, mocks)
    held = Held(mocks[1].port, "a1")
    held.first_token()
    wait_for(lambda: running_seen(g, "u1", 1), budget(5),
             msg="the gateway reads u1's running adapter")
    before = calls(g, 3)
    for i in range(10):
        r = g.post(CHAT, chat_body("to a1 %d" % i, model="a1", max_tokens=1))
        assert r.status == 200, r
    got = [a - b for a, b in zip(calls(g, 3), before)]
    assert got == [0, 10, 0], "calls per upstream: %r" % got
    assert [m.stats()["lora_loads"] for m in mocks] == [0, 1, 0]
    ms = g.metrics()
    assert sum(metric(ms, "infergw_upstream_lora_loads_total",
                      upstream="u%d" % i) for i in range(3)) == 0
    before = calls(g, 3)
    for i in range(6):
        r = g.post(CHAT, chat_body("base %d" % i, max_tokens=1))
        assert r.status == 200, r
    got = [a - b for a, b in zip(calls(g, 3), before)]
    assert got[1] < 6, "the base model followed a1: %r" % got
    # The status view names it.
    s = status(g)
    u1 = [u for u in s["upstreams"] if u["name"] == "u1"][0]
    assert u1["lora"]["max_lora"] == 4 and "a1" in u1["lora"]["running"], u1
    assert u1["lora_loads"] == 0, u1
    held.close()


def test_at_max_lora_everywhere_the_least_loaded_takes_it(t):
    """One slot a server, each held by another adapter (three streams of
    a1 on u0, one of a2 on u1, sent straight to them): a3 fits nowhere,
    so it goes by load, to u1, the lighter of the two (two servers, so
    that least_load's two choices are both), and the gateway counts the
    load it causes.  It waits there, as on vLLM, until a slot frees.
    (Mutant: pick the first of the group, or prefer u0's running
    adapters: u0 takes it.)"""
    mocks = [lora_mock(t, 1, ["a1", "a2", "a3"], load_ms=0, step_ms=10)
             for _ in range(2)]
    g = fleet(t, mocks)
    held = [Held(mocks[0].port, "a1") for _ in range(3)]
    held.append(Held(mocks[1].port, "a2"))
    for h in held:
        h.first_token()
    wait_for(lambda: running_seen(g, "u0", 1) and running_seen(g, "u1", 1)
             and metric(g.metrics(), "infergw_upstream_engine_running",
                        upstream="u0") == 3,
             budget(5), msg="both at max_lora, u0 the more loaded")
    before = calls(g, 2)
    c = Connection(g.port, timeout=budget(30))
    c.send(build_request("POST", CHAT, JSON_HEADERS,
                         chat_body("to a3", model="a3", stream=True,
                                   max_tokens=2)))
    wait_for(lambda: sum(calls(g, 2)) > sum(before), budget(5),
             msg="a3's call is made")
    got = [a - b for a, b in zip(calls(g, 2), before)]
    assert got == [0, 1], "calls per upstream: %r" % got
    assert metric_value(g, "infergw_upstream_lora_loads_total",
                        upstream="u1") == 1
    wait_for(lambda: latest_info(mocks[1].port)[0]["waiting_lora_adapters"]
             == "a3", budget(5), msg="a3 waits on u1 for a slot")
    for h in held:
        h.close()
    r = c.read_response()
    assert r.status == 200 and CONTENT in r.body, r
    c.close()


def test_a_stale_scrape_falls_back_to_load_alone(t):
    """a1 runs on u1, but u1's /metrics stops answering: its scrape
    hangs (load_timeout is long), so its last one grows older than
    load_stale, and then nothing says a1 is there: no call for a1 goes
    to u1 (u0 and u2 have room).  (Mutant: a stale report taken as fresh
    in pool_lora.c: they all go to u1.)"""
    mocks = [lora_mock(t, 4, ["a1"], load_ms=0, step_ms=10)
             for _ in range(3)]
    g = fleet(t, mocks, {"load_timeout": "20s", "load_stale": "300ms"})
    held = Held(mocks[1].port, "a1")
    held.first_token()
    wait_for(lambda: running_seen(g, "u1", 1), budget(5),
             msg="the gateway reads u1's running adapter")
    r = request(mocks[1].port, "POST", "/control?metrics_delay_ms=60000")
    assert r.status == 200, r
    # Stale, not failed: the scrape under way has not timed out, and the
    # report is still there (infergw_upstream_lora_adapters), only old.
    wait_for(lambda: metric(g.metrics(),
                            "infergw_upstream_engine_load_age_seconds",
                            upstream="u1") > 0.5, budget(5),
             msg="u1's last scrape is stale")
    assert running_seen(g, "u1", 1)
    before = calls(g, 3)
    for i in range(6):
        r = g.post(CHAT, chat_body("stale %d" % i, model="a1", max_tokens=1))
        assert r.status == 200, r
    got = [a - b for a, b in zip(calls(g, 3), before)]
    assert got[1] == 0 and sum(got) == 6, "calls per upstream: %r" % got
    held.close()


def test_an_adapter_loaded_at_run_time_is_routable_at_the_next_beat(t):
    """Each upstream is configured with the base model alone: an adapter
    none lists is a 404.  Loaded on u2 at run time (vLLM's
    /v1/load_lora_adapter), its /v1/models names it with the base model
    as parent, and from the next health beat it is routed there, and
    listed by the gateway's /v1/models.  (Mutant: no parent rule in
    pool_member_serves_locked(): still a 404.)"""
    mocks = [lora_mock(t, 2, load_ms=0, step_ms=5) for _ in range(3)]
    g = fleet(t, mocks, {"health_interval": "200ms"}, models="mock-model")
    r = g.post(CHAT, chat_body("too soon", model="late", max_tokens=1))
    assert r.status == 404, r
    r = request(mocks[2].port, "POST", "/v1/load_lora_adapter",
                JSON_HEADERS, jbody(lora_name="late", lora_path="/srv/late"))
    assert r.status == 200, r
    wait_for(lambda: b'"late"' in g.get("/v1/models").body, budget(5),
             msg="the gateway lists the new adapter")
    before = calls(g, 3)
    r = g.post(CHAT, chat_body("now", model="late", max_tokens=1))
    assert r.status == 200, r
    got = [a - b for a, b in zip(calls(g, 3), before)]
    assert got == [0, 0, 1], "calls per upstream: %r" % got
    assert mocks[2].stats()["lora_loads"] == 1
    entry = [e for e in g.get("/v1/models").json()["data"]
             if e["id"] == "late"][0]
    assert entry["parent"] == "mock-model", entry
