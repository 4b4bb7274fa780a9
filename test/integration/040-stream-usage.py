# SPDX-License-Identifier: MIT
"""040 - usage on coalesced streams (issue 30 item 4): the leader of a
coalesced stream asks the upstream for its usage
("stream_options":{"include_usage":true}, inserted right after the
body's '{' when the body has no stream_options of its own), the usage
event goes only to the clients that asked for it, and so every follower
is billed what it saved, whatever its client asked.  A body with
stream_options of its own, one that does not stream, and a call that
does not coalesce reach the upstream exactly as the client sent them.

The mock records the last body it was sent (/stats "last_body"), and
holds the leader's call (mock_hold) until every follower has joined.
"""

import json
import re

from gwtest import chat_body, completion_body, metric, sse_data, \
    sse_events, wait_for

from coalesce_util import (CHAT, COMPLETIONS, FOLLOWERS,
                           assert_complete_stream, assert_same_bodies,
                           counter, finish_all, new_tag, present, role,
                           roles, send, wait_state)

TOKENS = "infergw_tokens_total"
SAVED = "infergw_coalesce_tokens_saved_total"

KEY = "sk-a-0123456789abc"
TENANT = "[tenant a]\napi_key = %s\n" % KEY
AUTH = {"Authorization": "Bearer " + KEY}


def asked(body):
    """'body' as the gateway sends it upstream: with the usage asked
    for, in these very bytes (written out here, not as_sent())."""
    assert body.startswith(b"{"), body
    return b'{"stream_options":{"include_usage":true},' + body[1:]


def last_body(m):
    """The body of the mock's last completion request, as it came."""
    b = m.stats()["last_body"]
    assert b is not None, "the mock recorded no body"
    return b.encode()


def usage_events(body):
    """The events of a stream body that carry a usage object."""
    return [ev for ev in sse_events(body)
            if isinstance(sse_data(ev), dict)
            and isinstance(sse_data(ev).get("usage"), dict)]


def without(body, events):
    """A stream body with 'events' (each once, with its blank line)
    taken out."""
    for ev in events:
        assert body.count(ev + b"\n\n") == 1, (ev, body)
        body = body.replace(ev + b"\n\n", b"")
    return body


def held_flight(g, m, lead_body, follower_bodies, path=CHAT):
    """One flight: 'lead_body' leads it (held at the mock), then each of
    'follower_bodies' joins; released once all have.  Checks that the
    mock was sent the leader's body with the usage asked for, and that
    one call served them all.  Returns the finished streams, the
    leader's first."""
    tag = re.search(rb'"mock_hold":"([^"]+)"', lead_body).group(1).decode()
    base = m.stats()["completions"]
    followers = counter(g, FOLLOWERS)
    conns = [send(g, lead_body, path, headers=AUTH)]
    wait_state(g, m, held=1, completions=base + 1)
    sent = last_body(m)
    conns += [send(g, b, path, headers=AUTH) for b in follower_bodies]
    wait_state(g, m, held=1, completions=base + 1,
               followers=followers + len(follower_bodies))
    assert m.release(tag) == 1
    streams = finish_all(conns)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert role(streams[0]) == "leader", role(streams[0])
    assert roles(streams[1:]) == ["follower"] * len(follower_bodies), \
        roles(streams)
    doc = json.loads(sent)
    assert doc["stream_options"] == {"include_usage": True}, sent
    wait_state(g, m, completions=base + 1, in_progress=0)
    return streams, sent


def the_usage(m, sent, path=CHAT):
    """The usage the upstream reports for 'sent' (asked for), from a
    call of the mock's own: (prompt, completion)."""
    r = m.call("POST", path, sent)
    assert r.status == 200 and r.clean_end, r
    (ev,) = usage_events(r.body)
    u = sse_data(ev)["usage"]
    assert u["prompt_tokens"] > 0 and u["completion_tokens"] > 0, u
    return u["prompt_tokens"], u["completion_tokens"]


def billed(g):
    """Tenant a's billed prompt and completion tokens (a model's series
    appears with its first bill: 0 before) and its tokens saved by
    coalescing (a series every tenant has: it must exist)."""
    gm = g.metrics()
    return (metric(gm, TOKENS, tenant="a", model="mock-model",
                   kind="prompt"),
            metric(gm, TOKENS, tenant="a", model="mock-model",
                   kind="completion"),
            present(gm, SAVED, tenant="a"))


def wait_billed(g, want, pick=slice(0, 3)):
    """Poll until billed(g)[pick] is 'want' (each client is billed just
    after its last byte)."""
    last = []

    def done():
        last[:] = [billed(g)[pick]]
        return last[0] == want
    try:
        wait_for(done, 10, msg="billed %r" % (want,))
    except AssertionError as e:
        raise AssertionError("%s; last seen %r" % (e, last))


