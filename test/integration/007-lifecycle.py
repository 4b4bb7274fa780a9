"""007 - lifecycle: the connection limit, draining on SIGTERM/SIGINT,
drain_timeout, a second signal."""

import re
import select
import signal
import time

from gwtest import (HttpError, assert_error, budget, chat_body, connect,
                    parse_response, port_refuses, recv_all, sse_events,
                    wait_for)


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


SLOW_STREAM = dict(stream=True, mock_chunks=10, mock_delay_ms=200)


def test_drain_finishes_inflight_stream_and_exits_0(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "10s"}})
    s = g.stream("/v1/chat/completions", chat_body("drain", **SLOW_STREAM),
                 timeout=20)
    assert s.resp.status == 200
    assert s.next_event() is not None
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
    s = g.stream("/v1/chat/completions",
                 chat_body("cut", stream=True, mock_chunks=20,
                           mock_delay_ms=200), timeout=20)
    assert s.resp.status == 200
    assert s.next_event() is not None
    t0 = time.monotonic()
    g.send_signal(signal.SIGTERM)
    rc = g.wait_exit(5)
    elapsed = time.monotonic() - t0
    assert rc is not None, "still running 5s after SIGTERM (drain 1s)"
    assert elapsed >= 0.8, "exited after %.2fs, before drain_timeout " \
        "(the stream was still running)" % elapsed
    assert elapsed < budget(3), "exit %.2fs after SIGTERM" % elapsed
    body = s.read_all()
    assert not s.clean_end, "stream ended cleanly though it was cut"
    assert b"[DONE]" not in body


def test_second_sigterm_exits_at_once(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"drain_timeout": "30s"}})
    s = g.stream("/v1/chat/completions",
                 chat_body("again", stream=True, mock_chunks=20,
                           mock_delay_ms=200), timeout=20)
    assert s.next_event() is not None
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
