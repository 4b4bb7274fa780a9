"""013 - /metrics is valid Prometheus text exposition (issue 10), checked
with a real parser (prometheus_client's, see metrics_check.py) after
traffic that fills every kind of series: per route, per tenant, per
upstream and per failure kind, coalesced and not, errors, histograms.
"""

from gwtest import chat_body, request, wait_for

from coalesce_util import finish_all, new_tag, send
from metrics_check import validate


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
    # The kinds of series the issue names are all there.
    for name in ("infergw_upstream_state{", "infergw_upstream_failures_total{",
                 "infergw_request_duration_seconds_bucket{",
                 'tenant="acme"'):
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
