# SPDX-License-Identifier: MIT
"""006 - upstream faults: unreachable, slow, broken, erroring upstreams,
and a client that goes away mid-stream."""

import os
import time

from gwtest import (JSON_HEADERS, assert_error, budget, build_request,
                    chat_body, refused_port, connect, normalise, sse_data,
                    sse_events, wait_for)

UPSTREAM_502 = {"upstream_error", "upstream_unreachable"}


def test_upstream_down_is_502_unreachable(t):
    port = refused_port()
    g = t.gateway(port, {"upstream": {"connect_timeout": "2s"}})
    t0 = time.monotonic()
    r = g.post("/v1/chat/completions", chat_body("anyone there?"))
    assert_error(r, 502, "upstream_unreachable")
    assert time.monotonic() - t0 < budget(3), "refused connect was slow"
    # a stream request that never started is a plain JSON error too
    r = g.post("/v1/chat/completions", chat_body("stream?", stream=True))
    assert_error(r, 502, "upstream_unreachable")
    # /v1/models is the gateway's cache: nothing answered, nothing listed
    r = g.get("/v1/models")
    assert r.status == 200 and r.json() == {"object": "list", "data": []}, r
    # the gateway itself is still alive and healthy
    assert g.get("/healthz").status == 200


def test_upstream_stall_is_504_and_abandoned(t):
    m = t.mock()
    g = t.gateway(m, {"upstream": {"first_byte_timeout": "1s"}})
    t0 = time.monotonic()
    r = g.post("/v1/chat/completions", chat_body("stall",
                                                 mock_fault="stall"))
    elapsed = time.monotonic() - t0
    assert_error(r, 504, "upstream_timeout")
    assert elapsed >= 0.8, "504 before first_byte_timeout: %.2fs" % elapsed
    assert elapsed < budget(3), "504 after %.2fs (timeout 1s)" % elapsed
    # the stalled upstream request is abandoned (the mock sees it go)
    wait_for(lambda: m.stats()["aborted"] >= 1, 5,
             msg="mock sees the stalled request aborted")


def test_upstream_stall_stream_is_504(t):
    m = t.mock()
    g = t.gateway(m, {"upstream": {"first_byte_timeout": "1s"}})
    r = g.post("/v1/chat/completions",
               chat_body("stall s", stream=True, mock_fault="stall"))
    assert_error(r, 504, "upstream_timeout")


def _relays_status(t, status):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("fail %d" % status, mock_status=status)
    direct = m.call("POST", "/v1/chat/completions", body)
    assert direct.status == status, direct
    r = g.post("/v1/chat/completions", body)
    assert r.status == status, r
    assert r.content_type == direct.content_type, (r, direct)
    assert normalise(r.body) == normalise(direct.body), \
        "upstream error body not relayed: %r vs %r" % (r.body, direct.body)
    assert r.clean_end


def test_upstream_500_relayed(t):
    _relays_status(t, 500)


def test_upstream_429_relayed(t):
    _relays_status(t, 429)


