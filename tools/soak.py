#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""soak.py - a bounded fault soak for infergw (loopback only).

Usage:
  python3 tools/soak.py --bin build/soak/bin --seconds 180 [--clients 40]
                        [--mocks 3] [--tls CERTDIR] [--seed N] [--keep]
                        [--eject-after N] [--inject-bug]
  python3 tools/soak.py --self-test [--tls CERTDIR]

Python 3 standard library only; nothing from test/ is imported.

What it does
------------
Starts --mocks (default 3) mock upstreams (BIN/mock_upstream, port 0) and
one gateway (BIN/infergw) with its own temp dir and config: one
[upstream mN] section per mock (so failures fail over), [coalesce]
defaults, [routing] first_byte_timeout = idle_timeout = 2s,
connect_timeout = 2s, health_interval = 1s, eject_time = 2s,
eject_after = --eject-after (10; with the gateway's default 3 this
poison-heavy mix ejects every upstream within seconds, since each poison
request is retried on every upstream, and the run turns into 503s),
[server] send_timeout = 5s.

Then --clients worker threads run for --seconds a weighted mix of request
kinds (see KINDS below): coalesced groups of 3..6 identical streams
started together (some late joiners, some members that hang up, read
slowly or are plain/TLS mixed), distinct streams, /v1/completions
streams, non-streamed chat, embeddings, keep-alive pairs, clients that
hang up mid-stream or before the answer, slow readers of big streams
(1.3 MB through an 8 KiB receive buffer), a reader that stalls past
send_timeout (one at a time, 5 MiB), and requests whose body asks the
mock for each mock_fault (streamed and not), alone and coalesced.  After
a 503 a client waits min(Retry-After, 1 s) before its next request.

A chaos thread meanwhile, one action at a time, on one mock at a time:
POST /control status=503 (Retry-After 1) / status=500 / fault=stall /
fault=die_mid_stream / fault=head_then_die / fault=reset / health=503,
SIGSTOP ... SIGCONT (an upstream that stalls everything, health probes
included), and at most twice a SIGKILL followed, 3 s later, by a restart
on the same port (SO_REUSEADDR; if the port cannot be bound again the
mock stays dead and the run goes on with one upstream fewer, said so in
the report).  Every action is undone after 3..6 s; the last 15 % of the
run has no chaos.

A sampler reads /proc/PID of the gateway every second: VmRSS, Threads,
and its descriptors, split (via /proc/net/tcp and /proc/net/unix) into
client sockets, upstream sockets (remote port = a mock), unix sockets
(the socketpair of each libcurl multi handle: one per upstream session,
idle or not), listeners, other sockets and non-socket descriptors.  The
series goes to TMP/samples.csv; the gateway's and mocks' logs to TMP/;
raw bytes of every BAD response to TMP/bad/.

Bounded in time: every socket has a timeout and every request a hard
deadline (REQ_DEADLINE s), workers are daemon threads, no new request
starts after --seconds, the settle phase is at most SETTLE_MAX s, and a
watchdog kills everything at --seconds + 45 s (a normal run ends about
8 s after --seconds, start-up included).  All children are killed
at the end.  The temp dir is removed unless --keep or something was BAD.

Classification of every client response
---------------------------------------
The response bytes are parsed strictly (HTTP/1.1 status line, header
fields without obs-fold or whitespace before the colon, exactly one of
Content-Length / Transfer-Encoding: chunked, hex chunk sizes with CRLF
after each chunk's data, no 1xx, no close-delimited body, no bytes after
the end of a response).

COMPLETE      2xx with the whole body (Content-Length reached, or the
              last chunk and the end of the trailers seen); a stream is
              text/event-stream, every event is `data: <json>` or
              `data: [DONE]`, [DONE] is the last event and comes once, a
              chunk with a finish_reason comes before it, every chunk has
              the same "id", and no event is an error; a JSON body parses
              and has the right "object".  Identical bodies must give
              identical completion text (the mock's words are a function
              of the body), whichever flight served them.
HONEST ERROR  one of:
              - status 500/502/503/504 with a complete body that is an
                OpenAI error ({"error":{"message":"...", ...}}) and
                Content-Type application/json;
              - a 200 stream whose last event is an SSE error event
                `data: {"error":{...}}`, followed by no byte and by an
                unclean end (connection closed/reset without the last
                chunk);
              - a 200 non-streamed JSON body cut short whose framing
                itself says so (fewer bytes than Content-Length, or a
                chunked body without its last chunk) and then closed.
                A JSON object cannot carry an error event, and every
                HTTP client must treat such a message as incomplete
                (RFC 9112 section 8); it is reported as its own form so
                it can be told apart.
CLIENT GAVE UP the client closed the connection itself (hang-up kinds),
              or stalled past send_timeout and was dropped (the
              stuck-reader kind: then a cut without an error event is
              the documented outcome).  What was received until then must
              still parse.
BAD           anything else, for instance: a framing error; a stream
              cut without an error event; an error event followed by a
              clean end; a clean end without [DONE]; a 4xx (nothing the
              soak sends is invalid, and no tenant limits are configured)
              or another unexpected status; an error status whose body
              is not an OpenAI error or is cut; no end within
              REQ_DEADLINE s (a hang); the connection closed or reset
              before a single byte (the gateway must always answer, a
              fault in the body or not); a connect error; a COMPLETE
              answer to a body that cannot succeed (below); different
              text for identical bodies; mixed ids inside one stream.

What is honest for each fault asked in the body (every upstream gets the
same body, so retries fail the same way):

  fault              stream                      not streamed
  reset              502 (after retries)         502
  stall              504 (first_byte_timeout)    504
  die_mid_stream     SSE error event, cut        200 body cut (framing)
  stall_mid_stream   SSE error event, cut        200 body cut (framing)
  head_then_die      502                         - (the mock ignores it)
  head_then_stall    504                         - (the mock ignores it)
  big_headers        502                         502
  chunked_json       - (a normal stream)         COMPLETE (chunked JSON)
  chunked_json_die   - (a normal stream)         200 body cut (framing)

Entries with a status may also be 503 (every upstream ejected) or any
honest form; a COMPLETE answer where the table says it must fail is BAD.
Requests without a fault may be COMPLETE or any honest error, since the
chaos thread makes upstreams fail under them.

