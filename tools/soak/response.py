# SPDX-License-Identifier: MIT
"""Strict HTTP/1.1 response parsing (pure: bytes in, structure out) and
the classifier that puts every client response in one of CATS."""

import json
import re

from . import limits


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
            return BAD, "no byte within %.0fs (hang)" % (
                limits.REQ_DEADLINE), p, None
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
            limits.REQ_DEADLINE, p.status, len(p.body)), p, None
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
