# SPDX-License-Identifier: MIT
"""--self-test: a raw TCP server that sends canned good and bad responses
(it also plays the upstream of --inject-bug's kind), and the check that
the classifier puts each in its expected category."""

import json
import os
import socket
import ssl
import threading
import time

from . import limits
from .client import Target, one_request
from .procs import client_tls_ctx, ensure_certs
from .response import BAD, COMPLETE, HONEST
from .workload import Soak, text_mismatches


CANNED_STREAM_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")


def _chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)


def _ev(obj):
    return _chunk(b"data: " + (obj if isinstance(obj, bytes)
                               else json.dumps(obj).encode()) + b"\n\n")


def _cc(text=None, finish=None, cid="chatcmpl-x"):
    d = {} if text is None else {"content": text}
    return {"id": cid, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


_ERR = {"error": {"message": "upstream connection broken",
                  "type": "upstream_error", "param": None,
                  "code": "upstream_error"}}
_ERRB = json.dumps(_ERR).encode()
_GOOD_EVENTS = _ev(_cc("a ")) + _ev(_cc("b ")) + _ev(_cc(None, "stop"))


def _json_resp(status, body, extra=b""):
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s"
            % (status, len(body), extra, body))


_NS = json.dumps({"id": "c", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"},
     "finish_reason": "stop"}]}).encode()

# name -> (bytes to send, then: "close"|"reset"|"hang", stream?, expected)
CANNED = {
    "good stream": (CANNED_STREAM_OK + _GOOD_EVENTS + _ev(b"[DONE]")
                    + b"0\r\n\r\n", "close", True, COMPLETE),
    "good json": (_json_resp(200, _NS), "close", False, COMPLETE),
    "honest 502": (_json_resp(502, _ERRB), "close", True, HONEST),
    "honest error event": (CANNED_STREAM_OK + _ev(_cc("a ")) + _ev(_ERR),
                           "close", True, HONEST),
    "honest json cut (length)": (_json_resp(200, _NS)[:-10], "close", False,
                                 HONEST),
    "truncated stream": (CANNED_STREAM_OK + _ev(_cc("a ")) + _ev(_cc("b ")),
                         "close", True, BAD),
    "truncated mid-chunk": ((CANNED_STREAM_OK + _ev(_cc("a ")))[:-20],
                            "close", True, BAD),
    "clean end without [DONE]": (CANNED_STREAM_OK + _GOOD_EVENTS
                                 + b"0\r\n\r\n", "close", True, BAD),
    "error event then clean end": (CANNED_STREAM_OK + _ev(_cc("a "))
                                   + _ev(_ERR) + b"0\r\n\r\n", "close",
                                   True, BAD),
    "garbage chunk size": (CANNED_STREAM_OK + b"zz\r\nhello\r\n", "close",
                           True, BAD),
    "chunk without CRLF": (CANNED_STREAM_OK + b"5\r\nhelloXX0\r\n\r\n",
                           "close", True, BAD),
    "both CL and TE": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"
                       b"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
                       b"\r\n\r\n0\r\n\r\n", "close", True, BAD),
    "bare LF head": (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "close",
                     False, BAD),
    "close-delimited": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json"
                        b"\r\n\r\n" + _NS, "close", False, BAD),
    "bytes after the end": (_json_resp(200, _NS) + b"junk", "close", False,
                            BAD),
    "502 not OpenAI": (_json_resp(502, b"<html>bad gateway</html>"),
                       "close", True, BAD),
    "502 cut": (_json_resp(502, _ERRB)[:-5], "close", True, BAD),
    "unexpected 400": (_json_resp(400, _ERRB), "close", True, BAD),
    "[DONE] then cut": (CANNED_STREAM_OK + _GOOD_EVENTS + _ev(b"[DONE]"),
                        "close", True, BAD),
    "mixed ids": (CANNED_STREAM_OK + _ev(_cc("a ")) + _ev(_cc("b ", None,
                  "other")) + _ev(_cc(None, "stop")) + _ev(b"[DONE]")
                  + b"0\r\n\r\n", "close", True, BAD),
    "stream body not JSON": (CANNED_STREAM_OK + _ev(b"{oops")
                             + b"0\r\n\r\n", "close", True, BAD),
    "json 200 not JSON": (_json_resp(200, b"{oops}"), "close", False, BAD),
    "closed before any byte": (b"", "close", True, BAD),
    "reset before any byte": (b"", "reset", True, BAD),
    "hang mid-stream": (CANNED_STREAM_OK + _ev(_cc("a ")), "hang", True,
                        BAD),
    "1xx": (b"HTTP/1.1 100 Continue\r\n\r\n" + _json_resp(200, _NS),
            "close", False, BAD),
    "HTTP/1.0 status": (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
                        "close", False, BAD),
}


