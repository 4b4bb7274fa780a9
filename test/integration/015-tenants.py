# SPDX-License-Identifier: MIT
"""015 - tenants (issue 10): max_inflight and requests_per_minute limits
(429 with Retry-After; coalesced followers count as the tenant's
requests, not as upstream calls), keys stored as api_key_sha256, and the
token bill from the upstream's usage: infergw_tokens_total,
infergw_coalesce_tokens_saved_total and the access log.
"""

import hashlib
import json
import re
import threading
import time

from gwtest import assert_error, budget, chat_body, refused_port, \
    completion_body, request, sse_data, sse_events, wait_for

from coalesce_util import (CHAT, COMPLETIONS, assert_complete_stream,
                           finish, finish_all, new_tag, present, role,
                           send, wait_state)

REJECTED = "infergw_tenant_rejected_total"
INFLIGHT = "infergw_tenant_requests_inflight"
TOKENS = "infergw_tokens_total"
SAVED = "infergw_coalesce_tokens_saved_total"


def auth(key):
    return {"Authorization": "Bearer %s" % key}


def body_tag(body):
    return re.search(rb'"mock_hold":"([^"]+)"', body).group(1).decode()


# Tenant keys are at least 16 characters (config.c): shorter is weak.
KEY_A = "sk-a-0123456789abc"
KEY_B = "sk-b-0123456789abc"
TENANT_A = "[tenant a]\napi_key = %s\n" % KEY_A
TENANT_B = "[tenant b]\napi_key = %s\n" % KEY_B
JSON_A = {"Authorization": "Bearer " + KEY_A,
          "Content-Type": "application/json"}


def retry_after(resp):
    v = resp.headers.get("Retry-After")
    assert v is not None and v.isdigit(), "Retry-After %r" % (v,)
    return int(v)


def test_max_inflight_counts_followers_not_calls(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "max_inflight = 2\n" + TENANT_B)
    tag = new_tag()
    body = chat_body("limits", stream=True, mock_hold=tag)
    # A leader and its follower: two of a's requests, one upstream call.
    c1 = send(g, body, headers=auth(KEY_A))
    wait_state(g, m, held=1, leaders=1)
    c2 = send(g, body, headers=auth(KEY_A))
    wait_state(g, m, held=1, followers=1)
    gm = g.metrics()
    assert present(gm, INFLIGHT, tenant="a") == 2
    # The third is over a's limit, though it would cost no call either.
    conn = g.connection()
    r3 = conn.request("POST", CHAT, JSON_A, body)
    assert_error(r3, 429, "rate_limit_exceeded")
    assert retry_after(r3) >= 1
    assert b"max_inflight" in r3.body, r3.body
    assert role(r3) is None, "a refused request has a role %r" % role(r3)
    # Another tenant is not held back by a's limit.
    c4 = send(g, body, headers=auth(KEY_B))
    wait_state(g, m, held=2, leaders=2)
    m.release(tag)
    for s in finish_all([c1, c2, c4]):
        assert_complete_stream(s)
    wait_state(g, m, completions=2, upstream=2)
    gm = g.metrics()
    assert present(gm, REJECTED, tenant="a", limit="max_inflight") == 1
    assert present(gm, REJECTED, tenant="b", limit="max_inflight") == 0
    wait_for(lambda: present(g.metrics(), INFLIGHT, tenant="a") == 0)
    # Under the limit again: served.
    r = g.post(CHAT, chat_body("again"), dict(auth(KEY_A),
               **{"Content-Type": "application/json"}))
    assert r.status == 200, r
    # The 429 kept the connection: the body was read, like any answer's.
    r = conn.request("POST", CHAT, JSON_A, chat_body("same connection"))
    assert r.status == 200, r


def test_openai_rate_limit_headers(t):
    # OpenAI's x-ratelimit-*-requests on every answer to a tenant with
    # requests_per_minute, the 429 included; none for one without.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "requests_per_minute = 2\n"
                  + TENANT_B)
    h = dict(auth(KEY_A), **{"Content-Type": "application/json"})
    seen = []
    for i in range(3):
        r = g.post(CHAT, chat_body("rl %d" % i, stream=(i == 1)), h)
        seen.append(r)
        assert r.headers.get("x-ratelimit-limit-requests") == "2", r.headers
    assert [r.status for r in seen] == [200, 200, 429], seen
    assert [r.headers.get("x-ratelimit-remaining-requests")
            for r in seen] == ["1", "0", "0"], [r.headers for r in seen]
    # Refilled at 2 a minute: full again 30 s after one was taken, and
    # never later than a minute.
    resets = []
    for r in seen:
        v = r.headers.get("x-ratelimit-reset-requests")
        f = re.fullmatch(r"(\d+)ms|(\d+(?:\.\d{1,3})?)s|(\d)m(\d+)s", v)
        assert f, v
        resets.append(int(f.group(1)) / 1000 if f.group(1) else
                      float(f.group(2)) if f.group(2) else
                      60 * int(f.group(3)) + int(f.group(4)))
    assert 25 <= resets[0] <= 30 and 50 <= resets[2] <= 60, resets
    r = g.post(CHAT, chat_body("b"), dict(auth(KEY_B),
               **{"Content-Type": "application/json"}))
    assert r.status == 200 and r.headers.get(
        "x-ratelimit-limit-requests") is None, r.headers


