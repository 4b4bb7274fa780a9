# SPDX-License-Identifier: MIT
"""012 - upstream pools (issue 9): model routing, /v1/models union,
balancing, passive and active health, retries and their budget, Retry-After,
admission control, all-down, /readyz.

Every upstream is a mock; which one answered is read from the mocks'
/stats ("completions" counts the completion requests each one saw).
Concurrency is made certain with mock_hold, never hoped for.
"""

import socket
import threading
import time

from gwtest import (JSON_HEADERS, Connection, assert_error, budget,
                    chat_body, has_metric, metric, refused_port, request,
                    sse_data, wait_for)

from coalesce_util import finish, finish_all, new_tag, send, start

STATE = "infergw_upstream_state"
CALLS = "infergw_upstream_calls_total"
EJECTIONS = "infergw_upstream_ejections_total"
FAILURES = "infergw_upstream_failures_total"
RETRIES = "infergw_upstream_retries_total"
REFUSED = "infergw_upstream_retry_budget_exhausted_total"
UNAVAILABLE = "infergw_upstream_unavailable_total"
QUEUE_WAITS = "infergw_upstream_queue_waits_total"
QUEUE_TIMEOUTS = "infergw_upstream_queue_timeouts_total"
OPEN_CALLS = "infergw_upstream_open_calls"


def pool(t, mocks, routing=None, per=None, names=None):
    """A gateway over 'mocks' (Mock objects or ports) as [upstream uN],
    with [routing] settings and per-upstream settings per[i]."""
    conf = {"routing": dict(routing or {})}
    for i, m in enumerate(mocks):
        port = m if isinstance(m, int) else m.port
        sec = {"url": "http://127.0.0.1:%d" % port}
        sec.update((per or {}).get(i, {}))
        conf["upstream %s" % (names[i] if names else "u%d" % i)] = sec
    return t.gateway(None, conf)


def completions(mocks):
    return [m.stats()["completions"] for m in mocks]


def value(g, name, **labels):
    """A metric that must exist (checked first), summed over labels."""
    ms = g.metrics()
    assert has_metric(ms, name, **labels), "no %s %r" % (name, labels)
    return metric(ms, name, **labels)


def control(m, **kw):
    q = "&".join("%s=%s" % kv for kv in kw.items())
    r = request(m.port, "POST", "/control?" + q)
    assert r.status == 200, r


def post(g, body):
    return g.post("/v1/chat/completions", body)


# ---- routing by model ------------------------------------------------------

def test_model_picks_the_upstreams_that_serve_it(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], per={0: {"models": "llama-3-8b"},
                             1: {"models": "qwen2-7b, mock-model"}})
    for i in range(4):
        assert post(g, chat_body("l%d" % i, model="llama-3-8b")).status == 200
    for i in range(3):
        assert post(g, chat_body("q%d" % i, model="qwen2-7b")).status == 200
    assert completions([a, b]) == [4, 3]
    r = post(g, chat_body("x", model="gpt-4"))
    assert_error(r, 404, "model_not_found", param="model")
    assert completions([a, b]) == [4, 3], "a 404 went upstream"
    # A body without "model" may go anywhere: both serve it over time.
    for i in range(30):
        assert g.post("/v1/completions",
                      b'{"prompt":"any %d"}' % i).status == 200
    assert all(n > 0 for n in (a.stats()["completions"] - 4,
                               b.stats()["completions"] - 3))


def test_discovered_models_route_and_union(t):
    a = t.mock("-m", "alpha,shared")
    b = t.mock("-m", "beta,shared")
    g = pool(t, [a, b])

    def ids():
        r = g.get("/v1/models")
        assert r.status == 200, r
        return sorted(e["id"] for e in r.json()["data"])
    wait_for(lambda: ids() == ["alpha", "beta", "shared"],
             msg="union of both upstreams' models, each once")
    assert post(g, chat_body("a", model="alpha")).status == 200
    assert post(g, chat_body("b", model="beta")).status == 200
    assert completions([a, b]) == [1, 1]
    assert_error(post(g, chat_body("n", model="nope")), 404,
                 "model_not_found", param="model")
    # Clients' /v1/models are answered from the cache.
    before = a.stats()["probes"] + b.stats()["probes"]
    for _ in range(20):
        g.get("/v1/models")
    assert a.stats()["probes"] + b.stats()["probes"] <= before + 4


