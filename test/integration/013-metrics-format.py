# SPDX-License-Identifier: MIT
"""013 - /metrics is valid Prometheus text exposition (issue 10), checked
with a real parser (prometheus_client's, see metrics_check.py) and with
Prometheus's own linter (`promtool check metrics`) after traffic that
fills every kind of series: per route, per tenant, per upstream and per
failure kind, coalesced and not, errors, histograms.  And the series of
issue 19 item 3, each with what it must say: build and process series,
the configuration's generation and reloads, the per-upstream histograms,
the model and stream labels, requests per tenant and status, the limits.
And what ships for Prometheus and Grafana (issue 19 item 5): the rules
pass `promtool check rules` and their own `promtool test rules`; every
series the rules and the dashboard name is one a live gateway's /metrics
has; docs/OPERATIONS.md's scrape configuration works, with a real
Prometheus scraping a live gateway's admin listener with its key.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.parse

import gwtest
from gwtest import (ADMIN_KEY, chat_body, has_metric, metric, metric_value,
                    request, tool, wait_for)

from coalesce_util import finish_all, new_tag, send
from metrics_check import promtool_check, validate

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
RULES = os.path.join(ROOT, "etc", "prometheus", "infergw.rules.yml")
RULES_TEST = os.path.join(ROOT, "etc", "prometheus", "infergw.rules.test.yml")
DASHBOARD = os.path.join(ROOT, "etc", "grafana", "infergw.json")
OPERATIONS = os.path.join(ROOT, "docs", "OPERATIONS.md")
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
    chat = {"route": "chat_completions"}

    # A request is counted after its client has the answer: wait until
    # the last two are (six chat requests, two /v1/models at least).
    def counted():
        ms = g.metrics()
        n = sum(v for (name, ls), v in ms.items() if name == DURATION
                and dict(ls).get("route") == "chat_completions")
        m = sum(v for (name, ls), v in ms.items() if name == DURATION
                and dict(ls).get("route") == "models")
        return ms if n >= 6 and m >= 2 else None
    ms = wait_for(counted, msg="every request counted")
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
    fam = "infergw_tenant_requests_total"
    # A request is counted after its client has the answer: wait for
    # the last one.
    ms = wait_for(lambda: (lambda ms: ms if has_metric(ms, fam)
                           and metric(ms, fam) >= 4 else None)(g.metrics()),
                  msg="four tenant requests counted")
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
    # Each client connection is a descriptor of the gateway's.  Its own
    # upstream connections come and go meanwhile (the load beat's, idle
    # ones closed): 20 clients, and a margin of 5 for those.
    fds = metric_value(g, "process_open_fds")
    assert metric_value(g, "process_resident_memory_bytes") > 1 << 20
    conns = [g.connection() for _ in range(20)]
    wait_for(lambda: metric_value(g, "infergw_connections_active") >= 21)
    assert metric_value(g, "process_open_fds") >= fds + 15
    for c in conns:
        c.close()


# ---- issue 19 item 5: what ships for Prometheus and Grafana ----

# A series name in PromQL: the gateway's own and the process_* ones.
# A recording rule's name (level:metric:operations) has colons, so
# "job:infergw_x:rate5m" is never taken for "infergw_x".
SERIES_RX = re.compile(r"(?<![\w:])((?:infergw|process)_[a-z0-9_]+)(?![\w:])")


def exposed_names(text):
    """Every series name a /metrics text can be queried by: each family
    (TYPE line, with or without samples yet) and a histogram's _bucket,
    _sum and _count."""
    names = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(m.group(1))
        if m.group(2) == "histogram":
            names.update(m.group(1) + sfx
                         for sfx in ("_bucket", "_sum", "_count"))
    return names


def dashboard_queries(dash):
    """(panel title, expr) of every query of the dashboard: its panels'
    (rows' too) and its template variables'."""
    out = []

    def walk(panels):
        for p in panels:
            for tg in p.get("targets", []):
                out.append((p.get("title"), tg.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            out.append(("$" + v["name"],
                        q["query"] if isinstance(q, dict) else q))
    return out


def rule_exprs(text):
    """The expr of every rule of a rules file, as written (the YAML is
    read with a pattern: an 'expr:' line, or a block after 'expr: |')."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", lines[i])
        i += 1
        if not m:
            continue
        if m.group(2) != "|":
            out.append(m.group(2))
            continue
        block = []
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip())
                                  > len(m.group(1))):
            block.append(lines[i].strip())
            i += 1
        out.append(" ".join(block))
    return out