def test_rate_limit_headers_are_each_requests_own_in_a_flight(t):
    # A leader and its follower (one tenant's: tenants never share a
    # flight): each answer's x-ratelimit-* are its own request's, not a
    # copy of the leader's head.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "requests_per_minute = 5\n"
                  + TENANT_B)
    body = chat_body("shared", stream=True, mock_hold=new_tag())
    c1 = send(g, body, headers=auth(KEY_A))
    wait_state(g, m, held=1, leaders=1)
    c2 = send(g, body, headers=auth(KEY_A))
    wait_state(g, m, held=1, followers=1)
    m.release(body_tag(body))
    lead, follow = finish_all([c1, c2])
    assert (role(lead), role(follow)) == ("leader", "follower")
    wait_state(g, m, completions=1)
    for s, left in ((lead, "4"), (follow, "3")):
        assert_complete_stream(s)
        assert s.resp.headers.get("x-ratelimit-limit-requests") == "5"
        assert s.resp.headers.get("x-ratelimit-remaining-requests") == \
            left, (role(s), s.resp.headers)


def test_requests_per_minute(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "requests_per_minute = 3\n"
                  + TENANT_B)
    h = dict(auth(KEY_A), **{"Content-Type": "application/json"})
    for i in range(3):
        r = g.post(CHAT, chat_body("rpm %d" % i), h)
        assert r.status == 200, (i, r)
    r = g.post(CHAT, chat_body("rpm 3"), h)
    assert_error(r, 429, "rate_limit_exceeded")
    # One token every 20 s at 3 a minute.
    assert 1 <= retry_after(r) <= 20, r.headers.get("Retry-After")
    assert b"requests_per_minute" in r.body, r.body
    r = g.post(CHAT, chat_body("rpm b"), dict(auth(KEY_B),
               **{"Content-Type": "application/json"}))
    assert r.status == 200, r
    assert m.stats()["completions"] == 4
    gm = g.metrics()
    assert present(gm, REJECTED, tenant="a",
                   limit="requests_per_minute") == 1


def test_requests_per_minute_holds_for_keep_alive_connections(t):
    """Issue 16 item 10: 8 keep-alive connections sending as fast as they
    can get no more through than the bucket holds (a minute's worth, 700)
    plus what it refills while they send (700 a minute): the old bucket
    admitted every request that came while the next token was due in
    under 0.5 ms, 3.8-8x the limit."""
    rpm = 700
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "requests_per_minute = %d\n" % rpm)
    lock = threading.Lock()
    statuses = {}
    refused = []                # when each 429 came back
    errors = []
    hard_stop = time.monotonic() + budget(30)

    def done():
        # Go on for 1.5 s of an empty bucket: about 17 refills, each of
        # which the old bucket turned into a burst.
        with lock:
            return (len(refused) >= 100
                    and time.monotonic() - refused[0] >= 1.5) \
                or time.monotonic() >= hard_stop

    def sender(n):
        try:
            conn = g.connection()
            i = 0
            while not done():
                r = conn.request("POST", CHAT, JSON_A,
                                 chat_body("rate %d.%d" % (n, i)))
                i += 1
                with lock:
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if r.status == 429:
                        refused.append(time.monotonic())
                if r.status == 429:
                    assert_error(r, 429, "rate_limit_exceeded")
                    # The next token is at most 86 ms away.
                    assert retry_after(r) == 1, r.headers
                else:
                    assert r.status == 200, r
        except Exception as e:          # reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=sender, args=(n,), daemon=True)
               for n in range(8)]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(budget(40))
    elapsed = time.monotonic() - start
    assert not errors, errors[0]
    assert time.monotonic() < hard_stop, "too slow to empty the bucket: " \
        "%r in %.1f s" % (statuses, elapsed)
    ok, no = statuses.get(200, 0), statuses.get(429, 0)
    # Every admission happened between 'start' and now: the bucket can
    # have held its minute's worth and what 'elapsed' refilled, no more
    # (+1: the clocks' rounding).  And it starts full: the first 700 pass.
    allowed = rpm + int(rpm * elapsed / 60)
    assert rpm <= ok <= allowed + 1, \
        "%d passed, %d refused in %.2f s; the bucket allows %d" % (
            ok, no, elapsed, allowed)
    assert present(g.metrics(), REJECTED, tenant="a",
                   limit="requests_per_minute") == no