def test_models_of_an_ejected_upstream_leave_the_union(t):
    a = t.mock("-m", "alpha")
    b = t.mock("-m", "beta")
    g = pool(t, [a, b], routing={"health_interval": "100ms",
                                 "eject_after": 1, "eject_time": "1m"})
    wait_for(lambda: len(g.get("/v1/models").json()["data"]) == 2)
    control(b, health=503)
    wait_for(lambda: value(g, STATE, upstream="u1") == 2, msg="u1 ejected")
    assert [e["id"] for e in g.get("/v1/models").json()["data"]] == ["alpha"]
    assert value(g, EJECTIONS, upstream="u1") >= 1


# ---- balancing --------------------------------------------------------------

def test_round_robin_follows_weights_exactly(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin"},
             per={0: {"weight": 3}, 1: {"weight": 1}})
    for i in range(40):
        assert post(g, chat_body("rr %d" % i)).status == 200
    assert completions([a, b]) == [30, 10]


def test_least_inflight_weights_share_new_calls(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "least_inflight"},
             per={0: {"weight": 4}, 1: {"weight": 1}})
    for i in range(200):
        # Idle when it is picked: a slot still held after its client had
        # the answer would send the next call to the other one.
        wait_for(lambda: value(g, OPEN_CALLS) == 0)
        assert post(g, chat_body("w %d" % i)).status == 200
    na, nb = completions([a, b])
    # Idle upstreams: the pick is random by weight, 4:1 (160:40 expected).
    assert 120 <= na <= 190 and na + nb == 200, (na, nb)


def test_least_inflight_prefers_the_idle_upstream(t):
    # least_inflight, not the default least_load: a scrape that overlaps
    # a quick call may count it after it ended (engine.h), and for the
    # next 100 ms the two would tie.  025 tests least_load.
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "least_inflight"})
    tag = new_tag()
    held = send(g, chat_body("busy", mock_hold=tag))
    wait_for(lambda: a.stats()["held"] + b.stats()["held"] == 1)
    busy, idle = (a, b) if a.stats()["held"] == 1 else (b, a)
    name = "u1" if idle is b else "u0"
    for i in range(10):
        # A call's slot goes back just after its client has the last
        # byte: wait for it, or the next call may see a tie.
        wait_for(lambda: value(g, OPEN_CALLS, upstream=name) == 0)
        assert post(g, chat_body("quick %d" % i)).status == 200
    assert idle.stats()["completions"] == 10, "a call went to the busy one"
    assert busy.stats()["completions"] == 1
    busy.release(tag)
    assert finish(held).resp.status == 200


