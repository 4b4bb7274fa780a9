# SPDX-License-Identifier: MIT
"""027 - the status view on the admin listener (issue 19 items 1, 2).

GET /status.json on [admin] listen says what the gateway is doing now:
its flights (key, model, tenant, age, state, upstream, followers now and
at most, bytes), its upstreams (breaker state and time left, open calls,
the queue, the engine's scraped load, calls, failures by kind, retries,
hedges), its tenants (in flight, the last minute, 429s, tokens, tokens
saved) and the last 50 errors it answered, with the generation and the
last reload.  GET /status is a page that draws it, checked in headless
Chromium.  Neither is ever served on an API port.

Every flight is held at the mock (mock_hold) while the view is read, and
every wait polls status.json with a deadline.
"""

import re
import signal

import gwtest
from coalesce_util import finish, finish_all, new_tag, send, start, \
    wait_state
from gwtest import (ADMIN_KEY, assert_error, chat_body, refused_port,
                    request, wait_for)

CHAT = "/v1/chat/completions"
ADMIN = {"admin": {"listen": "127.0.0.1:0"}}


def status(g, headers=None):
    """The gateway's /status.json (with the admin key if it has one)."""
    h = dict(headers or {})
    if g.admin_key is not None and "Authorization" not in h:
        h["Authorization"] = "Bearer %s" % g.admin_key
    r = request(g.admin_port, "GET", "/status.json", h)
    assert r.status == 200, r
    assert r.content_type == "application/json", r
    return r.json()


def flights_where(g, pred, msg):
    """Poll until some flight matches pred(flight); returns the view."""
    def check():
        s = status(g)
        return s if any(pred(f) for f in s["flights"]) else None
    return wait_for(check, 10, msg=msg)


def flight(s, key):
    found = [f for f in s["flights"] if f["key"] == key]
    assert len(found) == 1, (key, s["flights"])
    return found[0]


def release(g, m, tag, n=1):
    """Let go the n calls held at mock 'm' under 'tag', once it holds
    them: the status view shows a call sent before the mock has it."""
    wait_state(g, m, held=n)
    assert m.release(tag) == n


def leader_key(g, n=1):
    """The key the n-th "coalesce: leader key=..." log line names."""
    def keys():
        ks = re.findall(r"coalesce: leader key=([0-9a-f]{12})",
                        "\n".join(g.log_lines()))
        return ks if len(ks) >= n else None
    return wait_for(keys, 10, msg="%d leader lines" % n)[n - 1]


def upstream(s, name):
    found = [u for u in s["upstreams"] if u["name"] == name]
    assert len(found) == 1, (name, s["upstreams"])
    return found[0]


def tenant(s, name):
    found = [t for t in s["tenants"] if t["name"] == name]
    assert len(found) == 1, (name, s["tenants"])
    return found[0]


def test_document_shape(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN)
    s = status(g)
    for k in ("version", "uptime_s", "generation", "last_reload", "flights",
              "flights_total", "flights_not_listed", "upstreams", "readyz",
              "tenants", "errors"):
        assert k in s, (k, s)
    assert s["version"] == "0.1.0", s
    assert s["generation"] == 1 and s["last_reload"] is None, s
    assert s["uptime_s"] >= 0, s
    assert s["flights"] == [] and s["flights_total"] == 0, s
    u = upstream(s, "default")
    assert u["url"] == "http://127.0.0.1:%d" % m.port, u
    for k in ("state", "probe", "ready", "inflight", "max_inflight",
              "queued", "engine", "calls", "failures", "retries", "hedges",
              "hedges_won", "ttft_p50_ms", "ttft_p99_ms"):
        assert k in u, (k, u)
    assert set(u["failures"]) == {"connect", "timeout", "status",
                                  "throttled", "broken"}, u
    # No tenant configured: everyone is "default", with no limits.
    d = tenant(s, "default")
    assert d["max_inflight"] is None and d["requests_per_minute"] is None
    assert s["errors"] == [], s["errors"]


