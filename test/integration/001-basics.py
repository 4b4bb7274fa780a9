# SPDX-License-Identifier: MIT
"""001 - basics: start-up, health endpoints, metrics, request ids, the
access log."""

import re

from gwtest import (JSON_HEADERS, REQUEST_ID_RX, chat_body, has_metric,
                    metric, wait_for)


def test_starts_and_logs_listening_port(t):
    m = t.mock()
    g = t.gateway(m)
    lines = [l for l in g.log_lines() if "server: listening" in l]
    assert len(lines) == 1, "want one 'server: listening' line: %r" % lines
    assert re.search(r"\bport=%d\b" % g.port, lines[0]), lines[0]
    assert g.port != 0
    r = g.get("/healthz")
    assert r.status == 200, r


def test_healthz_is_200_json(t):
    g = t.gateway(t.mock())
    r = g.get("/healthz")
    assert r.status == 200, r
    ct = r.headers.get("Content-Type", "")
    assert ct.split(";")[0].strip() == "application/json", ct
    r.json()                            # parses
    assert r.clean_end, r


def test_readyz_is_200_when_serving(t):
    g = t.gateway(t.mock())
    # From the health beat's first passing probe (031-readyz.py).
    r = g.wait_ready()
    assert r.json() == {"status": "ready"}, r
    assert r.clean_end, r


def test_metrics_is_prometheus_text(t):
    g = t.gateway(t.mock())
    assert g.get("/healthz").status == 200
    r = g.get("/metrics")
    assert r.status == 200, r
    ct = r.headers.get("Content-Type", "")
    parts = [p.strip().lower() for p in ct.split(";")]
    assert parts[0] == "text/plain" and "version=0.0.4" in parts, \
        "Content-Type %r, want text/plain; version=0.0.4" % ct
    from gwtest import parse_metrics
    ms = parse_metrics(r.text)          # every line parses
    assert any(n.startswith("infergw_") for n, _ in ms), \
        "no infergw_ samples in %r" % r.text[:500]
    # The /healthz request above is counted (possibly just after its
    # response went out, hence the wait).
    wait_for(lambda: metric(g.metrics(), "infergw_requests_total",
                            route="healthz", status="200") >= 1,
             msg="requests_total{route=healthz,status=200} >= 1")
    assert r.text.endswith("\n"), "exposition must end with a newline"


def test_metrics_requests_total_counts_chat(t):
    m = t.mock()
    g = t.gateway(m)

    def chat200():
        return metric(g.metrics(), "infergw_requests_total",
                      route="chat_completions", status="200")
    before = chat200()
    r = g.post("/v1/chat/completions", chat_body("count me"))
    assert r.status == 200, r
    wait_for(lambda: chat200() == before + 1,
             msg="chat_completions 200 counter +1")
    r = g.post("/v1/chat/completions", chat_body("count me too"))
    assert r.status == 200, r
    wait_for(lambda: chat200() == before + 2,
             msg="chat_completions 200 counter +2")


def test_metrics_upstream_requests_total_counts_upstream_calls(t):
    m = t.mock()
    g = t.gateway(m)

    def up():
        return metric(g.metrics(), "infergw_upstream_requests_total")
    assert has_metric(g.metrics(), "infergw_upstream_requests_total"), \
        "no infergw_upstream_requests_total sample"
    before = up()
    for i in range(3):
        r = g.post("/v1/chat/completions", chat_body("up %d" % i))
        assert r.status == 200, r
    wait_for(lambda: up() == before + 3, msg="upstream calls +3")
    # Local routes do not call upstream; /v1/models comes from the cache.
    for path in ("/healthz", "/readyz", "/metrics", "/nope", "/v1/models"):
        g.get(path)
    assert up() == before + 3, "local routes counted as upstream calls"
    assert m.stats()["requests"] == 3


def test_metrics_route_labels(t):
    m = t.mock()
    g = t.gateway(m)
    g.wait_ready()                      # /readyz below answers 200
    calls = [
        ("POST", "/v1/chat/completions", chat_body("r"), 200,
         "chat_completions"),
        ("POST", "/v1/completions", b'{"model":"mock-model","prompt":"p"}', 200,
         "completions"),
        ("POST", "/v1/embeddings", b'{"model":"mock-model","input":"x"}', 200,
         "embeddings"),
        ("GET", "/v1/models", b"", 200, "models"),
        ("GET", "/healthz", b"", 200, "healthz"),
        ("GET", "/readyz", b"", 200, "readyz"),
        ("GET", "/metrics", b"", 200, "metrics"),
        ("GET", "/no/such/path", b"", 404, "other"),
    ]
    for method, path, body, status, _ in calls:
        r = g.request(method, path, JSON_HEADERS if body else None, body)
        assert r.status == status, (path, r)
    for _, path, _, status, route in calls:
        wait_for(lambda: metric(g.metrics(), "infergw_requests_total",
                                route=route, status=str(status)) >= 1,
                 msg="requests_total{route=%s,status=%d}" % (route, status))