def test_fourteen_followers_none_asked_all_billed(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT)
    body = chat_body("fifteen clients", stream=True, mock_hold=new_tag(),
                     mock_chunks=6)
    streams, sent = held_flight(g, m, body, [body] * 14)
    # The upstream was asked for the usage, the rest of the body as sent.
    assert sent == asked(body), sent
    # Every client has the leader's bytes, and no usage event.
    assert_same_bodies(streams)
    assert usage_events(streams[0].body) == [], streams[0].body[-300:]
    assert b'"usage"' not in streams[0].body, streams[0].body[-300:]
    # All fifteen are billed the flight's usage, and the fourteen
    # followers saved it.
    p, c = the_usage(m, sent)
    wait_billed(g, (15 * p, 15 * c, 14 * (p + c)))


def test_completions_route_too(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT)
    body = completion_body("text clients", stream=True,
                           mock_hold=new_tag(), mock_chunks=4)
    streams, sent = held_flight(g, m, body, [body] * 2, COMPLETIONS)
    assert sent == asked(body), sent
    assert_same_bodies(streams)
    assert usage_events(streams[0].body) == [], streams[0].body[-300:]
    p, c = the_usage(m, sent, COMPLETIONS)
    wait_billed(g, (3 * p, 3 * c, 2 * (p + c)))


def test_mixed_flight_usage_only_to_who_asked(t):
    # A body that asks in exactly the words of the rewrite is the same
    # request as one the gateway rewrites: they share a flight, either
    # leading.  The client that asked gets the usage event; the other
    # gets every other byte, the same.
    m = t.mock()
    g = t.gateway(m, extra=TENANT)
    saved = 0
    for lead_asks in (False, True):
        plain = chat_body("mixed %s" % lead_asks, stream=True,
                          mock_hold=new_tag(), mock_chunks=5)
        asking = asked(plain)
        lead, follow = (asking, plain) if lead_asks else (plain, asking)
        streams, sent = held_flight(g, m, lead, [follow])
        assert sent == asking, sent
        got = streams[0] if lead_asks else streams[1]
        other = streams[1] if lead_asks else streams[0]
        evs = usage_events(got.body)
        assert len(evs) == 1, got.body[-300:]
        d = sse_data(evs[0])
        assert d["choices"] == [], d
        # Just before [DONE], as the upstream sent it.
        assert got.body.endswith(evs[0] + b"\n\ndata: [DONE]\n\n"), \
            got.body[-300:]
        assert usage_events(other.body) == [], other.body[-300:]
        assert other.body == without(got.body, evs), \
            "other bytes differ:\n%r\n%r" % (other.body[-300:],
                                             got.body[-300:])
        u = d["usage"]
        saved += u["prompt_tokens"] + u["completion_tokens"]
        # The follower saved it, whether it asked or not.
        wait_billed(g, saved, 2)


def test_own_stream_options_sent_unchanged(t):
    # stream_options in any form is the client's choice: the body goes
    # as it is, and the stream is what it asked for.
    m = t.mock()
    g = t.gateway(m)
    for opts, has_usage in (({"include_usage": False}, False), ({}, False),
                            ({"include_usage": True}, True)):
        body = chat_body("own %r" % opts, stream=True, stream_options=opts)
        s = g.stream(CHAT, body)
        assert s.resp.status == 200, s.resp
        assert role(s.resp) == "leader", s.resp
        s.read_all()
        assert_complete_stream(s)
        assert last_body(m) == body, last_body(m)
        assert len(usage_events(s.body)) == (1 if has_usage else 0), \
            s.body[-300:]


def test_unstreamed_and_uncoalesced_bodies_unchanged(t):
    m = t.mock()
    g = t.gateway(m)
    # Not a stream: nothing to ask ("true" the string is not true).
    for body in (chat_body("json"), chat_body("json", stream=False),
                 chat_body("json", stream="true")):
        r = g.post(CHAT, body)
        assert r.status == 200, r
        assert role(r) == "leader", r
        assert last_body(m) == body, last_body(m)
    # A stream that does not coalesce (opted out, or sampled) goes alone
    # with the client's own body, and gets no usage event.
    for body, headers in (
            (chat_body("alone", stream=True),
             {"X-Infergw-Coalesce": "off"}),
            (chat_body("sampled", stream=True, temperature=0.7), None)):
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        s = g.stream(CHAT, body, h)
        s.read_all()
        assert_complete_stream(s)
        assert role(s.resp) == "bypass", s.resp
        assert last_body(m) == body, last_body(m)
        assert usage_events(s.body) == [], s.body[-300:]
