# SPDX-License-Identifier: MIT
"""004 - errors made by the gateway: the OpenAI shape, the codes, which
errors close the connection, request timeouts."""

import time

from gwtest import (JSON_HEADERS, assert_error, budget, chat_body,
                    parse_response, send_raw)


def test_not_found_shape_and_keepalive(t):
    m = t.mock()
    g = t.gateway(m)
    c = g.connection()
    r = c.request("GET", "/does/not/exist")
    e = assert_error(r, 404, "not_found")
    assert not r.connection_close, r
    # a routing error is not a framing error: the connection goes on
    r = c.request("GET", "/healthz")
    assert r.status == 200, r
    assert e["type"], e


def test_method_not_allowed_keeps_connection(t):
    g = t.gateway(t.mock())
    c = g.connection()
    r = c.request("GET", "/v1/chat/completions")
    assert_error(r, 405, "method_not_allowed")
    assert r.headers.has_token("Allow", "POST"), r
    assert not r.connection_close, r
    assert c.request("GET", "/v1/models").status == 200


def test_invalid_json_keeps_connection(t):
    m = t.mock()
    g = t.gateway(m)
    c = g.connection()
    r = c.request("POST", "/v1/chat/completions", JSON_HEADERS, b"{oops")
    assert_error(r, 400, "invalid_json")
    assert not r.connection_close, \
        "a well-framed request with a bad JSON body need not close: %r" % r
    r = c.request("POST", "/v1/chat/completions", JSON_HEADERS,
                  chat_body("after bad json"))
    assert r.status == 200, r
    assert m.stats()["requests"] == 1


def test_error_request_id_echoed(t):
    g = t.gateway(t.mock())
    r = g.get("/nowhere", headers={"X-Request-Id": "err-id-1"})
    assert_error(r, 404, "not_found")
    assert r.headers.get("X-Request-Id") == "err-id-1", r


def test_framing_error_closes_connection(t):
    m = t.mock()
    g = t.gateway(m)
    c = g.connection()
    assert c.request("GET", "/healthz").status == 200
    c.send(b"THIS IS NOT HTTP\r\n\r\n")
    r = c.read_response()
    assert_error(r, 400, "bad_request", close=True)
    assert c.wait_closed(5), "server kept the socket open after a 400"


def test_body_timeout_is_408(t):
    """A body that stops arriving: 408 request_timeout, then close."""
    m = t.mock()
    g = t.gateway(m, {"server": {"body_timeout": "1s"}})
    body = chat_body("slow body")
    c = g.connection()
    t0 = time.monotonic()
    c.send(("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)).encode() + body[:10])
    r = c.read_response("POST", timeout=10)
    elapsed = time.monotonic() - t0
    assert_error(r, 408, "request_timeout", close=True)
    assert elapsed >= 0.8, "408 before the body timeout: %.2fs" % elapsed
    assert elapsed < budget(3), "408 after %.2fs (timeout 1s)" % elapsed
    assert c.wait_closed(5)
    assert m.stats()["requests"] == 0, "a partial body went upstream"


def test_error_codes_by_status(t):
    """One framing error of each kind: status, code, close."""
    m = t.mock()
    g = t.gateway(m, {"server": {"max_request_body": "1k"}})
    cases = [
        (b"GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: x\r\n\r\n",
         400, "bad_request"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
         b"Content-Length: 4096\r\n\r\n", 413, "request_too_large"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n",
         414, "uri_too_long"),
        (b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"b" * 20000 +
         b"\r\n\r\n", 431, "headers_too_large"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
         b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
         501, "not_implemented"),
        (b"GET /healthz HTTP/2.0\r\nHost: gw\r\n\r\n", 505,
         "http_version_not_supported"),
    ]
    for raw, status, code in cases:
        out, closed = send_raw(g.port, raw)
        assert out, "no response to %r" % raw[:60]
        r = parse_response(out)
        assert r.status == status, "%r: got %r" % (raw[:60], r)
        assert_error(r, status, code, close=True)
        assert closed, "socket left open after %d" % status
    assert m.stats()["requests"] == 0