def test_a_held_flight_its_followers_and_its_end(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN)
    tag = new_tag()
    body = chat_body("held", temperature=0, stream=True, mock_hold=tag)
    lead = send(g, body)
    key = leader_key(g)
    s = flights_where(g, lambda f: f["key"] == key, "the leader's flight")
    f = flight(s, key)
    assert f["model"] == "mock-model" and f["tenant"] == "default", f
    assert f["state"] == "waiting_first_byte", f
    assert f["upstream"] == "default", f
    assert f["followers"] == 0 and f["bytes"] == 0, f
    assert f["age_ms"] >= 0 and s["flights_total"] == 1, s

    followers = [send(g, body) for _ in range(3)]
    s = flights_where(g, lambda f: f["followers"] == 3, "three followers")
    assert flight(s, key)["followers_peak"] == 3
    # One leaves: attached now goes down, the peak stays.
    followers[0].close()
    # The flight lets the leaver go first, its tenant's count just after.
    s = wait_for(lambda: (lambda s: s if any(
        f["followers"] == 2 for f in s["flights"])
        and tenant(s, "default")["inflight"] == 3 else None)(status(g)),
        10, msg="a follower gone")
    f = flight(s, key)
    assert f["followers_peak"] == 3, f
    u = upstream(s, "default")
    assert u["inflight"] == 1 and u["calls"] == 1, u
    d = tenant(s, "default")
    assert d["inflight"] == 3 and d["requests_last_minute"] == 4, d

    release(g, m, tag)
    for st in finish_all([lead] + followers[1:]):
        assert st.resp.status == 200 and st.clean_end, st.resp
    wait_for(lambda: status(g)["flights"] == [], 10, msg="no flight left")


def test_queued_then_waiting_then_streaming(t):
    m = t.mock()
    g = t.gateway(m, conf=dict(ADMIN, upstream={"max_inflight": 1},
                               routing={"queue_timeout": "30s"}))
    ta, tb = new_tag(), new_tag()
    a = send(g, chat_body("a", temperature=0, mock_hold=ta))
    ka = leader_key(g, 1)
    flights_where(g, lambda f: f["key"] == ka
                  and f["state"] == "waiting_first_byte", "a at the mock")
    b = send(g, chat_body("b", temperature=0, mock_hold=tb))
    kb = leader_key(g, 2)
    s = flights_where(g, lambda f: f["key"] == kb
                      and f["state"] == "queued", "b in the queue")
    assert flight(s, kb)["upstream"] is None, s
    u = upstream(s, "default")
    assert u["inflight"] == 1 and u["max_inflight"] == 1, u
    assert u["queued"] == 1, u

    # a ends, b takes its slot and waits at the mock in turn.
    release(g, m, ta)
    assert finish(a).resp.status == 200
    s = flights_where(g, lambda f: f["key"] == kb
                      and f["state"] == "waiting_first_byte", "b sent")
    assert flight(s, kb)["upstream"] == "default"
    assert upstream(s, "default")["queued"] == 0
    release(g, m, tb)
    assert finish(b).resp.status == 200

    # A stream's first event is in, the next is a minute away.
    c = send(g, chat_body("c", temperature=0, stream=True, mock_chunks=2,
                          mock_delay_ms=60000))
    kc = leader_key(g, 3)
    head = start(c)
    assert head.resp.status == 200, head.resp
    s = flights_where(g, lambda f: f["key"] == kc
                      and f["state"] == "streaming", "c streaming")
    assert flight(s, kc)["bytes"] > 0, s
    c.close()
    wait_for(lambda: status(g)["flights"] == [], 10, msg="c aborted")