def conversations(n_prompts, turns):
    """Requests sharing a long system prompt per conversation."""
    out = []
    for p in range(n_prompts):
        system = ("You are assistant number %d. " % p) * 20
        for k in range(turns):
            out.append(chat_body("question %d" % k, messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": "question %d of %d" % (k, p)}]))
    return out


def test_prefix_balance_sends_a_prefix_to_one_upstream(t):
    def run(balance):
        ms = [t.mock("-p", "200") for _ in range(3)]
        # A generous epsilon: a client's next request may arrive before
        # its last call's slot is given back, and with one call open the
        # bound of a tight epsilon would already spill (the bound has its
        # own test below).
        g = pool(t, ms, routing={"balance": balance, "prefix_bytes": "200",
                                 "prefix_epsilon": "2"})
        for body in conversations(6, 5):
            assert post(g, body).status == 200
        s = [m.stats() for m in ms]
        return sum(x["prefix_hits"] for x in s), sum(
            x["prefix_misses"] for x in s)
    hits, misses = run("prefix")
    # 6 prompts, each seen once first: every other request is a hit.
    assert (hits, misses) == (24, 6), (hits, misses)
    rr_hits, rr_misses = run("round_robin")
    assert rr_misses > misses and rr_hits < hits, (rr_hits, rr_misses)


def test_prefix_balance_bounds_the_load(t):
    ms = [t.mock() for _ in range(3)]
    # The bound over the gateway's own open calls, which are exact: the
    # engines' reads are off.  Read while calls are on their way, an
    # engine's count may hold a call the gateway also counts as started
    # since (engine.h: for one round trip), and the mean with it; the
    # bound on the engines' load is check_pool's
    # test_prefix_bounds_on_the_engines_load.
    g = pool(t, ms, routing={"balance": "prefix", "prefix_epsilon": "0.25",
                             "load_interval": "0"})
    tag = new_tag()
    system = "one shared system prompt " * 60   # past prefix_bytes (1k)
    conns = [send(g, chat_body("q%d" % i, mock_hold=tag, messages=[
        {"role": "system", "content": system},
        {"role": "user", "content": "q%d" % i}])) for i in range(12)]
    wait_for(lambda: sum(m.stats()["held"] for m in ms) == 12,
             msg="12 held calls")
    held = [m.stats()["held"] for m in ms]
    # (1 + 0.25) x the mean (4): at most 5 on any upstream.
    assert max(held) <= 5 and sorted(held) != [0, 0, 12], held
    for m in ms:
        m.release(tag)
    assert all(s.resp.status == 200 for s in finish_all(conns))


def test_identical_requests_are_one_flight_whatever_the_balancer(t):
    ms = [t.mock() for _ in range(3)]
    g = pool(t, ms, routing={"balance": "round_robin"})
    tag = new_tag()
    body = chat_body("same", stream=True, mock_hold=tag)
    conns = [send(g, body) for _ in range(6)]
    wait_for(lambda: sum(m.stats()["held"] for m in ms) == 1
             and value(g, "infergw_coalesce_followers_total") >= 5)
    assert sum(completions(ms)) == 1
    for m in ms:
        m.release(tag)
    bodies = {s.body for s in finish_all(conns)}
    assert len(bodies) == 1


# ---- passive health ---------------------------------------------------------

def test_retry_before_the_first_byte_is_invisible(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin",
                                 "eject_after": 100})
    control(a, status=503)
    for i in range(6):
        r = post(g, chat_body("r%d" % i))
        assert r.status == 200, r
    na, nb = completions([a, b])
    assert nb == 6 and na >= 1, (na, nb)
    assert value(g, RETRIES) == na
    assert value(g, FAILURES, upstream="u0", kind="status") == na


def test_retry_on_connect_failure_and_stream_before_first_byte(t):
    b = t.mock()
    port = refused_port()
    g = pool(t, [port, b], routing={"balance": "round_robin",
                                    "eject_after": 100})
    for i in range(4):
        s = finish(send(g, chat_body("s%d" % i, stream=True)))
        assert s.resp.status == 200 and s.clean_end, s.resp
    assert b.stats()["completions"] == 4
    assert value(g, FAILURES, upstream="u0", kind="connect") >= 1


def test_head_then_death_is_retried_invisibly(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin",
                                 "eject_after": 100})
    control(a, fault="head_then_die")
    s = finish(send(g, chat_body("held", stream=True)))
    assert s.resp.status == 200 and s.clean_end, s.resp
    assert s.body.count(b"data: [DONE]") == 1
    assert completions([a, b]) == [1, 1]
    assert value(g, RETRIES) == 1
    assert value(g, FAILURES, upstream="u0", kind="broken") == 1


def test_head_then_silence_is_a_first_byte_timeout_retried(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin",
                                 "first_byte_timeout": "500ms",
                                 "eject_after": 100})
    control(a, fault="head_then_stall")
    t0 = time.monotonic()
    s = finish(send(g, chat_body("quiet", stream=True)))
    assert s.resp.status == 200 and s.clean_end, s.resp
    assert 0.45 <= time.monotonic() - t0 < budget(3)
    assert completions([a, b]) == [1, 1]
    assert value(g, FAILURES, upstream="u0", kind="timeout") == 1
    wait_for(lambda: a.stats()["aborted"] == 1, msg="the stall was cut")


