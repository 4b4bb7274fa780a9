# SPDX-License-Identifier: MIT
"""002 - proxying: the OpenAI routes relayed from the mock, routing,
body validation, byte-exact bodies, upstream headers, keep-alive on both
sides."""

import json

from gwtest import (JSON_HEADERS, Connection, assert_error, chat_body,
                    completion_body, metric, normalise, wait_for)


def relay_matches(g, m, method, path, body=b"", headers=None):
    """The gateway's answer equals a direct call to the mock with the same
    body bytes (after blanking per-call ids and timestamps)."""
    if headers is None:
        headers = dict(JSON_HEADERS) if body else None
    direct = m.call(method, path, body)
    via = g.request(method, path, headers, body)
    assert via.status == direct.status, "status %s, mock said %s: %r" % (
        via.status, direct.status, via)
    assert via.content_type == direct.content_type, \
        "Content-Type %r, mock said %r" % (via.content_type,
                                           direct.content_type)
    assert normalise(via.body) == normalise(direct.body), \
        "body differs from the mock's:\n via: %r\n mock: %r" % (
            via.body[:400], direct.body[:400])
    assert via.clean_end, "response not cleanly framed: %r" % via
    return via


def test_chat_completions_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    r = relay_matches(g, m, "POST", "/v1/chat/completions",
                      chat_body("proxy me", mock_chunks=5))
    assert r.status == 200
    doc = r.json()
    assert doc["object"] == "chat.completion", doc
    assert doc["choices"][0]["message"]["content"], doc


def test_completions_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    r = relay_matches(g, m, "POST", "/v1/completions",
                      completion_body("complete me"))
    assert r.status == 200
    assert r.json()["object"] == "text_completion", r.body[:200]


def test_embeddings_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    r = relay_matches(g, m, "POST", "/v1/embeddings",
                      b'{"model":"mock-model","input":"embed me"}')
    assert r.status == 200
    doc = r.json()
    assert doc["object"] == "list" and len(doc["data"][0]["embedding"]) == 8


def test_models_from_the_upstreams_answer(t):
    m = t.mock()
    g = t.gateway(m)
    # The health beat asks the upstream once at start; clients get the
    # cached answer, byte for byte the upstream's (but "created").
    r = wait_for(lambda: (lambda r: r.json()["data"] and r)(
        g.get("/v1/models")), msg="/v1/models filled from the upstream")
    assert r.status == 200 and r.content_type == "application/json", r
    assert normalise(r.body) == normalise(m.get("/v1/models").body), r.body
    for _ in range(5):
        assert g.get("/v1/models").status == 200
    assert m.stats()["requests"] == 0, "a client's /v1/models went upstream"


def test_relayed_response_carries_request_id(t):
    m = t.mock()
    g = t.gateway(m)
    # Direct (not coalesced: sampling at 0.9): the client's id goes
    # upstream.  A coalesced call sends its flight's (011).
    r = g.post("/v1/chat/completions", chat_body("rid", temperature=0.9))
    assert r.status == 200, r
    assert r.headers.get("X-Infergw-Coalesce") == "bypass", r
    rid = r.headers.get("X-Request-Id")
    assert rid, "no X-Request-Id on a proxied response"
    assert m.stats()["last_headers"].get("x-request-id") == rid, \
        "upstream got a different X-Request-Id than the client"


def test_unknown_path_is_404(t):
    m = t.mock()
    g = t.gateway(m)
    for method, path in (("GET", "/"), ("GET", "/v1"),
                         ("GET", "/v1/unknown"), ("POST", "/v2/models"),
                         ("POST", "/v1/chat/completions/x"),
                         ("GET", "/stats"), ("GET", "/healthzz")):
        body = b"{}" if method == "POST" else b""
        r = g.request(method, path, JSON_HEADERS if body else None, body)
        assert_error(r, 404, "not_found")
        if not body:
            # (a server may close rather than read an unwanted body)
            assert not r.connection_close, "404 should not close: %r" % r
    assert m.stats()["requests"] == 0, "a 404 went upstream"


def test_wrong_method_is_405_with_allow(t):
    m = t.mock()
    g = t.gateway(m)
    cases = [("GET", "/v1/chat/completions", "POST"),
             ("PUT", "/v1/chat/completions", "POST"),
             ("GET", "/v1/completions", "POST"),
             ("DELETE", "/v1/embeddings", "POST"),
             ("POST", "/v1/models", "GET"),
             ("POST", "/healthz", "GET"),
             ("POST", "/readyz", "GET"),
             ("POST", "/metrics", "GET")]
    for method, path, allow in cases:
        body = b"{}" if method in ("POST", "PUT") else b""
        r = g.request(method, path, JSON_HEADERS if body else None, body)
        assert_error(r, 405, "method_not_allowed")
        assert r.headers.has_token("Allow", allow), \
            "%s %s: Allow %r, want %s" % (method, path,
                                          r.headers.get("Allow"), allow)
        if allow == "GET":
            assert r.headers.has_token("Allow", "HEAD"), r.headers
    assert m.stats()["requests"] == 0, "a 405 went upstream"