def test_api_key_sha256_and_keys_never_logged(t):
    m = t.mock()
    key = "sk-only-its-digest-9f2c"
    digest = hashlib.sha256(key.encode()).hexdigest()
    plain = "sk-plain-77aa-4d2e"
    g = t.gateway(m, extra="[tenant h]\napi_key_sha256 = %s\n"
                           "[tenant p]\napi_key = %s\n" % (digest, plain))
    ok = dict(auth(key), **{"Content-Type": "application/json"})
    r = g.post(CHAT, chat_body("hashed"), ok)
    assert r.status == 200, r
    r = g.post(CHAT, chat_body("hashed"), dict(auth(digest), **{
        "Content-Type": "application/json"}))
    assert_error(r, 401, "invalid_api_key")
    r = g.post(CHAT, chat_body("hashed"), dict(auth(key[:-1]), **{
        "Content-Type": "application/json"}))
    assert_error(r, 401, "invalid_api_key")
    # RFC 9110 11.6.1: a 401 says which scheme it wants.
    assert r.headers.get("WWW-Authenticate") == "Bearer", r
    r = g.post(CHAT, chat_body("plain"), dict(auth(plain), **{
        "Content-Type": "application/json"}))
    assert r.status == 200, r
    g.wait_log(r"access .*status=200")
    log = "\n".join(g.log_lines())
    for secret in (key, plain, "sk-plain"):
        assert secret not in log, "a key in the log"


def test_no_log_line_carries_a_query_string(t):
    """Issue 16 item 12: a client that puts its key in the query
    (?api_key=...) finds it in no log line: every line that names a
    request logs its path alone.  Each kind of line that names one is
    provoked: the access line (200, 4xx, 502), the upstream failure line
    (a dead upstream) and the hedge line.  The upstream still gets the
    whole target, query and all: it is the client's request."""
    key = "sk-in-the-query-5e1d0c7a"
    q = "?api_key=%s&x=1" % key
    tenant = "[tenant a]\napi_key = %s\n" % key
    h = dict(auth(key), **{"Content-Type": "application/json"})
    debug = {"log_level": "debug"}
    dead = t.gateway(refused_port(), conf={
        "server": debug, "routing": {"retries": 0, "health_interval": 0}},
        extra=tenant)
    assert_error(dead.post(CHAT + q, chat_body("dead"), h), 502,
                 "upstream_unreachable")
    dead.wait_log(r"upstream: failed .*path=")
    assert_error(dead.request("GET", "/nope" + q), 404, "not_found")
    assert_error(dead.request("GET", CHAT + q, h), 405,
                 "method_not_allowed")
    assert_error(dead.post(CHAT + q, chat_body("x"), dict(
        h, Authorization="Bearer sk-wrong-wrong-wrong")), 401,
        "invalid_api_key")
    assert_error(dead.post(CHAT + q, b"{not json", h), 400, "invalid_json")

    slow, fast = t.mock(), t.mock()
    r = request(slow.port, "POST", "/control?slow_every=1&slow_ms=5000")
    assert r.status == 200, r
    pool = t.gateway(None, conf={
        "server": debug,
        "routing": {"balance": "round_robin", "hedge_after": "100ms",
                    "retry_budget_min": 100},
        "upstream u0": {"url": "http://127.0.0.1:%d" % slow.port},
        "upstream u1": {"url": "http://127.0.0.1:%d" % fast.port}},
        extra=tenant)
    r = pool.post(CHAT + q, chat_body("hedged"), h)
    assert r.status == 200, r
    pool.wait_log(r"upstream: hedge .*path=")
    targets = [x["target"] for x in json.loads(
        fast.get("/recorded").body)["requests"]]
    assert targets == [CHAT + q], targets

    for g, n in ((dead, 5), (pool, 1)):
        # An access line is written once its answer has gone out.
        wait_for(lambda: len(g.access_lines()) >= n, msg="%d access lines"
                 % n)
        log = g.log_lines()
        named = [l for l in log if "path=" in l]
        assert len(named) >= n + 1, named
        for line in named:
            assert re.search(r"\bpath=/[^ ?]*( |$)", line), line
        for line in log:
            assert key not in line and "api_key" not in line, line


def usage_of_stream(body):
    """The usage object of a stream's events (the last one), or None."""
    found = None
    for ev in sse_events(body):
        d = sse_data(ev)
        if isinstance(d, dict) and isinstance(d.get("usage"), dict):
            found = d["usage"]
    return found


def access_usage(g, n):
    """The (prompt, completion) of each of the first n access lines that
    carry a usage (waits for them)."""
    rx = re.compile(r"\baccess .*prompt_tokens=(\d+) "
                    r"completion_tokens=(\d+)")

    def lines():
        got = [rx.search(l) for l in g.access_lines()]
        got = [(int(x.group(1)), int(x.group(2))) for x in got if x]
        return got if len(got) >= n else None
    return wait_for(lines, msg="%d access lines with usage" % n)


