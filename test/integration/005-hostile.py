# SPDX-License-Identifier: MIT
"""005 - hostile input: request smuggling shapes, malformed framing,
oversized heads and bodies, slow clients.  Every refused request gets
the right status with Connection: close, the server closes the socket,
and nothing reaches the upstream."""

import select
import time

from gwtest import (CODE_FOR_STATUS, assert_error, budget, connect,
                    parse_response, recv_all, send_raw)

POST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        b"Content-Type: application/json\r\n")
BODY = b'{"prompt":""}'                     # 13 bytes = 0xd
CHUNKED = b"d\r\n" + BODY + b"\r\n0\r\n\r\n"

# (raw bytes, expected status or set of statuses, one-line note)
CASES = [
    (POST + b"Content-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n" +
     CHUNKED, 400, "CL and TE together"),
    (POST + b"Transfer-Encoding: chunked\r\nContent-Length: 13\r\n\r\n" +
     CHUNKED, 400, "TE and CL together (TE first)"),
    (POST + b"Content-Length: 13\r\nContent-Length: 13\r\n\r\n" + BODY,
     400, "two equal Content-Length fields"),
    (POST + b"Content-Length: 13\r\nContent-Length: 2\r\n\r\n" + BODY,
     400, "two different Content-Length fields"),
    (POST + b"Content-Length: 13, 13\r\n\r\n" + BODY,
     400, "Content-Length list"),
    (POST + b"Content-Length: +13\r\n\r\n" + BODY,
     400, "Content-Length with a sign"),
    (POST + b"Content-Length: -13\r\n\r\n" + BODY,
     400, "negative Content-Length"),
    (POST + b"Content-Length: 1 3\r\n\r\n" + BODY,
     400, "space inside Content-Length"),
    (POST + b"Content-Length: 0x0d\r\n\r\n" + BODY,
     400, "hex Content-Length"),
    (POST + b"Content-Length: 99999999999999999999999\r\n\r\n" + BODY,
     {400, 413}, "Content-Length overflows 64 bits"),
    (POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + CHUNKED,
     501, "unsupported coding before chunked"),
    (POST + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + CHUNKED,
     {400, 501}, "chunked not the final coding"),
    (POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
     b"\r\n" + CHUNKED, {400, 501}, "chunked applied twice"),
    # RFC 9112 6.1: chunked not final MUST be 400; an unknown coding
    # SHOULD be 501.  Both apply here.
    (POST + b"Transfer-Encoding: xchunked\r\n\r\n" + CHUNKED,
     {400, 501}, "unknown transfer coding alone"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY +
     b"\r\n0\r\n\r\n", 400, "chunk size not hex"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" + b"0" * 20 +
     b"\r\n" + BODY + b"\r\n0\r\n\r\n", 400, "chunk size overflows"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\n-d\r\n" + BODY +
     b"\r\n0\r\n\r\n", 400, "negative chunk size"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\nd\r\n" + BODY +
     b"0\r\n\r\n", 400, "no CRLF after chunk data"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\nd\r\n" + BODY +
     b"XX0\r\n\r\n", 400, "junk after chunk data"),
    (POST + b"X-Foo: a\r\n  folded\r\nContent-Length: 13\r\n\r\n" + BODY,
     400, "obs-fold"),
    (POST + b"X-Foo : a\r\nContent-Length: 13\r\n\r\n" + BODY,
     400, "space before colon"),
    (POST + b"Content-Length : 13\r\n\r\n" + BODY,
     400, "space before colon in Content-Length"),
    (POST + b"X-Foo: a\x00b\r\nContent-Length: 13\r\n\r\n" + BODY,
     400, "NUL in a header value"),
    (POST + b"X-Foo: a\rb\r\nContent-Length: 13\r\n\r\n" + BODY,
     400, "bare CR in a header value"),
    (b"GET /v1/models HTTP/1.1\nHost: gw\n\n",
     400, "bare LF line endings"),
    (b"GET /v1/models HTTP/1.1\r\nHost: gw\n\r\n",
     400, "bare LF after a header"),
    (b"POST http://x/v1/models HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 13\r\n\r\n" + BODY, 400, "absolute-form target"),
    (b"GET http://x/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
     400, "absolute-form GET"),
    (b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n",
     400, "CONNECT"),
    (b"OPTIONS * HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "asterisk-form"),
    (b"GET /v1/models HTTP/2.0\r\nHost: gw\r\n\r\n", 505, "HTTP/2.0"),
    (b"GET /v1/models HTTP/3.0\r\nHost: gw\r\n\r\n", 505, "HTTP/3.0"),
    (b"GET /v1/models HTTP/1.1 \r\nHost: gw\r\n\r\n",
     400, "space after the version"),
    (b"GET  /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n",
     400, "two spaces in the request line"),
    (b"G@T /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n",
     400, "method not a token"),
    (b"GET /v1/mo\x01dels HTTP/1.1\r\nHost: gw\r\n\r\n",
     400, "control byte in the target"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n",
     414, "9000-byte request line"),
    (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n" +
     b"".join(b"X-H%d: v\r\n" % i for i in range(100)) + b"\r\n",
     431, "100 header fields"),
    (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"b" * 20480 +
     b"\r\n\r\n", 431, "20 KiB header field"),
    (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n" +
     b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 400) for i in range(50)) +
     b"\r\n", 431, "50 fields of 400 bytes"),
    (POST + b"Content-Length: 2048\r\n\r\n", 413,
     "Content-Length over max_request_body (no body sent)"),
    (POST + b"Transfer-Encoding: chunked\r\n\r\n" +
     b"".join(b"200\r\n" + b" " * 512 + b"\r\n" for _ in range(4)) +
     b"0\r\n\r\n", 413, "chunked body over max_request_body"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 13\r\n\r\n" +
     BODY, 400, "HTTP/1.1 without Host"),
    (b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
     400, "two Host fields"),
]