Resources
---------
baseline: after start-up, one warm stream and one warm non-stream request
and 2 s of quiet.  warm-up ends at 20 % of the run; "steady" is from there
to the moment the last client stopped.  Verdicts:
  flat after warm-up (judged for runs of 120 s or more): RSS max over
    the second half of the steady part
    <= 1.2 x the RSS max of its first quarter, and threads / descriptors
    never above baseline + (peak concurrent client connections) x 1 / x 3
    + a constant (each client connection costs the gateway one thread and
    one socket, an upstream call one or two more);
  back to baseline: once the clients have stopped, polled up to SETTLE_MAX
    s: threads == baseline, no client socket left, non-socket descriptors
    == baseline; idle upstream keep-alive sockets (libcurl's cache) are
    reported apart.  RSS is reported but not judged: glibc keeps freed
    arenas and heap tops mapped, so RSS above baseline after a burst is
    expected.

Exit status: 0 all good, 1 any BAD response (or the gateway died, or a
resource verdict failed), 2 setup problem (e.g. --tls with a gateway
that has no TLS yet), 3 watchdog.

--self-test runs the classifier, through the same socket client code,
against a raw TCP server inside this script that sends canned good and
bad responses (truncated streams, garbage framing, a hang, a reset...),
and checks each lands in the expected category.  --inject-bug adds a
request kind to a real soak that talks to that canned server's truncated
stream, to show that a soak run fails (exit 1) when BAD appears.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

REQ_DEADLINE = 15.0       # hard deadline of one request (a hang is BAD)
SETTLE_MAX = 15.0         # settle phase after the clients stopped
SEND_TIMEOUT_S = 5        # the gateway's [server] send_timeout
STUCK_PAUSE = 7.0         # stuck reader: no read for this long (> send_timeout)
MUST_FAIL = {             # fault -> (fails when streamed, fails when not)
    "reset": (True, True),
    "stall": (True, True),
    "die_mid_stream": (True, True),
    "stall_mid_stream": (True, True),
    "head_then_die": (True, False),
    "head_then_stall": (True, False),
    "big_headers": (True, True),
    "chunked_json": (False, False),
    "chunked_json_die": (False, True),
}
HONEST_STATUSES = (500, 502, 503, 504)

COMPLETE, HONEST, GAVE_UP, BAD = "COMPLETE", "HONEST", "GAVE_UP", "BAD"
CATS = (COMPLETE, HONEST, GAVE_UP, BAD)

# ---------------------------------------------------------------------------
# Strict HTTP/1.1 response parsing (pure: bytes in, structure out)

_STATUS_RX = re.compile(rb"HTTP/1\.1 ([1-9][0-9]{2}) ([\x20-\x7e\t]*)\Z")
_TOKEN_RX = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_VALUE_RX = re.compile(rb"[\x20-\x7e\t\x80-\xff]*\Z")
_HEX_RX = re.compile(rb"[0-9a-fA-F]{1,16}\Z")


class Parsed:
    def __init__(self):
        self.state = "none"     # none, head, body, complete
        self.error = None       # a framing violation (always BAD)
        self.status = None
        self.headers = []       # [(lower name, value str)]
        self.framing = None     # length, chunked
        self.body = b""
        self.consumed = 0       # bytes of this response
        self.extra = 0          # bytes after its end

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None


def parse_http(raw, method="POST"):
    """Parse one response from the start of 'raw', which may be partial."""
    p = Parsed()
    if not raw:
        return p
    p.state = "head"
    end = raw.find(b"\r\n\r\n")
    head = raw if end < 0 else raw[:end]
    if end < 0 and head.endswith(b"\r"):
        head = head[:-1]            # a CRLF split across two reads
    lines = head.split(b"\r\n")
    # check what we have of the head even when it is partial
    for i, line in enumerate(lines):
        if b"\n" in line or b"\r" in line:
            p.error = "bare CR or LF in the response head"
            return p
        last_partial = end < 0 and i == len(lines) - 1
        if i == 0:
            if last_partial:
                if not b"HTTP/1.1 "[:len(line)] == line[:9]:
                    p.error = "bad status line %r" % line[:80]
                continue
            m = _STATUS_RX.match(line)
            if not m:
                p.error = "bad status line %r" % line[:80]
                return p
            p.status = int(m.group(1))
            continue
        if last_partial:
            continue
        if b":" not in line:
            p.error = "header line without a colon %r" % line[:80]
            return p
        k, v = line.split(b":", 1)
        if not _TOKEN_RX.match(k):
            p.error = "bad header name %r" % k[:80]
            return p
        if not _VALUE_RX.match(v):
            p.error = "control character in header %r" % k
            return p
        p.headers.append((k.decode("latin-1").lower(),
                          v.strip(b" \t").decode("latin-1")))
    if end < 0:
        return p
    if 100 <= p.status < 200:
        p.error = "unexpected 1xx response %d" % p.status
        return p
    pos = end + 4
    p.state = "body"
    te = [v for k, v in p.headers if k == "transfer-encoding"]
    cl = [v for k, v in p.headers if k == "content-length"]
    if p.status in (204, 304) or method == "HEAD":
        if te or cl:
            p.error = "framing fields on a %d" % p.status
            return p
        p.state = "complete"
        p.consumed = pos
        p.extra = len(raw) - pos
        return p
    if te and cl:
        p.error = "both Transfer-Encoding and Content-Length"
        return p
    if te:
        if len(te) != 1 or te[0].lower() != "chunked":
            p.error = "Transfer-Encoding %r" % te
            return p
        p.framing = "chunked"
        parts = []
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                if len(raw) - pos > 64 or b"\n" in raw[pos:]:
                    p.error = "bad chunk size line %r" % raw[pos:pos + 40]
                break
            line = raw[pos:eol].split(b";", 1)[0]
            if not _HEX_RX.match(line):
                p.error = "bad chunk size line %r" % raw[pos:eol][:40]
                break
            size = int(line, 16)
            if size == 0:
                # trailers up to the empty line
                tpos = eol + 2
                while True:
                    teol = raw.find(b"\r\n", tpos)
                    if teol < 0:
                        break
                    if teol == tpos:
                        p.state = "complete"
                        p.consumed = teol + 2
                        break
                    if b":" not in raw[tpos:teol]:
                        p.error = "bad trailer %r" % raw[tpos:teol][:40]
                        break
                    tpos = teol + 2
                break
            dstart = eol + 2
            if len(raw) < dstart + size:
                parts.append(raw[dstart:])
                break
            parts.append(raw[dstart:dstart + size])
            after = raw[dstart + size:dstart + size + 2]
            if after != b"\r\n"[:len(after)]:
                p.error = "chunk data not followed by CRLF (%r)" % after
                break
            if len(after) < 2:
                break
            pos = dstart + size + 2
        p.body = b"".join(parts)
    elif cl:
        if len(cl) != 1 or not re.fullmatch(r"[0-9]{1,15}", cl[0]):
            p.error = "bad Content-Length %r" % cl
            return p
        p.framing = "length"
        n = int(cl[0])
        p.body = raw[pos:pos + n]
        if len(raw) - pos >= n:
            p.state = "complete"
            p.consumed = pos + n
    else:
        p.error = "close-delimited body (no Content-Length, not chunked)"
        return p
    if p.state == "complete":
        p.extra = len(raw) - p.consumed
    return p


def sse_events(body):
    """(complete events as bytes, trailing partial bytes)."""
    evs = body.split(b"\n\n")
    return evs[:-1], evs[-1]


def _event_data(ev):
    """The data of one SSE event, or None if it is not data lines only."""
    out = []
    for line in ev.split(b"\n"):
        if line.startswith(b"data: "):
            out.append(line[6:])
        elif line.startswith(b"data:"):
            out.append(line[5:])
        else:
            return None
    return b"\n".join(out)


def is_openai_error(obj):
    return (isinstance(obj, dict) and isinstance(obj.get("error"), dict)
            and isinstance(obj["error"].get("message"), str))


def check_stream_events(body, route):
    """Validate SSE events.  Returns (problem or None, info dict)."""
    evs, tail = sse_events(body)
    info = {"done": False, "error_last": False, "finish": False,
            "text": "", "tail": tail, "n": len(evs)}
    ids = set()
    want = {"chat": "chat.completion.chunk",
            "completions": "text_completion"}.get(route)
    for i, ev in enumerate(evs):
        d = _event_data(ev)
        if d is None:
            return "event %d is not data lines: %r" % (i, ev[:80]), info
        if info["done"]:
            return "event after [DONE]", info
        if info["error_last"]:
            return "event after an error event", info
        if d == b"[DONE]":
            info["done"] = True
            continue
        try:
            obj = json.loads(d)
        except Exception:
            return "event %d is not JSON: %r" % (i, d[:80]), info
        if not isinstance(obj, dict):
            return "event %d is not a JSON object" % i, info
        if "error" in obj:
            if not is_openai_error(obj):
                return "malformed error event %r" % d[:120], info
            info["error_last"] = True
            info["error_code"] = obj["error"].get("code")
            continue
        if want and obj.get("object") != want:
            return "chunk object %r, not %r" % (obj.get("object"), want), info
        ids.add(obj.get("id"))
        for ch in obj.get("choices") or []:
            if ch.get("finish_reason"):
                info["finish"] = True
            if route == "chat":
                info["text"] += (ch.get("delta") or {}).get("content") or ""
            else:
                info["text"] += ch.get("text") or ""
    if len(ids) > 1:
        return "chunks with %d different ids in one stream" % len(ids), info
    return None, info


def check_json_body(body, route):
    try:
        obj = json.loads(body)
    except Exception:
        return "200 body is not JSON: %r" % body[:80], None
    if not isinstance(obj, dict):
        return "200 body is not a JSON object", None
    want = {"chat": "chat.completion", "completions": "text_completion",
            "embeddings": "list"}[route]
    if obj.get("object") != want:
        return "object %r, not %r" % (obj.get("object"), want), None
    if route == "embeddings":
        if not obj.get("data"):
            return "embeddings without data", None
        return None, json.dumps(obj["data"])
    ch = obj.get("choices") or []
    if not ch:
        return "no choices", None
    if route == "chat":
        return None, (ch[0].get("message") or {}).get("content")
    return None, ch[0].get("text")


def classify(raw, end, req):
    """(category, reason/form, parsed, text).

    raw: every byte received; end: how reading ended: "eof", "reset",
    "timeout" (our deadline), "gave_up" (we closed), "stalled" (stuck
    reader, then eof/reset), "connect" (connect/handshake failed);
    req: dict with stream, route, fault, kind."""
    p = parse_http(raw)
    if end == "connect":
        return BAD, "connect failed: %s" % req.get("connect_error"), p, None
    if p.error:
        return BAD, "framing: " + p.error, p, None
    if end == "gave_up":
        if p.state == "body" or p.state == "complete":
            if (p.header("content-type") or "").startswith(
                    "text/event-stream"):
                prob, _ = check_stream_events(p.body, req["route"])
                if prob:
                    return BAD, "before hang-up: " + prob, p, None
        return GAVE_UP, "client hung up", p, None
    if p.state == "none":
        if end == "timeout":
            return BAD, "no byte within %.0fs (hang)" % REQ_DEADLINE, p, None
        return BAD, "connection %s before any byte" % (
            "reset" if end == "reset" else "closed"), p, None
    if p.state == "head":
        if end == "timeout":
            return BAD, "hang inside the response head", p, None
        return BAD, "cut inside the response head", p, None
    complete = p.state == "complete"
    if complete and p.extra:
        return BAD, "%d bytes after the end of the response" % p.extra, p, None
    if not complete and end == "timeout":
        return BAD, "hang: no end within %.0fs (status %d, %d body bytes)" % (
            REQ_DEADLINE, p.status, len(p.body)), p, None
    ct = p.header("content-type") or ""
    st = p.status
    fault = req.get("fault")
    must_fail = fault and MUST_FAIL[fault][0 if req["stream"] else 1]
    if st in HONEST_STATUSES:
        if not complete:
            return BAD, "%d with a cut body" % st, p, None
        if not ct.startswith("application/json"):
            return BAD, "%d with Content-Type %r" % (st, ct), p, None
        try:
            obj = json.loads(p.body)
        except Exception:
            obj = None
        if not is_openai_error(obj):
            return BAD, "%d body is not an OpenAI error: %r" % (
                st, p.body[:100]), p, None
        return HONEST, "status %d %s" % (st, obj["error"].get("code")), p, None
    if st != 200:
        return BAD, "unexpected status %d" % st, p, None
    if req["stream"]:
        if not ct.startswith("text/event-stream"):
            return BAD, "stream answered with Content-Type %r" % ct, p, None
        prob, info = check_stream_events(p.body, req["route"])
        if prob:
            return BAD, prob, p, None
        if complete:
            if info["error_last"]:
                return BAD, "error event followed by a clean end", p, None
            if info["tail"]:
                return BAD, "clean end inside an SSE event", p, None
            if not info["done"]:
                return BAD, "clean end without data: [DONE]", p, None
            if not info["finish"]:
                return BAD, "no finish_reason before [DONE]", p, None
            if must_fail:
                return BAD, "COMPLETE answer to mock_fault=%s" % fault, p, None
            return COMPLETE, "stream", p, info["text"]
        # cut
        if info["error_last"] and not info["tail"]:
            return HONEST, "sse error event (%s) + cut" % info.get(
                "error_code"), p, None
        if end == "stalled":
            return GAVE_UP, "dropped after stalling past send_timeout", p, None
        if info["done"]:
            return BAD, "[DONE] then cut without the last chunk", p, None
        return BAD, "stream cut without an error event (%d events, %s)" % (
            info["n"], end), p, None
    # not streamed
    if not ct.startswith("application/json"):
        return BAD, "JSON answered with Content-Type %r" % ct, p, None
    if complete:
        prob, text = check_json_body(p.body, req["route"])
        if prob:
            return BAD, prob, p, None
        if must_fail:
            return BAD, "COMPLETE answer to mock_fault=%s" % fault, p, None
        return COMPLETE, "json (%s)" % p.framing, p, text
    if end == "stalled":
        return GAVE_UP, "dropped after stalling past send_timeout", p, None
    return HONEST, "json body cut, %s framing shows it" % p.framing, p, None


# ---------------------------------------------------------------------------
# The client

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
    deadline = t0 + REQ_DEADLINE
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


# ---------------------------------------------------------------------------
# Request bodies and kinds

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


class Soak:
    def __init__(self, args):
        self.args = args
        self.results = []
        self.rlock = threading.Lock()
        self.stop_at = None
        self.groups = 0
        self.texts = {}           # body -> set of texts (COMPLETE only)
        self.text_kinds = {}
        self.bad_server = None
        self.stuck_sem = threading.Semaphore(1)

    def record(self, res, body=None):
        with self.rlock:
            self.results.append(res)
            if body is not None and res.get("cat") == COMPLETE and \
                    res.get("text") is not None:
                self.texts.setdefault(body, set()).add(res["text"])
                self.text_kinds[body] = res["kind"]

    def targets(self, rng):
        if self.tls_target and rng.random() < 0.5:
            return self.tls_target
        return self.plain_target

    # -- kinds ------------------------------------------------------------
    def k_distinct_stream(self, rng):
        body = chat_body("distinct %s" % uuid.uuid4().hex,
                         mock_chunks=rng.randint(4, 16),
                         mock_delay_ms=rng.randint(5, 40))
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "distinct_stream", "stream": True,
                                 "route": "chat"}), body)

    def k_completions_stream(self, rng):
        body = comp_body("text %s" % uuid.uuid4().hex,
                         mock_chunks=rng.randint(4, 12),
                         mock_delay_ms=rng.randint(5, 30))
        self.record(one_request(self.targets(rng), COMP, body,
                                {"kind": "completions_stream",
                                 "stream": True, "route": "completions"}),
                    body)

    def k_nonstream(self, rng):
        # a small pool of prompts so that some coalesce by chance
        body = chat_body("nonstream %d" % rng.randint(0, 50), stream=False,
                         mock_chunks=rng.randint(2, 10), mock_delay_ms=10)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "nonstream", "stream": False,
                                 "route": "chat"}), body)

    def k_embeddings(self, rng):
        body = json.dumps({"model": "mock-model",
                           "input": ["emb %d" % rng.randint(0, 1000)]}
                          ).encode()
        self.record(one_request(self.targets(rng), EMB, body,
                                {"kind": "embeddings", "stream": False,
                                 "route": "embeddings"}), body)

    def k_hangup_mid_stream(self, rng):
        body = chat_body("hangup %s" % uuid.uuid4().hex, mock_chunks=20,
                         mock_delay_ms=30)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "hangup_mid_stream", "stream": True,
                                 "route": "chat"},
                                policy=("events", rng.randint(1, 4))))

    def k_hangup_before_answer(self, rng):
        body = chat_body("early %s" % uuid.uuid4().hex, mock_first_ms=400)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "hangup_before_answer",
                                 "stream": True, "route": "chat"},
                                hangup_before=rng.uniform(0.01, 0.3)))

    def k_slow_reader(self, rng):
        body = chat_body("slow %s" % uuid.uuid4().hex, mock_chunks=40,
                         mock_pad=32768, mock_delay_ms=2)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "slow_reader", "stream": True,
                                 "route": "chat"},
                                policy=("slow", 8192, 0.01), rcvbuf=8192),
                    body)

    def k_stuck_reader(self, rng):
        if not self.stuck_sem.acquire(blocking=False):
            return self.k_slow_reader(rng)    # one at a time (5 MiB each)
        try:
            self._stuck_reader(rng)
        finally:
            self.stuck_sem.release()

    def _stuck_reader(self, rng):
        # 5 MiB: more than the gateway's socket buffer (tcp_wmem max 4 MiB)
        body = chat_body("stuck %s" % uuid.uuid4().hex, mock_chunks=80,
                         mock_pad=65536, mock_delay_ms=5)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "stuck_reader", "stream": True,
                                 "route": "chat"},
                                policy=("stuck", 1000, STUCK_PAUSE),
                                rcvbuf=8192), body)

    def k_fault(self, rng):
        fault = rng.choice(sorted(MUST_FAIL))
        stream = rng.random() < 0.6
        body = chat_body("fault %s %s" % (fault, uuid.uuid4().hex),
                         stream=stream, mock_fault=fault, mock_chunks=6,
                         mock_delay_ms=10)
        kind = "fault_%s_%s" % (fault, "stream" if stream else "json")
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": kind, "stream": stream,
                                 "route": "chat", "fault": fault}), body)

    def k_keepalive_pair(self, rng):
        """Two requests on one connection (the first kept alive)."""
        t = self.targets(rng)
        t0 = time.monotonic()
        deadline = t0 + REQ_DEADLINE
        b1 = chat_body("ka1 %s" % uuid.uuid4().hex, stream=False,
                       mock_chunks=3)
        b2 = chat_body("ka2 %s" % uuid.uuid4().hex, mock_chunks=5)
        r1 = {"kind": "keepalive_pair", "stream": False, "route": "chat"}
        r2 = {"kind": "keepalive_pair", "stream": True, "route": "chat"}
        try:
            s = open_conn(t, deadline)
        except Exception as e:
            cat, why, _, _ = classify(b"", "connect",
                                      dict(r1, connect_error=repr(e)))
            self.record({"kind": "keepalive_pair", "transport": t.name,
                         "cat": cat, "why": why, "raw": b"", "dur": 0})
            return
        try:
            s.settimeout(5)
            s.sendall(build_request(CHAT, b1, close=False))
            raw, end, _ = read_response(s, deadline, ("keepalive",))
            p = parse_http(raw)
            res1 = {"kind": "keepalive_pair", "transport": t.name, "t0": t0}
            if p.state == "complete":
                leftover = raw[p.consumed:]
                cat, why, p1, text = classify(raw[:p.consumed], "eof", r1)
                if leftover:
                    cat, why = BAD, "bytes after a kept-alive response"
                res1.update(cat=cat, why=why, raw=raw, text=text,
                            rid=p.header("x-request-id"), dur=0)
                self.record(res1, b1)
                if p.status == 200 and not leftover and not \
                        (p.header("connection") or "").lower() == "close":
                    s.sendall(build_request(CHAT, b2, close=True))
                    raw2, end2, _ = read_response(s, deadline)
                    cat, why, p2, text = classify(raw2, end2, r2)
                    self.record({"kind": "keepalive_pair",
                                 "transport": t.name, "cat": cat,
                                 "why": "2nd: " + why, "raw": raw2,
                                 "text": text, "dur": time.monotonic() - t0,
                                 "rid": p2.header("x-request-id")}, b2)
            else:
                cat, why, p1, text = classify(raw, end, r1)
                res1.update(cat=cat, why=why, raw=raw, text=text, dur=0,
                            rid=p1.header("x-request-id"))
                self.record(res1, b1)
        except Exception as e:
            self.record({"kind": "keepalive_pair", "transport": t.name,
                         "cat": BAD, "why": "client error %r" % e,
                         "raw": b"", "dur": 0})
        finally:
            close_conn(s)

    def k_coalesced(self, rng, fault=None):
        """3..6 identical streams at once; some join late, one may hang
        up, one may read slowly; plain and TLS mixed."""
        n = rng.randint(3, 6)
        big = rng.random() < 0.25
        kw = {"mock_chunks": 12, "mock_first_ms": 150, "mock_delay_ms": 25}
        if big:
            kw.update(mock_chunks=24, mock_pad=16384, mock_delay_ms=10)
        if fault:
            kw["mock_fault"] = fault
        stream = not (fault is None and rng.random() < 0.2)
        body = chat_body("group %s" % uuid.uuid4().hex, stream=stream, **kw)
        kind = "coalesced_" + (("fault_" + fault) if fault else
                               ("stream" if stream else "json"))
        roles = ["normal"] * n
        if stream and rng.random() < 0.35:
            roles[rng.randrange(n)] = "hangup"
        if stream and rng.random() < 0.35:
            roles[rng.randrange(n)] = "slow"
        barrier = threading.Barrier(n)
        with self.rlock:
            self.groups += 1

        def member(i):
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass
            if i >= n - 1 and rng.random() < 0.5:
                time.sleep(rng.uniform(0.05, 0.4))     # a late joiner
            pol, rcv = None, None
            if roles[i] == "hangup":
                pol = ("events", rng.randint(1, 3))
            elif roles[i] == "slow":
                pol, rcv = ("slow", 4096, 0.01), 8192
            tgt = (self.tls_target if self.tls_target and i % 2
                   else self.plain_target)
            res = one_request(tgt, CHAT, body,
                              {"kind": kind, "stream": stream,
                               "route": "chat", "fault": fault},
                              policy=pol, rcvbuf=rcv)
            res["group_role"] = roles[i]
            self.record(res, body)

        ths = [threading.Thread(target=member, args=(i,), daemon=True)
               for i in range(1, n)]
        for t in ths:
            t.start()
        member(0)
        for t in ths:
            t.join(REQ_DEADLINE + 8)

    def k_coalesced_fault(self, rng):
        self.k_coalesced(rng, fault=rng.choice(
            ["die_mid_stream", "stall_mid_stream", "stall", "reset"]))

    def k_injected_bug(self, rng):
        body = chat_body("injected")
        self.record(one_request(Target(self.bad_server.port), CHAT, body,
                                {"kind": "injected_bug", "stream": True,
                                 "route": "chat"}))

    KINDS = [  # (weight, method name)
        (16, "k_coalesced"),
        (16, "k_distinct_stream"),
        (5, "k_completions_stream"),
        (9, "k_nonstream"),
        (3, "k_embeddings"),
        (7, "k_hangup_mid_stream"),
        (3, "k_hangup_before_answer"),
        (5, "k_slow_reader"),
        (1, "k_stuck_reader"),
        (7, "k_fault"),
        (2, "k_coalesced_fault"),
        (4, "k_keepalive_pair"),
    ]

    def worker(self, idx):
        rng = random.Random(self.args.seed * 1000 + idx)
        kinds = list(self.KINDS)
        if self.args.inject_bug:
            kinds.append((3, "k_injected_bug"))
        names = [k for _, k in kinds]
        weights = [w for w, _ in kinds]
        time.sleep(rng.uniform(0, 1.0))      # spread the start
        while time.monotonic() < self.stop_at:
            name = rng.choices(names, weights)[0]
            try:
                getattr(self, name)(rng)
            except Exception as e:
                self.record({"kind": name[2:], "transport": "?", "cat": BAD,
                             "why": "client exception %r" % e, "raw": b"",
                             "dur": 0})


