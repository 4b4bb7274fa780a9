# SPDX-License-Identifier: MIT
"""021 - a fleet a poison prompt cannot eject (issue 16 item 7).

A poison request fails on every upstream it reaches: here a prompt
holding a marker that every mock answers 500 (or 502) to, while
everything else gets 200 (the mock's /control?poison=MARKER).  Three
defences keep such prompts from taking the fleet out for everyone else:

- poison: a request that failed the same way (the same 5xx) on two
  upstreams is the request's fault, and its failures do not count
  toward ejection;
- [routing] max_ejected: never more than that share of a model's
  upstreams ejected at once;
- [routing] panic_below: with fewer than that share usable, calls go to
  all of them, ejected or not (Envoy's panic mode), but never to one held
  back by its own Retry-After.

The first test is the issue's: default settings, 80% poison, 15 s.  The
others take one defence at a time, with the other two turned off, so
each fails when its own is broken.
"""

import random
import threading
import time

from gwtest import (JSON_HEADERS, Connection, budget, chat_body, has_metric,
                    metric, refused_port, request, wait_for)

from coalesce_util import send, start

STATE = "infergw_upstream_state"
EJECTIONS = "infergw_upstream_ejections_total"
FAILURES = "infergw_upstream_failures_total"
POISON = "infergw_upstream_poison_requests_total"
CAPPED = "infergw_upstream_ejections_capped_total"
PANIC = "infergw_upstream_panic"
CHAT = "/v1/chat/completions"
MARKER = "POISON-PILL-7f3a"


def pool(t, mocks, routing=None):
    """A gateway over 'mocks' (Mock objects or ports) as [upstream uN]."""
    conf = {"routing": dict(routing or {})}
    for i, m in enumerate(mocks):
        port = m if isinstance(m, int) else m.port
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % port}
    return t.gateway(None, conf)


def value(g, name, **labels):
    """A metric that must exist (checked first), summed over labels."""
    ms = g.metrics()
    assert has_metric(ms, name, **labels), "no %s %r" % (name, labels)
    return metric(ms, name, **labels)


def states(g, n):
    return [value(g, STATE, upstream="u%d" % i) for i in range(n)]


def poison(m, status=None):
    q = "/control?poison=" + MARKER
    if status is not None:
        q += "&poison_status=%d" % status
    r = request(m.port, "POST", q)
    assert r.status == 200, r


def post(g, content):
    return g.post(CHAT, chat_body(content))


def test_mock_answers_the_marker_with_its_poison_status(t):
    m = t.mock()
    r = request(m.port, "POST", "/control?poison=" + MARKER
                + "&poison_status=502")
    assert r.status == 200 and r.json()["poison"] == MARKER, r
    marked = m.call("POST", CHAT, chat_body("say " + MARKER + " now"))
    assert marked.status == 502, marked
    assert m.call("POST", CHAT, chat_body("clean")).status == 200
    assert request(m.port, "POST", "/control?poison_status=99").status == 400
    assert request(m.port, "POST", "/control?poison=%01").status == 400
    assert request(m.port, "POST", "/control?poison=").status == 200
    assert m.call("POST", CHAT, chat_body(MARKER)).status == 200


def test_poison_prompts_cannot_take_the_fleet_away(t):
    """The issue's test: three upstreams that answer 500 to any prompt
    with the marker and 200 otherwise; 4 clients on keep-alive
    connections send 80% marked, 20% clean for 15 s, default settings:
    at least 99% of the clean requests get 200."""
    ms = [t.mock() for _ in range(3)]
    for m in ms:
        poison(m)
    g = pool(t, ms)
    seconds, clients = 15.0, 4
    lock = threading.Lock()
    counts = {"clean": {}, "marked": {}}
    errors = []

    def client(k):
        rnd = random.Random(k)
        c = Connection(g.port, timeout=10.0)
        n = 0
        start = time.monotonic()
        end, last = start + seconds, start + budget(4 * seconds)

        def going():
            # 'seconds', and on a slow build on until enough clean ones.
            now = time.monotonic()
            with lock:
                enough = sum(counts["clean"].values()) >= 120
            return now < end or (not enough and now < last)
        try:
            while going():
                n += 1
                kind = "marked" if rnd.random() < 0.8 else "clean"
                text = "client %d request %d" % (k, n)
                if kind == "marked":
                    text += " " + MARKER
                r = c.request("POST", CHAT, JSON_HEADERS, chat_body(text))
                with lock:
                    d = counts[kind]
                    d[r.status] = d.get(r.status, 0) + 1
                if r.connection_close:
                    c.close()
                    c = Connection(g.port, timeout=10.0)
        except Exception as e:          # noqa: B902 - reported below
            errors.append("client %d: %r" % (k, e))
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(k,))
               for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    clean, marked = counts["clean"], counts["marked"]
    total = sum(clean.values())
    ok = clean.get(200, 0)
    ms_ = g.metrics()
    report = ("clean %d/%d got 200 (%.2f%%), clean statuses %r, marked "
              "statuses %r; ejections %r, capped %r, panic gauge %r" % (
                  ok, total, 100.0 * ok / max(total, 1), clean, marked,
                  metric(ms_, EJECTIONS) if has_metric(ms_, EJECTIONS)
                  else None,
                  metric(ms_, CAPPED) if has_metric(ms_, CAPPED) else None,
                  metric(ms_, PANIC) if has_metric(ms_, PANIC) else None))
    assert not errors, "%s; %s" % (errors, report)
    assert total >= 100, "too few clean requests to judge: " + report
    assert ok >= 0.99 * total, report
    # A refused ejection is logged once per upstream until the sets
    # change (an upstream readmitted), not once per refusal.
    kept = sum(1 for l in g.log_lines() if "kept in: max_ejected" in l)
    assert kept <= 20, "%d 'kept in' log lines; %s" % (kept, report)