def test_coalesced_flight_retries_for_every_client(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin",
                                 "eject_after": 100})
    control(a, status=503)
    tag = new_tag()
    body = chat_body("together", stream=True, mock_hold=tag)
    conns = [send(g, body) for _ in range(8)]
    wait_for(lambda: value(g, "infergw_coalesce_followers_total") == 7
             and a.stats()["held"] == 1, msg="8 clients on one held call")
    a.release(tag)
    wait_for(lambda: b.stats()["held"] == 1, msg="the retry on u1")
    b.release(tag)
    streams = finish_all(conns)
    assert len({s.body for s in streams}) == 1
    assert all(s.resp.status == 200 and s.clean_end for s in streams)
    assert completions([a, b]) == [1, 1]


def test_failing_fleet_under_concurrency_answers_the_upstream_status(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"retries": 1, "retry_budget_min": 2,
                                 "retry_budget": "0%", "eject_after": 1000})
    control(a, status=503, retry_after=7)
    control(b, status=503, retry_after=7)
    tag = new_tag()
    conns = [send(g, chat_body("c%d" % i, mock_hold=tag))
             for i in range(16)]
    wait_for(lambda: a.stats()["held"] + b.stats()["held"] == 16)
    a.release(tag)
    b.release(tag)
    for s in finish_all(conns):
        assert s.resp.status == 503, s.resp
        assert s.resp.headers.get("Retry-After") == "7", s.resp
    # Two retries at most (the minimum), never a refused one counted.
    assert sum(completions([a, b])) <= 16 + 2
    assert value(g, RETRIES) <= 2


def test_no_retry_after_the_first_body_byte(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b])
    s = finish(send(g, chat_body("cut", stream=True,
                                 mock_fault="die_mid_stream")))
    assert s.resp.status == 200 and not s.clean_end
    assert b"upstream" in s.body and b"error" in s.body, s.body[-200:]
    assert sum(completions([a, b])) == 1, "retried after bytes were sent"
    assert value(g, RETRIES) == 0


def test_ejection_after_failures_then_half_open_then_closed(t):
    a, b = t.mock(), t.mock()
    eject = round(budget(3))        # the 5 calls below fit in it
    g = pool(t, [a, b], routing={"balance": "round_robin", "eject_after": 2,
                                 "eject_time": "%ds" % eject,
                                 "health_interval": 0})
    control(a, status=500)          # an answer, relayed, but a failure
    codes = []
    while value(g, STATE, upstream="u0") != 2:
        codes.append(post(g, chat_body("e%d" % len(codes))).status)
        assert len(codes) < 10, codes
    t0 = time.monotonic()           # ejected: eject_time runs from here
    assert codes.count(500) == 2, codes
    calls = a.stats()["completions"]
    for i in range(5):
        assert post(g, chat_body("f%d" % i)).status == 200
    assert a.stats()["completions"] == calls, "an ejected upstream got calls"
    control(a, status=0)
    wait_for(lambda: value(g, STATE, upstream="u0") == 1,
             timeout=eject + 5, msg="half-open after eject_time")
    assert time.monotonic() - t0 > eject - 0.5
    wait_for(lambda: post(g, chat_body("probe %f" % time.monotonic()))
             and value(g, STATE, upstream="u0") == 0, msg="closed again")
    assert a.stats()["completions"] > calls


def test_half_open_trial_failure_ejects_for_twice_as_long(t):
    # Each ejection must outlast the step that looks at it (a request
    # and a /metrics read): a slow build's take longer.
    eject = budget(0.5)
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin", "eject_after": 1,
                                 "eject_time": "%dms" % (eject * 1000),
                                 "health_interval": 0})
    control(a, status=500)
    while value(g, STATE, upstream="u0") != 2:
        post(g, chat_body("x %f" % time.monotonic()))
    wait_for(lambda: value(g, STATE, upstream="u0") == 1)
    t0 = time.monotonic()
    wait_for(lambda: post(g, chat_body("y %f" % time.monotonic()))
             and value(g, STATE, upstream="u0") == 2, msg="trial failed")
    wait_for(lambda: value(g, STATE, upstream="u0") == 1, timeout=5)
    # The second ejection lasts twice the first.
    assert time.monotonic() - t0 >= 2 * eject - 0.1
    assert value(g, EJECTIONS, upstream="u0") == 2


