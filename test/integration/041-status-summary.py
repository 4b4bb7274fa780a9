# SPDX-License-Identifier: MIT
"""041 - the status view's summary (issue 30 item 4).

/status.json's "summary" and the top of /status say in a few lines what
the gateway did: requests per second over the last minute, answers by
class (2xx, 4xx, 5xx) over that minute and since the start, upstream
calls per client request, what coalesced followers saved (and, with a
cache, what its hits saved: zeros and hidden until there is one), and
how long each upstream has been in its state.  Its figures must add up
with /metrics, the operator's routes (/healthz, /readyz, /metrics,
/status*) are not in them, and a /readyz 503 is no upstream error.

A follower is made certain with mock_hold, every wait polls with a
deadline, and every metric is checked to exist before it is read.
"""

import re
import time

from coalesce_util import finish_all, held_trio, new_tag, wait_state
from gwtest import (assert_error, chat_body, chromium_dom, has_metric,
                    metric, refused_port, request, wait_for)

CHAT = "/v1/chat/completions"
ADMIN = {"admin": {"listen": "127.0.0.1:0"}}
OPERATOR_ROUTES = {"healthz", "readyz", "metrics", "status"}


def status(g):
    """The gateway's /status.json (with the admin key if it has one)."""
    h = {}
    if g.admin_key is not None:
        h["Authorization"] = "Bearer %s" % g.admin_key
    r = request(g.admin_port, "GET", "/status.json", h)
    assert r.status == 200, r
    return r.json()


def summary(g):
    s = status(g)
    assert "summary" in s, sorted(s)
    return s["summary"]


def metrics(g, *names):
    """g's /metrics, once every name in 'names' has a sample."""
    ms = g.metrics()
    for n in names:
        assert has_metric(ms, n), "no %s in /metrics" % n
    return ms


def answers_by_class(ms):
    """infergw_requests_total over the client routes, by class."""
    out = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0}
    for (name, labels), v in ms.items():
        if name != "infergw_requests_total":
            continue
        lv = dict(labels)
        if lv["route"] in OPERATOR_ROUTES:
            continue
        out["requests"] += v
        cls = lv["status"][0] + "xx"
        if cls in out:
            out[cls] += v
    return out


def close(a, b):
    return abs(a - b) < 1e-9


def test_the_figures_add_up_with_metrics(t):
    m = t.mock()
    g = t.gateway(m, conf=dict(ADMIN, routing={"eject_after": 100}))
    ok, bad, failed = 4, 2, 1      # every class its own count
    for i in range(ok):
        r = g.post(CHAT, chat_body("ok %d" % i, temperature=0))
        assert r.status == 200, r
    for i in range(bad):
        r = g.post(CHAT, b'{"model": nope %d' % i,
                   {"Content-Type": "application/json"})
        assert_error(r, 400, "invalid_json")
    for i in range(failed):
        r = g.post(CHAT, chat_body("boom %d" % i, mock_status=500))
        assert r.status == 500, r
    # One flight, held at the mock until two followers have joined it.
    trio = held_trio(g, m, chat_body("shared", temperature=0,
                                     mock_hold=new_tag()))
    for st in finish_all(trio):
        assert st.resp.status == 200, st.resp
    # The operator's routes are not the clients' traffic.
    for _ in range(5):
        assert g.get("/healthz").status == 200
        assert g.get("/readyz").status == 200
        assert g.get("/metrics").status == 200
    total = ok + bad + failed + 3

    # A request is counted after its answer is written: wait for the last.
    def settled():
        s = summary(g)
        return s if s["since_start"]["requests"] == total \
            and s["coalesced"]["tokens_saved"] > 0 else None
    s = wait_for(settled, 10, msg="every answer counted")
    ms = metrics(g, "infergw_requests_total",
                 "infergw_upstream_requests_total",
                 "infergw_proxied_requests_total",
                 "infergw_coalesce_leaders_total",
                 "infergw_coalesce_followers_total",
                 "infergw_coalesce_tokens_saved_total",
                 "infergw_tokens_total")
    up = status(g)["uptime_s"]

    # Answers by class: what was sent, and what /metrics counts.
    want = {"requests": total, "2xx": ok + 3, "4xx": bad, "5xx": failed}
    assert s["since_start"] == want, s["since_start"]
    assert answers_by_class(ms) == want, answers_by_class(ms)
    # The gateway is younger than a minute: the window holds them all,
    # and its span is the time since the start.
    assert up < 55, up
    assert s["last_minute"] == want, s["last_minute"]
    assert 0 < s["window_s"] <= up + 2, s
    assert close(s["requests_per_s"], total / s["window_s"]), s

    # Calls per request: upstream calls over the requests proxied (the
    # 400s never were), as /metrics counts both.
    calls = metric(ms, "infergw_upstream_requests_total")
    proxied = metric(ms, "infergw_proxied_requests_total")
    assert s["upstream_calls"] == calls == ok + failed + 1, (s, calls)
    assert s["proxied_requests"] == proxied == ok + failed + 3, (s, proxied)
    assert proxied == metric(ms, "infergw_coalesce_leaders_total") + \
        metric(ms, "infergw_coalesce_followers_total") + \
        metric(ms, "infergw_coalesce_bypass_total")
    assert close(s["calls_per_request"], calls / proxied), s

    # Followers and their share of the calls that would have been made.
    c = s["coalesced"]
    followers = metric(ms, "infergw_coalesce_followers_total")
    assert c["requests"] == followers == 2, c
    assert close(c["calls_saved_share"], followers / (calls + followers)), c
    saved = metric(ms, "infergw_coalesce_tokens_saved_total")
    tokens = metric(ms, "infergw_tokens_total")
    assert c["tokens_saved"] == saved > 0, (c, saved)
    assert close(c["tokens_saved_share"], saved / tokens), (c, tokens)
    # What the followers received, as their access lines say.
    got = [re.search(r"prompt_tokens=(\d+) completion_tokens=(\d+)", line)
           for line in g.access_lines() if "role=follower" in line]
    assert len(got) == 2 and all(got), got
    assert saved == sum(int(x.group(1)) + int(x.group(2)) for x in got)

    # No cache yet: its row reads zeros, and is not shown.
    assert s["cache_enabled"] is False, s
    assert s["cache"] == {"requests": 0, "calls_saved_share": 0.0,
                          "tokens_saved": 0, "tokens_saved_share": 0.0}, s
    # The upstream and its state.
    assert [(u["name"], u["state"]) for u in s["upstreams"]] == \
        [("default", "up")], s["upstreams"]