CONF = {"server": {"max_request_body": "1k"}}


def _slug(note):
    s = "".join(ch if ch.isalnum() else "_" for ch in note.lower())
    while "__" in s:
        s = s.replace("__", "_")
    return s.strip("_")


def _make(raw, want, note):
    wants = {want} if isinstance(want, int) else set(want)

    def test(t):
        m = t.mock()
        g = t.gateway(m, CONF)
        before = m.stats()["requests"]
        out, closed = send_raw(g.port, raw, timeout=5)
        assert out, "%s: no response at all (closed=%s)" % (note, closed)
        r = parse_response(out)
        assert r.status in wants, "%s: status %s, want %s: %r" % (
            note, r.status, "/".join(map(str, sorted(wants))), r)
        assert_error(r, r.status, CODE_FOR_STATUS[r.status], close=True)
        assert closed, "%s: the server did not close the socket" % note
        assert m.stats()["requests"] == before, \
            "%s: the request reached the upstream" % note
    test.__name__ = "test_" + _slug(note)
    test.__doc__ = note
    return test


for _raw, _want, _note in CASES:
    _fn = _make(_raw, _want, _note)
    assert _fn.__name__ not in globals(), _fn.__name__
    globals()[_fn.__name__] = _fn


def test_oversized_body_refused_before_it_is_sent(t):
    """413 comes back while the client is still waiting to send."""
    m = t.mock()
    g = t.gateway(m, CONF)
    s = connect(g.port)
    s.sendall(POST + b"Content-Length: 1000000\r\n\r\n" + b"x" * 100)
    t0 = time.monotonic()
    r, _, _ = select.select([s], [], [], budget(3))
    assert r, "no answer within 3s: the gateway waits for the 1 MB body"
    data, _ = recv_all(s, 5)
    s.close()
    assert time.monotonic() - t0 < budget(5)
    resp = parse_response(data)
    assert_error(resp, 413, "request_too_large", close=True)
    assert m.stats()["requests"] == 0


