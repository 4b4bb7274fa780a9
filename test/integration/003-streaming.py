# SPDX-License-Identifier: MIT
"""003 - streaming: SSE relayed as it arrives, exact bytes, one [DONE]."""

import os

from gwtest import (JSON_HEADERS, chat_body, completion_body,
                    normalise, sse_data, sse_events)


def check_stream_relay(g, m, path, body):
    """Stream 'body' through the gateway and straight from the mock; the
    de-chunked bodies must match.  Returns the list of events."""
    direct = m.call("POST", path, body)
    assert direct.status == 200 and direct.clean_end, direct
    s = g.stream(path, body)
    r = s.resp
    assert r.status == 200, r
    ct = r.headers.get("Content-Type", "")
    assert ct.split(";")[0].strip() == "text/event-stream", ct
    assert r.headers.has_token("Transfer-Encoding", "chunked"), \
        "stream not chunked: %r" % r
    assert r.headers.get("Content-Length") is None, r
    assert r.headers.get("X-Request-Id"), "stream without X-Request-Id"
    body_via = s.read_all()
    assert s.clean_end, "stream did not end with the zero-length chunk"
    assert normalise(body_via) == normalise(direct.body), \
        "stream differs from the mock's:\n via: %r\n mock: %r" % (
            body_via[-300:], direct.body[-300:])
    events = sse_events(body_via)
    assert events[-1] == b"data: [DONE]", events[-1]
    assert body_via.count(b"data: [DONE]") == 1, "[DONE] repeated"
    assert body_via.endswith(b"data: [DONE]\n\n")
    return events


def test_chat_stream_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    events = check_stream_relay(
        g, m, "/v1/chat/completions",
        chat_body("stream me", stream=True, mock_chunks=5))
    docs = [sse_data(e) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"].get("role") == "assistant"
    assert len(docs) == 1 + 5 + 1, "role + 5 content + finish: %d" % len(
        docs)
    assert docs[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(d["object"] == "chat.completion.chunk" for d in docs)


def test_completions_stream_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    events = check_stream_relay(
        g, m, "/v1/completions",
        completion_body("stream text", stream=True, mock_chunks=4))
    docs = [sse_data(e) for e in events[:-1]]
    assert all(d["object"] == "text_completion" for d in docs), docs[0]


def test_stream_include_usage_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    events = check_stream_relay(
        g, m, "/v1/chat/completions",
        chat_body("usage", stream=True, mock_chunks=3,
                  stream_options={"include_usage": True}))
    usage = sse_data(events[-2])
    assert usage["choices"] == [] and "usage" in usage, usage
    assert usage["usage"]["completion_tokens"] >= 1, usage


def test_stream_max_tokens_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    events = check_stream_relay(
        g, m, "/v1/chat/completions",
        chat_body("short", stream=True, mock_chunks=10, max_tokens=2))
    assert sse_data(events[-2])["choices"][0]["finish_reason"] == "length"


def test_stream_first_event_arrives_while_upstream_sends(t):
    """Each event reaches the client while the upstream still has the
    rest to send: the mock sends content chunk i only once the test has
    opened its gate past i (mock_gate), and the test opens it a chunk at
    a time, each once the client has the event before.  A gateway that
    held the stream back would leave the client waiting for an end the
    upstream never reaches by itself; no clock is read."""
    m = t.mock()
    g = t.gateway(m)
    n = 6
    tag = "early-" + os.urandom(6).hex()
    body = chat_body("early", stream=True, mock_chunks=n, mock_gate=tag)
    s = g.stream("/v1/chat/completions", body)
    events = s.events()
    first = next(events, None)
    assert first is not None, "no event at all"
    assert sse_data(first)["choices"][0]["delta"].get("role") == \
        "assistant", first
    for i in range(n):
        # The upstream is held at content chunk i: still answering.
        st = m.stats()
        assert st["in_progress"] == 1 and st["completions"] == 1, st
        assert m.gate(tag, i + 1) == i + 1
        ev = next(events, None)
        assert ev is not None, "the stream ended after %d chunks" % i
        assert "content" in sse_data(ev)["choices"][0]["delta"], ev
    rest = list(events)
    assert s.clean_end
    assert rest[-1] == b"data: [DONE]", rest
    assert sse_data(rest[0])["choices"][0]["finish_reason"] == "stop", rest


def test_stream_connection_reusable_after_stream(t):
    m = t.mock()
    g = t.gateway(m)
    c = g.connection()
    s = c.stream("POST", "/v1/chat/completions", JSON_HEADERS,
                 chat_body("first", stream=True, mock_chunks=3))
    assert s.resp.status == 200
    s.read_all()
    assert s.clean_end
    r = c.request("POST", "/v1/chat/completions", JSON_HEADERS,
                  chat_body("second"))
    assert r.status == 200 and r.clean_end, r
    s = c.stream("POST", "/v1/chat/completions", JSON_HEADERS,
                 chat_body("third", stream=True, mock_chunks=2))
    assert s.resp.status == 200
    assert s.read_all().endswith(b"data: [DONE]\n\n")
    assert s.clean_end
    assert m.stats()["requests"] == 3


def test_nonstream_json_has_clean_framing(t):
    m = t.mock()
    g = t.gateway(m)
    body = chat_body("plain", mock_chunks=7)
    r = g.post("/v1/chat/completions", body)
    assert r.status == 200, r
    assert r.content_type.split(";")[0].strip() == "application/json", r
    assert r.framing in ("length", "chunked") and r.clean_end, r
    assert normalise(r.body) == normalise(
        m.call("POST", "/v1/chat/completions", body).body)


def test_concurrent_streams_independent(t):
    """Different prompts at once: each client gets its own stream."""
    m = t.mock()
    g = t.gateway(m)
    bodies = [chat_body("parallel %d" % i, stream=True, mock_chunks=4,
                        mock_delay_ms=50) for i in range(4)]
    streams = [g.stream("/v1/chat/completions", b) for b in bodies]
    outs = [s.read_all() for s in streams]
    for s, b, out in zip(streams, bodies, outs):
        assert s.clean_end
        direct = m.call("POST", "/v1/chat/completions", b)
        assert normalise(out) == normalise(direct.body)
    assert len(set(normalise(o) for o in outs)) == 4
