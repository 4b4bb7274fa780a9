# SPDX-License-Identifier: MIT
"""010 - coalescing when things go wrong: clients that leave, upstream
errors and failures shared by every client, and the bounds past which a
request bypasses coalescing (DESIGN.md "Threads and data flow",
"Responses and errors").

As in 009, concurrency comes from "mock_hold": the upstream call is parked
until the test has seen every client join, then released.
"""

import json

from gwtest import (JSON_HEADERS, assert_error, chat_body, normalise,
                    sse_data, wait_for)

from coalesce_util import (PUSHED, Tail, assert_complete_stream,
                           assert_same_bodies, counter, events_of,
                           expect_state, finish, finish_all, gateway_kib,
                           held_trio, measured_env, memory_factor, new_tag,
                           pace, role, send, start, wait_state)


def read_events(s, n):
    """Read n SSE events from a Stream (fails if it ends first)."""
    got = []
    for ev in s.events():
        got.append(ev)
        if len(got) >= n:
            break
    assert len(got) == n, "stream ended after %d events: %r" % (
        len(got), got)
    return got


def access_line(g, role_name):
    """The access-log lines of completion requests with that role."""
    return [l for l in g.log_lines() if " access " in " %s " % l
            and "path=/v1/chat/completions" in l
            and "role=%s" % role_name in l]


# ---- clients that leave ----------------------------------------------------

def leader_gone_lines(g):
    return [l for l in g.log_lines() if "coalesce: leader client gone" in l]


def test_leader_client_disconnects_followers_complete(t):
    """Mid-stream by construction: the mock sends one content chunk,
    then waits at its gate (mock_gate) until the gateway has seen the
    leader's client go."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("leader leaves", stream=True, mock_chunks=10,
                     mock_hold=tag, mock_gate=tag)
    m.gate(tag, 1)
    lead_c, f1, f2 = held_trio(g, m, body)
    lead = start(lead_c)
    assert role(lead) == "leader", role(lead)
    got = read_events(lead, 2)
    expect_state(g, m, in_progress=1, flights=1)    # mid-stream
    lead.close()                                    # the leader's client
    wait_for(lambda: leader_gone_lines(g), msg="the leader's client gone")
    m.gate(tag, 10)
    streams = finish_all([f1, f2])
    for i, s in enumerate(streams):
        assert role(s) == "follower", role(s)
        assert_complete_stream(s, "follower %d" % i)
    assert_same_bodies(streams, "followers")
    assert streams[0].body.startswith(b"".join(e + b"\n\n" for e in got)), \
        "followers' bodies do not start with what the leader had"
    docs = [sse_data(e) for e in events_of(streams[0].body)[:-1]]
    assert len(docs) == 1 + 10 + 1, len(docs)
    # The upstream call was never cut: one call, nothing aborted.
    wait_state(g, m, completions=1, upstream=1, in_progress=0, flights=0)
    expect_state(g, m, aborted=0)
    # The gateway did see the leader's client go (not a late no-op).
    lines = wait_for(lambda: access_line(g, "leader"),
                     msg="the leader's access line")
    assert "broken=1" in lines[0], lines[0]


def test_all_clients_disconnect_aborts_upstream(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    # Mid-stream until the test says: one content chunk, then the gate.
    body = chat_body("everybody leaves", stream=True, mock_chunks=40,
                     mock_hold=tag, mock_gate=tag)
    m.gate(tag, 1)
    lead_c, f1, f2 = held_trio(g, m, body)
    streams = [start(c) for c in (lead_c, f1, f2)]
    for s in streams:
        read_events(s, 2)
    expect_state(g, m, in_progress=1, flights=1, aborted=0)
    for s in streams:
        s.close()
    # Nobody listens any more: the upstream transfer is aborted and the
    # flight is gone.
    wait_state(g, m, aborted=1, in_progress=0, flights=0)
    expect_state(g, m, completions=1, upstream=1)
    # Logged as what it is (the README's demo, '| head -c 200'): the
    # clients hung up, at info; no upstream failed.
    g.wait_log(r"level=info .*upstream: call stopped, its clients hung up "
               r"upstream=default")
    assert not [l for l in g.log_lines() if "upstream: failed" in l
                or "level=warn" in l], g.log_tail()
    # An identical request afterwards is a new leader with a new call.
    m.gate(tag, 40)
    fresh = finish(send(g, body), timeout=15)
    assert role(fresh) == "leader", role(fresh)
    assert_complete_stream(fresh, "fresh request")
    docs = [sse_data(e) for e in events_of(fresh.body)[:-1]]
    assert len(docs) == 1 + 40 + 1, len(docs)
    wait_state(g, m, completions=2, upstream=2, leaders=2, aborted=1,
               flights=0)


def test_parked_clients_leave_quiet_flight_aborted(t):
    """Everybody hangs up while the upstream has not sent a byte: the
    parked followers' threads sleep, so only the leader's look at their
    sockets notices; the flight must end without waiting for the upstream."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("nobody waits", stream=True, mock_hold=tag)
    conns = [send(g, body) for _ in range(3)]
    wait_state(g, m, leaders=1, followers=2, held=1, parked=2)
    for c in conns:
        c.close()
    wait_state(g, m, flights=0, parked=0, timeout=10)
    # The upstream call was cut, while the hold was still in place: the
    # mock saw its client (the gateway) go, and nothing is held now.
    wait_state(g, m, aborted=1, held=0, in_progress=0)
    expect_state(g, m, upstream=1, completions=1)
    assert m.release(tag) == 0
    fresh = finish(send(g, chat_body("nobody waits", stream=True)),
                   timeout=15)
    assert role(fresh) == "leader", role(fresh)
    assert_complete_stream(fresh, "fresh request")