def test_shipped_rules_pass_promtool(t):
    promtool = tool("promtool", "prometheus")
    for args in (["check", "rules", RULES], ["test", "rules", RULES_TEST]):
        p = subprocess.run([promtool] + args, cwd=os.path.dirname(RULES),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        out = p.stdout.decode("utf-8", "replace")
        assert p.returncode == 0, "promtool %s:\n%s" % (" ".join(args), out)
        assert "SUCCESS" in out, out


def test_rules_and_dashboard_name_series_metrics_has(t):
    """Every query of the dashboard, and every rule, names at least one
    series, and each series it names is in a live gateway's /metrics (a
    family, with samples or not yet)."""
    m = t.mock()
    g = t.gateway(m, extra="[tenant a]\napi_key = sk-tenant-a-1234567\n")
    have = exposed_names(g.metrics_response().body.decode())
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] == "infergw" and dash["title"], dash.get("title")
    queries = dashboard_queries(dash)
    with open(RULES) as f:
        rules = rule_exprs(f.read())
    assert len(rules) >= 19, rules
    assert len(queries) >= 30, len(queries)
    ids = set()
    for title, expr in queries + [("rule", e) for e in rules]:
        names = SERIES_RX.findall(expr)
        recorded = re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", expr)
        assert names or recorded, "%r names no series: %r" % (title, expr)
        missing = [n for n in names if n not in have]
        assert not missing, "%r: %s not in /metrics: %r" % (
            title, missing, expr)
    # Each panel is one Grafana can place: an id of its own, a position,
    # and every query on the chosen data source.
    for p in dash["panels"]:
        assert p["id"] not in ids, p["id"]
        ids.add(p["id"])
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
        for tg in p.get("targets", []):
            assert tg["datasource"]["uid"] == "${datasource}", p["title"]


def docs_scrape_config():
    """docs/OPERATIONS.md's Prometheus configuration (the yaml block with
    the shipped rules and the admin key's credentials_file)."""
    with open(OPERATIONS) as f:
        text = f.read()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    found = [b for b in blocks
             if "rule_files" in b and "\n      credentials_file" in b]
    assert len(found) == 1, \
        "docs/OPERATIONS.md: one scrape config with the admin key"
    return found[0]


class Prometheus:
    """A real Prometheus on 'config' (a path), its web API on port 0
    (read back from its log), its data in 'tmp'."""

    def __init__(self, exe, tmp, config):
        self.logpath = os.path.join(tmp, "prometheus.log")
        self.log = open(self.logpath, "w")
        self.proc = subprocess.Popen(
            [exe, "--config.file=" + config,
             "--storage.tsdb.path=" + os.path.join(tmp, "prom-data"),
             "--web.listen-address=127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)
        gwtest._register(self)
        self.port = wait_for(self._port, timeout=20,
                             msg="prometheus listens")

    def _port(self):
        with open(self.logpath) as f:
            m = re.search(r'msg="Listening on" address=127\.0\.0\.1:(\d+)',
                          f.read())
        assert self.proc.poll() is None, "prometheus exited"
        return int(m.group(1)) if m else None

    def query(self, q):
        """The result of instant query 'q'; [] while Prometheus is not
        ready yet (503)."""
        r = request(self.port, "GET", "/api/v1/query?query="
                    + urllib.parse.quote(q))
        if r.status == 503:
            return []
        assert r.status == 200, r
        return r.json()["data"]["result"]

    def close(self):
        gwtest.kill_process(self.proc)
        self.log.close()


def test_the_docs_scrape_config_with_a_real_prometheus(t):
    """docs/OPERATIONS.md's configuration, as written but for the paths, the
    port and a 1 s interval: Prometheus scrapes the admin listener with
    the admin key (the gateway answers it 200, and would answer 401
    without), and evaluates the shipped rules over what it scraped."""
    exe = tool("prometheus")
    promtool = tool("promtool", "prometheus")
    m = t.mock()
    g = t.gateway(m, conf={"admin": {"listen": "127.0.0.1:0"}},
                  extra="[tenant a]\napi_key = sk-tenant-a-1234567\n")
    assert g.admin_key == ADMIN_KEY and g.admin_port
    # Without the key the admin listener refuses /metrics.
    assert request(g.admin_port, "GET", "/metrics").status == 401
    key = t.write("admin.key", ADMIN_KEY + "\n")
    text = docs_scrape_config()
    for old, new in (("/etc/prometheus/infergw.rules.yml", RULES),
                     ("/etc/prometheus/infergw-admin.key", key),
                     ("127.0.0.1:8081", "127.0.0.1:%d" % g.admin_port),
                     ("scrape_interval: 15s", "scrape_interval: 1s")):
        assert old in text, old
        text = text.replace(old, new)
    config = t.write("prometheus.yml",
                     "global:\n  evaluation_interval: 1s\n" + text)
    p = subprocess.run([promtool, "check", "config", config],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")
    assert g.post(CHAT, chat_body("x"), bearer("sk-tenant-a-1234567")) \
        .status == 200
    prom = Prometheus(exe, t.tmp, config)

    def up():
        r = prom.query('up{job="infergw"}')
        return r and r[0]["value"][1] == "1"

    wait_for(up, timeout=20, msg="prometheus scraped the gateway")
    ms = parse(request(g.admin_port, "GET", "/metrics",
                       headers={"Authorization": "Bearer " + ADMIN_KEY}))
    assert metric(ms, "infergw_requests_total", route="metrics",
                  status="200") >= 1
    # The data is the gateway's, and the rules run on it.
    r = prom.query('infergw_build_info{job="infergw"}')
    assert r and r[0]["metric"]["version"], r
    wait_for(lambda: prom.query("job:infergw_upstream_calls:rate5m"),
             timeout=20, msg="a recording rule evaluated")
    r = prom.query("ALERTS")
    assert r == [], "an alert on a healthy gateway: %r" % r


def parse(r):
    assert r.status == 200, r
    return gwtest.parse_metrics(r.body.decode("utf-8"))
