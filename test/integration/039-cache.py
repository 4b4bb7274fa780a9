# SPDX-License-Identifier: MIT
"""039 - the response cache, the flight's afterlife (issue 30): a finished
flight's answer kept for [cache] ttl and replayed to identical requests
that come after it.

Requests here are sent one after the other (the second once the first
has ended: its answer read and its flight closed, see ask()), so each is
a hit or a miss by construction, never by timing;
where a flight must still run, the mock holds it (mock_hold).  Waits for
an entry to expire poll /metrics (which drops what has expired) with a
deadline.
"""

import signal

from gwtest import (JSON_HEADERS, budget, chat_body, completion_body,
                    has_metric, metric, wait_for)

from coalesce_util import (COMPLETIONS, assert_complete_stream, counter,
                           finish, gateway_kib, measured_env, memory_factor,
                           new_tag, role, send, wait_state, HeldClient)

CACHE = {"cache": {"ttl": "60s"}}
CACHE_HEADER = "X-Infergw-Cache"
REQUESTS = "infergw_cache_requests_total"
EVICTIONS = "infergw_cache_evictions_total"
ENTRIES = "infergw_cache_entries"
BYTES = "infergw_cache_bytes"


def ask(g, body, headers=None, path="/v1/chat/completions"):
    """One request on its own connection, read to its end, and then its
    flight closed.  A client can have the last byte of a JSON answer (its
    Content-Length) before the leader's thread has ended the call and
    charged it: a request sent in that gap follows the flight (the same
    bytes, no second call) rather than hitting the kept entry, and the
    tests here mean to send each one after the other has ended."""
    h = dict(JSON_HEADERS)
    h.update(headers or {})
    resp = g.post(path, body, headers=h)
    wait_state(g, None, flights=0)
    return resp


def cache_of(resp):
    return resp.headers.get(CACHE_HEADER)


def completions(m):
    return m.stats()["completions"]


def test_a_stream_after_its_end_is_a_hit_with_the_same_bytes(t):
    """Two identical streams, the second sent after the first ended: one
    upstream call; the second says hit, has an Age and the same bytes."""
    m = t.mock()
    g = t.gateway(m, CACHE)
    body = chat_body("cached stream", stream=True)
    first = ask(g, body)
    assert first.status == 200 and cache_of(first) == "miss", first
    assert role(first) == "leader"
    second = ask(g, body)
    assert second.status == 200, second
    assert cache_of(second) == "hit", second.headers
    assert int(second.headers.get("Age")) >= 0
    assert second.body == first.body, "a hit replays other bytes"
    assert second.headers.get("Content-Type") == \
        first.headers.get("Content-Type")
    assert completions(m) == 1, m.stats()
    assert counter(g, REQUESTS, result="hit") == 1
    assert counter(g, REQUESTS, result="miss") == 1
    assert counter(g, ENTRIES) == 1
    assert counter(g, BYTES) > len(first.body)
    g.wait_log(r"access .*status=200 .*cache=hit")