def _send_all_then_read(port, data):
    """Send all of 'data' (the gateway may answer first), then read the
    answer.  Returns (raw answer, whether the connection was reset)."""
    s = connect(port)
    s.settimeout(budget(10))
    reset = False
    try:
        s.sendall(data)
        data, _ = recv_all(s, 5)
    except (BrokenPipeError, ConnectionResetError):
        reset = True
        data = b""
    s.close()
    return data, reset


def test_answer_before_the_body_survives_it(t):
    """An error answered before the body is read (404, 405, 401, 413)
    closes the connection lingering, reading what the client still
    sends, so the close is not a reset that would destroy the answer."""
    m = t.mock()
    g = t.gateway(m, {"server": {"max_request_body": "1m"}},
                  extra="[tenant acme]\napi_key = sk-acme-01234567\n")
    big = b"x" * (4 << 20)
    cases = [
        (b"POST /v1/nope HTTP/1.1\r\nHost: gw\r\n", 404, "not_found"),
        (b"POST /v1/models HTTP/1.1\r\nHost: gw\r\n", 405,
         "method_not_allowed"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
         b"Authorization: Bearer sk-wrong\r\n", 401, "invalid_api_key"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
         b"Authorization: Bearer sk-acme-01234567\r\n", 413,
         "request_too_large"),
    ]
    for head, status, code in cases:
        data, reset = _send_all_then_read(
            g.port, head + b"Content-Length: %d\r\n\r\n" % len(big) + big)
        assert not reset, "%d: the connection was reset under the " \
            "client's body" % status
        assert_error(parse_response(data), status, code, close=True)
    assert m.stats()["requests"] == 0


def test_trickled_head_times_out(t):
    """One byte every 200 ms with header_timeout = 1s: 408 (or a close)
    soon after a second, and nothing goes upstream."""
    m = t.mock()
    g = t.gateway(m, {"server": {"header_timeout": "1s"}})
    head = (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Pad: " + b"p" * 100 +
            b"\r\n\r\n")
    s = connect(g.port)
    t0 = time.monotonic()
    answered_at = None
    sent = 0
    hard_stop = t0 + budget(8)
    for b in head:
        try:
            s.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            answered_at = time.monotonic()
            break
        sent += 1
        # pace the trickle by waiting for an answer for 200 ms
        r, _, _ = select.select([s], [], [], 0.2)
        if r:
            answered_at = time.monotonic()
            break
        if time.monotonic() > hard_stop:
            break
    assert answered_at is not None, \
        "no answer or close after %d bytes over %.1fs" % (
            sent, time.monotonic() - t0)
    elapsed = answered_at - t0
    assert sent < len(head), "the whole head got through"
    assert elapsed >= 0.8, "cut off after %.2fs, before the 1s header " \
        "timeout" % elapsed
    assert elapsed < budget(3), "took %.2fs to time out the head" % elapsed
    data, _ = recv_all(s, 5)
    s.close()
    if data:
        assert_error(parse_response(data), 408, "request_timeout",
                     close=True)
    assert m.stats()["requests"] == 0


def test_idle_keepalive_connection_closed(t):
    g = t.gateway(t.mock(), {"server": {"idle_timeout": "1s"}})
    c = g.connection()
    assert c.request("GET", "/healthz").status == 200
    t0 = time.monotonic()
    assert c.wait_closed(5), "idle keep-alive connection still open"
    elapsed = time.monotonic() - t0
    assert 0.7 <= elapsed < budget(3), \
        "closed after %.2fs, idle_timeout is 1s" % elapsed


def test_idle_new_connection_closed(t):
    """A connection that never sends a byte is closed after idle_timeout
    too (no slot held forever)."""
    g = t.gateway(t.mock(), {"server": {"idle_timeout": "1s"}})
    c = g.connection()
    t0 = time.monotonic()
    assert c.wait_closed(5), "silent connection still open"
    elapsed = time.monotonic() - t0
    assert 0.7 <= elapsed < budget(3), \
        "closed after %.2fs, idle_timeout is 1s" % elapsed