def test_tokens_billed_from_usage(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + TENANT_B)
    h = dict(auth(KEY_A), **{"Content-Type": "application/json"})
    # Not streamed: the body's usage.
    r = g.post(COMPLETIONS, completion_body("count me"), h)
    assert r.status == 200, r
    u1 = r.json()["usage"]
    # Streamed with include_usage: the usage chunk.
    body = chat_body("count me too", stream=True,
                     stream_options={"include_usage": True})
    s = finish(send(g, body, headers=auth(KEY_A)))
    assert_complete_stream(s)
    u2 = usage_of_stream(s.body)
    assert u2 is not None, "the mock sent no usage chunk"
    # Streamed without it, alone (a coalesced stream asks the upstream
    # for its usage, 040-stream-usage.py): nothing to bill.
    s = finish(send(g, chat_body("no usage asked", stream=True),
                    headers=dict(auth(KEY_A),
                                 **{"X-Infergw-Coalesce": "off"})))
    assert_complete_stream(s)
    assert usage_of_stream(s.body) is None
    model = "mock-model"
    want_p = u1["prompt_tokens"] + u2["prompt_tokens"]
    want_c = u1["completion_tokens"] + u2["completion_tokens"]
    assert want_p > 0 and want_c > 0, (u1, u2)

    def billed():
        gm = g.metrics()
        if not any(k[0] == TOKENS for k in gm):
            return None
        return (present(gm, TOKENS, tenant="a", model=model, kind="prompt"),
                present(gm, TOKENS, tenant="a", model=model,
                        kind="completion"))
    wait_for(lambda: billed() == (want_p, want_c),
             msg="both billed, the third not")
    # Each is logged after its client has the answer, so in either order.
    assert sorted(access_usage(g, 2)) == sorted([
        (u1["prompt_tokens"], u1["completion_tokens"]),
        (u2["prompt_tokens"], u2["completion_tokens"])])
    assert present(g.metrics(), SAVED, tenant="a") == 0


def test_followers_billed_and_saved(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    tag = new_tag()
    body = chat_body("one call for three", stream=True, mock_hold=tag,
                     stream_options={"include_usage": True})
    conns = [send(g, body, headers=auth(KEY_A))]
    wait_state(g, m, held=1, leaders=1)
    conns += [send(g, body, headers=auth(KEY_A)) for _ in range(2)]
    wait_state(g, m, held=1, followers=2)
    m.release(tag)
    streams = finish_all(conns)
    for s in streams:
        assert_complete_stream(s)
    u = usage_of_stream(streams[0].body)
    p, c = u["prompt_tokens"], u["completion_tokens"]
    wait_state(g, m, completions=1, upstream=1)

    def billed():
        gm = g.metrics()
        if not any(k[0] == SAVED for k in gm):
            return None
        return (present(gm, TOKENS, tenant="a", model="mock-model",
                        kind="prompt"),
                present(gm, TOKENS, tenant="a", model="mock-model",
                        kind="completion"),
                present(gm, SAVED, tenant="a"))
    # Each of the three received the usage; two got it for nothing.
    assert wait_for(lambda: billed() == (3 * p, 3 * c, 2 * (p + c))
                    and billed()), billed()
    assert access_usage(g, 3) == [(p, c)] * 3


def test_no_bill_for_an_error_or_a_cut_stream(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    h = dict(auth(KEY_A), **{"Content-Type": "application/json"})
    r = g.post(CHAT, chat_body("x", mock_status=429), h)
    assert r.status == 429, r
    # Cut mid-way: neither the stream nor the cut JSON body is billed.
    body = chat_body("cut", stream=True, mock_fault="die_mid_stream",
                     stream_options={"include_usage": True})
    s = finish(send(g, body, headers=auth(KEY_A)))
    assert not s.clean_end
    s = finish(send(g, chat_body("cut", mock_fault="die_mid_stream"),
                    headers=auth(KEY_A)))
    r = g.post(CHAT, chat_body("fine"), dict(auth(KEY_A), **{
        "Content-Type": "application/json"}))
    assert r.status == 200, r
    u = r.json()["usage"]
    # The bill is made before the access line is written, and both after
    # the client has its answer: wait for the line, then read the bill.
    assert access_usage(g, 1) == [(u["prompt_tokens"],
                                   u["completion_tokens"])]
    gm = g.metrics()
    assert present(gm, TOKENS, tenant="a", model="mock-model",
                   kind="prompt") == u["prompt_tokens"]
    assert present(gm, TOKENS, tenant="a", model="mock-model",
                   kind="completion") == u["completion_tokens"]