def test_killed_upstream_streams_end_honestly_others_go_on(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"eject_after": 1, "eject_time": "1s",
                                 "health_interval": "200ms"})
    # One content chunk, then the mock's gate (mock_gate), never opened:
    # the stream is certainly running when its upstream dies.
    tag = new_tag()
    s = start(send(g, chat_body("long", stream=True, mock_chunks=100,
                                mock_gate=tag)))
    assert s.resp.status == 200
    assert s.next_event() is not None
    victim, other = (a, b) if a.stats()["in_progress"] else (b, a)
    vport, name = victim.port, "u0" if victim is a else "u1"
    victim.close()
    s.read_all()
    assert not s.clean_end, "a cut stream ended cleanly"
    last = sse_data(s.body.rstrip(b"\n").split(b"\n\n")[-1])
    assert "error" in last, s.body[-200:]
    # New requests succeed on the other one; the dead one is ejected.
    for i in range(10):
        assert post(g, chat_body("after %d" % i)).status == 200
    wait_for(lambda: value(g, STATE, upstream=name) == 2)
    # It comes back on the same port and is readmitted.
    t.mock("-l", "127.0.0.1:%d" % vport)
    wait_for(lambda: value(g, STATE, upstream=name) == 0, timeout=10,
             msg="readmitted by the health probe")
    assert other.stats()["completions"] >= 10


def test_retry_after_keeps_calls_off_for_that_long(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"balance": "round_robin",
                                 "eject_after": 100})
    ra = round(budget(2))           # the 4 calls below fit in it
    control(a, status=429, retry_after=ra)
    t0 = time.monotonic()
    for i in range(4):
        assert post(g, chat_body("ra %d" % i)).status == 200
    assert a.stats()["completions"] == 1
    control(a, status=0)
    wait_for(lambda: post(g, chat_body("rb %f" % time.monotonic()))
             and a.stats()["completions"] == 2, timeout=ra + 4,
             msg="calls again after Retry-After")
    assert time.monotonic() - t0 >= ra - 0.1
    assert value(g, FAILURES, upstream="u0", kind="throttled") == 1


def test_an_upstream_held_back_by_retry_after_gets_no_call_in_panic(t):
    """The issue's probe: the only upstream answers 503 with Retry-After.
    It is then held back, so fewer than panic_below (50%) are usable, and
    ejected too (eject_after = 1); panic routes across ejected upstreams
    but never across one held back by its own word: the next request gets
    the gateway's 503 at once, told the time the hold has left, and no
    call is made."""
    a = t.mock()
    ra = 30                         # far longer than the steps below
    control(a, status=503, retry_after=ra)
    g = pool(t, [a], routing={"eject_after": 1, "health_interval": 0})
    r = post(g, chat_body("first"))
    assert r.status == 503 and r.headers.get("Retry-After") == str(ra), r
    assert a.stats()["completions"] == 1
    wait_for(lambda: value(g, STATE, upstream="u0") == 2, msg="ejected")
    t0 = time.monotonic()
    r = post(g, chat_body("second"))
    assert time.monotonic() - t0 < budget(0.5), "not at once"
    assert_error(r, 503, "upstream_unavailable")
    # The hold's time left (not the 30 s ejection's, nor a flat 1 s).
    left = int(r.headers.get("Retry-After"))
    assert ra - budget(3) <= left <= ra, r.headers
    assert a.stats()["completions"] == 1, "a call went to a held upstream"
    assert value(g, CALLS, upstream="u0") == 1
    assert value(g, "infergw_upstream_panic") == 0


def test_retry_budget_spares_a_failing_fleet(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"retries": 1, "retry_budget": "20%",
                                 "retry_budget_min": 3, "eject_after": 1000})
    control(a, status=503)
    control(b, status=503)
    n = 40
    codes = [post(g, chat_body("fleet %d" % i)).status for i in range(n)]
    assert set(codes) == {503}, codes
    calls = sum(completions([a, b]))
    assert calls <= n * 1.2 + 3, calls
    assert calls > n, "no retry at all"
    assert value(g, REFUSED) > 0


# ---- admission --------------------------------------------------------------

def queued_behind_a_held_call(t, queue_timeout):
    """One upstream with max_inflight = 1, its slot held by a call
    (released with the tag), and a second call queued behind it."""
    a = t.mock()
    g = pool(t, [a], routing={"queue_timeout": queue_timeout},
             per={0: {"max_inflight": 1}})
    tag = new_tag()
    first = send(g, chat_body("holder", mock_hold=tag))
    wait_for(lambda: a.stats()["held"] == 1)
    second = send(g, chat_body("queued"))
    wait_for(lambda: value(g, "infergw_upstream_queued") == 1)
    return a, g, tag, first, second


