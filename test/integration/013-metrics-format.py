"""013 - /metrics is valid Prometheus text exposition (issue 10), checked
with a real parser (prometheus_client's, see metrics_check.py) and with
Prometheus's own linter (`promtool check metrics`) after traffic that
fills every kind of series: per route, per tenant, per upstream and per
failure kind, coalesced and not, errors, histograms.  And the series of
issue 19 item 3, each with what it must say: build and process series,
the configuration's generation and reloads, the per-upstream histograms,
the model and stream labels, requests per tenant and status, the limits.
"""

import signal
import time

from gwtest import (chat_body, has_metric, metric, metric_value, request,
                    tool, wait_for)

from coalesce_util import finish_all, new_tag, send
from metrics_check import promtool_check, validate

CHAT = "/v1/chat/completions"
DURATION = "infergw_request_duration_seconds_count"
TTFB = "infergw_time_to_first_byte_seconds_count"


def bearer(key):
    return {"Authorization": "Bearer %s" % key,
            "Content-Type": "application/json"}


def test_metrics_parse_with_a_real_parser(t):
    a, b = t.mock(), t.mock()
    r = request(b.port, "POST", "/control?status=503")
    assert r.status == 200
    conf = {"routing": {"balance": "round_robin", "eject_after": 100},
            "upstream u0": {"url": "http://127.0.0.1:%d" % a.port},
            "upstream u1": {"url": "http://127.0.0.1:%d" % b.port},
            "tenant acme": {"api_key": "sk-acme-1-abcdef"}}
    g = t.gateway(None, conf)
    auth = {"Authorization": "Bearer sk-acme-1-abcdef"}
    # A coalesced trio, a bypass, a retry (u1 answers 503), errors.
    tag = new_tag()
    body = chat_body("metrics", stream=True, mock_hold=tag)
    conns = [send(g, body, headers=auth) for _ in range(3)]
    wait_for(lambda: a.stats()["held"] == 1)     # round robin: u0 first
    a.release(tag)
    b.release(tag)
    finish_all(conns)
    for i in range(4):
        g.post("/v1/chat/completions",
               chat_body("b%d" % i, temperature=0.9), dict(auth))
    g.post("/v1/chat/completions", chat_body("x", model="nope"), dict(auth))
    g.post("/v1/chat/completions", b"{", dict(auth))
    g.get("/v1/models", headers=auth)
    g.get("/nope")
    text = g.metrics_response().body.decode()
    out = validate(text)
    assert out.startswith("ok:"), out
    # Prometheus's own linter has nothing to say.
    lint = promtool_check(tool("promtool", "prometheus"), text)
    assert lint == "", lint
    # The kinds of series the issues name are all there.
    for name in ("infergw_upstream_state{", "infergw_upstream_failures_total{",
                 "infergw_request_duration_seconds_bucket{",
                 'tenant="acme"', "infergw_build_info{version=",
                 "\nprocess_start_time_seconds ",
                 "\nprocess_resident_memory_bytes ", "\nprocess_open_fds ",
                 "\ninfergw_config_generation ",
                 "\ninfergw_config_last_reload_success ",
                 "\ninfergw_config_last_reload_success_timestamp_seconds ",
                 "infergw_upstream_time_to_first_byte_seconds_bucket{",
                 "infergw_upstream_request_duration_seconds_bucket{",
                 "infergw_tenant_requests_total{", "infergw_upstream_queued{",
                 "infergw_upstream_max_inflight{",
                 "infergw_tenant_max_inflight{",
                 "infergw_tenant_requests_per_minute_limit{",
                 "\ninfergw_max_connections "):
        assert name in text, "no %s in /metrics" % name


def test_the_checker_refuses_broken_text(t):
    good = ("# HELP x_total A counter.\n# TYPE x_total counter\n"
            "x_total 1\n")
    assert validate(good).startswith("ok:")
    for bad in (good + "x_total 2\n",                   # a series twice
                "x 1\n",                                # no TYPE, no HELP
                "# HELP h A histogram.\n# TYPE h histogram\n"
                'h_bucket{le="1"} 5\nh_bucket{le="+Inf"} 3\n'
                "h_count 3\nh_sum 1\n"):                # not cumulative
        try:
            out = validate(bad)
        except AssertionError as e:
            out = str(e)
        assert not out.startswith("ok:"), (bad, out)


def known(g, model):
    """Has the gateway learnt 'model' from an upstream's GET /v1/models?"""
    r = g.get("/v1/models")
    return r.status == 200 and ('"%s"' % model) in r.text


def test_model_and_stream_labels(t):
    """Known models (configured, or learnt from /v1/models) are label
    values of their own; every other name is one value; no model is "-";
    streamed and not streamed requests are apart."""
    a, b = t.mock(), t.mock()
    conf = {"upstream pinned": {"url": "http://127.0.0.1:%d" % a.port,
                                "models": "cfg-model"},
            "upstream open": {"url": "http://127.0.0.1:%d" % b.port}}
    g = t.gateway(None, conf)
    wait_for(lambda: known(g, "mock-model"), msg="mock-model learnt")
    for stream in (True, False, False):
        r = g.post(CHAT, chat_body("s", stream=stream))
        assert r.status == 200, r
    assert g.post(CHAT, chat_body("c", model="cfg-model")).status == 200
    for name in ("stranger-1", "stranger-2"):
        assert g.post(CHAT, chat_body("x", model=name)).status in (200, 404)
    assert g.get("/v1/models").status == 200
    ms = g.metrics()
    chat = {"route": "chat_completions"}
    for fam in (DURATION, TTFB):
        assert has_metric(ms, fam, model="mock-model", stream="true", **chat)
        assert metric(ms, fam, model="mock-model", stream="true", **chat) == 1
        assert metric(ms, fam, model="mock-model", stream="false",
                      **chat) == 2
        assert metric(ms, fam, model="cfg-model", **chat) == 1
        assert has_metric(ms, fam, model="(other models)", **chat)
        assert metric(ms, fam, model="(other models)", **chat) == 2
        assert metric(ms, fam, model="-", route="models") >= 2
    assert not any(("model", n) in ls for (_, ls) in ms
                   for n in ("stranger-1", "stranger-2"))


