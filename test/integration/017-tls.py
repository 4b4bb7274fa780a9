# SPDX-License-Identifier: MIT
"""017 - TLS for clients (issue 10), with a throwaway CA made at test
time by tools/mkcert (mbedTLS's own x509write API): curl verifies the
gateway against that CA; a wrong CA, plain HTTP on the TLS port and a
trickled handshake are refused and counted; keep-alive, streams and a
coalesced flight (parked followers pushed through TLS records, slow
readers included) are byte-identical to plain; -t checks the certificate
and key; SIGHUP swaps the certificate; the drain works the same.
"""

import os
import signal
import socket
import ssl
import subprocess
import time

import gwtest
from gwtest import (JSON_HEADERS, Connection, budget, build_request,
                    chat_body, wait_for)

from coalesce_util import (CHAT, assert_complete_stream, assert_same_bodies,
                           finish, finish_all, new_tag, role, send, start,
                           wait_state)
from tls_util import (TlsConnection, certs, client_ctx, handshakes,
                      tls_gateway)


def send_tls(g, ctx, body, path=CHAT, headers=None, timeout=15.0):
    c = TlsConnection(g.tls_port, ctx, timeout)
    h = dict(JSON_HEADERS)
    h.update(headers or {})
    c.send(build_request("POST", path, h, body))
    return c


def curl(*args):
    exe = gwtest.tool("curl")
    return subprocess.run([exe, "-sS", "--max-time", "20"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=60)


def test_curl_verifies_against_the_ca(t):
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d)
    url = "https://127.0.0.1:%d" % g.tls_port
    p = curl("--cacert", os.path.join(d, "ca.pem"), url + "/healthz")
    assert p.returncode == 0 and b'"ok"' in p.stdout, (p.stdout, p.stderr)
    # The name in the certificate (localhost) works as well as its IP.
    p = curl("--cacert", os.path.join(d, "ca.pem"), "--resolve",
             "localhost:%d:127.0.0.1" % g.tls_port,
             "https://localhost:%d/v1/chat/completions" % g.tls_port,
             "-H", "Content-Type: application/json",
             "--data-binary", chat_body("over TLS").decode())
    assert p.returncode == 0 and b'"chat.completion"' in p.stdout, p
    # A CA that did not sign it: curl refuses (exit 60), we count it.
    p = curl("--cacert", os.path.join(d, "other-ca.pem"), url + "/healthz")
    assert p.returncode == 60, (p.returncode, p.stderr)
    wait_for(lambda: handshakes(g, "protocol") == 1)
    assert handshakes(g, "ok") == 2
    # ALPN: http/1.1 is what we speak.
    c = TlsConnection(g.tls_port, client_ctx(d))
    assert c.sock.selected_alpn_protocol() == "http/1.1"
    assert c.sock.version() == "TLSv1.2", c.sock.version()
    c.close()
    # And the plain listener still works beside it.
    assert g.get("/healthz").status == 200


def test_plain_http_on_the_tls_port_is_refused(t):
    d = certs(t)
    g = tls_gateway(t, t.mock(), d)
    s = gwtest._register(socket.create_connection(("127.0.0.1", g.tls_port),
                                                  timeout=budget(5)))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            got += b
    except ConnectionResetError:
        pass
    assert b"HTTP/1.1 200" not in got, got
    wait_for(lambda: handshakes(g, "protocol") == 1)
    g.wait_log(r"tls: handshake failed .*plain HTTP request on the TLS port")
    # Garbage, then nothing: the connection alone is closed.
    s = gwtest._register(socket.create_connection(("127.0.0.1", g.tls_port),
                                                  timeout=budget(5)))
    s.sendall(b"\x16\x03\x01\x00\x05hello")
    wait_for(lambda: handshakes(g, "protocol") == 2)
    assert g.get("/healthz").status == 200