def test_head_on_every_get_route(t):
    # RFC 9110 9.3.2: HEAD answers as GET would, without the body.  On
    # one keep-alive connection: a body sent anyway would be read as the
    # next answer's head.
    m = t.mock()
    g = t.gateway(m)
    # /v1/models changes once the health beat has the mock's models.
    wait_for(lambda: g.get("/v1/models").json()["data"] != [])
    c = Connection(g.port)
    for path in ("/v1/models", "/healthz", "/readyz", "/metrics"):
        get = g.request("GET", path)
        r = c.request("HEAD", path)
        assert r.status == get.status == 200, (path, r, get)
        assert r.body == b"", (path, r.body[:100])
        assert r.headers.get("Content-Type") == \
            get.headers.get("Content-Type"), (path, r.headers)
        assert int(r.headers.get("Content-Length", -1)) > 0, r.headers
        if path in ("/healthz", "/readyz", "/v1/models"):
            assert int(r.headers.get("Content-Length")) == len(get.body), \
                (path, r.headers, get.body)
    # Errors too come without their bodies.
    r = c.request("HEAD", "/v1/chat/completions")
    assert r.status == 405 and r.body == b"", r
    assert r.headers.has_token("Allow", "POST"), r.headers
    r = c.request("HEAD", "/no/such/route")
    assert r.status == 404 and r.body == b"", r
    r = c.request("GET", "/healthz")
    assert r.status == 200 and r.json() == {"status": "ok"}, r
    assert m.stats()["requests"] == 0, "a HEAD went upstream"


def test_query_string_ignored_for_routing(t):
    m = t.mock()
    g = t.gateway(m)
    g.wait_ready()
    assert g.get("/healthz?probe=1").status == 200
    assert g.get("/readyz?x=y&z").status == 200
    assert g.get("/metrics?").status == 200
    # (the cache fills from the health beat's first answer)
    r = wait_for(lambda: (lambda r: r.json()["data"] and r)(
        g.get("/v1/models?limit=5")), msg="/v1/models with a query")
    assert r.status == 200 and r.json()["data"][0]["id"] == "mock-model", r
    body = chat_body("query")
    r = g.post("/v1/chat/completions?api-version=2024-01-01", body)
    assert r.status == 200, r
    assert normalise(r.body) == normalise(
        m.call("POST", "/v1/chat/completions", body).body)
    assert_error(g.get("/nope?x=/v1/models"), 404, "not_found")


# Bodies that are not a JSON object nested at most 64 deep.
DEEP64 = (b'{"model":"mock-model","x":' + b"[" * 63 + b"]" * 63 + b"}")  # 1+63
DEEP65 = (b'{"model":"mock-model","x":' + b"[" * 64 + b"]" * 64 + b"}")  # 1+64
BAD_BODIES = [
    (b"{not json", "invalid JSON"),
    (b'[{"model":"mock-model"}]', "an array"),
    (b'"a string"', "a string"),
    (b"42", "a number"),
    (b"null", "null"),
    (DEEP65, "65 deep"),
    (b'{"a":' * 1000 + b"1" + b"}" * 1000, "1000 deep"),
    (b"", "empty"),
    (b'{"model":"mock-model"} {"x":1}', "trailing garbage"),
    (b'{"model":"mock-model",}', "trailing comma"),
]


def test_completion_bodies_must_be_json_objects(t):
    m = t.mock()
    g = t.gateway(m)
    for path in ("/v1/chat/completions", "/v1/completions",
                 "/v1/embeddings"):
        for body, note in BAD_BODIES:
            r = g.post(path, body)
            assert r.status == 400, "%s with %s: %r" % (path, note, r)
            assert_error(r, 400, "invalid_json")
    assert m.stats()["requests"] == 0, "an invalid body went upstream"


def test_nesting_depth_boundary(t):
    """64 levels (counting the top object) pass, 65 do not."""
    assert DEEP64.count(b"[") + 1 == 64 and DEEP65.count(b"[") + 1 == 65
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions", DEEP64)
    assert r.status == 200, "64 deep refused: %r" % r
    r = g.post("/v1/chat/completions", DEEP65)
    assert_error(r, 400, "invalid_json")
    assert m.stats()["requests"] == 1


