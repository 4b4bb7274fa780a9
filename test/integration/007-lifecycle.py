# SPDX-License-Identifier: MIT
"""007 - lifecycle: the connection limit, draining on SIGTERM/SIGINT,
drain_timeout, a second signal."""

import os
import re
import select
import signal
import time

from gwtest import (JSON_HEADERS, HttpError, Stream, assert_error, budget,
                    build_request, chat_body, connect, has_metric, metric,
                    parse_metrics, parse_response, port_refuses, recv_all,
                    sse_data, sse_events, wait_for)


def _overloaded_answer(port):
    """Connect; the gateway may answer at once or after a request."""
    s = connect(port)
    try:
        r, _, _ = select.select([s], [], [], budget(0.5))
        if not r:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
        return recv_all(s, 5)
    finally:
        s.close()


def test_over_capacity_is_503_overloaded(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"max_connections": "2"}})
    c1 = g.connection()
    c2 = g.connection()
    # both are being served (and now idle in keep-alive)
    assert c1.request("GET", "/healthz").status == 200
    assert c2.request("GET", "/healthz").status == 200
    data, closed = _overloaded_answer(g.port)
    assert data, "third connection got no answer"
    r = parse_response(data)
    assert_error(r, 503, "overloaded")
    ra = r.headers.get("Retry-After")
    assert ra is not None and re.fullmatch(r"\d+", ra.strip()), \
        "Retry-After %r" % (ra,)
    assert closed, "the over-capacity connection was not closed"
    # the two admitted connections still work
    assert c1.request("GET", "/healthz").status == 200
    # a freed slot admits a new connection again
    c1.close()

    def admitted():
        data, _ = _overloaded_answer(g.port)
        return data and parse_response(data).status == 200
    wait_for(admitted, 5, msg="a new connection admitted after one closed")
    assert c2.request("GET", "/healthz").status == 200
    assert m.stats()["requests"] == 0


def test_over_capacity_flooder_cannot_hold_the_acceptor(t):
    """A refused client that keeps sending gets its 503 and is cut off
    after a bounded read of its bytes; the acceptor goes on answering.
    (A loopback sender rarely outpaces the drain for long, so the bound
    itself is pinned by check_proxy's test_refuse_drain_is_bounded.)"""
    m = t.mock()
    g = t.gateway(m, {"server": {"max_connections": "1"}})
    c1 = g.connection()
    assert c1.request("GET", "/healthz").status == 200
    s = connect(g.port)
    s.settimeout(budget(10))
    junk = b"x" * (1 << 20)
    sent = 0
    cut = False
    try:
        for _ in range(64):             # 64 MiB, far past any buffer
            s.sendall(junk)
            sent += len(junk)
    except (BrokenPipeError, ConnectionResetError):
        cut = True
    assert cut, "the refused client could send %d MiB" % (sent >> 20)
    data, closed = recv_all(s, 5)
    s.close()
    if data:
        assert_error(parse_response(data), 503, "overloaded")
    # The acceptor is free: the next over-capacity client is answered.
    data, _ = _overloaded_answer(g.port)
    assert_error(parse_response(data), 503, "overloaded")
    assert c1.request("GET", "/healthz").status == 200


def gated_stream(g, content, chunks, timeout=20):
    """A stream whose content chunks the mock sends only as far as the
    test opens their gate (mock_gate): returns (its Stream, read up to
    its first event, and the gate's tag).  Until the test opens the
    gate the call is certainly still running, whatever the machine."""
    tag = "gate-" + os.urandom(6).hex()
    s = g.stream("/v1/chat/completions",
                 chat_body(content, stream=True, mock_chunks=chunks,
                           mock_gate=tag), timeout=timeout)
    assert s.resp.status == 200, s.resp
    assert s.next_event() is not None
    return s, tag