def test_max_inflight_queues_then_503(t):
    a, g, tag, first, second = queued_behind_a_held_call(t, "2s")
    assert a.stats()["completions"] == 1, "went past max_inflight"
    a.release(tag)
    assert finish(first).resp.status == 200
    assert finish(second).resp.status == 200
    assert value(g, QUEUE_WAITS) == 1

    tag2 = new_tag()
    third = send(g, chat_body("three", mock_hold=tag2))
    wait_for(lambda: a.stats()["held"] == 1)
    t0 = time.monotonic()
    r = post(g, chat_body("four"))
    waited = time.monotonic() - t0
    assert_error(r, 503, "upstream_unavailable")
    assert r.headers.get("Retry-After") is not None
    assert 1.8 <= waited < budget(5), waited
    assert value(g, QUEUE_TIMEOUTS) == 1
    a.release(tag2)
    assert finish(third).resp.status == 200


def test_followers_take_no_slot(t):
    a = t.mock()
    g = pool(t, [a], routing={"queue_timeout": 0},
             per={0: {"max_inflight": 1}})
    tag = new_tag()
    body = chat_body("shared", stream=True, mock_hold=tag)
    conns = [send(g, body) for _ in range(5)]
    wait_for(lambda: value(g, "infergw_coalesce_followers_total") == 4)
    a.release(tag)
    assert all(s.resp.status == 200 for s in finish_all(conns))
    assert a.stats()["completions"] == 1
    assert value(g, QUEUE_TIMEOUTS) == 0


def test_a_client_that_leaves_the_queue_takes_no_slot(t):
    a, g, tag, first, leaver = queued_behind_a_held_call(t, "10s")
    leaver.close()
    wait_for(lambda: value(g, "infergw_upstream_queued") == 0,
             msg="the waiter whose client left is out of the queue")
    a.release(tag)
    assert finish(first).resp.status == 200
    assert post(g, chat_body("after")).status == 200
    assert a.stats()["completions"] == 2, "the leaver made a call"


# ---- all down ---------------------------------------------------------------

def test_all_upstreams_down_fast_503_and_readyz(t):
    # Every upstream ejected takes max_ejected = 100% (by default at most
    # half of them go) and no panic (by default calls would then go to
    # the ejected ones anyway): 021-poison.py has the defaults.
    # Two ports where a connect is refused: bound, not listening, and
    # so not given to anything else (a gateway's own port 0) meanwhile.
    dead = [socket.socket() for _ in range(2)]
    for s in dead:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in dead]
    # Long enough for the steps below, while both are still ejected.
    g = pool(t, ports, routing={"eject_after": 1, "eject_time": "4s",
                                "health_interval": 0, "max_ejected": "100%",
                                "panic_below": "0%"})
    assert g.get("/readyz").status == 200
    assert_error(post(g, chat_body("x")), 502, "upstream_unreachable")
    wait_for(lambda: value(g, STATE, upstream="u0") == 2
             and value(g, STATE, upstream="u1") == 2)
    t0 = time.monotonic()
    r = post(g, chat_body("y"))
    assert time.monotonic() - t0 < budget(0.5)
    assert_error(r, 503, "upstream_unavailable")
    assert int(r.headers.get("Retry-After")) >= 1
    assert value(g, UNAVAILABLE) >= 1
    r = g.get("/readyz")
    assert r.status == 503 and r.json()["status"] == "no_upstream", r
    # Back: one mock on its old port; ready again once half-open.
    dead[0].close()
    t.mock("-l", "127.0.0.1:%d" % ports[0])
    wait_for(lambda: g.get("/readyz").status == 200, timeout=budget(10))
    wait_for(lambda: post(g, chat_body("z %f" % time.monotonic())).status
             == 200, timeout=5)
    dead[1].close()