def test_upstreams_breaker_load_and_retries(t):
    m = t.mock()
    dead = refused_port()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[routing]\neject_after = 1\neject_time = 60s\nretries = 1\n"
        "health_interval = 0\nbalance = round_robin\n"
        "[upstream good]\nurl = http://127.0.0.1:%d\nmax_inflight = 7\n"
        "[upstream dead]\nurl = http://127.0.0.1:%d\n" % (m.port, dead)))

    def ejected():
        r = g.post(CHAT, chat_body("x", temperature=0))
        assert r.status == 200, r
        u = upstream(status(g), "dead")
        return u if u["state"] == "ejected" else None
    d = wait_for(ejected, 10, msg="dead ejected")
    assert 0 < d["state_left_ms"] <= 60000, d
    assert d["failures"]["connect"] >= 1, d
    assert d["engine"] is None and d["inflight"] == 0, d
    # Its failed call was made again on the good one, which counts it.
    s = wait_for(lambda: (lambda s: s if upstream(s, "good")["engine"]
                          is not None else None)(status(g)), 10,
                 msg="good's engine scraped")
    u = upstream(s, "good")
    assert u["state"] == "up" and u["state_left_ms"] is None, u
    assert u["max_inflight"] == 7 and u["calls"] >= 1, u
    assert u["retries"] >= 1 and u["hedges"] == 0, u
    assert sum(u["failures"].values()) == 0, u
    e = u["engine"]
    assert e["running"] >= 0 and e["waiting"] >= 0 and e["age_ms"] >= 0, e
    # TTFT from the upstream's histogram (metrics.h): good answered,
    # dead never did.
    assert isinstance(u["ttft_p50_ms"], (int, float)), u
    assert 0 <= u["ttft_p50_ms"] <= u["ttft_p99_ms"], u
    assert d["ttft_p50_ms"] is None and d["ttft_p99_ms"] is None, d


def test_a_hedge_that_wins_moves_the_flight(t):
    """The call starts on one upstream and, held there past hedge_after,
    is hedged on the other; the hedge's first byte wins: the flight is on
    the hedge's upstream now, which counts the hedge fired and won."""
    ma, mb = t.mock(), t.mock()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[routing]\nhedge_after = 100ms\nhealth_interval = 0\n"
        "[upstream a]\nurl = http://127.0.0.1:%d\n"
        "[upstream b]\nurl = http://127.0.0.1:%d\n" % (ma.port, mb.port)))
    tag = new_tag()
    c = send(g, chat_body("hedge", temperature=0, stream=True, mock_chunks=2,
                          mock_delay_ms=60000, mock_hold=tag))
    key = leader_key(g)
    wait_for(lambda: ma.stats()["held"] + mb.stats()["held"] == 2, 10,
             msg="the call and its hedge held")
    first = flight(status(g), key)["upstream"]
    assert first in ("a", "b"), first
    hedge, mock = ("b", mb) if first == "a" else ("a", ma)
    assert mock.release(tag) == 1
    head = start(c)
    assert head.resp.status == 200, head.resp
    s = flights_where(g, lambda f: f["key"] == key
                      and f["state"] == "streaming", "the hedge streaming")
    assert flight(s, key)["upstream"] == hedge, s["flights"]
    u = upstream(s, hedge)
    assert u["hedges"] == 1 and u["hedges_won"] == 1, u
    u = upstream(s, first)
    assert u["hedges"] == 0 and u["hedges_won"] == 0, u
    c.close()
    (ma if mock is mb else mb).release(tag)
    wait_for(lambda: status(g)["flights"] == [], 10, msg="the flight gone")