def test_drain_finishes_inflight_stream_and_exits_0(t):
    """The stream is held at the mock's gate until the drain has begun,
    so it is in flight at SIGTERM by construction; then it runs to its
    end and the gateway exits 0."""
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "10s"}})
    s, tag = gated_stream(g, "drain", 10)
    # an idle keep-alive connection that has been used once
    b = g.connection()
    assert b.request("GET", "/healthz").status == 200
    # a connection with half a request head in flight
    p = g.connection()
    p.send(b"GET /readyz HTTP/1.1\r\nHost: gw\r\n")
    assert g.get("/healthz").status == 200      # let the gateway catch up

    t0 = time.monotonic()
    g.send_signal(signal.SIGTERM)
    wait_for(lambda: port_refuses(g.port), 3,
             msg="new connections refused after SIGTERM")

    # readyz: 503 if the gateway still answers at all
    for conn, send in ((b, b"GET /readyz HTTP/1.1\r\nHost: gw\r\n\r\n"),
                       (p, b"\r\n")):
        try:
            conn.send(send)
            r = conn.read_response(timeout=5)
        except (HttpError, BrokenPipeError, ConnectionResetError):
            r = None
        if r is not None:
            assert r.status == 503, "readyz while draining: %r" % r

    assert g.proc.poll() is None, "exited with a stream in flight"
    assert m.stats()["in_progress"] == 1, "the call ended before its gate"
    m.gate(tag, 10)
    body = s.read_all()
    assert s.clean_end, "in-flight stream cut during the drain"
    events = sse_events(body)
    assert events[-1] == b"data: [DONE]" and body.count(b"[DONE]") == 1
    assert len(events) == 1 + 10 + 1 + 1, \
        "want role + 10 content + finish + [DONE]: %d events" % len(events)
    rc = g.wait_exit(10)
    assert rc == 0, "exit status %r after drain" % (rc,)
    assert time.monotonic() - t0 < budget(10)


def test_drain_timeout_cuts_stream(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "1s"}})
    s, _ = gated_stream(g, "cut", 20)      # its gate stays shut
    t0 = time.monotonic()
    g.send_signal(signal.SIGTERM)
    rc = g.wait_exit(5)
    elapsed = time.monotonic() - t0
    assert rc is not None, "still running 5s after SIGTERM (drain 1s)"
    assert elapsed >= 0.8, "exited after %.2fs, before drain_timeout " \
        "(the stream was still running)" % elapsed
    assert elapsed < budget(3), "exit %.2fs after SIGTERM" % elapsed
    assert rc == 1, "exit status %r after a cut drain" % rc
    body = s.read_all()
    assert not s.clean_end, "stream ended cleanly though it was cut"
    assert b"[DONE]" not in body
    # The defined end: an SSE error event, last, then no last chunk.
    last = sse_data(sse_events(body)[-1])
    assert last == {"error": {"message": "gateway shutting down",
                              "type": "server_error", "param": None,
                              "code": "shutting_down"}}, last


def _flight_of_three(g, m, body):
    """Three connections sending 'body' (with a mock_hold tag): the first
    leads, held at the mock, before the other two are sent."""
    conns = [g.connection(timeout=20) for _ in range(3)]
    conns[0].send(build_request("POST", "/v1/chat/completions",
                                JSON_HEADERS, body))
    wait_for(lambda: m.stats()["held"] == 1, msg="the leader held")
    for c in conns[1:]:
        c.send(build_request("POST", "/v1/chat/completions", JSON_HEADERS,
                             body))
    return conns


def test_drain_timeout_ends_every_coalesced_stream_alike(t):
    """At drain_timeout a flight mid-stream is cut for every client the
    same defined way, and the upstream call is aborted, before exit."""
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "1s"}})
    tag = "drain-" + os.urandom(6).hex()
    # Held until all three are in, then sending nothing past the role
    # chunk (the gate stays shut): mid-stream at drain_timeout.
    body = chat_body("cut flight", stream=True, mock_chunks=40,
                     mock_hold=tag, mock_gate=tag)
    conns = _flight_of_three(g, m, body)
    wait_for(lambda: metric(g.metrics(), "infergw_coalesce_followers_total")
             == 2, msg="two followers")
    assert m.release(tag) == 1
    streams = [Stream(c, "POST") for c in conns]
    for s in streams:
        assert s.next_event() is not None
    g.send_signal(signal.SIGTERM)
    assert g.wait_exit(5) == 1
    bodies = [s.read_all() for s in streams]
    for s, b in zip(streams, bodies):
        assert not s.clean_end
        assert b"[DONE]" not in b
        assert sse_data(sse_events(b)[-1])["error"]["code"] == \
            "shutting_down", b[-200:]
    # One upstream call, cut: the mock saw the gateway go.
    wait_for(lambda: m.stats()["aborted"] == 1, msg="upstream call aborted")
    assert m.stats()["completions"] == 1