def test_the_cache_row_adds_up_with_metrics(t):
    """With [cache] on: one upstream call, then two hits; the row says
    what /metrics says of them."""
    m = t.mock()
    g = t.gateway(m, conf=dict(ADMIN, cache={"ttl": "60s"}))
    body = chat_body("cached", temperature=0)
    for i in range(3):
        r = g.post(CHAT, body)
        assert r.status == 200, r
        assert r.headers.get("X-Infergw-Cache") == ("miss" if i == 0
                                                    else "hit"), r.headers
        # The next once this one's flight has closed: a JSON answer's
        # client can read its last byte just before (039's ask()).
        wait_state(g, None, flights=0)

    def settled():
        s = summary(g)
        return s if s["since_start"]["requests"] == 3 \
            and s["cache"]["tokens_saved"] > 0 else None
    s = wait_for(settled, 10, msg="every answer counted")
    ms = metrics(g, "infergw_cache_requests_total",
                 "infergw_cache_tokens_saved_total",
                 "infergw_upstream_requests_total", "infergw_tokens_total")
    hits = metric(ms, "infergw_cache_requests_total", result="hit")
    calls = metric(ms, "infergw_upstream_requests_total")
    saved = metric(ms, "infergw_cache_tokens_saved_total")
    tokens = metric(ms, "infergw_tokens_total")
    assert s["cache_enabled"] is True, s
    c = s["cache"]
    assert c["requests"] == hits == 2 and calls == 1, (c, hits, calls)
    assert close(c["calls_saved_share"], hits / (calls + hits)), c
    assert c["tokens_saved"] == saved > 0, (c, saved)
    assert close(c["tokens_saved_share"], saved / tokens), (c, tokens)
    assert close(c["tokens_saved_share"], 2 / 3), c
    assert s["coalesced"]["requests"] == 0, s


def test_no_traffic_yet(t):
    """Before any request the shares have nothing to be a share of."""
    m = t.mock()
    g = t.gateway(m, conf=ADMIN)
    s = summary(g)
    zero = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0}
    assert s["last_minute"] == zero and s["since_start"] == zero, s
    assert s["requests_per_s"] == 0 and s["window_s"] >= 1, s
    assert s["calls_per_request"] is None, s
    assert s["coalesced"] == {"requests": 0, "calls_saved_share": None,
                              "tokens_saved": 0,
                              "tokens_saved_share": None}, s
    assert s["cache_enabled"] is False, s


def test_readyz_503_is_no_upstream_error(t):
    """A balancer's probe of /readyz that gets 503 (no usable upstream)
    is neither in the summary's answers nor in the recent errors.  A
    client's request that finds no upstream to answer it (here a 502:
    the one upstream refuses connections) is an error the gateway
    answers with its own code, never "upstream answered"."""
    g = t.gateway(refused_port(), conf=dict(ADMIN, routing={
        "eject_after": 1, "eject_time": "5m"}))
    wait_for(lambda: g.get("/readyz").status == 503, msg="/readyz 503")
    c = g.connection()
    for _ in range(10):
        r = c.request("GET", "/readyz")
        assert r.status == 503 and r.json() == {"status": "no_upstream"}, r
    r = g.post(CHAT, chat_body("nobody"),
               headers={"X-Request-Id": "gw-own"})
    assert r.status >= 500, r

    def noted():
        s = status(g)
        return s if any(e["request_id"] == "gw-own"
                        for e in s["errors"]) else None
    s = wait_for(noted, 10, msg="the refused request noted")
    for e in s["errors"]:
        assert e["path"] != "/readyz", e
        assert "upstream answered" not in (e["message"] or ""), e
        assert e["kind"] != "upstream_status", e
    # Only the client's request is in the summary's answers.
    assert s["summary"]["since_start"]["requests"] == 1, s["summary"]
    assert s["summary"]["since_start"]["5xx"] == 1, s["summary"]