def test_tenants_limits_429s_tokens_and_savings(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN, extra=(
        "[tenant a]\napi_key = sk-status-tenant-a-0001\nmax_inflight = 3\n"
        "requests_per_minute = 100\n"
        "[tenant b]\napi_key = sk-status-tenant-b-0002\n"))
    ha = {"Authorization": "Bearer sk-status-tenant-a-0001"}
    tag = new_tag()
    body = chat_body("tenants", temperature=0, mock_hold=tag)
    conns = [send(g, body, headers=ha)]
    wait_state(g, m, leaders=1, held=1)
    conns += [send(g, body, headers=ha) for _ in range(2)]
    wait_state(g, m, followers=2, held=1)
    a = tenant(status(g), "a")
    assert a["inflight"] == 3 and a["max_inflight"] == 3, a
    assert a["requests_per_minute"] == 100, a
    r = g.post(CHAT, chat_body("over"), dict(ha, **gwtest.JSON_HEADERS))
    assert_error(r, 429, "rate_limit_exceeded")
    release(g, m, tag)
    for st in finish_all(conns):
        assert st.resp.status == 200, st.resp

    def settled():
        s = status(g)
        a = tenant(s, "a")
        return s if a["inflight"] == 0 and a["tokens_saved"] > 0 else None
    s = wait_for(settled, 10, msg="a's bill")
    a = tenant(s, "a")
    assert a["requests_last_minute"] == 3 and a["rejected_429"] == 1, a
    one = (a["tokens"]["prompt"] + a["tokens"]["completion"]) // 3
    assert one > 0 and a["tokens_saved"] == 2 * one, a
    b = tenant(s, "b")
    assert b["inflight"] == 0 and b["requests_last_minute"] == 0, b
    assert b["max_inflight"] is None and b["tokens_saved"] == 0, b
    assert [x["name"] for x in s["tenants"]] == ["a", "b"], s["tenants"]


def noted(g, n):
    """Wait for the n-th error to be noted: it is noted after its answer
    was written, so the next request could otherwise be noted first."""
    wait_for(lambda: len(status(g)["errors"]) >= n, 10,
             msg="%d errors noted" % n)


def test_recent_errors(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN)
    r = g.get("/nope?api_key=sk-secret-in-a-query",
              headers={"X-Request-Id": "err-404"})
    assert r.status == 404
    noted(g, 1)
    r = g.post(CHAT, b'{"api_key": sk-secret-in-a-body}',
               {"Content-Type": "application/json",
                "X-Request-Id": "err-400"})
    assert r.status == 400
    noted(g, 2)
    r = g.post(CHAT, chat_body("boom", mock_status=500),
               {"Content-Type": "application/json",
                "X-Request-Id": "err-500"})
    assert r.status == 500
    noted(g, 3)
    r = g.post(CHAT, chat_body("cut", stream=True,
                               mock_fault="die_mid_stream"),
               {"Content-Type": "application/json",
                "X-Request-Id": "err-cut"})
    assert r.status == 200

    def four():
        s = status(g)
        return s if len(s["errors"]) >= 4 else None
    s = wait_for(four, 10, msg="four errors")
    e = s["errors"]
    assert [x["request_id"] for x in e] == ["err-cut", "err-500", "err-400",
                                            "err-404"], e
    cut, e500, e400, e404 = e
    assert e404["status"] == 404 and e404["kind"] == "not_found", e404
    assert e404["path"] == "/nope" and e404["upstream"] is None, e404
    assert e400["status"] == 400 and e400["kind"] == "invalid_json", e400
    assert e400["message"] == "body is not valid JSON", e400
    assert e500["status"] == 500 and e500["kind"] == "upstream_status", e500
    assert e500["upstream"] == "default" and "500" in e500["message"], e500
    assert cut["status"] == 200 and cut["kind"] == "upstream_error", cut
    assert cut["upstream"] == "default", cut
    for x in e:
        assert x["time_unix_ms"] > 0, x
    text = request(g.admin_port, "GET", "/status.json").text
    assert "sk-secret" not in text and "api_key" not in text, text

    # Bounded: the newest 50.  An error is noted after its answer is
    # written, so requests on separate connections could be noted out of
    # order; on one kept connection each is noted before the next is read.
    c = g.connection()
    for i in range(60):
        assert c.request("GET", "/nope",
                         headers={"X-Request-Id": "n%d" % i}).status == 404

    def last_noted():
        s = status(g)
        return s if s["errors"][0]["request_id"] == "n59" else None
    e = wait_for(last_noted, 10, msg="n59 noted")["errors"]
    assert len(e) == 50, len(e)
    assert e[0]["request_id"] == "n59" and e[-1]["request_id"] == "n10", e