def test_one_follower_leaves_mid_stream_others_complete(t):
    """Mid-stream by construction: the mock sends two content chunks,
    then waits at its gate (mock_gate) until the leaver is seen gone."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("one leaves", stream=True, mock_chunks=20,
                     mock_hold=tag, mock_gate=tag)
    m.gate(tag, 2)
    lead_c, f1, f2 = held_trio(g, m, body)
    leaver = start(f1)
    read_events(leaver, 3)
    leaver.close()
    # The leaver's thread noticed and left (parked, it is the leader's
    # sweep that notices); the others go on.  (f2's unbroken line comes
    # at the flight's end, once the gate is open.)
    wait_for(lambda: [l for l in access_line(g, "follower")
                      if "broken=1" in l],
             msg="the leaving follower's access line, broken=1")
    expect_state(g, m, in_progress=1, flights=1)    # still mid-stream
    m.gate(tag, 20)
    streams = finish_all([lead_c, f2])
    for s in streams:
        assert_complete_stream(s)
    assert_same_bodies(streams)
    docs = [sse_data(e) for e in events_of(streams[0].body)[:-1]]
    assert len(docs) == 1 + 20 + 1, len(docs)
    wait_state(g, m, completions=1, upstream=1, flights=0, in_progress=0)
    expect_state(g, m, aborted=0)


def test_pushed_follower_connection_is_reused(t):
    """A follower whose chunks the leader pushed (its thread asleep) can
    send its next request on the same connection."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("push then reuse", stream=True, mock_chunks=6,
                     mock_hold=tag)
    lead_c = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    f1, f2 = send(g, body), send(g, body)
    # Both parked before the first chunk: it is pushed to them.
    wait_state(g, m, followers=2, held=1, parked=2)
    assert m.release(tag) == 1
    streams = finish_all([lead_c, f1, f2])
    for s in streams:
        assert_complete_stream(s)
    assert counter(g, PUSHED) > 0, "the leader pushed nothing"
    for i, c in enumerate((f1, f2)):
        s = c.stream("POST", "/v1/chat/completions", JSON_HEADERS,
                     chat_body("next request %d" % i, stream=True))
        s.read_all()
        assert_complete_stream(s, "second request on follower %d" % i)
        assert role(s) == "leader", role(s)
        assert c.request("GET", "/healthz").status == 200


def test_stuck_leader_client_dropped_after_send_timeout(t):
    """The leader's own client is written without waiting; one that takes
    nothing for send_timeout is dropped all the same, as any other
    client would be, so it cannot keep the flight's memory and the
    upstream call alive: with nobody left, the call is aborted."""
    m = t.mock()
    g = t.gateway(m, {"server": {"send_timeout": "1s"},
                      "coalesce": {"max_flight_bytes": "1k"}})
    # 20 MiB go at once, more than any socket buffer on the way, and the
    # last chunk never (its gate stays shut): the call cannot end by
    # itself, on any machine; only the drop of its client ends it.
    tag = new_tag()
    m.gate(tag, 319)
    body = chat_body("nobody reads this", stream=True, mock_chunks=320,
                     mock_pad=65536, mock_gate=tag)
    send(g, body, rcvbuf=4096)          # and never read
    wait_state(g, m, leaders=1, in_progress=1)
    wait_state(g, m, aborted=1, in_progress=0, flights=0, timeout=10)
    expect_state(g, m, completions=1, upstream=1)
    lines = wait_for(lambda: access_line(g, "leader"),
                     msg="the leader's access line")
    assert "broken=1" in lines[0], lines[0]
    assert any("coalesce: leader client stuck for send_timeout" in l
               for l in g.log_lines()), g.log_tail()