def test_request_id_echoed_when_sane(t):
    m = t.mock()
    g = t.gateway(m)
    for rid in ("abc", "A.b_c-9", "x" * 64, "0"):
        r = g.get("/healthz", headers={"X-Request-Id": rid})
        assert r.status == 200, r
        assert r.headers.get("X-Request-Id") == rid, \
            "sent %r, got %r" % (rid, r.headers.get("X-Request-Id"))
    rid = "proxied-req.42"
    r = g.post("/v1/chat/completions", chat_body("rid"),
               headers={"Content-Type": "application/json",
                        "X-Request-Id": rid})
    assert r.status == 200, r
    assert r.headers.get("X-Request-Id") == rid, r
    # A coalesced call sends its flight's id upstream (011 tests that);
    # a direct one, here an embedding, sends the client's.
    assert re.match(r"^flight-[0-9a-f]{24}$",
                    m.stats()["last_headers"].get("x-request-id")), \
        m.stats()["last_headers"]
    rid = "direct-req.43"
    r = g.post("/v1/embeddings", b'{"input":"x"}',
               headers={"Content-Type": "application/json",
                        "X-Request-Id": rid})
    assert r.status == 200, r
    assert r.headers.get("X-Request-Id") == rid, r
    assert m.stats()["last_headers"].get("x-request-id") == rid


def test_request_id_generated_when_absent_or_insane(t):
    g = t.gateway(t.mock())
    seen = set()
    for sent in (None, "x" * 65, "has space", "semi;colon", "<script>",
                 "caf\xe9", ""):
        hdrs = None if sent is None else {"X-Request-Id": sent}
        r = g.get("/healthz", headers=hdrs)
        assert r.status == 200, (sent, r)
        rid = r.headers.get("X-Request-Id")
        assert rid, "no X-Request-Id for %r" % (sent,)
        assert REQUEST_ID_RX.match(rid), "generated id not sane: %r" % rid
        assert rid != sent, "insane id %r was echoed" % (sent,)
        seen.add(rid)
    assert len(seen) == 7, "generated ids repeat: %r" % seen


def _fields(line):
    return dict(re.findall(r"(\w+)=(\S*)", line))


def _access_rx(rid):
    """An access line for request id 'rid' (fields in any order)."""
    return r"^(?=.*\baccess\b)(?=.*(^|\s)req=%s(\s|$))" % re.escape(rid)


def test_access_log_line_per_request(t):
    m = t.mock()
    g = t.gateway(m)
    rid = "acc-chat.1"
    r = g.post("/v1/chat/completions", chat_body("log me"),
               headers={"Content-Type": "application/json",
                        "X-Request-Id": rid})
    assert r.status == 200, r
    line = g.wait_log(_access_rx(rid))
    f = _fields(line)
    assert f.get("method") == "POST", line
    assert f.get("path") == "/v1/chat/completions", line
    assert f.get("status") == "200", line
    assert f.get("upstream_status") == "200", line
    assert re.fullmatch(r"\d+", f.get("bytes", "")), line
    assert int(f["bytes"]) >= len(r.body) > 0, \
        "bytes=%s but the body was %d bytes" % (f["bytes"], len(r.body))
    assert re.fullmatch(r"\d+(\.\d+)?", f.get("duration_ms", "")), line
    assert "ttft_ms" in f, line

    rid2 = "acc-health.2"
    assert g.get("/healthz", headers={"X-Request-Id": rid2}).status == 200
    line = g.wait_log(_access_rx(rid2))
    f = _fields(line)
    assert f.get("method") == "GET" and f.get("path") == "/healthz", line
    assert f.get("status") == "200", line
    for k in ("upstream_status", "bytes", "duration_ms", "ttft_ms"):
        assert k in f, "%s= missing: %s" % (k, line)

    rid3 = "acc-404.3"
    assert g.get("/nope", headers={"X-Request-Id": rid3}).status == 404
    line = g.wait_log(_access_rx(rid3))
    assert _fields(line).get("status") == "404", line

    # exactly one line per request
    for x in (rid, rid2, rid3):
        n = sum(1 for l in g.log_lines() if re.search(_access_rx(x), l))
        assert n == 1, "%d access lines for req=%s" % (n, x)


def test_the_seed_demo_model_is_served_by_the_bundled_mock(t):
    """The tutorial's demo asks for "llama-3-8b": once the gateway has the
    mock's model list, that model must still be routed (make run)."""
    m = t.mock()
    g = t.gateway(m)
    wait_for(lambda: "llama-3-8b" in [e["id"] for e in
                                      g.get("/v1/models").json()["data"]],
             msg="the demo model in /v1/models")
    r = g.post("/v1/chat/completions",
               b'{"model":"llama-3-8b","messages":[{"role":"user",'
               b'"content":"identical"}],"stream":true}')
    assert r.status == 200, r
