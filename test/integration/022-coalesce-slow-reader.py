# SPDX-License-Identifier: MIT
"""022 - a slow reader cannot make a flight hold the whole response
([coalesce] max_reader_lag, DESIGN.md "Threads and data flow").

Past max_flight_bytes a flight keeps what its slowest reader still has to
receive.  A client further behind than max_reader_lag is cut with an
honest error (an SSE error event, code client_too_slow, then no clean
end; a JSON body is cut short), logged and counted, and the others go on
untouched; so a flight holds at most about max_flight_bytes +
max_reader_lag.

The slow client is held by the test: it reads nothing (through a small
receive buffer) until the fast one has the whole response, then reads
what it was given.  (A follower's own thread learns of its cut only when
its client takes the bytes it is writing, so the cut is counted then.)  The fast one reads as fast as it can while the test paces the
upstream (mock_gate): a step of STEP chunks goes out only once the fast
one has everything before it, so the fast one is never more than a step
(1 MiB) behind, well inside max_reader_lag (4 MiB), and the slow one
falls behind by all the upstream sends: neither outcome depends on the
machine's speed.  As in 009 and 010, the clients meet in one flight by
"mock_hold".
"""

import hashlib
import json

import gwtest
from gwtest import chat_body, wait_for

from coalesce_util import (HeldClient, Tail, assert_complete_stream, counter,
                           finish, gateway_kib, measured_env, memory_factor,
                           new_tag, pace, role, send, wait_state)

CUT = "infergw_coalesce_readers_cut_total"
PAD = 65536
STEP = 16                       # chunks of PAD per paced step: 1 MiB


def assert_cut(resp, stream_body, what):
    """'resp' (a cut client's) is a 200 event stream that got a prefix
    of the flight's bytes, then the client_too_slow error event, and no
    clean end."""
    assert resp.status == 200, "%s: %r" % (what, resp)
    assert resp.headers.get("Content-Type", "").startswith(
        "text/event-stream"), resp
    assert not resp.clean_end, "%s: a clean end after the cut" % what
    # The cut falls where a chunk from the upstream ended, maybe inside
    # an event: the error event is the last "data: " of the body.
    head, _, last = resp.body.rpartition(b"data: ")
    assert last.endswith(b"\n\n"), "%s: ends %r" % (what, resp.body[-200:])
    err = json.loads(last)["error"]
    assert err["code"] == "client_too_slow", err
    assert err["type"] == "server_error", err
    assert "max_reader_lag" in err["message"], err
    assert len(head) > 0 and stream_body.startswith(head), \
        "%s: its bytes are not the flight's (%d bytes)" % (what, len(head))
    assert len(head) < len(stream_body) // 2, \
        "%s: got %d of %d bytes before the cut" % (what, len(head),
                                                   len(stream_body))


def lag_gateway(t, m, max_bytes="1m", max_lag="4m"):
    """A gateway with these bounds, whose clients may take nothing for
    as long as the test holds them (send_timeout)."""
    return t.gateway(m, {"server": {"send_timeout": "10m"},
                         "coalesce": {"max_flight_bytes": max_bytes,
                                      "max_reader_lag": max_lag}},
                     env=measured_env())


def paced_body(content, chunks, stream=True):
    """A chat body held at the mock ("mock_hold") and then paced by the
    test ("mock_gate", the same tag); returns (body, tag)."""
    tag = new_tag()
    extra = {"stream": True} if stream else {}
    return chat_body(content, mock_chunks=chunks, mock_pad=PAD,
                     mock_hold=tag, mock_gate=tag, **extra), tag