def test_the_same_5xx_on_two_upstreams_is_poison_and_not_counted(t):
    """Poison alone (max_ejected and panic off): a 502 on every upstream
    a request tries ejects none of them; a 502 that another upstream
    does not share still counts as it always did."""
    ms = [t.mock() for _ in range(3)]
    for m in ms:
        poison(m, 502)
    g = pool(t, ms, routing={"balance": "round_robin", "eject_after": 2,
                             "eject_time": "1m", "health_interval": 0,
                             "max_ejected": "100%", "panic_below": "0%",
                             "retry_budget": "100%",
                             "retry_budget_min": 1000})
    n = 8
    for i in range(n):
        r = post(g, "marked %d %s" % (i, MARKER))
        assert r.status == 502, r      # the last attempt's, relayed
    assert sum(m.stats()["completions"] for m in ms) == 3 * n
    # Counted as failures all the same, only not toward ejection (the
    # last verdict may land just after its answer reached the client).
    wait_for(lambda: value(g, FAILURES, kind="status") == 3 * n,
             msg="every failure judged")
    assert value(g, POISON) == n
    assert states(g, 3) == [0, 0, 0], "a poison request ejected: %r" % (
        states(g, 3),)
    assert value(g, EJECTIONS) == 0
    g.wait_log(r"dispatch: poison request status=502 upstreams=u\d,u\d")
    for i in range(6):
        assert post(g, "clean %d" % i).status == 200

    # u0 now fails everything, the others answer: its failures are its
    # own (the held verdict is judged when the retry answers).
    r = request(ms[0].port, "POST", "/control?status=502")
    assert r.status == 200, r
    codes = []
    while value(g, STATE, upstream="u0") != 2:
        codes.append(post(g, "plain %d" % len(codes)).status)
        assert len(codes) <= 12, "u0 never ejected: %r" % (codes,)
    assert set(codes) == {200}, codes
    assert value(g, POISON) == n


def test_a_held_failure_is_judged_at_the_retrys_first_byte(t):
    """The verdict a 5xx attempt holds is judged when the retry answers,
    not when its stream ends: u0 is ejected while u1's stream still
    runs."""
    a, b = t.mock(), t.mock()
    r = request(a.port, "POST", "/control?status=502")
    assert r.status == 200, r
    g = pool(t, [a, b], routing={"balance": "round_robin", "eject_after": 1,
                                 "eject_time": "1m", "health_interval": 0,
                                 "max_ejected": "100%", "panic_below": "0%"})
    s = start(send(g, chat_body("long", stream=True,
                                mock_fault="stall_mid_stream")))
    assert s.resp.status == 200, s.resp
    assert s.next_event() is not None
    assert b.stats()["in_progress"] == 1, "u1's stream is not running"
    wait_for(lambda: value(g, STATE, upstream="u0") == 2, timeout=3,
             msg="u0 ejected while the retry's stream runs")
    assert b.stats()["in_progress"] == 1
    s.close()


def test_max_ejected_keeps_half_of_a_models_upstreams_in(t):
    """max_ejected alone (panic off): 4 upstreams, 3 of them down; at
    most 2 (50%) are ejected, the third down one stays in however many
    failures it has."""
    live = t.mock()
    ports = [refused_port() for _ in range(3)]
    g = pool(t, ports + [live], routing={
        "balance": "round_robin", "eject_after": 1, "eject_time": "1m",
        "health_interval": 0, "panic_below": "0%", "retries": 3,
        "retry_budget": "100%", "retry_budget_min": 1000})

    def connect_failures(i):
        ms_ = g.metrics()
        lab = {"upstream": "u%d" % i, "kind": "connect"}
        return metric(ms_, FAILURES, **lab) if has_metric(
            ms_, FAILURES, **lab) else 0
    sent = 0
    # Until each down one failed at least once and one of them 3 times:
    # with eject_after = 1, that is 3 ejections due for it.
    while (min(connect_failures(i) for i in range(3)) < 1
           or max(connect_failures(i) for i in range(3)) < 3):
        r = post(g, "r%d" % sent)
        assert r.status == 200, r      # retried onto the live one
        sent += 1
        assert sent <= 60, "no down upstream kept in after %d requests: " \
            "connect failures %r, states %r" % (
                sent, [connect_failures(i) for i in range(3)], states(g, 4))
    s = states(g, 4)
    assert s[3] == 0 and sorted(s[:3]) == [0, 2, 2], s
    kept = s.index(0)
    assert value(g, CAPPED, upstream="u%d" % kept) >= 2, \
        "the third one's failures past eject_after were not refused"
    assert value(g, EJECTIONS) == 2
    g.wait_log(r"pool: upstream u%d kept in: max_ejected" % kept)