def test_drain_timeout_wakes_parked_followers_of_a_quiet_flight(t):
    """Followers parked on a flight whose upstream sends nothing sleep
    without a timer: the stop wakes them, and every client gets the same
    503 (nothing was sent yet) before the gateway exits."""
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "1s"}})
    tag = "quiet-" + os.urandom(6).hex()
    body = chat_body("quiet flight", stream=True, mock_hold=tag)
    conns = _flight_of_three(g, m, body)
    gm = lambda: parse_metrics(g.get("/metrics").body.decode())  # noqa
    assert has_metric(gm(), "infergw_coalesce_parked")
    wait_for(lambda: metric(gm(), "infergw_coalesce_parked") == 2,
             msg="two parked followers")
    t0 = time.monotonic()
    g.send_signal(signal.SIGTERM)
    rc = g.wait_exit(6)
    elapsed = time.monotonic() - t0
    assert rc == 1, "exit status %r" % (rc,)
    assert elapsed >= 0.8, "exited after %.2fs, before drain_timeout" \
        % elapsed
    for c in conns:
        r = c.read_response("POST", timeout=5)
        assert_error(r, 503, "shutting_down")
    wait_for(lambda: m.stats()["aborted"] == 1, msg="upstream call aborted")


def test_stop_answers_a_request_still_arriving(t):
    """At the stop, a request whose body (or head) is still arriving gets
    the 503 every open request gets, not a silent close."""
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "1s"}})
    body = g.connection(timeout=20)
    body.send(build_request("POST", "/v1/chat/completions",
                            [("Content-Type", "application/json"),
                             ("Content-Length", "1000")], b'{"model":'))
    head = g.connection(timeout=20)
    head.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
    wait_for(lambda: metric(g.metrics(), "infergw_connections_active") >= 3,
             msg="both connections accepted")
    g.send_signal(signal.SIGTERM)
    assert g.wait_exit(6) == 1
    for c in (body, head):
        assert_error(c.read_response("POST", timeout=5), 503,
                     "shutting_down")


def test_second_sigterm_exits_at_once(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "30s"}})
    s, _ = gated_stream(g, "again", 20)    # its gate stays shut
    g.send_signal(signal.SIGTERM)
    wait_for(lambda: port_refuses(g.port), 3, msg="drain started")
    assert g.wait_exit(0.3) is None, "exited at the first SIGTERM"
    t0 = time.monotonic()
    g.send_signal(signal.SIGTERM)
    rc = g.wait_exit(5)
    elapsed = time.monotonic() - t0
    assert rc is not None, "second SIGTERM did not end the process"
    assert elapsed < budget(1), "second SIGTERM took %.2fs" % elapsed


def test_sigint_idle_exits_0(t):
    g = t.gateway(t.mock())
    assert g.get("/healthz").status == 200
    t0 = time.monotonic()
    rc = g.stop(signal.SIGINT, 5)
    assert rc == 0, "exit status %r on SIGINT" % rc
    assert time.monotonic() - t0 < budget(2), "idle drain was slow"


def test_sigterm_closes_idle_keepalive_and_exits_0(t):
    g = t.gateway(t.mock(), {"server": {"drain_timeout": "10s"}})
    c = g.connection()
    assert c.request("GET", "/healthz").status == 200
    t0 = time.monotonic()
    rc = g.stop(signal.SIGTERM, 5)
    assert rc == 0, "exit status %r" % rc
    assert time.monotonic() - t0 < budget(2), \
        "an idle keep-alive connection held up the drain"
    assert c.wait_closed(2)