def test_body_forwarded_byte_exact(t):
    m = t.mock()
    g = t.gateway(m)
    odd = (b'{ "mock_chunks" : 12,\n\t"messages" :[ {"content":"hi  there",'
           b'"role":"user"} ],\r\n   "model":  "mock-model" , "z": 1.50 }  ')
    compact = json.dumps(json.loads(odd), separators=(",", ":"),
                         sort_keys=True).encode()
    d_odd = m.call("POST", "/v1/chat/completions", odd).json()
    d_compact = m.call("POST", "/v1/chat/completions", compact).json()
    text_odd = d_odd["choices"][0]["message"]["content"]
    # The mock hashes the whole body: re-serialising would show.
    assert text_odd != d_compact["choices"][0]["message"]["content"], \
        "mock text does not depend on the body bytes; test cannot work"
    r = g.post("/v1/chat/completions", odd)
    assert r.status == 200, r
    assert r.json()["choices"][0]["message"]["content"] == text_odd, \
        "the gateway changed the body bytes on the way upstream"


def test_hop_by_hop_and_client_headers_not_forwarded(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions", chat_body("hop"), headers=[
        ("Content-Type", "application/json"),
        ("Connection", "keep-alive, X-Foo"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Upgrade", "websocket"),
        ("Proxy-Authorization", "Basic c2VjcmV0"),
        ("X-Foo", "bar"),
        ("X-Stainless-Lang", "python"),
        ("Cookie", "session=1"),
    ])
    assert r.status == 200, r
    seen = {k.lower() for k in m.stats()["last_headers"]}
    for h in ("keep-alive", "te", "upgrade", "proxy-authorization", "x-foo",
              "x-stainless-lang", "cookie"):
        assert h not in seen, "%s was forwarded upstream: %r" % (h, seen)
    for h in ("content-type", "x-request-id"):
        assert h in seen, "%s not forwarded upstream: %r" % (h, seen)


def test_upstream_api_key_sent(t):
    m = t.mock()
    g = t.gateway(m, {"upstream": {"api_key": "sk-up"}})
    r = g.post("/v1/chat/completions", chat_body("key"),
               headers={"Content-Type": "application/json",
                        "Authorization": "Bearer sk-client"})
    assert r.status == 200, r
    h = m.stats()["last_headers"]
    assert h.get("authorization") == "Bearer sk-up", \
        "upstream Authorization %r" % h.get("authorization")
    assert "sk-up" not in "\n".join(g.log_lines()), "API key in the log"
    r = g.get("/v1/models")
    assert r.status == 200
    assert m.stats()["last_headers"].get("authorization") == "Bearer sk-up"


def test_client_authorization_not_forwarded_by_default(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions", chat_body("auth"),
               headers={"Content-Type": "application/json",
                        "Authorization": "Bearer sk-client"})
    assert r.status == 200, r
    h = m.stats()["last_headers"]
    assert "authorization" not in h, \
        "client Authorization forwarded: %r" % h.get("authorization")


def test_client_authorization_forwarded_when_enabled(t):
    m = t.mock()
    g = t.gateway(m, {"upstream": {"forward_client_auth": "on"}})
    r = g.post("/v1/chat/completions", chat_body("auth"),
               headers={"Content-Type": "application/json",
                        "Authorization": "Bearer sk-client"})
    assert r.status == 200, r
    assert m.stats()["last_headers"].get("authorization") == \
        "Bearer sk-client"


def test_upstream_connections_reused(t):
    # No beats: a probe or a scrape taking the idle connection just as a
    # request wants it would make the request open another.  And each
    # request waits for the last one's connection to be back in the
    # cache (a client can have its answer a moment before).
    m = t.mock()
    g = t.gateway(m, {"routing": {"health_interval": "0",
                                  "load_interval": "0"}})

    def kept():
        wait_for(lambda: metric(g.metrics(),
                                "infergw_upstream_keepalive_idle") >= 1,
                 msg="the connection back in the cache")
    # The start's GET /v1/models (the beat's one probe) is over first.
    wait_for(lambda: m.stats()["probes"] >= 1, msg="the start's probe")
    kept()
    assert g.post("/v1/chat/completions", chat_body("warm")).status == 200
    kept()
    s1 = m.stats()
    for i in range(20):
        r = g.post("/v1/chat/completions", chat_body("reuse %d" % i))
        assert r.status == 200, r
        kept()
    s2 = m.stats()
    assert s2["requests"] - s1["requests"] == 20, (s1, s2)
    # The /stats call that produced s2 is one of the new connections.
    new = s2["connections_total"] - s1["connections_total"] - 1
    assert new <= 1, ("%d new upstream connections for 20 sequential "
                      "requests (want the warm one reused)" % new)