def test_a_json_answer_is_a_hit_too(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    body = completion_body("cached json")
    first = ask(g, body, path=COMPLETIONS)
    second = ask(g, body, path=COMPLETIONS)
    assert (first.status, second.status) == (200, 200)
    assert cache_of(second) == "hit" and second.body == first.body
    assert second.headers.get("Content-Length") == str(len(first.body))
    assert completions(m) == 1


def test_without_a_cache_section_nothing_is_kept_or_said(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("no cache", stream=True)
    first, second = ask(g, body), ask(g, body)
    assert cache_of(first) is None and cache_of(second) is None
    assert role(second) == "leader"
    assert completions(m) == 2


def test_an_entry_past_its_ttl_is_a_miss(t):
    m = t.mock()
    g = t.gateway(m, {"cache": {"ttl": "1s"}})
    body = chat_body("short ttl", stream=True)
    ask(g, body)
    assert counter(g, ENTRIES) == 1
    wait_for(lambda: counter(g, ENTRIES) == 0, budget(5),
             msg="the entry expired")
    assert counter(g, EVICTIONS, reason="expired") == 1
    again = ask(g, body)
    assert cache_of(again) == "miss", again.headers
    assert completions(m) == 2


def test_a_request_while_the_flight_streams_is_a_follower(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    tag = new_tag()
    body = chat_body("still running", stream=True, mock_hold=tag)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    follow = send(g, body)
    wait_state(g, m, followers=1)
    m.release(tag)
    a, b = finish(lead), finish(follow)
    assert role(b.resp) == "follower" and cache_of(b.resp) == "miss"
    assert a.body == b.body
    # And the flight it followed is kept: the next is a hit.
    assert cache_of(ask(g, body)) == "hit"
    assert completions(m) == 1


def test_no_cache_no_store_and_max_age(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    body = chat_body("directives", stream=True)
    ask(g, body)
    # no-store: the cache is not used at all; the entry stays.
    r = ask(g, body, {"Cache-Control": "no-store"})
    assert cache_of(r) == "bypass" and role(r) == "bypass", r.headers
    assert completions(m) == 2
    assert cache_of(ask(g, body)) == "hit"
    # A max-age that does not parse is ignored, never an error.
    r = ask(g, body, {"Cache-Control": "max-age=soon"})
    assert r.status == 200 and cache_of(r) == "hit"
    # max-age: fine while the entry is young enough...
    r = ask(g, body, {"Cache-Control": "max-age=3600"})
    assert cache_of(r) == "hit"
    # ...and once it is a second old, max-age=0 wants a new answer, which
    # replaces the entry.
    wait_for(lambda: int(ask(g, body).headers.get("Age")) >= 1, budget(5),
             interval=0.2, msg="the entry a second old")
    calls = completions(m)
    r = ask(g, body, {"Cache-Control": "max-age=0"})
    assert cache_of(r) == "miss" and role(r) == "leader", r.headers
    assert completions(m) == calls + 1
    assert counter(g, EVICTIONS, reason="replaced") == 1
    r = ask(g, body)
    assert cache_of(r) == "hit" and int(r.headers.get("Age")) == 0
    # no-cache: a new answer, never the entry; it is kept for the next.
    r = ask(g, body, [("Cache-Control", "max-age=60"),
                      ("Cache-Control", "no-cache")])
    assert cache_of(r) == "miss" and role(r) == "leader", r.headers
    assert completions(m) == calls + 2
    assert counter(g, EVICTIONS, reason="replaced") == 2
    assert cache_of(ask(g, body)) == "hit"
    assert completions(m) == calls + 2


def test_no_cache_never_follows_a_running_flight(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    tag = new_tag()
    body = chat_body("fresh only", stream=True, mock_hold=tag)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    fresh = send(g, body, headers={"Cache-Control": "no-cache"})
    wait_state(g, m, held=2)        # its own call, not the flight
    m.release(tag)
    a, b = finish(lead), finish(fresh)
    assert role(b.resp) == "bypass" and cache_of(b.resp) == "bypass"
    assert_complete_stream(a)
    assert_complete_stream(b)


def test_a_tenant_with_cache_off_is_never_cached(t):
    m = t.mock()
    keys = {"on": "sk-cache-on-0123456789", "off": "sk-cache-off-012345678"}
    g = t.gateway(m, CACHE, extra="[tenant on]\napi_key = %s\n\n"
                  "[tenant off]\napi_key = %s\ncache = off\n"
                  % (keys["on"], keys["off"]))
    body = chat_body("per tenant", stream=True)
    off = {"Authorization": "Bearer " + keys["off"]}
    on = {"Authorization": "Bearer " + keys["on"]}
    a, b = ask(g, body, off), ask(g, body, off)
    assert (cache_of(a), cache_of(b)) == ("bypass", "bypass")
    assert role(b) == "leader"      # it still coalesces
    assert completions(m) == 2
    # Another tenant's identical request never hits another's entry.
    c, d = ask(g, body, on), ask(g, body, on)
    assert (cache_of(c), cache_of(d)) == ("miss", "hit")
    assert completions(m) == 3


def test_different_credentials_never_hit(t):
    m = t.mock()
    g = t.gateway(m, dict(CACHE, routing={"forward_client_auth": "on"}))
    body = chat_body("whose answer", stream=True)
    a = ask(g, body, {"Authorization": "Bearer client-one"})
    b = ask(g, body, {"Authorization": "Bearer client-two"})
    c = ask(g, body)
    d = ask(g, body, {"Authorization": "Bearer client-one"})
    assert [cache_of(x) for x in (a, b, c, d)] == \
        ["miss", "miss", "miss", "hit"]
    assert completions(m) == 3


def test_errors_and_cut_or_failed_streams_are_never_kept(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    cases = [
        ("an error status", {"mock_status": 500}),
        ("a stream cut short", {"mock_fault": "die_mid_stream"}),
        ("an error event before [DONE]", {"mock_fault": "error_event"}),
        ("upstream no-store", {"mock_fault": "no_store"}),
        ("upstream private", {"mock_fault": "private"}),
    ]
    for i, (what, knobs) in enumerate(cases):
        body = chat_body("never kept %d" % i, stream=True, **knobs)
        first = ask(g, body)
        second = ask(g, body)
        assert cache_of(second) == "miss", (what, second.headers)
        assert role(second) == "leader", what
    assert counter(g, ENTRIES) == 0
    assert counter(g, REQUESTS, result="hit") == 0
    assert completions(m) == 2 * len(cases)
    # Control: the mock's faults are per request, a plain one is kept.
    body = chat_body("kept", stream=True)
    ask(g, body)
    assert cache_of(ask(g, body)) == "hit"


def test_a_reload_drops_every_entry(t):
    m = t.mock()
    g = t.gateway(m, CACHE)
    body = chat_body("before the reload", stream=True)
    ask(g, body)
    assert counter(g, ENTRIES) == 1
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    assert counter(g, ENTRIES) == 0
    assert counter(g, EVICTIONS, reason="reload") == 1
    assert cache_of(ask(g, body)) == "miss"
    assert completions(m) == 2


def test_a_hit_is_billed_as_saved_and_charged_nothing(t):
    m = t.mock()
    key = "sk-billed-0123456789ab"
    g = t.gateway(m, CACHE, extra="[tenant acme]\napi_key = %s\n"
                  "tokens_per_minute = 100000\n" % key)
    auth = {"Authorization": "Bearer " + key}
    body = completion_body("billed")
    ask(g, body, auth, path=COMPLETIONS)
    charged = counter(g, "infergw_tenant_tokens_charged_total",
                      tenant="acme")
    assert charged > 0
    hit = ask(g, body, auth, path=COMPLETIONS)
    assert cache_of(hit) == "hit"
    usage = hit.json()["usage"]
    saved = usage["prompt_tokens"] + usage["completion_tokens"]
    assert counter(g, "infergw_cache_tokens_saved_total",
                   tenant="acme") == saved
    assert counter(g, "infergw_coalesce_tokens_saved_total",
                   tenant="acme") == 0
    assert counter(g, "infergw_tenant_tokens_charged_total",
                   tenant="acme") == charged
    # The bill counts what the client received, both times.
    assert counter(g, "infergw_tokens_total", tenant="acme",
                   kind="prompt") == 2 * usage["prompt_tokens"]


def test_lru_keeps_memory_under_max_bytes_with_a_held_reader(t):
    """Entries of about 256 KiB through a cache of 2 MiB, 40 of them
    (10 MiB), while a client holds a hit of the first one unread: the
    cache drops the least recently used (never past max_bytes) and the
    gateway's RSS grows by less than the cache's bound plus that one
    entry and some slack, where keeping them all would take 10 MiB."""
    m = t.mock()
    g = t.gateway(m, {"cache": {"ttl": "600s", "max_bytes": "2m",
                                "max_entry_bytes": "1m"},
                      "coalesce": {"max_flight_bytes": "2m"}},
                  env=measured_env())
    factor = memory_factor(g)

    def big(i):
        return chat_body("big %d" % i, stream=True, mock_chunks=64,
                         mock_pad=4000, mock_delay_ms=0)

    first = ask(g, big(0))
    assert len(first.body) > 200000, len(first.body)
    held = HeldClient(g, big(0))
    wait_for(lambda: counter(g, REQUESTS, result="hit") == 1, budget(5),
             msg="the held client's hit")
    base = gateway_kib(g, "VmRSS")
    for i in range(1, 41):
        r = ask(g, big(i))
        assert r.status == 200 and cache_of(r) == "miss"
        assert counter(g, BYTES) <= 2 * 1024 * 1024
    grown = gateway_kib(g, "VmRSS") - base
    assert counter(g, EVICTIONS, reason="size") >= 30
    assert counter(g, ENTRIES) <= 8
    bound = factor * (2048 + 1024 + 3072)
    assert grown < bound, "RSS grew %d KiB, bound %d" % (grown, bound)
    resp = held.read_all()
    assert resp.body == first.body, "the held hit lost bytes"
    # The entry it read was dropped meanwhile, and is gone now.
    r = ask(g, big(0))
    assert cache_of(r) == "miss"


def test_bad_cache_settings_are_file_line_errors(t):
    cases = [
        ("ttl = soon\n", "ttl"),
        ("ttl = 1500ms\n", "whole number of seconds"),
        ("max_bytes = 1m\nmax_entry_bytes = 2m\n", "max_entry_bytes"),
        ("max_entry_bytes = 0\n", "max_entry_bytes"),
        ("size = 1m\n", "size"),
    ]
    for text, word in cases:
        path = t.write("bad.conf", "[server]\nlisten = 127.0.0.1:0\n"
                       "[upstream]\nurl = http://127.0.0.1:9\n\n"
                       "[cache]\n" + text)
        rc, out = t.infergw("-t", "-c", path)
        assert rc != 0, (text, out)
        assert "bad.conf:" in out and word in out, (text, out)
    path = t.write("badt.conf", "[server]\nlisten = 127.0.0.1:0\n"
                   "[upstream]\nurl = http://127.0.0.1:9\n\n"
                   "[tenant a]\napi_key = sk-a-0123456789abcdef\n"
                   "cache = maybe\n")
    rc, out = t.infergw("-t", "-c", path)
    assert rc != 0 and "badt.conf:8" in out, out


def test_a_stream_hit_is_billed_though_its_client_asked_no_usage(t):
    """The leader's call asked the upstream for usage (usage_ask()): the
    hit of a client that did not ask gets no usage event, and is billed
    what it saved all the same."""
    m = t.mock()
    g = t.gateway(m, CACHE)
    body = chat_body("stream usage", stream=True)
    first = ask(g, body)
    second = ask(g, body)
    assert cache_of(second) == "hit" and second.body == first.body
    assert b'"usage"' not in second.body, second.body[-300:]
    assert counter(g, "infergw_cache_tokens_saved_total") > 0