def test_upstream_histograms(t):
    """Each upstream's time to first byte and duration, from its own
    attempts: a slow first byte lands above its delay."""
    a, b = t.mock(), t.mock()
    conf = {"routing": {"balance": "round_robin"},
            "upstream fast": {"url": "http://127.0.0.1:%d" % a.port},
            "upstream slow": {"url": "http://127.0.0.1:%d" % b.port}}
    g = t.gateway(None, conf)
    ttfb = "infergw_upstream_time_to_first_byte_seconds"
    dur = "infergw_upstream_request_duration_seconds"
    ms = g.metrics()
    for up in ("fast", "slow"):
        assert has_metric(ms, ttfb + "_count", upstream=up)
        assert metric(ms, ttfb + "_count", upstream=up) == 0
    # 300 ms before the first byte, 4 chunks 100 ms apart after it.
    body = chat_body("slow", stream=True, temperature=0.5, mock_first_ms=300,
                     mock_delay_ms=100, mock_chunks=4)
    for _ in range(2):
        assert g.post(CHAT, body).status == 200
    ms = g.metrics()
    for up in ("fast", "slow"):     # round robin: one each
        assert metric(ms, ttfb + "_count", upstream=up) == 1
        assert metric(ms, ttfb + "_bucket", upstream=up, le="0.25") == 0
        assert metric(ms, ttfb + "_bucket", upstream=up, le="+Inf") == 1
        assert metric(ms, ttfb + "_sum", upstream=up) >= 0.3
        assert metric(ms, dur + "_sum", upstream=up) >= 0.6
        assert metric(ms, dur + "_bucket", upstream=up, le="0.5") == 0


def test_tenant_requests_and_limits(t):
    m = t.mock()
    conf = {"server": {"max_connections": "77"},
            "tenant acme": {"api_key": "sk-acme-1-abcdef",
                            "max_inflight": "5",
                            "requests_per_minute": "1"},
            "tenant free": {"api_key": "sk-free-1-abcdef"}}
    g = t.gateway(m, conf)
    assert g.post(CHAT, chat_body("a"), bearer("sk-acme-1-abcdef")).status \
        == 200
    assert g.post(CHAT, chat_body("b"), bearer("sk-acme-1-abcdef")).status \
        == 429
    assert g.post(CHAT, chat_body("c"), bearer("sk-nobody-abcdef")).status \
        == 401
    assert g.get("/v1/models", headers=bearer("sk-free-1-abcdef")).status \
        == 200
    ms = g.metrics()
    fam = "infergw_tenant_requests_total"
    assert has_metric(ms, fam, tenant="acme", status="200")
    assert metric(ms, fam, tenant="acme", status="200") == 1
    assert metric(ms, fam, tenant="acme", status="429") == 1
    assert metric(ms, fam, tenant="default", status="401") == 1
    assert metric(ms, fam, tenant="free", status="200") == 1
    # /metrics itself is no tenant's request.
    assert metric(ms, fam) == 4
    assert metric_value(g, "infergw_tenant_max_inflight", tenant="acme") == 5
    assert metric_value(g, "infergw_tenant_max_inflight", tenant="free") == 0
    assert metric_value(g, "infergw_tenant_requests_per_minute_limit",
                        tenant="acme") == 1
    assert metric_value(g, "infergw_max_connections") == 77
    assert metric_value(g, "infergw_upstream_max_inflight",
                        upstream="default") == 0


def test_reloads_and_process(t):
    m = t.mock()
    t0 = time.time()
    g = t.gateway(m)
    gen = "infergw_config_generation"
    ok = "infergw_config_last_reload_success"
    ts = ok + "_timestamp_seconds"
    assert metric_value(g, gen) == 1
    assert metric_value(g, ok) == 1
    first = metric_value(g, ts)
    start = metric_value(g, "process_start_time_seconds")
    assert t0 - 1 <= start <= first <= time.time() + 1, (t0, start, first)
    assert metric_value(g, "infergw_build_info", version="0.1.0") == 1
    # A bad file: 0, and the generation in force stays.
    good = g.conf_text
    with open(g.conf_path, "w") as f:
        f.write(good + "[coalesce]\nmax_followers = lots\n")
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: .*max_followers: expected")
    assert metric_value(g, ok) == 0
    assert metric_value(g, gen) == 1
    assert metric_value(g, ts) == first
    with open(g.conf_path, "w") as f:
        f.write(good)
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    assert metric_value(g, gen) == 2
    assert metric_value(g, ok) == 1
    assert metric_value(g, ts) >= first
    # Each client connection is a descriptor of the gateway's.
    fds = metric_value(g, "process_open_fds")
    assert metric_value(g, "process_resident_memory_bytes") > 1 << 20
    conns = [g.connection() for _ in range(5)]
    wait_for(lambda: metric_value(g, "infergw_connections_active") >= 6)
    assert metric_value(g, "process_open_fds") >= fds + 5
    for c in conns:
        c.close()