class CannedServer:
    """Answers every connection with CANNED[name], the name being the
    request's path (percent-free: spaces as '_'); POST /v1/... (the
    --inject-bug kind) gets "truncated stream"."""

    def __init__(self, tls_ctx=None):
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.tls_ctx = tls_ctx
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,),
                             daemon=True).start()

    def _serve(self, c):
        try:
            c.settimeout(10)
            if self.tls_ctx:
                c = self.tls_ctx.wrap_socket(c, server_side=True)
            req = b""
            while b"\r\n\r\n" not in req:
                d = c.recv(4096)
                if not d:
                    return
                req += d
            path = req.split(b" ", 2)[1].decode()
            name = path.lstrip("/").replace("_", " ")
            if name not in CANNED:
                name = "truncated stream"
            data, then, _, _ = CANNED[name]
            if data:
                c.sendall(data)
            if then == "reset":
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             b"\x01\x00\x00\x00\x00\x00\x00\x00")
            elif then == "hang":
                time.sleep(limits.REQ_DEADLINE + 2)
        except Exception:
            pass
        finally:
            try:
                c.close()
            except Exception:
                pass


def self_test(args):
    limits.REQ_DEADLINE = 2.0           # the hang case waits this long
    srv_ctx, cli_ctx = None, None
    if args.tls:
        cert_dir = ensure_certs(args)
        srv_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        srv_ctx.load_cert_chain(os.path.join(cert_dir, "server.pem"),
                                os.path.join(cert_dir, "server.key"))
        cli_ctx = client_tls_ctx(cert_dir)
    srv = CannedServer(srv_ctx)
    tgt = Target(srv.port, cli_ctx, "tls" if cli_ctx else "plain")
    ok = 0
    print("self-test: the classifier against %d canned responses (%s)"
          % (len(CANNED), tgt.name))
    results = []

    def run(name):
        data, then, stream, want = CANNED[name]
        want_r = want
        res = one_request(tgt, "/" + name.replace(" ", "_"), b"{}",
                          {"kind": "selftest", "stream": stream,
                           "route": "chat"})
        results.append((name, want_r, res))

    ths = [threading.Thread(target=run, args=(n,)) for n in CANNED]
    for t in ths:
        t.start()
    for t in ths:
        t.join(limits.REQ_DEADLINE + 10)
    for name, want, res in sorted(results, key=lambda r: list(CANNED).index(
            r[0])):
        good = res["cat"] == want
        ok += good
        print("  %-4s %-28s expected %-8s got %-8s %s" % (
            "ok" if good else "FAIL", name, want, res["cat"], res["why"]))
    # the identical-body text check, offline
    print("  %-4s %-28s" % ("ok" if _text_check_selftest() else "FAIL",
                             "different text, same body"))
    ok += _text_check_selftest()
    total = len(CANNED) + 1
    print("self-test: %d/%d as expected; BAD detected in %d of %d bad cases"
          % (ok, total,
             sum(1 for n, w, r in results if w == BAD and r["cat"] == BAD)
             + _text_check_selftest(),
             sum(1 for n, w, r in results if w == BAD) + 1))
    return 0 if ok == total else 1


def _text_check_selftest():
    s = Soak.__new__(Soak)
    s.texts = {b"x": {"a b", "a c"}}
    s.text_kinds = {b"x": "k"}
    return len(text_mismatches(s)) == 1