def upstream_row(s, name):
    found = [u for u in s["summary"]["upstreams"] if u["name"] == name]
    assert len(found) == 1, (name, s["summary"]["upstreams"])
    table = [u for u in s["upstreams"] if u["name"] == name][0]
    # The summary's line and the table's row say the same.
    assert table["state"] == found[0]["state"], (table, found)
    assert "state_for_ms" in table, table
    return found[0]


def control(m, **kw):
    q = "&".join("%s=%s" % kv for kv in kw.items())
    r = request(m.port, "POST", "/control?" + q)
    assert r.status == 200, r


def test_time_in_state_grows_and_resets_on_a_change(t):
    a, b = t.mock(), t.mock()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[routing]\nbalance = round_robin\neject_after = 1\n"
        "eject_time = 1m\nhealth_interval = 0\n"
        "[upstream a]\nurl = http://127.0.0.1:%d\n"
        "[upstream b]\nurl = http://127.0.0.1:%d\n" % (a.port, b.port)))
    first = upstream_row(status(g), "a")
    assert first["state"] == "up" and first["for_ms"] >= 0, first

    # It grows while nothing changes.
    def grown():
        u = upstream_row(status(g), "a")
        return u if u["for_ms"] >= first["for_ms"] + 300 else None
    up = wait_for(grown, 10, msg="a's time up grows")
    assert up["state"] == "up", up

    # a fails once: ejected, and its time starts over.
    control(a, status=500)
    t0 = time.monotonic()
    n = 0

    def ejected():
        nonlocal n
        n += 1
        g.post(CHAT, chat_body("e%d" % n))
        u = upstream_row(status(g), "a")
        return u if u["state"] == "ejected" else None
    wait_for(ejected, 10, msg="a ejected")
    s = status(g)
    since = (time.monotonic() - t0) * 1000
    ej, bu = upstream_row(s, "a"), upstream_row(s, "b")
    assert ej["state"] == "ejected" and bu["state"] == "up", (ej, bu)
    # a was up at least up["for_ms"] before it was ejected, b (made with
    # it) has been up all along: a's clock started over.
    assert ej["for_ms"] + up["for_ms"] <= bu["for_ms"] + 5, (ej, up, bu)
    assert ej["for_ms"] <= since + 5, (ej, since)
    row = [u for u in s["upstreams"] if u["name"] == "a"][0]
    assert row["state_for_ms"] == ej["for_ms"], (row, ej)
    assert 0 < row["state_left_ms"] <= 60000, row
    # ... and grows again in its new state.
    wait_for(lambda: upstream_row(status(g), "a")["for_ms"]
             >= ej["for_ms"] + 300, 10, msg="a's time ejected grows")


def test_the_page_draws_the_summary(t):
    """The summary block at the top of /status, in headless Chromium:
    the rate line, the answers, the calls per request, the followers'
    line, no cache line, and each upstream's state with its time."""
    m = t.mock()
    g = t.gateway(None, conf=ADMIN, extra=(
        "[upstream alpha]\nurl = http://127.0.0.1:%d\n" % m.port))
    trio = held_trio(g, m, chat_body("page", temperature=0,
                                     mock_hold=new_tag()))
    finish_all(trio)
    r = g.post(CHAT, b"{", {"Content-Type": "application/json"})
    assert r.status == 400, r
    wait_for(lambda: summary(g)["since_start"]["requests"] == 4, 10,
             msg="four answers counted")
    dom = chromium_dom(t.tmp, "http://127.0.0.1:%d/status" % g.admin_port)

    def text(id_):
        """The text of <div id=id_>, its tags dropped."""
        mo = re.search(r'<div id="%s"[^>]*>(.*?)</div>' % id_, dom, re.S)
        assert mo, (id_, dom)
        return re.sub(r"<[^>]+>", "", mo.group(1))
    assert re.fullmatch(r"\d+\.\d requests/s over the last \d+ s: "
                        "2xx 3 \u00b7 4xx 1 \u00b7 5xx 0",
                        text("sum-rate")), text("sum-rate")
    assert text("sum-start") == \
        "since start 4 requests: 2xx 3 \u00b7 4xx 1 \u00b7 5xx 0", dom
    assert text("sum-calls") == \
        "0.33 upstream calls per request (1 calls, 3 requests proxied)", dom
    assert text("sum-followers").startswith(
        "followers 2 (67% of calls saved), tokens saved "), dom
    assert '<div id="sum-cache" hidden="">' in dom, dom
    assert re.fullmatch(r"alpha up \d+s", text("sum-upstreams")), dom
    assert "HTTP 4" not in dom and "HTTP 5" not in dom, dom