def test_readyz_and_healthz_answers_are_no_errors(t):
    """/readyz's 503 and /healthz's 200 are what a balancer asks for every
    second, on either listener: never noted as errors (were they, the
    first would read "upstream answered 503" and push every real error
    out of the 50).  An error on those routes, a 405, is one."""
    g = t.gateway(refused_port(), conf=dict(ADMIN, routing={
        "eject_after": 1, "eject_time": "5m"}))
    # Its first probe is refused: out, and /readyz says 503.
    wait_for(lambda: g.get("/readyz").status == 503, msg="/readyz 503")
    for port, mark in ((g.port, "mark-api"), (g.admin_port, "mark-admin")):
        # One kept connection: each answer is noted, if at all, before
        # the next request is read, so before the mark's.
        c = gwtest.Connection(port)
        for _ in range(55):             # more than the 50 kept
            r = c.request("GET", "/readyz")
            assert r.status == 503, r
            assert r.json() == {"status": "no_upstream"}, r
            assert c.request("HEAD", "/readyz").status == 503
            assert c.request("GET", "/healthz").status == 200
        r = c.request("GET", "/nope", headers={"X-Request-Id": mark})
        assert r.status == 404, r
    r = g.request("POST", "/readyz", headers={"X-Request-Id": "post"})
    assert_error(r, 405, "method_not_allowed")

    def three():
        s = status(g)
        return s if len(s["errors"]) >= 3 else None
    e = wait_for(three, 10, msg="three errors")["errors"]
    assert [x["request_id"] for x in e] == ["post", "mark-admin",
                                            "mark-api"], (len(e), e[:4])
    assert e[0]["path"] == "/readyz" and e[0]["status"] == 405, e[0]


def test_flights_past_the_cap_are_counted(t):
    m = t.mock()
    g = t.gateway(m, conf={"admin": {"listen": "127.0.0.1:0",
                                     "status_flights": 2}})
    tag = new_tag()
    conns = [send(g, chat_body("cap%d" % i, temperature=0, mock_hold=tag))
             for i in range(3)]
    wait_state(g, m, held=3)
    s = status(g)
    assert len(s["flights"]) == 2, s["flights"]
    assert s["flights_total"] == 3 and s["flights_not_listed"] == 1, s
    ages = [f["age_ms"] for f in s["flights"]]
    assert ages == sorted(ages, reverse=True), ages     # oldest first
    release(g, m, tag, 3)
    finish_all(conns)
    s = wait_for(lambda: (lambda s: s if s["flights_total"] == 0 else None)
                 (status(g)), 10, msg="no flight")
    assert s["flights_not_listed"] == 0, s

    # 0 lists none, and still counts them.
    g0 = t.gateway(m, conf={"admin": {"listen": "127.0.0.1:0",
                                      "status_flights": 0}})
    tag = new_tag()
    c = send(g0, chat_body("cap0", temperature=0, mock_hold=tag))
    s = wait_for(lambda: (lambda s: s if s["flights_total"] == 1 else None)
                 (status(g0)), 10, msg="one flight")
    assert s["flights"] == [] and s["flights_not_listed"] == 1, s
    release(g0, m, tag)
    finish(c)


def test_only_on_the_admin_listener_and_with_its_key(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN, admin_key=ADMIN_KEY)
    key = {"Authorization": "Bearer %s" % ADMIN_KEY}
    for path in ("/status.json", "/status"):
        for h in ({}, key):
            assert_error(g.get(path, headers=h), 404, "not_found")
    r = request(g.admin_port, "GET", "/status.json")
    assert_error(r, 401, "invalid_api_key")
    assert request(g.admin_port, "GET", "/status.json", key).status == 200
    # The page holds no data: no key asked.
    r = request(g.admin_port, "GET", "/status")
    assert r.status == 200, r
    assert r.content_type == "text/html; charset=utf-8", r
    assert r.body.startswith(b"<!DOCTYPE html>"), r.body[:40]
    # Nothing from another host: no URL with a scheme in the page.
    assert not re.search(rb"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]", r.body), \
        re.findall(rb"(?i)(?:https?:)?//[^\s'\"]+", r.body)
    assert_error(request(g.admin_port, "POST", "/status.json", key), 405,
                 "method_not_allowed")


