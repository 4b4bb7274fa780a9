# SPDX-License-Identifier: MIT
"""The client: connections (counted in OPEN_CONNS), a request's bytes,
reading one response under a policy, one request classified, and the
request bodies."""

import json
import random
import socket
import ssl
import threading
import time

from . import limits
from .response import BAD, classify, parse_http, sse_events


class Target:
    def __init__(self, port, tls_ctx=None, name="plain"):
        self.port = port
        self.tls_ctx = tls_ctx
        self.name = name


OPEN_CONNS = [0, 0]           # now, peak
_conn_lock = threading.Lock()


def _conn_delta(d):
    with _conn_lock:
        OPEN_CONNS[0] += d
        if OPEN_CONNS[0] > OPEN_CONNS[1]:
            OPEN_CONNS[1] = OPEN_CONNS[0]


def open_conn(target, deadline, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
        s.connect(("127.0.0.1", target.port))
        if target.tls_ctx is not None:
            s = target.tls_ctx.wrap_socket(s, server_hostname="127.0.0.1")
    except Exception:
        s.close()
        raise
    _conn_delta(1)
    return s


def close_conn(s):
    try:
        s.close()
    except Exception:
        pass
    _conn_delta(-1)


def build_request(path, body, close=True, method="POST"):
    h = ["%s %s HTTP/1.1" % (method, path), "Host: 127.0.0.1"]
    if method == "POST":
        h += ["Content-Type: application/json",
              "Content-Length: %d" % len(body)]
    if close:
        h.append("Connection: close")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + body


def read_response(s, deadline, policy=None, buf=b""):
    """Read one response.  Returns (raw, end, t_first).  policy:
    None: to the end; ("events", n): hang up after n SSE events;
    ("slow", nbytes, sleep): small reads with sleeps; ("stuck", after,
    pause): stop reading for 'pause' s after 'after' body bytes;
    ("keepalive",): stop at the end of the response (no EOF wait)."""
    raw = bytearray(buf)
    t_first = None
    stalled = False
    kind = policy[0] if policy else None
    rsize = 65536
    if kind == "slow":
        rsize = policy[1]
    while True:
        p = None
        if kind in ("events", "keepalive") or len(raw) < (1 << 16) or \
                (kind == "stuck" and not stalled):
            p = parse_http(bytes(raw))
            if p.error:
                return bytes(raw), "eof", t_first
            if p.state == "complete" and kind == "keepalive":
                return bytes(raw), "eof", t_first
            if kind == "events" and p.state in ("body", "complete"):
                if len(sse_events(p.body)[0]) >= policy[1]:
                    return bytes(raw), "gave_up", t_first
            if (kind == "stuck" and not stalled and p.state == "body"
                    and len(p.body) >= policy[1]):
                stalled = True
                time.sleep(policy[2])
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(raw), "timeout", t_first
        s.settimeout(left)
        try:
            data = s.recv(rsize)
        except socket.timeout:
            return bytes(raw), "timeout", t_first
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return bytes(raw), ("stalled" if stalled else "reset"), t_first
        except ssl.SSLError as e:
            if "EOF" in str(e) or isinstance(e, ssl.SSLEOFError):
                return bytes(raw), ("stalled" if stalled else "eof"), t_first
            return bytes(raw), ("stalled" if stalled else "reset"), t_first
        except OSError:
            return bytes(raw), ("stalled" if stalled else "reset"), t_first
        if not data:
            return bytes(raw), ("stalled" if stalled else "eof"), t_first
        if t_first is None:
            t_first = time.monotonic()
        raw += data
        if kind == "slow":
            time.sleep(policy[2])


def one_request(target, path, body, req, policy=None, rcvbuf=None,
                hangup_before=None):
    """Send one request on a new connection; returns a result dict."""
    t0 = time.monotonic()
    deadline = t0 + limits.REQ_DEADLINE
    res = {"kind": req["kind"], "transport": target.name, "t0": t0}
    try:
        s = open_conn(target, deadline, rcvbuf)
    except Exception as e:
        req = dict(req, connect_error=repr(e))
        cat, why, _, _ = classify(b"", "connect", req)
        res.update(cat=cat, why=why, raw=b"", dur=time.monotonic() - t0)
        return res
    try:
        try:
            s.settimeout(5)
            s.sendall(build_request(path, body))
        except Exception as e:
            # the gateway may answer and close early (it never should for a
            # valid request); read what it said
            res["send_error"] = repr(e)
        if hangup_before is not None:
            time.sleep(hangup_before)
            raw, end = b"", "gave_up"
            s.settimeout(0)
            try:
                raw = s.recv(65536)
            except Exception:
                pass
            t_first = None
        else:
            raw, end, t_first = read_response(s, deadline, policy)
    finally:
        close_conn(s)
    cat, why, p, text = classify(raw, end, req)
    res.update(cat=cat, why=why, raw=raw, text=text, end=end,
               dur=time.monotonic() - t0,
               ttfb=(t_first - t0) if t_first else None,
               role=p.header("x-infergw-coalesce"),
               rid=p.header("x-request-id"), status=p.status)
    if p.status in (429, 503) and cat != BAD:
        # a polite client: honour Retry-After, at most 1 s, so that an
        # outage does not turn the soak into a connect storm
        try:
            ra = float(p.header("retry-after") or 0.2)
        except ValueError:
            ra = 0.2
        time.sleep(min(1.0, ra) * random.uniform(0.5, 1.0))
    return res


def chat_body(prompt, stream=True, **kw):
    b = {"model": "mock-model", "temperature": 0, "stream": stream,
         "messages": [{"role": "user", "content": prompt}]}
    b.update(kw)
    return json.dumps(b, separators=(",", ":")).encode()


def comp_body(prompt, stream=True, **kw):
    b = {"model": "mock-model", "temperature": 0, "stream": stream,
         "prompt": prompt}
    b.update(kw)
    return json.dumps(b, separators=(",", ":")).encode()


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
EMB = "/v1/embeddings"