def test_panic_sends_calls_to_ejected_upstreams(t):
    """Panic alone (every upstream may be ejected): with both upstreams
    ejected, calls go to them anyway, the gauge says 1 and the log says
    so once."""
    a, b = t.mock(), t.mock()
    for m in (a, b):
        r = request(m.port, "POST", "/control?status=500")
        assert r.status == 200, r
    g = pool(t, [a, b], routing={"balance": "round_robin", "eject_after": 1,
                                 "eject_time": "1m", "health_interval": 0,
                                 "max_ejected": "100%"})
    # A verdict may land just after its answer reached the client.
    assert post(g, "one").status == 500
    wait_for(lambda: states(g, 2) == [2, 0], msg="u0 ejected")
    # One of two usable is not fewer than 50%: no panic yet.
    assert post(g, "two").status == 500
    assert value(g, PANIC) == 0
    wait_for(lambda: states(g, 2) == [2, 2], msg="u1 ejected")
    for m in (a, b):
        r = request(m.port, "POST", "/control?status=0")
        assert r.status == 200, r
    before = a.stats()["completions"] + b.stats()["completions"]
    for i in range(4):
        r = post(g, "in panic %d" % i)
        assert r.status == 200, r
    assert a.stats()["completions"] + b.stats()["completions"] == before + 4
    assert states(g, 2) == [2, 2], "an answer in panic is no trial"
    assert value(g, PANIC) == 1
    g.wait_log(r"pool: panic usable=0/2 panic_below=50% upstreams=u0,u1")
    assert sum(1 for l in g.log_lines() if "pool: panic usable" in l) == 1
    assert g.get("/readyz").status == 503, "panic made /readyz ready"


def test_panic_leaves_upstreams_held_back_by_retry_after_alone(t):
    """Panic over Retry-After holds: both upstreams said 429 with
    Retry-After, so none is usable and the set is in panic, yet no call
    goes to either until its hold is over: a request meanwhile gets the
    gateway's 503 at once, with the time left."""
    a, b = t.mock(), t.mock()
    ra = round(budget(3))           # the steps up to the 503 fit in it
    for m in (a, b):
        r = request(m.port, "POST",
                    "/control?status=429&retry_after=%d" % ra)
        assert r.status == 200, r
    g = pool(t, [a, b], routing={"eject_after": 1000, "health_interval": 0})
    r = post(g, "throttled")
    assert r.status == 429, r          # retried once, then relayed
    assert a.stats()["completions"] + b.stats()["completions"] == 2
    wait_for(lambda: g.get("/readyz").status == 503,
             msg="both held back: none usable")
    for m in (a, b):
        r = request(m.port, "POST", "/control?status=0")
        assert r.status == 200, r
    r = post(g, "held back, so not sent")
    assert r.status == 503 and r.json()["error"]["code"] \
        == "upstream_unavailable", r
    assert 1 <= int(r.headers.get("Retry-After")) <= ra, r.headers
    assert a.stats()["completions"] + b.stats()["completions"] == 2
    assert value(g, PANIC) == 0
    # Each hold ends on its own; then calls go again.
    wait_for(lambda: post(g, "later").status == 200, timeout=ra + 7,
             msg="calls again once a hold is over")
    assert a.stats()["completions"] + b.stats()["completions"] == 3


def test_503_with_retry_after_is_the_upstreams_own_word(t):
    """A 503 with Retry-After says "not now" about the upstream itself:
    judged at once, never taken for poison, even when every upstream
    says it."""
    ms = [t.mock() for _ in range(2)]
    for m in ms:
        r = request(m.port, "POST", "/control?status=503&retry_after=30")
        assert r.status == 200, r
    g = pool(t, ms, routing={"eject_after": 1000, "health_interval": 0,
                             "panic_below": "0%"})
    r = post(g, "busy everywhere")
    assert r.status == 503 and r.headers.get("Retry-After") == "30", r
    assert sum(m.stats()["completions"] for m in ms) == 2
    wait_for(lambda: g.get("/readyz").status == 503,
             msg="both held back by their Retry-After")
    assert value(g, POISON) == 0