def client_hello(d):
    """The bytes of a real ClientHello (made with a memory BIO)."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx(d).wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def test_trickled_handshake_is_cut_off(t):
    d = certs(t)
    g = tls_gateway(t, t.mock(), d, {"tls_handshake_timeout": "500ms"})
    hello = client_hello(d)
    assert len(hello) > 100
    s = gwtest._register(socket.create_connection(("127.0.0.1", g.tls_port),
                                                  timeout=budget(5)))
    start = time.monotonic()
    closed = False
    for b in hello:
        try:
            s.sendall(bytes([b]))
            time.sleep(0.05)
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed = True
            except BlockingIOError:
                pass
            s.setblocking(True)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        if closed or time.monotonic() - start > budget(5):
            break
    took = time.monotonic() - start
    assert closed, "a trickled handshake was not cut off"
    assert 0.4 <= took <= budget(3), took
    wait_for(lambda: handshakes(g, "timeout") == 1)


def test_keep_alive_and_a_stream_over_tls(t):
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d)
    c = TlsConnection(g.tls_port, client_ctx(d))
    for i in range(3):
        r = c.request("POST", CHAT, JSON_HEADERS, chat_body("ka %d" % i))
        assert r.status == 200, r
    s = c.stream("POST", CHAT, JSON_HEADERS,
                 chat_body("stream", stream=True))
    s.read_all()
    assert_complete_stream(s)
    assert handshakes(g, "ok") == 1, "keep-alive made new handshakes"


def test_one_flight_over_tls_and_plain_is_byte_identical(t):
    """A flight led on plain HTTP, followed over TLS and plain, one of
    the TLS followers a slow reader of a big stream: every client gets
    exactly the same bytes, pushed through TLS records for the parked
    ones (partial writes included)."""
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d)
    ctx = client_ctx(d)
    tag = new_tag()
    body = chat_body("tls flight", stream=True, mock_hold=tag,
                     mock_chunks=40, mock_pad=65536)
    lead = send(g, body)
    wait_state(g, m, held=1, leaders=1)
    conns = [send_tls(g, ctx, body), send(g, body), send_tls(g, ctx, body)]
    wait_state(g, m, held=1, followers=3)
    m.release(tag)
    streams = finish_all([lead] + conns[:2])
    # The last reads slowly: its pushes meet a full socket again and again.
    ss = start(conns[2], timeout=60)
    for _ in ss.chunks():
        time.sleep(0.01)
    streams.append(ss)
    for s in streams:
        assert_complete_stream(s)
    assert_same_bodies(streams)
    assert len(streams[0].body) > 40 * 65536
    assert [role(s) for s in streams] == ["leader"] + ["follower"] * 3
    wait_state(g, m, completions=1, upstream=1)


def test_t_checks_certificate_and_key(t):
    d = certs(t)
    base = ("[server]\nlisten = 127.0.0.1:0\ntls_listen = 127.0.0.1:0\n"
            "tls_cert = %s\ntls_key = %s\n")
    ok = t.write("ok.conf", base % (os.path.join(d, "server.pem"),
                                    os.path.join(d, "server.key")))
    rc, out = t.infergw("-t", "-c", ok)
    assert rc == 0, out
    for cert, key, what in (
            ("server.pem", "mismatch.key", "match"),
            ("expired.pem", "expired.key", "expired"),
            ("missing.pem", "server.key", "cannot open"),
            ("ca.key", "server.key", "certificate")):
        path = t.write("bad.conf", base % (os.path.join(d, cert),
                                           os.path.join(d, key)))
        rc, out = t.infergw("-t", "-c", path)
        assert rc == 2, (what, out)
        assert "bad.conf:4: " in out, (what, out)
        assert what in out, (what, out)
    path = t.write("v13.conf", base % (os.path.join(d, "server.pem"),
                                       os.path.join(d, "server.key"))
                   + "tls_min_version = 1.3\n")
    rc, out = t.infergw("-t", "-c", path)
    assert rc == 2 and "v13.conf:6: " in out and "1.3" in out, out


def test_sighup_swaps_the_certificate(t):
    d1, d2 = certs(t, "one"), certs(t, "two")
    m = t.mock()
    g = tls_gateway(t, m, d1)
    old = TlsConnection(g.tls_port, client_ctx(d1))
    assert old.request("GET", "/healthz").status == 200
    with open(g.conf_path) as f:
        text = f.read()
    with open(g.conf_path, "w") as f:
        f.write(text.replace(d1, d2))
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    # New handshakes get the new certificate.
    c = TlsConnection(g.tls_port, client_ctx(d2))
    assert c.request("GET", "/healthz").status == 200
    try:
        TlsConnection(g.tls_port, client_ctx(d1))
        raise AssertionError("the old CA still verifies")
    except ssl.SSLCertVerificationError:
        pass
    # A connection made before the reload keeps working.
    assert old.request("GET", "/healthz").status == 200


def test_tls_only_and_drain(t):
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d, {"listen": ""}, wait=False)
    tag = new_tag()
    held = send_tls(g, client_ctx(d), chat_body("drain", stream=True,
                                                mock_hold=tag))
    wait_for(lambda: m.stats()["held"] == 1)
    g.send_signal(signal.SIGTERM)
    g.wait_log(r"server: draining")
    m.release(tag)
    assert_complete_stream(finish(held))
    assert g.wait_exit(10) == 0


def test_https_upstream_verified_against_its_ca(t):
    """A gateway whose upstream is https://: another gateway's TLS port
    in front of the mock.  Its ca_file verifies it; a wrong CA is a 502
    (nothing reaches the upstream), unless tls_verify is off."""
    d = certs(t)
    m = t.mock()
    front = tls_gateway(t, m, d)
    url = "https://localhost:%d" % front.tls_port

    def via(**up):
        up["url"] = url
        g = t.gateway(None, {"upstream u": up,
                             "routing": {"health_interval": "0"}})
        return g.post(CHAT, chat_body("via https"), JSON_HEADERS)

    r = via(ca_file=os.path.join(d, "ca.pem"))
    assert r.status == 200, r
    assert m.stats()["completions"] == 1
    r = via(ca_file=os.path.join(d, "other-ca.pem"))
    assert r.status == 502, r
    assert m.stats()["completions"] == 1
    r = via(ca_file=os.path.join(d, "other-ca.pem"), tls_verify="off")
    assert r.status == 200, r
    assert m.stats()["completions"] == 2


class ClientCertUpstream:
    """A tiny https upstream (Python's ssl) that demands a client
    certificate signed by the test CA, and answers every POST with a
    chat completion and GET /health with 200."""

    def __init__(self, d):
        import http.server
        import json as _json

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                body = _json.dumps({"object": "chat.completion",
                                    "choices": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(d, "server.pem"),
                            os.path.join(d, "server.key"))
        ctx.load_verify_locations(os.path.join(d, "ca.pem"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        self.port = self.srv.server_address[1]
        import threading
        self.th = threading.Thread(target=self.srv.serve_forever,
                                   daemon=True)
        self.th.start()
        gwtest._register(self)

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_https_upstream_client_certificate(t):
    d = certs(t)
    up = ClientCertUpstream(d)

    def via(**extra):
        conf = {"url": "https://localhost:%d" % up.port,
                "ca_file": os.path.join(d, "ca.pem")}
        conf.update(extra)
        g = t.gateway(None, {"upstream u": conf,
                             "routing": {"health_interval": "0"}})
        return g.post(CHAT, chat_body("client cert"), JSON_HEADERS)

    r = via(client_cert=os.path.join(d, "server.pem"),
            client_key=os.path.join(d, "server.key"))
    assert r.status == 200, r
    # Without one, the upstream refuses the handshake: 502, said so.
    r = via()
    assert r.status == 502, r


def test_limits_over_tls(t):
    """A tenant limit answers its 429 through TLS; past max_connections a
    TLS client is closed (a plain 503 would be garbage to it)."""
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d, {"max_connections": "2"},
                    extra="[tenant a]\napi_key = sk-a-0123456789a\n"
                          "requests_per_minute = 1\n")
    c = TlsConnection(g.tls_port, client_ctx(d))
    h = dict(JSON_HEADERS, Authorization="Bearer sk-a-0123456789a")
    assert c.request("POST", CHAT, h, chat_body("one")).status == 200
    r = c.request("POST", CHAT, h, chat_body("two"))
    assert r.status == 429 and b"rate_limit_exceeded" in r.body, r
    assert r.headers.get("Retry-After"), r.headers
    # c holds one of the two connections; a plain one holds the other.
    plain = Connection(g.port)
    assert plain.request("GET", "/healthz").status == 200
    try:
        extra = TlsConnection(g.tls_port, client_ctx(d))
        extra.request("GET", "/healthz")
        raise AssertionError("a TLS connection past max_connections "
                             "was served")
    except (ssl.SSLError, OSError, gwtest.HttpError):
        pass
    g.wait_log(r"server: rejected connection reason=max_connections")


def test_a_tls_connection_does_not_pin_its_configuration(t):
    """A TLS connection keeps the certificate it shook hands with, not
    the whole configuration: an old generation is freed while the
    connection stays open, and the connection keeps working."""
    d = certs(t)
    m = t.mock()
    g = tls_gateway(t, m, d)
    c = TlsConnection(g.tls_port, client_ctx(d))
    assert c.request("GET", "/healthz").status == 200
    for gen in (2, 3):
        g.send_signal(signal.SIGHUP)
        g.wait_log(r"reload: configuration generation=%d in force" % gen)
        assert c.request("GET", "/healthz").status == 200
    g.wait_log(r"generation: configuration generation=1 freed")
    g.wait_log(r"generation: configuration generation=2 freed")