def test_upstream_503_relayed_on_stream_request(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("fail s", stream=True, mock_status=503)
    direct = m.call("POST", "/v1/chat/completions", body)
    r = g.post("/v1/chat/completions", body)
    assert r.status == 503, r
    assert normalise(r.body) == normalise(direct.body)


def _check_mid_stream_failure(t, conf, fault, code):
    m = t.mock()
    g = t.gateway(m, conf)
    body = chat_body("die", stream=True, mock_chunks=8, mock_fault=fault)
    s = g.stream("/v1/chat/completions", body, timeout=15)
    assert s.resp.status == 200, s.resp
    assert s.resp.headers.get("Content-Type", "").startswith(
        "text/event-stream"), s.resp
    t0 = time.monotonic()
    got = s.read_all()
    elapsed = time.monotonic() - t0
    assert s.conn.reader.eof, "stream did not end with a close"
    assert not s.clean_end, \
        "a broken upstream stream ended with the zero-length chunk " \
        "(a fake success)"
    assert b"[DONE]" not in got, "fake [DONE] after an upstream failure"
    events = sse_events(got)
    assert len(events) >= 2, "want some events, then the error: %r" % got
    err = sse_data(events[-1])
    assert isinstance(err, dict) and set(err) == {"error"}, events[-1]
    e = err["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and isinstance(e["type"], str)
    assert e["param"] is None and e["code"] == code, e
    for ev in events[:-1]:
        d = sse_data(ev)
        assert d["object"] == "chat.completion.chunk", d
    return m, g, events, elapsed


def test_die_mid_stream_sends_error_event_and_no_clean_end(t):
    m, g, events, _ = _check_mid_stream_failure(
        t, None, "die_mid_stream", "upstream_error")
    # everything before the error event is what the mock did send
    body = chat_body("die", stream=True, mock_chunks=8,
                     mock_fault="die_mid_stream")
    direct = m.call("POST", "/v1/chat/completions", body)
    relayed = b"".join(e + b"\n\n" for e in events[:-1])
    assert normalise(relayed) == normalise(direct.body), \
        "events before the error differ from the mock's"
    # the gateway keeps serving
    r = g.post("/v1/chat/completions", chat_body("after"))
    assert r.status == 200, r


def test_stall_mid_stream_times_out_with_error_event(t):
    _, g, _, elapsed = _check_mid_stream_failure(
        t, {"upstream": {"idle_timeout": "1s"}}, "stall_mid_stream",
        "upstream_timeout")
    assert elapsed < budget(4), "idle timeout of 1s took %.2fs" % elapsed
    assert g.get("/healthz").status == 200


def test_die_mid_body_nonstream_is_no_fake_success(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions",
               chat_body("half", mock_fault="die_mid_stream"))
    if r.status == 200:
        assert not r.clean_end, \
            "half an upstream body relayed as a complete 200: %r" % r
    else:
        assert_error(r, 502, UPSTREAM_502)


def test_cut_close_delimited_body_is_a_reset(t):
    """An HTTP/1.0 client of a JSON body of unknown length gets it
    close-delimited, where a plain close would pass for the end: when the
    upstream dies mid-body, its connection is reset instead."""
    m = t.mock()
    g = t.gateway(m)
    for body in (chat_body("cut 1.0", mock_fault="chunked_json_die"),
                 chat_body("cut 1.0 direct", temperature=0.9,
                           mock_fault="chunked_json_die")):
        s = connect(g.port)
        s.settimeout(budget(10))
        s.sendall(build_request("POST", "/v1/chat/completions", JSON_HEADERS,
                                body, version="HTTP/1.0"))
        got, reset = b"", False
        try:
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                got += piece
        except ConnectionResetError:
            reset = True
        s.close()
        assert got.startswith(b"HTTP/1.1 200 "), got[:100]
        assert b"Content-Length" not in got.split(b"\r\n\r\n")[0], got
        assert reset, "a cut HTTP/1.0 body ended with a plain close: %r" \
            % got[-80:]


def test_upstream_reset_is_502(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions", chat_body("rst", mock_fault="reset"))
    assert_error(r, 502, UPSTREAM_502)
    r = g.post("/v1/chat/completions", chat_body("ok after reset"))
    assert r.status == 200, r


def test_upstream_big_headers_is_502(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions",
               chat_body("big", mock_fault="big_headers"))
    assert_error(r, 502, UPSTREAM_502)
    assert g.get("/healthz").status == 200


def test_upstream_chunked_json_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("pieces", mock_fault="chunked_json", mock_chunks=6)
    direct = m.call("POST", "/v1/chat/completions", body)
    assert direct.status == 200 and direct.chunked, direct
    r = g.post("/v1/chat/completions", body)
    assert r.status == 200, r
    assert r.clean_end, r
    assert r.content_type == direct.content_type
    assert normalise(r.body) == normalise(direct.body)
    r.json()


def test_client_disconnect_aborts_upstream(t):
    """The client leaves mid-stream: the upstream call is cut.  The mock
    sends no content chunk until the test opens its gate (mock_gate), so
    the stream is still running when the client goes, on any machine."""
    m = t.mock()
    g = t.gateway(m)
    tag = "bye-" + os.urandom(6).hex()
    s = g.stream("/v1/chat/completions",
                 chat_body("bye", stream=True, mock_chunks=20,
                           mock_gate=tag))
    assert s.resp.status == 200, s.resp
    assert s.next_event() is not None
    assert m.stats()["in_progress"] == 1
    s.close()
    wait_for(lambda: m.stats()["aborted"] == 1, 5,
             msg="mock sees the upstream request aborted")
    wait_for(lambda: m.stats()["in_progress"] == 0, 5)
    assert m.stats()["completions"] == 1
    assert g.get("/healthz").status == 200


def test_client_disconnect_nonstream_aborts_upstream(t):
    """A client that leaves while the upstream is still thinking (held at
    the mock until the test releases it, which it never does)."""
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("wait", mock_hold="wait-" + os.urandom(6).hex())
    c = g.connection()
    c.send(build_request("POST", "/v1/chat/completions", JSON_HEADERS, body))
    wait_for(lambda: m.stats()["held"] == 1, 5,
             msg="request held at the mock")
    c.close()
    wait_for(lambda: m.stats()["aborted"] == 1, 5,
             msg="mock sees the upstream request aborted")