def test_follower_timeout_is_504(t):
    """follower_timeout: a follower that gets nothing new for that long
    ends with 504; the leader's own call goes on."""
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"follower_timeout": "1s"}})
    tag = new_tag()
    body = chat_body("too quiet", stream=True, mock_hold=tag)
    lead_c = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    fols = [send(g, body) for _ in range(2)]
    wait_state(g, m, followers=2, held=1, parked=2)
    for c in fols:
        r = c.read_response("POST", timeout=10)
        assert_error(r, 504, "upstream_timeout")
        assert "follower wait timeout" in r.json()["error"]["message"], r
        assert r.headers.get("X-Infergw-Coalesce") == "follower"
    wait_state(g, m, parked=0, held=1)
    assert m.release(tag) == 1
    lead = finish(lead_c)
    assert_complete_stream(lead, "leader after its followers timed out")
    wait_state(g, m, completions=1, upstream=1, flights=0, aborted=0)


def test_flight_memory_follows_the_slowest_reader(t):
    """max_flight_bytes bounds memory, not only joining: a 20 MiB stream
    through a flight bounded to 1k raises the gateway's peak RSS by about
    what the slowest reader has still to read, not by the stream.  The
    test sets that: the upstream is paced (mock_gate) so that it sends
    STEP chunks only once all three clients have everything before, so
    the slowest is at most a step behind on any machine, and the design
    bounds the flight by max_flight_bytes + max_reader_lag (flight.h),
    which no reader reaches here: nobody is cut."""
    pad, step, chunks = 65536, 8, 320
    max_bytes, max_lag = 1024, 4 << 20
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_flight_bytes": "1k",
                                   "max_reader_lag": "4m"}},
                  env=measured_env())
    # Warm up: threads, libcurl, buffers of a stream of the same shape.
    warm = finish(send(g, chat_body("warm", stream=True, mock_chunks=8,
                                    mock_pad=pad)))
    assert_complete_stream(warm)
    base = gateway_kib(g, "VmHWM")
    tag = new_tag()
    body = chat_body("twenty megabytes", stream=True, mock_chunks=chunks,
                     mock_pad=pad, mock_hold=tag, mock_gate=tag)
    lead = send(g, body)
    wait_state(g, m, leaders=2, held=1)             # the warm-up's, this
    rest = [send(g, body) for _ in range(2)]
    wait_state(g, m, followers=2, held=1)
    readers = [Tail(c) for c in [lead] + rest]
    assert m.release(tag) == 1
    # The role chunk, then an event per content chunk, for every reader.
    pace(m, tag, chunks, step,
         lambda k: all(r.has(events=1 + k) for r in readers),
         "all three readers")
    streams = [r.result() for r in readers]
    for s in streams:
        assert_complete_stream(s)
    assert_same_bodies(streams)
    size = len(streams[0].body)
    assert size > 20 * 1024 * 1024, size
    assert counter(g, "infergw_coalesce_readers_cut_total", reason="lag") \
        == 0
    grew = gateway_kib(g, "VmHWM") - base
    # The configured bound, and as much again for a reader's pending copy
    # of a chunk, libcurl's buffers and the allocator's share (five times
    # the heap in RSS under ThreadSanitizer).  Without freeing, the flight
    # alone would hold the whole 20 MiB.
    bound = 2 * (max_bytes + max_lag) // 1024 * memory_factor(g)
    assert grew < bound, (
        "peak RSS grew by %d KiB for a %d KiB stream (from %d to %d KiB); "
        "the bound is %d KiB" % (grew, size // 1024, base, base + grew,
                                 bound))


# ---- upstream errors --------------------------------------------------------