def test_the_last_reload(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN)
    good = g.conf_text
    # The loader quotes the bad value, here bytes that are not UTF-8:
    # the document must still render (jansson refuses such a string).
    with open(g.conf_path, "ab") as f:
        f.write(b"[routing]\nretries = many\xff\xfe\n")
    g.send_signal(signal.SIGHUP)
    s = wait_for(lambda: (lambda s: s if s["last_reload"] else None)
                 (status(g)), 10, msg="a reload noted")
    r = s["last_reload"]
    assert r["result"] == "failed" and s["generation"] == 1, s
    assert g.conf_path in r["error"] and "retries" in r["error"], r
    assert "many??" in r["error"], r
    assert r["time_unix_ms"] > 0, r
    with open(g.conf_path, "w") as f:
        f.write(good)
    g.send_signal(signal.SIGHUP)
    s = wait_for(lambda: (lambda s: s if s["generation"] == 2 else None)
                 (status(g)), 10, msg="generation 2")
    assert s["last_reload"]["result"] == "ok", s
    assert s["last_reload"]["error"] is None, s
    assert s["last_reload"]["time_unix_ms"] >= r["time_unix_ms"], s


def test_no_password_of_an_upstream_url(t):
    """user:password@ in an upstream's url goes to libcurl, not into the
    status view."""
    m = t.mock()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[upstream u]\nurl = http://svc:s3cr3t@127.0.0.1:%d\n" % m.port))
    h = {}
    if g.admin_key is not None:
        h["Authorization"] = "Bearer %s" % g.admin_key
    r = request(g.admin_port, "GET", "/status.json", h)
    assert r.status == 200, r
    assert b"s3cr3t" not in r.body and b"svc" not in r.body, r.body
    assert upstream(r.json(), "u")["url"] == \
        "http://127.0.0.1:%d" % m.port, r.body


def test_page_in_headless_chromium(t):
    m = t.mock()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[upstream alpha]\nurl = http://127.0.0.1:%d\n" % m.port))
    tag = new_tag()
    conns = [send(g, chat_body("page", temperature=0, stream=True,
                               mock_hold=tag))]
    key = leader_key(g)
    conns.append(send(g, chat_body("page", temperature=0, stream=True,
                                   mock_hold=tag)))
    flights_where(g, lambda f: f["followers"] == 1, "a follower")
    g.wait_ready()
    dom = gwtest.chromium_dom(t.tmp,
                              "http://127.0.0.1:%d/status" % g.admin_port)
    # The head says what /readyz answers.
    head = re.search(r"<div id=\"head\">([^<]*)</div>", dom)
    assert head and head.group(1).startswith("ready \u00b7 "), dom
    # The script drew the flight's row: its key, state and upstream.
    rows = re.findall(r"<tr class=\"waiting_first_byte\">(.*?)</tr>", dom)
    assert len(rows) == 1, dom
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", rows[0])
    assert cells[0] == key and "alpha" in cells, cells
    # ... and the upstream's.
    rows = re.findall(r"<tr class=\"up\">(.*?)</tr>", dom)
    assert len(rows) == 1, dom
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", rows[0])
    assert cells[:2] == ["alpha", "http://127.0.0.1:%d" % m.port], cells
    assert cells[3:5] == ["passed", "yes"], cells   # probe, takes calls
    assert cells[2].startswith("up "), cells        # ... for how long
    # The summary at the top (041 reads it closer): the follower so far
    # saves one call of two, and the one upstream is up.
    summary = re.search(r"<div id=\"summary\">(.*?)</div>\s*<h2>", dom, re.S)
    assert summary, dom
    text = re.sub(r"<[^>]+>", "", summary.group(1))
    assert "requests/s over the last" in text, text
    assert "followers 1 (50% of calls saved)" in text, text
    assert "alpha up " in text, text
    assert '<div id="sum-cache" hidden="">' in dom, dom    # no cache
    assert "HTTP 4" not in dom and "HTTP 5" not in dom, dom
    release(g, m, tag)
    finish_all(conns)