# ---- keep-alive and request framing on the client side

def test_keepalive_several_requests_one_socket(t):
    m = t.mock()
    g = t.gateway(m)
    c = g.connection()
    for i in range(3):
        for method, path, body in (
                ("GET", "/healthz", b""),
                ("GET", "/v1/models", b""),
                ("POST", "/v1/chat/completions", chat_body("ka %d" % i)),
                ("GET", "/nope", b"")):
            r = c.request(method, path, JSON_HEADERS if body else None, body)
            assert r.status in (200, 404), (path, r)
            assert r.clean_end, r
            assert not r.connection_close, "server asked to close: %r" % r
    assert c.is_open(), "server closed a keep-alive connection"
    assert m.stats()["requests"] == 3     # /v1/models is the gateway's


def test_pipelined_requests_answered_in_order(t):
    m = t.mock()
    g = t.gateway(m)
    from gwtest import build_request
    c = g.connection()
    b1, b2 = chat_body("pipe one"), chat_body("pipe two")
    c.send(build_request("POST", "/v1/chat/completions", JSON_HEADERS, b1) +
           build_request("GET", "/healthz", {"X-Request-Id": "p2"}) +
           build_request("POST", "/v1/chat/completions", JSON_HEADERS, b2))
    r1 = c.read_response("POST")
    r2 = c.read_response("GET")
    r3 = c.read_response("POST")
    assert r1.status == r2.status == r3.status == 200, (r1, r2, r3)
    assert r2.headers.get("X-Request-Id") == "p2"
    assert normalise(r1.body) == normalise(
        m.call("POST", "/v1/chat/completions", b1).body)
    assert normalise(r3.body) == normalise(
        m.call("POST", "/v1/chat/completions", b2).body)


def test_http10_without_keepalive_closes(t):
    g = t.gateway(t.mock())
    c = g.connection()
    c.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    r = c.read_response()
    assert r.status == 200, r
    assert r.json()["status"] == "ok"
    assert c.wait_closed(5), "HTTP/1.0 connection left open"


def test_http10_keepalive_stays_open(t):
    g = t.gateway(t.mock())
    c = g.connection()
    for _ in range(2):
        c.send(b"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        r = c.read_response()
        assert r.status == 200, r
        assert r.framing == "length", \
            "keep-alive 1.0 response needs Content-Length: %r" % r
        assert r.headers.has_token("Connection", "keep-alive"), r
    assert c.is_open(), "HTTP/1.0 keep-alive connection closed"


def test_connection_close_honoured(t):
    g = t.gateway(t.mock())
    c = g.connection()
    r = c.request("GET", "/healthz", {"Connection": "close"})
    assert r.status == 200, r
    assert r.connection_close, "no Connection: close in reply: %r" % r
    assert c.wait_closed(5), "server kept the connection open"


def test_expect_100_continue(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("continue")
    c = g.connection()
    c.send(("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            "Content-Type: application/json\r\nExpect: 100-continue\r\n"
            "Content-Length: %d\r\n\r\n" % len(body)).encode())
    head = c.read_head("POST", timeout=5, want_interim=True)
    assert head is not None and head.status == 100, \
        "want 100 Continue before sending the body, got %r" % head
    assert bytes(c.reader.raw).startswith(b"HTTP/1.1 100 Continue\r\n"), \
        bytes(c.reader.raw[:60])
    c.send(body)
    r = c.read_response("POST")
    assert r.status == 200, r
    assert normalise(r.body) == normalise(
        m.call("POST", "/v1/chat/completions", body).body)


def test_chunked_request_body_forwarded(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("chunked upload", mock_chunks=10)
    parts = [body[:7], body[7:30], body[30:]]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + \
        b"0\r\n\r\n"
    c = g.connection()
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
           b"Content-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + wire)
    r = c.read_response("POST")
    assert r.status == 200, r
    direct = m.call("POST", "/v1/chat/completions", body)
    assert normalise(r.body) == normalise(direct.body), \
        "chunked upload answered differently from the same bytes with CL"
    # chunk extensions and trailers are allowed too, and the connection
    # stays usable
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
           b"Content-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" +
           b"%x;ext=1\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n" % (len(body), body))
    r = c.read_response("POST")
    assert r.status == 200, r
    assert normalise(r.body) == normalise(direct.body)
    # upstream got a plain body with a length, not our chunk framing
    last = m.stats()["last_headers"]
    assert last.get("content-length") == str(len(body)), last
    assert "transfer-encoding" not in last, last
    assert m.stats()["requests"] == 3