def test_active_health_ejects_and_readmits_without_traffic(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], routing={"health_interval": "100ms",
                                 "eject_after": 2, "eject_time": "300ms"})
    control(a, health=503)
    wait_for(lambda: value(g, STATE, upstream="u0") == 2)
    assert value(g, FAILURES, upstream="u0", kind="status") >= 2
    control(a, health=0)
    wait_for(lambda: value(g, STATE, upstream="u0") == 0, timeout=5,
             msg="the probe closed the half-open upstream")
    assert a.stats()["completions"] == 0


# ---- hedging ---------------------------------------------------------------

def test_hedge_takes_the_fast_upstream_and_aborts_the_slow(t):
    # The slow one would answer after 30 s: a client answered within
    # budget(2.5) (at most 25 s) was answered by the hedge.
    slow, fast = t.mock(), t.mock()
    control(slow, slow_every=1, slow_ms=30000)
    g = pool(t, [slow, fast], routing={"balance": "round_robin",
                                       "hedge_after": "200ms",
                                       "retry_budget_min": 100})
    streams = []
    for i in range(4):
        t0 = time.monotonic()
        s = finish(send(g, chat_body("h%d" % i, stream=True)))
        streams.append(s)
        assert time.monotonic() - t0 < min(budget(2.5), 25), \
            "waited for the slow upstream"
        assert s.resp.status == 200 and s.clean_end
        assert s.body.count(b"data: [DONE]") == 1, "bytes of two attempts"
    # Round robin: requests 0 and 2 went to the slow one first.
    assert value(g, "infergw_upstream_hedges_total") == 2
    wait_for(lambda: slow.stats()["aborted"] == 2,
             msg="the slow upstream saw both aborts")
    assert fast.stats()["completions"] == 4
    # Losing a race is no failure of the loser's upstream.
    assert value(g, FAILURES, upstream="u0") == 0
    assert value(g, STATE, upstream="u0") == 0


def test_hedged_coalesced_flight_two_calls_identical_bodies(t):
    slow, fast = t.mock(), t.mock()
    control(slow, slow_every=1, slow_ms=5000)
    g = pool(t, [slow, fast], routing={"balance": "round_robin",
                                       "hedge_after": "300ms"})
    tag = new_tag()
    body = chat_body("everyone", stream=True, mock_hold=tag)
    conns = [send(g, body) for _ in range(20)]
    # All 20 in the one flight, its call and its hedge held.
    wait_for(lambda: value(g, "infergw_coalesce_followers_total") == 19
             and slow.stats()["held"] == 1 and fast.stats()["held"] == 1,
             msg="one flight of 20, its call and its hedge held")
    assert fast.release(tag) == 1
    streams = finish_all(conns)
    slow.release(tag)           # the abort may already have freed it
    assert len({s.body for s in streams}) == 1, "clients saw different bytes"
    assert all(s.clean_end for s in streams)
    # One flight: its first attempt (slow, round robin's first) and one
    # hedge, never a call per client.
    assert completions([slow, fast]) == [1, 1]
    assert value(g, "infergw_upstream_hedges_total") == 1
    wait_for(lambda: slow.stats()["aborted"] == 1)


def test_hedges_cost_the_retry_budget(t):
    slow, fast = t.mock(), t.mock()
    control(slow, slow_every=1, slow_ms=800)
    g = pool(t, [slow, fast], routing={"balance": "round_robin",
                                       "hedge_after": "100ms",
                                       "retry_budget": "0%",
                                       "retry_budget_min": 1})
    assert post(g, chat_body("first")).status == 200    # slow, hedged
    wait_for(lambda: slow.stats()["aborted"] == 1, msg="the hedge won")
    assert post(g, chat_body("second")).status == 200   # fast
    t0 = time.monotonic()
    assert post(g, chat_body("third")).status == 200    # slow: no leave
    assert time.monotonic() - t0 >= 0.75, "hedged past the budget"
    assert slow.stats()["aborted"] == 1
    assert value(g, "infergw_upstream_hedges_total") == 1
    assert value(g, REFUSED) >= 1


def test_no_hedge_when_off(t):
    slow, fast = t.mock(), t.mock()
    control(slow, slow_every=1, slow_ms=600)
    g = pool(t, [slow, fast], routing={"balance": "round_robin"})
    t0 = time.monotonic()
    assert post(g, chat_body("patient")).status == 200
    assert time.monotonic() - t0 >= 0.55
    assert value(g, "infergw_upstream_hedges_total") == 0
    assert fast.stats()["completions"] == 0