# ---------------------------------------------------------------------------
# Processes

class Proc:
    """A child whose stdout is read by a thread into a log file."""

    def __init__(self, argv, logpath, ready_rx, timeout=10.0, on_line=None):
        self.argv = argv
        self.logpath = logpath
        self.lines_seen = []
        self.cond = threading.Condition()
        self.eof = False
        self.on_line = on_line
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.log = open(logpath, "a")
        self.keep = 200               # early lines kept in memory
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.wait_line(ready_rx, timeout) if ready_rx else None

    def _read(self):
        for raw in iter(self.p.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.write(line + "\n")
            if self.on_line:
                self.on_line(line)
            with self.cond:
                if len(self.lines_seen) < self.keep:
                    self.lines_seen.append(line)
                self.cond.notify_all()
        self.log.flush()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_line(self, rx, timeout):
        rx = re.compile(rx)
        deadline = time.monotonic() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.lines_seen):
                    m = rx.search(self.lines_seen[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.2))

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def kill(self):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
            except OSError:
                pass
            try:
                self.p.kill()
            except OSError:
                pass
        try:
            self.p.wait(timeout=5)
        except Exception:
            pass


def simple_http(port, method, path, body=b"", timeout=3.0):
    """A tiny client for control requests: (status, body) or None."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return None
    try:
        s.settimeout(timeout)
        s.sendall(build_request(path, body, method=method)
                  if method == "POST" else
                  ("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
                   "\r\n\r\n" % (method, path)).encode())
        raw = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            raw += d
            p = parse_http(raw, method)
            if p.state == "complete":
                break
    except OSError:
        return None
    finally:
        s.close()
    p = parse_http(raw, method)
    if p.state != "complete":
        return None
    return p.status, p.body


class Mock:
    def __init__(self, bindir, tmp, name, port=0):
        self.bindir, self.tmp, self.name = bindir, tmp, name
        self.port = None
        self.stopped = False
        self.start(port)

    def start(self, port=0):
        exe = os.path.join(self.bindir, "mock_upstream")
        self.proc = Proc([exe, "-l", "127.0.0.1:%d" % port, "-q",
                          "-n", "8", "-d", "20"],
                         os.path.join(self.tmp, self.name + ".log"),
                         r"mock_upstream listening port=(\d+)")
        if not self.proc.ready:
            self.proc.kill()
            return False
        self.port = int(self.proc.ready.group(1))
        return True

    def control(self, query):
        return simple_http(self.port, "POST", "/control?" + query, b"")


# ---------------------------------------------------------------------------
# /proc sampling

def _inode_map():
    """socket inode -> (local port, remote port, state); unix sockets map
    to (None, None, "unix")."""
    m = {}
    try:
        with open("/proc/net/unix") as fh:
            next(fh)
            for line in fh:
                a = line.split()
                if len(a) >= 7:
                    m[a[6]] = (None, None, "unix")
    except (OSError, StopIteration):
        pass
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(f) as fh:
                next(fh)
                for line in fh:
                    a = line.split()
                    lp = int(a[1].rsplit(":", 1)[1], 16)
                    rp = int(a[2].rsplit(":", 1)[1], 16)
                    m[a[9]] = (lp, rp, a[3])
        except (OSError, StopIteration, IndexError, ValueError):
            pass
    return m


TCP_STATES = {"01": "ESTABLISHED", "08": "CLOSE_WAIT", "0A": "LISTEN",
              "06": "TIME_WAIT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "07": "CLOSE", "09": "LAST_ACK", "0B": "CLOSING",
              "02": "SYN_SENT", "03": "SYN_RECV"}


def sample(pid, gw_ports, mock_ports):
    s = {"t": time.monotonic()}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    s["rss"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    s["threads"] = int(line.split()[1])
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    inodes = _inode_map()
    s.update(fds=len(fds), client=0, upstream=0, listen=0, unix=0,
             othersock=0, nonsock=0, up_states={})
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if not link.startswith("socket:["):
            s["nonsock"] += 1
            continue
        info = inodes.get(link[8:-1])
        if info is None:
            s["othersock"] += 1
        elif info[2] == "unix":
            s["unix"] += 1
        elif info[2] == "0A":
            s["listen"] += 1
        elif info[0] in gw_ports:
            s["client"] += 1
        elif info[1] in mock_ports:
            s["upstream"] += 1
            st = TCP_STATES.get(info[2], info[2])
            s["up_states"][st] = s["up_states"].get(st, 0) + 1
        else:
            s["othersock"] += 1
    s["conns_client_side"] = OPEN_CONNS[0]
    return s


# ---------------------------------------------------------------------------
# The canned bad server (self-test, --inject-bug)

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
                time.sleep(REQ_DEADLINE + 2)
        except Exception:
            pass
        finally:
            try:
                c.close()
            except Exception:
                pass


def self_test(args):
    global REQ_DEADLINE
    REQ_DEADLINE = 2.0           # the hang case waits this long
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
        t.join(REQ_DEADLINE + 10)
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


def text_mismatches(soak):
    return [(soak.text_kinds[b], sorted(t)) for b, t in soak.texts.items()
            if len(t) > 1]


# ---------------------------------------------------------------------------
# TLS

def ensure_certs(args):
    d = os.path.abspath(args.tls)
    need = ["ca.pem", "server.pem", "server.key"]
    if not all(os.path.exists(os.path.join(d, f)) for f in need):
        mk = os.path.join(args.bin or "", "mkcert")
        if args.bin and os.access(mk, os.X_OK):
            os.makedirs(d, exist_ok=True)
            r = subprocess.run([mk, d], capture_output=True, timeout=60)
            if r.returncode != 0:
                print("soak: %s %s failed: %s" % (mk, d, r.stderr.decode()))
                sys.exit(2)
        else:
            print("soak: --tls %s needs ca.pem, server.pem, server.key "
                  "(make them with BIN/mkcert DIR)" % d)
            sys.exit(2)
    return d


def client_tls_ctx(cert_dir):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(cert_dir, "ca.pem"))
    ctx.check_hostname = True
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


# ---------------------------------------------------------------------------
# Chaos

class Chaos:
    def __init__(self, soak, mocks, rng):
        self.soak, self.mocks, self.rng = soak, mocks, rng
        self.log = []
        self.kills = 0
        self.dead = set()
        self.stop = threading.Event()

    def note(self, msg):
        self.log.append((time.monotonic() - self.soak.t_start, msg))

    def run(self, until):
        actions = ["status503", "status500", "fault_stall", "fault_die",
                   "fault_head_then_die", "fault_reset", "health503",
                   "sigstop", "sigstop", "kill"]
        last = None
        time.sleep(3)
        while not self.stop.is_set() and time.monotonic() < until:
            live = [m for m in self.mocks if m.name not in self.dead]
            cands = [m for m in live if m is not last] or live
            if not cands:
                break
            m = self.rng.choice(cands)
            last = m
            a = self.rng.choice(actions)
            if a == "kill" and (self.kills >= 2 or
                                time.monotonic() > until - 15):
                a = "sigstop"
            hold = self.rng.uniform(3, 6)
            try:
                self.do(m, a, hold)
            except Exception as e:       # never leave the chaos thread
                self.note("%s %s raised %r" % (m.name, a, e))
            self.stop.wait(self.rng.uniform(1, 4))

    def do(self, m, a, hold):
        q = {"status503": ("status=503&retry_after=1", "status=0"),
             "status500": ("status=500", "status=0"),
             "fault_stall": ("fault=stall", "fault=none"),
             "fault_die": ("fault=die_mid_stream", "fault=none"),
             "fault_head_then_die": ("fault=head_then_die", "fault=none"),
             "fault_reset": ("fault=reset", "fault=none"),
             "health503": ("health=503", "health=0")}
        if a in q:
            on, off = q[a]
            r = m.control(on)
            self.note("%s %s %s" % (m.name, on, "ok" if r and r[0] == 200
                                    else "FAILED %r" % (r,)))
            self.stop.wait(hold)
            r = m.control(off)
            if not r or r[0] != 200:
                time.sleep(0.5)
                r = m.control(off)
            self.note("%s %s %s" % (m.name, off, "ok" if r and r[0] == 200
                                    else "FAILED %r" % (r,)))
        elif a == "sigstop":
            os.kill(m.proc.pid, signal.SIGSTOP)
            m.stopped = True
            self.note("%s SIGSTOP" % m.name)
            self.stop.wait(hold)
            os.kill(m.proc.pid, signal.SIGCONT)
            m.stopped = False
            self.note("%s SIGCONT" % m.name)
        elif a == "kill":
            self.kills += 1
            port = m.port
            m.proc.kill()
            self.note("%s SIGKILL (port %d)" % (m.name, port))
            self.stop.wait(3)
            t_end = time.monotonic() + 5
            while True:
                if m.start(port):
                    self.note("%s restarted on port %d" % (m.name, port))
                    break
                if time.monotonic() > t_end:
                    self.dead.add(m.name)
                    self.note("%s could not be restarted on port %d; "
                              "left dead" % (m.name, port))
                    break
                time.sleep(0.5)

    def undo_all(self):
        for m in self.mocks:
            if m.name in self.dead or not m.proc.alive():
                continue
            try:
                os.kill(m.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            m.control("status=0&fault=none&health=0")


# ---------------------------------------------------------------------------
# The run

def gw_log_counter():
    counts = {}
    lock = threading.Lock()
    rx = re.compile(r"level=(warn|error)\s+(?:req=\S+\s+)?(.*)$")

    def on_line(line):
        m = rx.search(line)
        if not m:
            return
        msg = m.group(2)
        # keep the message up to the first key=value (or a reason)
        short = re.sub(r'\s+\w+=.*$', "", msg)
        reason = re.search(r'reason="([^"]*)"', msg)
        key = "%s %s%s" % (m.group(1), short,
                           (" reason=" + reason.group(1)) if reason else "")
        with lock:
            counts[key] = counts.get(key, 0) + 1
    return counts, on_line


def percentile(xs, q):
    if not xs:
        return 0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def fmt_kb(kb):
    return "%.1f MiB" % (kb / 1024.0)


def run_soak(args):
    bindir = os.path.abspath(args.bin)
    for exe in ("infergw", "mock_upstream"):
        if not os.access(os.path.join(bindir, exe), os.X_OK):
            print("soak: no %s in %s (make BUILD=build/soak all)"
                  % (exe, bindir))
            return 2
    tmp = tempfile.mkdtemp(prefix="infergw-soak-")
    procs = []
    soak = Soak(args)
    soak.t_start = time.monotonic()
    hard_end = soak.t_start + args.seconds + 45

    def watchdog():
        while time.monotonic() < hard_end:
            time.sleep(1)
        print("soak: WATCHDOG: the run overran; killing everything",
              flush=True)
        for p in procs + [m.proc for m in mocks]:
            p.kill()
        os._exit(3)
    threading.Thread(target=watchdog, daemon=True).start()

    mocks = []
    try:
        for i in range(args.mocks):
            m = Mock(bindir, tmp, "m%d" % i)
            if not m.port:
                print("soak: mock m%d did not start" % i)
                return 2
            mocks.append(m)
            procs.append(m.proc)
        cert_dir = None
        tls_port = None
        conf = ["[server]", "listen = 127.0.0.1:0",
                "send_timeout = %ds" % SEND_TIMEOUT_S, "log_level = info",
                "access_log = on"]
        if args.tls:
            cert_dir = ensure_certs(args)
            ps = socket.socket()
            ps.bind(("127.0.0.1", 0))
            tls_port = ps.getsockname()[1]
            ps.close()
            conf += ["tls_listen = 127.0.0.1:%d" % tls_port,
                     "tls_cert = %s" % os.path.join(cert_dir, "server.pem"),
                     "tls_key = %s" % os.path.join(cert_dir, "server.key")]
        conf += ["", "[routing]", "first_byte_timeout = 2s",
                 "idle_timeout = 2s", "health_interval = 1s",
                 "eject_time = 2s", "connect_timeout = 2s",
                 "eject_after = %d" % args.eject_after, "",
                 "[coalesce]", "enabled = on", ""]
        for m in mocks:
            conf += ["[upstream %s]" % m.name,
                     "url = http://127.0.0.1:%d" % m.port,
                     "models = mock-model", ""]
        conf_path = os.path.join(tmp, "gateway.conf")
        with open(conf_path, "w") as f:
            f.write("\n".join(conf))
        counts, on_line = gw_log_counter()
        gw = Proc([os.path.join(bindir, "infergw"), "-c", conf_path],
                  os.path.join(tmp, "gateway.log"),
                  r"server: listening.*\bport=(\d+)", on_line=on_line)
        procs.append(gw)
        if not gw.ready:
            text = "\n".join(gw.lines_seen[-10:])
            rc = gw.p.poll()
            if args.tls and ("tls" in text.lower() or rc == 2):
                print("soak: this gateway does not accept the TLS settings "
                      "(exit %r):\n%s\nsoak: --tls needs a gateway with TLS "
                      "termination ([server] tls_listen); run without --tls"
                      % (rc, text))
                return 2
            print("soak: the gateway did not start (exit %r):\n%s"
                  % (rc, text))
            return 2
        gw_ports = set()
        time.sleep(0.3)
        for line in gw.lines_seen:
            m_ = re.search(r"server: listening.*\bport=(\d+)", line)
            if m_:
                gw_ports.add(int(m_.group(1)))
        plain_port = int(gw.ready.group(1))
        soak.plain_target = Target(plain_port, None, "plain")
        soak.tls_target = None
        if args.tls:
            ctx = client_tls_ctx(cert_dir)
            ok, err = False, None
            t_end = time.monotonic() + 5
            while time.monotonic() < t_end and not ok:
                try:
                    s = socket.create_connection(("127.0.0.1", tls_port),
                                                 timeout=2)
                    s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
                    s.close()
                    ok = True
                except Exception as e:
                    err = e
                    time.sleep(0.3)
            if not ok:
                print("soak: the gateway started but does not serve TLS on "
                      "tls_listen 127.0.0.1:%d (%r): this infergw has no TLS "
                      "termination yet; run without --tls" % (tls_port, err))
                return 2
            gw_ports.add(tls_port)
            soak.tls_target = Target(tls_port, ctx, "tls")
        if args.inject_bug:
            soak.bad_server = CannedServer()
        mock_ports = {m.port for m in mocks}

        # warm-up requests, then the baseline
        for body, st, route, path in (
                (chat_body("warm stream"), True, "chat", CHAT),
                (chat_body("warm json", stream=False), False, "chat", CHAT)):
            for t in [soak.plain_target] + ([soak.tls_target]
                                             if soak.tls_target else []):
                r = one_request(t, path, body, {"kind": "warm",
                                                "stream": st, "route": route})
                if r["cat"] != COMPLETE:
                    print("soak: warm request failed: %s %s"
                          % (r["cat"], r["why"]))
                    return 2
        time.sleep(2)
        base = sample(gw.pid, gw_ports, mock_ports)
        print("soak: %d mocks %s, gateway pid %d port %d%s, %d clients, "
              "%d s, temp %s" % (
                  len(mocks), sorted(mock_ports), gw.pid, plain_port,
                  (" tls %d" % tls_port) if tls_port else "", args.clients,
                  args.seconds, tmp), flush=True)
        r = simple_http(plain_port, "GET", "/metrics")
        soak.base_metrics = r[1].decode("utf-8", "replace") if r else ""
        print("soak: baseline rss %s fds %d (client %d upstream %d listen %d"
              " unix %d other sockets %d non-socket %d) threads %d" % (
                  fmt_kb(base["rss"]), base["fds"], base["client"],
                  base["upstream"], base["listen"], base["unix"],
                  base["othersock"], base["nonsock"], base["threads"]),
              flush=True)

        # the load
        samples = []
        t_load = time.monotonic()
        soak.t_start = t_load
        soak.stop_at = t_load + args.seconds
        hard_end = soak.stop_at + 45
        stop_sampling = threading.Event()

        def sampler():
            while not stop_sampling.is_set():
                s = sample(gw.pid, gw_ports, mock_ports)
                if s:
                    samples.append(s)
                stop_sampling.wait(1.0)
        threading.Thread(target=sampler, daemon=True).start()
        chaos = Chaos(soak, mocks, random.Random(args.seed + 7))
        ch_t = threading.Thread(target=chaos.run,
                                args=(t_load + 0.85 * args.seconds,),
                                daemon=True)
        ch_t.start()
        workers = [threading.Thread(target=soak.worker, args=(i,),
                                    daemon=True)
                   for i in range(args.clients)]
        for w in workers:
            w.start()
        next_print = t_load + 15
        while time.monotonic() < soak.stop_at:
            time.sleep(0.5)
            if not gw.alive():
                break
            if time.monotonic() >= next_print and samples:
                s = samples[-1]
                with soak.rlock:
                    n = len(soak.results)
                    nb = sum(1 for r in soak.results if r["cat"] == BAD)
                print("soak: t=%3.0fs responses %d bad %d | rss %s fds %d "
                      "threads %d clients-open %d" % (
                          time.monotonic() - t_load, n, nb, fmt_kb(s["rss"]),
                          s["fds"], s["threads"], OPEN_CONNS[0]), flush=True)
                next_print += 15
        # stop: no new requests; wait for the ones under way
        join_end = soak.stop_at + REQ_DEADLINE + 10
        for w in workers:
            w.join(max(0.0, join_end - time.monotonic()))
        stragglers = sum(1 for w in workers if w.is_alive())
        chaos.stop.set()
        ch_t.join(10)
        chaos.undo_all()
        t_clients_done = time.monotonic()
        # settle: poll until back to baseline or SETTLE_MAX
        settle_end = time.monotonic() + SETTLE_MAX
        final = None
        while time.monotonic() < settle_end and gw.alive():
            final = sample(gw.pid, gw_ports, mock_ports)
            if final and final["threads"] <= base["threads"] and \
                    final["client"] == 0 and \
                    final["nonsock"] <= base["nonsock"]:
                break
            time.sleep(0.5)
        settle_s = time.monotonic() - t_clients_done
        stop_sampling.set()
        gw_alive = gw.alive()
        metrics = None
        still_serves = None
        if gw_alive:
            time.sleep(0.2)
            final = sample(gw.pid, gw_ports, mock_ports) or final
            r = simple_http(plain_port, "GET", "/metrics")
            metrics = r[1].decode("utf-8", "replace") if r else None
            r = one_request(soak.plain_target, CHAT, chat_body("after"),
                            {"kind": "after", "stream": True,
                             "route": "chat"})
            still_serves = r["cat"] == COMPLETE
        rc = report(args, soak, base, samples, final, t_load,
                    t_clients_done, settle_s, stragglers, gw, gw_alive,
                    metrics, still_serves, counts, chaos, mocks, tmp)
        return rc
    finally:
        for p in procs:
            p.kill()
        for m in mocks:
            m.proc.kill()
        if not args.keep and not getattr(soak, "keep_tmp", False):
            shutil.rmtree(tmp, ignore_errors=True)


def metric_sum(text, name, label_filter=None):
    tot = 0.0
    found = False
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if label_filter and label_filter not in (m.group(2) or ""):
            continue
        try:
            tot += float(m.group(3))
            found = True
        except ValueError:
            pass
    return tot if found else None


def metric_by_label(text, name, label):
    out = {}
    for line in (text or "").splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        lm = re.search(r'%s="([^"]*)"' % label, m.group(2))
        k = lm.group(1) if lm else "?"
        out[k] = out.get(k, 0) + float(m.group(3))
    return out


def report(args, soak, base, samples, final, t_load, t_done, settle_s,
           stragglers, gw, gw_alive, metrics, still_serves, counts, chaos,
           mocks, tmp):
    res = soak.results
    print()
    print("=" * 78)
    print("infergw fault soak: %d s, %d clients, %d mocks, %s" % (
        args.seconds, args.clients, len(mocks),
        "plain + TLS" if args.tls else "plain"))
    print("=" * 78)
    # --- responses
    mism = text_mismatches(soak)
    bad = [r for r in res if r["cat"] == BAD]
    tot = {c: sum(1 for r in res if r["cat"] == c) for c in CATS}
    print("responses: %d   COMPLETE %d   HONEST ERROR %d   CLIENT GAVE UP "
          "%d   BAD %d" % (len(res), tot[COMPLETE], tot[HONEST],
                           tot[GAVE_UP], tot[BAD]))
    print("  (%.1f responses/s; peak concurrent client connections %d; "
          "coalesced groups %d)" % (len(res) / max(1, args.seconds),
                                    OPEN_CONNS[1], soak.groups))
    kinds = sorted(set(r["kind"] for r in res))
    print("\n%-34s %6s %8s %7s %7s %4s %7s %7s" % (
        "kind", "n", "COMPLETE", "HONEST", "GAVE_UP", "BAD", "p50 s",
        "max s"))
    for k in kinds:
        rs = [r for r in res if r["kind"] == k]
        durs = [r["dur"] for r in rs if r.get("dur")]
        print("%-34s %6d %8d %7d %7d %4d %7.2f %7.2f" % (
            k, len(rs), *[sum(1 for r in rs if r["cat"] == c) for c in CATS],
            percentile(durs, 0.5), max(durs) if durs else 0))
    if args.tls:
        for tr in ("plain", "tls"):
            rs = [r for r in res if r.get("transport") == tr]
            print("transport %-5s: %d responses, %s" % (
                tr, len(rs), ", ".join("%s %d" % (c, sum(
                    1 for r in rs if r["cat"] == c)) for c in CATS)))
    forms = {}
    for r in res:
        if r["cat"] in (HONEST, GAVE_UP):
            forms[r["cat"] + ": " + r["why"]] = forms.get(
                r["cat"] + ": " + r["why"], 0) + 1
    print("\nhonest errors and give-ups, by form:")
    for k, v in sorted(forms.items(), key=lambda kv: -kv[1]):
        print("  %6d  %s" % (v, k))
    roles = {}
    for r in res:
        if r["kind"].startswith("coalesced") and r.get("role"):
            roles[r["role"]] = roles.get(r["role"], 0) + 1
    print("coalesced-group members by X-Infergw-Coalesce: %s" % (
        ", ".join("%s %d" % kv for kv in sorted(roles.items())) or "none"))
    n_ident = sum(1 for b, t in soak.texts.items()
                  if len(t) == 1 and soak.text_kinds[b].startswith(
                      "coalesced"))
    print("identical bodies giving identical text: %d groups checked, %d "
          "mismatches" % (n_ident + len(mism), len(mism)))
    if bad or mism:
        soak.keep_tmp = True
        bd = os.path.join(tmp, "bad")
        os.makedirs(bd, exist_ok=True)
        print("\nBAD responses (first 25; raw bytes in %s):" % bd)
        for i, r in enumerate(bad):
            with open(os.path.join(bd, "%04d-%s.raw" % (i, r["kind"])),
                      "wb") as f:
                f.write(r.get("raw") or b"")
            if i < 25:
                print("  %-30s %-5s req=%s  %s" % (
                    r["kind"], r.get("transport"), r.get("rid"), r["why"]))
        for k, t in mism[:10]:
            print("  %-30s different completion texts for one body: %r"
                  % (k, t))
    # --- resources
    try:
        with open(os.path.join(tmp, "samples.csv"), "w") as f:
            keys = ["rss", "threads", "fds", "client", "upstream", "unix",
                    "othersock", "nonsock", "conns_client_side"]
            f.write("t," + ",".join(keys) + "\n")
            for s in samples:
                f.write("%.1f," % (s["t"] - t_load)
                        + ",".join(str(s[k]) for k in keys) + "\n")
    except OSError:
        pass
    print("\nresources of the gateway (pid %d), sampled every 1 s (%d "
          "samples):" % (gw.pid, len(samples)))
    dur = args.seconds
    warm = t_load + 0.2 * dur
    steady = [s for s in samples if warm <= s["t"] <= t_load + dur]
    q1 = [s for s in steady if s["t"] < warm + 0.25 * (t_load + dur - warm)]
    h2 = [s for s in steady if s["t"] >= warm + 0.5 * (t_load + dur - warm)]
    at_warm = min(samples, key=lambda s: abs(s["t"] - warm)) if samples \
        else None

    def row(name, key, conv=lambda v: str(v)):
        vals = [s[key] for s in steady]
        if not vals:
            return
        print("  %-22s %10s %10s %10s %10s %10s %10s" % (
            name, conv(base[key]), conv(at_warm[key]) if at_warm else "-",
            conv(min(vals)), conv(int(statistics.median(vals))),
            conv(max(vals)), conv(final[key]) if final else "-"))
    print("  %-22s %10s %10s %10s %10s %10s %10s" % (
        "", "baseline", "@warm-up", "min", "median", "max", "end"))
    row("RSS", "rss", fmt_kb)
    row("threads", "threads")
    row("descriptors", "fds")
    row("  client sockets", "client")
    row("  upstream sockets", "upstream")
    row("  unix sockets", "unix")
    row("  other sockets", "othersock")
    row("  non-socket fds", "nonsock")
    if steady and len(steady) > 5:
        xs = [s["t"] - t_load for s in steady]
        ys = [s["rss"] for s in steady]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        den = sum((x - mx) ** 2 for x in xs) or 1
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den
        print("  RSS trend over the steady part: %+.1f KiB/min" % (
            slope * 60))
    ups = {}
    for s in samples:
        for k, v in s["up_states"].items():
            ups[k] = max(ups.get(k, 0), v)
    print("  upstream socket states, max seen: %s; at the end: %s" % (
        ups, final["up_states"] if final else "-"))
    verdicts = []
    if q1 and h2:
        q1max = max(s["rss"] for s in q1)
        h2max = max(s["rss"] for s in h2)
        peak = OPEN_CONNS[1]
        thr_max = max(s["threads"] for s in steady)
        fd_max = max(s["fds"] for s in steady)
        thr_bound = base["threads"] + peak + 16
        fd_bound = base["fds"] + 3 * peak + 32
        flat = (h2max <= 1.2 * q1max and thr_max <= thr_bound
                and fd_max <= fd_bound)
        name = "flat after warm-up"
        if dur < 120:
            name += " (not judged: runs under 120 s are too short)"
            flat = True
        verdicts.append((name, flat,
                         "RSS max 2nd half %s <= 1.2 x %s (1st steady "
                         "quarter) = %s: %s; threads max %d <= %d "
                         "(baseline + peak clients %d + 16): %s; fds max %d "
                         "<= %d (baseline + 3 x %d + 32): %s" % (
                             fmt_kb(h2max), fmt_kb(q1max),
                             fmt_kb(1.2 * q1max), h2max <= 1.2 * q1max,
                             thr_max, thr_bound, peak, thr_max <= thr_bound,
                             fd_max, fd_bound, peak, fd_max <= fd_bound)))
    else:
        verdicts.append(("flat after warm-up", False, "too few samples"))
    if final:
        # What may stay: idle upstream sessions (upstream.c keeps up to
        # max_connections of them), each a libcurl multi handle with its
        # wake-up socketpair (2 unix sockets) and up to 4 kept-alive
        # upstream connections.  They are bounded by the peak number of
        # calls at once, not by time: judged against the steady maximum.
        sessions = final["unix"] // 2
        base_sessions = base["unix"] // 2
        unix_max = max([s["unix"] for s in steady] or [0])
        explained = (base["fds"] + (final["unix"] - base["unix"])
                     + (final["upstream"] - base["upstream"]))
        back = (final["threads"] == base["threads"] and final["client"] == 0
                and final["nonsock"] == base["nonsock"]
                and final["listen"] == base["listen"]
                and final["othersock"] <= base["othersock"]
                and final["unix"] <= unix_max
                and final["upstream"] <= 4 * max(1, sessions)
                and final["fds"] == explained)
        verdicts.append(("back to baseline", back,
                         "after %.1f s: threads %d (baseline %d); client "
                         "sockets %d; non-socket fds %d (baseline %d); fds "
                         "%d = baseline %d + %d idle upstream sessions' "
                         "socketpairs (%d -> %d sessions, steady max %d) + "
                         "%d more kept-alive upstream connections (%d, "
                         "baseline %d); RSS %s (baseline %s, +%s: not "
                         "judged, glibc keeps freed memory)" % (
                             settle_s, final["threads"], base["threads"],
                             final["client"], final["nonsock"],
                             base["nonsock"], final["fds"], base["fds"],
                             final["unix"] - base["unix"], base_sessions,
                             sessions, unix_max // 2,
                             final["upstream"] - base["upstream"],
                             final["upstream"], base["upstream"],
                             fmt_kb(final["rss"]), fmt_kb(base["rss"]),
                             fmt_kb(final["rss"] - base["rss"]))))
    else:
        verdicts.append(("back to baseline", False, "no final sample"))
    no_bad = not bad and not mism
    verdicts.append(("no BAD response", no_bad, "%d BAD, %d text mismatches"
                     % (len(bad), len(mism))))
    verdicts.append(("gateway alive at the end", gw_alive,
                     "exit status %r" % (gw.p.poll(),)))
    if gw_alive:
        verdicts.append(("gateway still serves after the soak",
                         bool(still_serves), ""))
    if stragglers:
        verdicts.append(("clients all finished", False,
                         "%d worker threads still running" % stragglers))
    # --- gateway's view
    if metrics:
        print("\ngateway /metrics at the end:")
        for name in ("infergw_connections_total", "infergw_connections_active",
                     "infergw_flights_active", "infergw_coalesce_parked",
                     "infergw_coalesce_leaders_total",
                     "infergw_coalesce_followers_total",
                     "infergw_upstream_retries_total",
                     "infergw_upstream_hedges_total",
                     "infergw_upstream_retry_budget_exhausted_total",
                     "infergw_upstream_unavailable_total",
                     "infergw_upstream_ejections_total"):
            v = metric_sum(metrics, name)
            print("  %-48s %s" % (name, "-" if v is None else "%g" % v))
        print("  %-48s %s" % ("infergw_upstream_failures_total by kind",
                              metric_by_label(
                                  metrics, "infergw_upstream_failures_total",
                                  "kind")))
        print("  %-48s %s" % ("infergw_coalesce_bypass_total by reason",
                              metric_by_label(
                                  metrics, "infergw_coalesce_bypass_total",
                                  "reason")))
        for name in ("infergw_connections_active", "infergw_flights_active",
                     "infergw_coalesce_parked", "infergw_upstream_open_calls",
                     "infergw_upstream_queued"):
            v = metric_sum(metrics, name) or 0
            b = metric_sum(getattr(soak, "base_metrics", ""), name) or 0
            verdicts.append(("%s back to baseline" % name, v == b,
                             "%g (baseline %g; the scrape itself counts as "
                             "one connection)" % (v, b)))
    print("\ngateway warn/error log lines (%d kinds):" % len(counts))
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:20]:
        print("  %6d  %s" % (v, k))
    print("\nchaos (%d actions):" % len(chaos.log))
    for t, msg in chaos.log:
        if "SIG" in msg or "restart" in msg or "FAILED" in msg or \
                "dead" in msg:
            print("  t=%5.1fs %s" % (t, msg))
    kinds_c = {}
    for t, msg in chaos.log:
        k = msg.split(" ", 1)[1].split(" ")[0]
        if "=" in k and not k.endswith("=0") and not k.endswith("none"):
            kinds_c[k] = kinds_c.get(k, 0) + 1
    print("  /control actions: %s" % kinds_c)
    print("\nverdicts:")
    ok = True
    for name, good, detail in verdicts:
        ok = ok and good
        print("  %-4s %s%s" % ("PASS" if good else "FAIL", name,
                               (": " + detail) if detail else ""))
    print("logs: %s%s" % (tmp, "" if (args.keep or getattr(
        soak, "keep_tmp", False)) else " (removed; --keep keeps it)"))
    if not ok:
        soak.keep_tmp = True
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(
        description="bounded fault soak of infergw (loopback only)")
    ap.add_argument("--bin", default="build/soak/bin",
                    help="directory with infergw and mock_upstream")
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--mocks", type=int, default=3)
    ap.add_argument("--tls", metavar="CERTDIR",
                    help="half the clients over TLS (ca.pem, server.pem, "
                    "server.key; made with BIN/mkcert when missing)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eject-after", type=int, default=10,
                    help="[routing] eject_after (default 10; the gateway's "
                    "own default 3 ejects the whole fleet under this "
                    "poison-heavy mix and the run turns into 503s)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (logs, config)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the classifier against canned responses")
    ap.add_argument("--inject-bug", action="store_true",
                    help="test only: add a client kind whose server sends "
                    "a truncated stream (the run must end with BAD)")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(self_test(args))
    if args.seconds < 10 or args.clients < 1 or args.mocks < 2:
        ap.error("need --seconds >= 10, --clients >= 1, --mocks >= 2")
    sys.exit(run_soak(args))


if __name__ == "__main__":
    main()