def meet(g, m, body, tag, chunks, slow_leads, leaders=0):
    """A fast client and a HeldClient in one flight, met by the body's
    "mock_hold": the held one leads if 'slow_leads' ('leaders': the
    gateway's leaders before).  Then the upstream is paced STEP chunks
    at a time behind the fast one.  Returns (the fast one's whole
    Stream, checked complete, the HeldClient, still unread).  'body'
    asks for a stream unless it has no "stream" field: then a JSON
    answer, sent in 'chunks' pieces."""
    stream = b'"stream"' in body
    if slow_leads:
        slow = HeldClient(g, body)
        wait_state(g, m, leaders=leaders + 1, held=1)
        fast_c = send(g, body, timeout=120)
    else:
        fast_c = send(g, body, timeout=120)
        wait_state(g, m, leaders=leaders + 1, held=1)
        slow = HeldClient(g, body)
    wait_state(g, m, followers=1, held=1)
    fast = Tail(fast_c)
    assert m.release(tag) == 1
    if stream:
        # The role chunk, then one event per content chunk.
        def caught_up(k):
            return fast.has(events=1 + k)
    else:
        # The head comes with the first piece (the gateway holds it
        # until then), and with it the length the pieces divide.
        def caught_up(k):
            n = fast.length
            return n is not None and fast.has(
                received=n if k >= chunks else n // chunks * k)
    pace(m, tag, chunks, STEP, caught_up, "the fast client")
    s = fast.result()
    if stream:
        assert_complete_stream(s, "the fast client")
    else:
        assert s.resp.status == 200 and s.clean_end, s.resp
    assert role(s) == ("follower" if slow_leads else "leader"), role(s)
    return s, slow


def cut_lines(g, who):
    return [l for l in g.log_lines()
            if "coalesce: client cut, too far behind" in l
            and "role=%s" % who in l and "level=warn" in l]


def test_slow_follower_cut_memory_bounded(t):
    """The issue's case: a 100 MB stream, a fast leader and a follower
    that falls behind.  The follower is cut with the error event, the
    leader gets the whole body, byte for byte the upstream's, and the
    gateway grows by about max_flight_bytes + max_reader_lag (1 + 4
    MiB), not by the stream (+96.6 MiB before)."""
    m = t.mock()
    g = lag_gateway(t, m)
    warm = finish(send(g, chat_body("warm", stream=True, mock_chunks=64,
                                    mock_pad=PAD)), timeout=60)
    assert_complete_stream(warm)
    base = gateway_kib(g, "VmHWM")
    body, tag = paced_body("a hundred megabytes", 1600)
    lead, slow = meet(g, m, body, tag, 1600, slow_leads=False,
                      leaders=1)                # the warm-up's
    size = len(lead.body)
    assert size > 100 * 1000 * 1000, size
    # The peak so far: the stream has all gone through.  5 MiB of flight,
    # a reader's pending copy, libcurl's and the allocator's share: 8 MiB
    # of slack.  Unbounded it was about 97 MiB.
    grew = gateway_kib(g, "VmHWM") - base
    assert grew < 13 * 1024 * memory_factor(g), (
        "peak RSS grew by %d KiB for a %d KiB stream with max_flight_bytes "
        "1m and max_reader_lag 4m" % (grew, size // 1024))
    cut = slow.read_all()
    assert cut.headers.get("X-Infergw-Coalesce") == "follower", cut
    assert_cut(cut, lead.body, "the slow follower")
    assert counter(g, CUT, reason="lag") == 1
    lines = wait_for(lambda: cut_lines(g, "follower"),
                     msg="the follower's cut log line")
    assert len(lines) == 1 and "flight=flight-" in lines[0] \
        and "key=" in lines[0] and "behind=" in lines[0], lines
    wait_state(g, m, completions=2, aborted=0, upstream=2, flights=0)
    assert events_digest(gwtest.sse_events(lead.body)) == \
        direct_digest(m, body), "the leader's body is not the upstream's"


def events_digest(events):
    """SHA-256 of SSE events, each normalise()d (the mock's per-call id
    and time blanked out)."""
    h = hashlib.sha256()
    for ev in events:
        h.update(gwtest.normalise(ev) + b"\n\n")
    return h.hexdigest()


def direct_digest(m, body):
    """events_digest() of the mock's own answer to 'body' (its words
    come from a hash of the body, its "mock_hold" and "mock_gate" tag
    included: released and open already, so it does not wait), read as it streams so that 100 MB need
    not sit in memory twice."""
    s = gwtest.stream(m.port, "POST", "/v1/chat/completions",
                      gwtest.JSON_HEADERS, body, timeout=120)
    return events_digest(s.events())


def test_slow_leader_cut_flight_goes_on(t):
    """The leader's own client is the slow one: it is cut with the error
    event while the upstream call goes on for the follower, which gets
    the whole stream; the call completes (not aborted)."""
    m = t.mock()
    g = lag_gateway(t, m)
    body, tag = paced_body("slow leader", 480)
    fol, slow = meet(g, m, body, tag, 480, slow_leads=True)
    cut = slow.read_all()
    assert cut.headers.get("X-Infergw-Coalesce") == "leader", cut
    assert_cut(cut, fol.body, "the slow leader")
    assert counter(g, CUT, reason="lag") == 1
    wait_for(lambda: cut_lines(g, "leader"), msg="the leader's cut line")
    wait_state(g, m, completions=1, aborted=0, upstream=1, flights=0)


def test_slow_lone_client_cut_aborts_call(t):
    """A slow client alone in its flight: once it is cut nobody reads the
    call, so it is aborted, as when the last client leaves; the client
    still gets what it was given and the error event.  It reads nothing
    until the call is aborted (the upstream goes as fast as the gateway
    takes it)."""
    m = t.mock()
    g = lag_gateway(t, m)
    body = chat_body("alone and slow", stream=True, mock_chunks=1600,
                     mock_pad=PAD)
    slow = HeldClient(g, body)
    wait_state(g, m, aborted=1, in_progress=0, flights=0, timeout=30)
    cut = slow.read_all()
    assert cut.status == 200 and not cut.clean_end, cut
    head, _, last = cut.body.rpartition(b"data: ")
    assert json.loads(last)["error"]["code"] == "client_too_slow", last
    assert counter(g, CUT, reason="lag") == 1
    wait_state(g, m, completions=1, upstream=1)     # the aborted call


def test_slow_json_client_cut_short(t):
    """Not a stream: a JSON body (with Content-Length) has no way to carry
    an error event, so a cut client's body is cut short instead, which
    every HTTP client reports as an error; the fast one gets all of it."""
    m = t.mock()
    g = lag_gateway(t, m)
    body, tag = paced_body("fifteen megabytes of json", 230, stream=False)
    lead, slow = meet(g, m, body, tag, 230, slow_leads=False)
    size = len(json.loads(lead.body)["choices"][0]["message"]["content"])
    assert size > 14 * 1000 * 1000, size
    cut = slow.read_all()
    assert cut.status == 200 and cut.framing == "length", cut
    assert not cut.clean_end and lead.body.startswith(cut.body), \
        "the slow client got %d of %d bytes, cleanly" % (len(cut.body),
                                                        len(lead.body))
    assert b"client_too_slow" not in cut.body
    assert counter(g, CUT, reason="lag") == 1
    wait_for(lambda: cut_lines(g, "follower"), msg="the cut log line")


def test_no_cut_under_max_flight_bytes(t):
    """A flight under max_flight_bytes behaves as before: however tight
    max_reader_lag, nobody is cut, the slow client included, though it
    reads nothing until the upstream call has ended and the fast one
    has all of it."""
    m = t.mock()
    g = lag_gateway(t, m, max_bytes="8m", max_lag="1k")
    tag = new_tag()
    body = chat_body("small enough", stream=True, mock_chunks=64,
                     mock_pad=PAD, mock_hold=tag)
    fast_c = send(g, body, timeout=120)
    wait_state(g, m, leaders=1, held=1)
    slow = HeldClient(g, body)
    wait_state(g, m, followers=1, held=1)
    fast = Tail(fast_c)
    assert m.release(tag) == 1
    lead = fast.result()
    assert_complete_stream(lead, "the fast client")
    wait_state(g, m, completions=1, in_progress=0)
    resp = slow.read_all()
    assert resp.clean_end and resp.body == lead.body, \
        "the slow client did not get the whole body (%d of %d bytes)" % (
            len(resp.body), len(lead.body))
    assert counter(g, CUT, reason="lag") == 0
    assert not cut_lines(g, ""), g.log_tail()