# ---- hostile upstream heads -------------------------------------------------

class RawUpstream:
    """A one-trick upstream: every request gets 'answer' (bytes), and the
    connection is closed unless keep is set; GET /health gets 200."""

    def __init__(self, answer, keep=False):
        self.answer, self.keep = answer, keep
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,),
                             daemon=True).start()

    def _conn(self, c):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                while len(buf) < n:
                    buf += c.recv(65536)
                buf = buf[n:]
                if head.startswith(b"GET"):
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
                              b"\r\n")
                    continue
                c.sendall(self.answer)
                if not self.keep:
                    return
        finally:
            c.close()

    def close(self):
        self.sock.close()


def test_upstream_204_has_no_body_and_keeps_the_connection(t):
    up = RawUpstream(b"HTTP/1.1 204 No Content\r\n\r\n", keep=True)
    try:
        g = pool(t, [up.port], routing={"health_interval": 0})
        c = Connection(g.port)
        for i in range(2):
            r = c.request("POST", "/v1/chat/completions", JSON_HEADERS,
                          chat_body("nothing %d" % i))
            assert r.status == 204, r
            assert r.headers.get("Transfer-Encoding") is None, r
            assert r.headers.get("Content-Length") is None, r
            assert r.body == b"", r
        assert c.is_open()
    finally:
        up.close()


def test_upstream_heads_we_cannot_relay_are_502(t):
    for answer in (b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\n{}",
                   b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r"
                   b"X-Injected: yes\r\nContent-Length: 2\r\n\r\n{}",
                   b"HTTP/1.1 200 OK\r\nContent-Type: a\x01b\r\n"
                   b"Content-Length: 2\r\n\r\n{}"):
        up = RawUpstream(answer)
        try:
            g = pool(t, [up.port], routing={"health_interval": 0,
                                            "eject_after": 100})
            r = post(g, chat_body("odd"))
            assert_error(r, 502, "upstream_error")
            assert r.headers.get("X-Injected") is None, r
        finally:
            up.close()


def test_retry_after_is_capped_for_clients(t):
    up = RawUpstream(b"HTTP/1.1 503 Busy\r\nRetry-After: 99999999\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
    try:
        g = pool(t, [up.port], routing={"health_interval": 0,
                                        "eject_after": 100})
        r = post(g, chat_body("later"))
        assert r.status == 503, r
        assert r.headers.get("Retry-After") == "60", r
    finally:
        up.close()


def test_the_gateways_own_retry_after_is_capped_too(t):
    # Every upstream ejected for 5 minutes: the gateway's own 503 says
    # when the first comes back, but no more than 60 s, as relayed ones.
    dead = t.mock()
    port = dead.port
    dead.close()
    g = pool(t, [port], routing={"eject_after": 1, "eject_time": "5m",
                                 "health_interval": 0, "max_ejected": "100%",
                                 "panic_below": "0%"})
    assert_error(post(g, chat_body("x")), 502, "upstream_unreachable")
    wait_for(lambda: value(g, STATE, upstream="u0") == 2)
    r = post(g, chat_body("y"))
    assert_error(r, 503, "upstream_unavailable")
    assert r.headers.get("Retry-After") == "60", r.headers


# ---- -t --------------------------------------------------------------------

def test_check_flag_validates_pools(t):
    good = t.write("good.conf", "[routing]\nbalance = round_robin\n"
                   "[upstream a]\nurl = http://127.0.0.1:1\nmodels = m1\n"
                   "[upstream b]\nurl = http://127.0.0.1:2\nweight = 2\n")
    rc, out = t.infergw("-t", "-c", good)
    assert rc == 0 and "is valid" in out, (rc, out)
    bad = t.write("bad.conf", "[upstream a]\nurl = http://127.0.0.1:1\n"
                  "[upstream a]\nurl = http://127.0.0.1:2\n")
    rc, out = t.infergw("-t", "-c", bad)
    assert rc == 2, (rc, out)
    assert "bad.conf:3: duplicate upstream 'a', first at line 1" in out, out