def test_upstream_500_shared_by_all(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("server error", stream=True, mock_status=500,
                     mock_hold=tag)
    streams = finish_all(held_trio(g, m, body))
    assert [role(s) for s in streams] == ["leader", "follower",
                                          "follower"], \
        [role(s) for s in streams]
    for i, s in enumerate(streams):
        r = s.resp
        assert r.status == 500, "client %d: %r" % (i, r)
        ct = r.headers.get("Content-Type", "")
        assert ct.split(";")[0].strip() == "application/json", ct
        assert s.clean_end, "client %d: error body cut short" % i
    assert_same_bodies(streams, "500 bodies")
    doc = json.loads(streams[0].body)
    assert doc["error"]["type"] == "server_error", doc
    direct = m.call("POST", "/v1/chat/completions", body)
    assert direct.status == 500 and direct.body == streams[0].body, \
        "not the upstream's own error body: %r" % streams[0].body
    wait_state(g, m, completions=2, upstream=1, flights=0)


def test_upstream_dies_mid_stream_same_error_for_all(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("dies", stream=True, mock_fault="die_mid_stream",
                     mock_chunks=8, mock_hold=tag)
    streams = finish_all(held_trio(g, m, body))
    assert [role(s) for s in streams] == ["leader", "follower",
                                          "follower"], \
        [role(s) for s in streams]
    for i, s in enumerate(streams):
        what = "client %d" % i
        assert s.resp.status == 200, "%s: %r" % (what, s.resp)
        assert s.resp.headers.get("Content-Type", "").startswith(
            "text/event-stream"), s.resp
        assert not s.clean_end, \
            "%s: stream ended cleanly after an upstream failure" % what
        assert b"[DONE]" not in s.body, "%s: fake [DONE]" % what
        evs = events_of(s.body)
        docs = [sse_data(e) for e in evs]
        # role chunk, 2 content chunks, then the error event, last.
        assert len(docs) == 4, "%s: %r" % (what, evs)
        assert all("choices" in d for d in docs[:3]), docs[:3]
        err = docs[-1]
        assert set(err) == {"error"}, "%s: last event %r" % (what, err)
        assert set(err["error"]) == {"message", "type", "param", "code"}, \
            err
        assert err["error"]["param"] is None, err
        assert isinstance(err["error"]["message"], str) and \
            err["error"]["message"], err
    assert_same_bodies(streams, "failed streams")
    wait_state(g, m, completions=1, upstream=1, flights=0)


# ---- bounds: past them a request bypasses ----------------------------------

def test_max_followers_bypass(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_followers": "1"}})
    tag = new_tag()
    body = chat_body("only one follower", stream=True, mock_hold=tag)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    fol = send(g, body)
    wait_state(g, m, followers=1, held=1)
    third = send(g, body)
    # The third goes upstream alone: a second parked call.
    wait_state(g, m, bypass_max_followers=1, held=2, followers=1)
    assert m.release(tag) == 2
    streams = finish_all([lead, fol, third])
    assert [role(s) for s in streams] == ["leader", "follower", "bypass"], \
        [role(s) for s in streams]
    for s in streams:
        assert_complete_stream(s)
    assert_same_bodies(streams[:2], "leader and follower")
    assert streams[2].body != streams[0].body, "bypass shared the flight"
    assert normalise(streams[2].body) == normalise(streams[0].body)
    wait_state(g, m, completions=2, upstream=2, flights=0)


def test_max_flights_bypass(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_flights": "1"}})
    tag = new_tag()
    a = chat_body("flight A", stream=True, mock_hold=tag)
    b = chat_body("flight B", stream=True, mock_hold=tag)
    ca = send(g, a)
    wait_state(g, m, leaders=1, held=1, flights=1)
    cb = send(g, b)
    wait_state(g, m, bypass_max_flights=1, held=2, flights=1)
    # Control: the one flight still takes followers.
    ca2 = send(g, a)
    wait_state(g, m, followers=1, held=2)
    assert m.release(tag) == 2
    streams = finish_all([ca, cb, ca2])
    assert [role(s) for s in streams] == ["leader", "bypass", "follower"], \
        [role(s) for s in streams]
    for s in streams:
        assert_complete_stream(s)
    assert_same_bodies([streams[0], streams[2]])
    wait_state(g, m, completions=2, upstream=2, flights=0)


def test_max_flight_bytes_bypass(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_flight_bytes": "1k"}})
    tag = new_tag()
    # 20 of the 60 chunks (well past 1k), then the gate (mock_gate):
    # still streaming when the late one comes, on any machine.
    body = chat_body("a long answer", stream=True, mock_chunks=60,
                     mock_hold=tag, mock_gate=tag)
    m.gate(tag, 20)
    lead_c = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    early = send(g, body)          # joins while the flight is empty
    wait_state(g, m, followers=1, held=1)
    assert m.release(tag) == 1
    lead = start(lead_c)
    assert role(lead) == "leader", role(lead)
    got = 0
    for ev in lead.events():
        got += len(ev) + 2
        if got > 1024:
            break
    assert got > 1024, "stream ended after %d bytes" % got
    expect_state(g, m, flights=1, in_progress=1)    # still streaming
    late_c = send(g, body)
    # Its own call, at the same gate.
    wait_state(g, m, bypass_max_flight_bytes=1, followers=1, in_progress=2)
    m.gate(tag, 60)
    late = finish(late_c, timeout=15)
    assert role(late) == "bypass", \
        "late request to a flight past max_flight_bytes is %r" % role(late)
    assert_complete_stream(late, "late bypass")
    wait_state(g, m, bypass_max_flight_bytes=1, followers=1)
    rest = finish(early)
    lead.read_all()
    for s, what in ((lead, "leader"), (rest, "early follower")):
        assert_complete_stream(s, what)
    assert role(rest) == "follower"
    assert rest.body == lead.body, "follower was cut at max_flight_bytes"
    assert normalise(late.body) == normalise(lead.body)
    wait_state(g, m, completions=2, upstream=2, flights=0)
