# SPDX-License-Identifier: MIT
"""027 - logs (issue 19 item 4): every access line, a 401 and a 429 too,
names tenant, client, model, status, bytes, ttft_ms, duration_ms, role,
flight, upstream and attempts; the client comes from X-Forwarded-For
only when the peer is one of [server] trusted_proxies, read the way
nginx's realip module with real_ip_recursive on reads it; and
log_format = json makes every line of a whole run, start to exit, one
JSON object, with no client's bytes able to break one.

Issue 26 item 3, logs a person can read: a failure that repeats in the
background (an upstream down, under the health and load beats) is a
start line, a counted summary at most every log_repeat_interval and an
end line, never a line per beat; the gateway's own /readyz and /healthz
answers are never a warning; the leader's line says what becomes of
the call; and make run's mock logs the completions, not the gateway's
probes and scrapes.
"""

import calendar
import http.server
import json
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time

import gwtest
from gwtest import (JSON_HEADERS, REPO_ROOT, Connection, assert_error,
                    budget, build_request, chat_body, closed_port,
                    has_metric, jbody, kill_group, parse_metrics,
                    recv_all, request, run_infergw, send_raw, skip,
                    wait_for)

from coalesce_util import (CHAT, assert_complete_stream, finish, held_trio,
                           new_tag, send, start, wait_state)

KEY = "sk-logs-0123456789ab"
TENANT = "[tenant acme]\napi_key = %s\nrequests_per_minute = 1\n" % KEY
AUTH = dict(JSON_HEADERS, Authorization="Bearer " + KEY)
WRONG = dict(JSON_HEADERS, Authorization="Bearer sk-not-a-key-0123456")

# Every access line has these, whatever its outcome.
FIELDS = ("method", "path", "tenant", "client", "model", "status",
          "upstream", "attempts", "upstream_status", "bytes", "duration_ms",
          "ttft_ms", "role", "flight")

KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def kv_access(line):
    """The fields of a kv access line (what follows ' access ')."""
    return dict(KV.findall(line.split(" access ", 1)[1]))


def access_kv(g, rid):
    """The kv fields of request 'rid''s access line (waits for it)."""
    line = g.wait_log(r"\breq=%s access " % re.escape(rid))
    f = kv_access(line)
    missing = [k for k in FIELDS if k not in f]
    assert not missing, "%s missing: %s" % (missing, line)
    return f


def with_id(headers, rid):
    return dict(headers, **{"X-Request-Id": rid})


def test_every_field_on_200_429_and_401(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT)
    ok = g.post(CHAT, chat_body("fields"), with_id(AUTH, "f-200"))
    assert ok.status == 200, ok
    limited = g.post(CHAT, chat_body("fields"), with_id(AUTH, "f-429"))
    assert_error(limited, 429, "rate_limit_exceeded")
    denied = g.post(CHAT, chat_body("fields"), with_id(WRONG, "f-401"))
    assert_error(denied, 401, "invalid_api_key")

    f = access_kv(g, "f-200")
    assert (f["method"], f["path"], f["tenant"], f["client"], f["model"],
            f["status"], f["upstream"], f["attempts"],
            f["upstream_status"], f["role"]) == (
        "POST", "/v1/chat/completions", "acme", "127.0.0.1", "mock-model",
        "200", "default", "1", "200", "leader"), f
    assert int(f["bytes"]) == len(ok.body), (f, len(ok.body))
    assert re.fullmatch(r"flight-[0-9a-f]{24}", f["flight"]), f
    assert int(f["ttft_ms"]) <= int(f["duration_ms"]), f

    # Refused after the body (the model is known), before any upstream.
    f = access_kv(g, "f-429")
    assert (f["tenant"], f["client"], f["model"], f["status"],
            f["upstream"], f["attempts"], f["upstream_status"], f["role"],
            f["flight"]) == ("acme", "127.0.0.1", "mock-model", "429", "-",
                             "0", "-", "-", "-"), f
    assert int(f["bytes"]) == len(limited.body) > 0, f
    assert re.fullmatch(r"\d+", f["duration_ms"]), f

    # Refused before the body: no tenant, no model.
    f = access_kv(g, "f-401")
    assert (f["method"], f["path"], f["tenant"], f["client"], f["model"],
            f["status"], f["upstream"], f["attempts"], f["role"],
            f["flight"]) == ("POST", "/v1/chat/completions", "-",
                             "127.0.0.1", "-", "401", "-", "0", "-", "-"), f
    assert int(f["bytes"]) == len(denied.body) > 0, f
    assert re.fullmatch(r"\d+", f["duration_ms"]), f


def test_a_bad_head_has_the_fields_too(t):
    g = t.gateway(t.mock())
    raw, _ = send_raw(g.port, b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 "), raw
    line = g.wait_log(r" access .*status=400")
    f = kv_access(line)
    assert all(k in f for k in FIELDS), line
    assert (f["method"], f["path"], f["client"], f["tenant"]) == (
        "-", "-", "127.0.0.1", "default"), f
    assert f["error"].startswith('"'), f


def client_of(g, rid, xff):
    """Send GET /healthz with an X-Forwarded-For line per item of 'xff'
    (name spellings vary: one list, RFC 9110 5.3) and return the access
    line's client."""
    names = ("X-Forwarded-For", "x-forwarded-for", "X-FORWARDED-FOR")
    headers = [("X-Request-Id", rid)] + [
        (names[i % 3], v) for i, v in enumerate(xff)]
    c = Connection(g.port)
    try:
        c.send(build_request("GET", "/healthz", headers))
        r = c.read_response()
        assert r.status == 200, r
    finally:
        c.close()
    return access_kv(g, rid)["client"]


# (X-Forwarded-For lines, the client logged) with trusted_proxies =
# 127.0.0.1, 10.0.0.0/8, 2001:db8:ffff::/48 and the test's peer 127.0.0.1.
XFF_CASES = [
    ([], "127.0.0.1", "no header: the peer"),
    (["203.0.113.9"], "203.0.113.9", "one address"),
    (["198.51.100.1, 203.0.113.9, 10.1.1.1"], "203.0.113.9",
     "from the right, trusted skipped, the first untrusted"),
    (["198.51.100.1", "10.2.2.2"], "198.51.100.1",
     "two lines are one list"),
    (["198.51.100.1", "203.0.113.5, 10.2.2.2"], "203.0.113.5",
     "the last line is read first"),
    (["10.1.1.1, 10.2.2.2"], "10.1.1.1", "all trusted: the left-most"),
    ([" , 203.0.113.9 ,, "], "203.0.113.9", "empty elements skipped"),
    (["2001:db8::1"], "2001:db8::1", "IPv6"),
    (["2001:db8::1, 2001:db8:ffff::7"], "2001:db8::1",
     "a trusted IPv6 network skipped"),
    (["::ffff:203.0.113.9"], "203.0.113.9", "a mapped address is IPv4"),
    (["garbage, 203.0.113.9"], "203.0.113.9",
     "past the client nothing is read"),
    (["203.0.113.9:8080"], "127.0.0.1", "a port: malformed, the peer"),
    (["203.0.113.9, unknown"], "127.0.0.1", "a name: malformed, the peer"),
    (["203.0.113.9, 10.1.1.1/8"], "127.0.0.1",
     "a network: malformed, the peer"),
    (['"\\\xff<x>'], "127.0.0.1", "hostile bytes: the peer"),
    ([""], "127.0.0.1", "an empty field"),
]


def test_forwarded_for_from_trusted_proxies_only(t):
    m = t.mock()
    g = t.gateway(m, conf={"server": {
        "trusted_proxies": "127.0.0.1, 10.0.0.0/8, 2001:db8:ffff::/48"}})
    got = [client_of(g, "x%d" % i, xff)
           for i, (xff, _, _) in enumerate(XFF_CASES)]
    want = [c for _, c, _ in XFF_CASES]
    bad = ["%s: %r gave %s, not %s" % (note, xff, have, c)
           for (xff, c, note), have in zip(XFF_CASES, got) if have != c]
    assert not bad, "\n".join(bad)
    assert got == want

    # The peer is not a trusted proxy: the header is anyone's, ignored.
    for conf in ({}, {"server": {"trusted_proxies": "10.0.0.0/8, ::1"}}):
        other = t.gateway(m, conf=conf)
        assert client_of(other, "u1", ["203.0.113.9"]) == "127.0.0.1"
        assert client_of(other, "u2", ["10.1.1.1, 203.0.113.9"]) \
            == "127.0.0.1"


def test_a_dual_stack_listener_sees_ipv4_peers_as_ipv4(t):
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::", 0))
        s.close()
    except OSError as e:
        skip("no IPv6 here: %s" % e)
    g = t.gateway(t.mock(), conf={"server": {
        "listen": "[::]:0", "trusted_proxies": "127.0.0.1"}})
    # An IPv4 peer, which the socket reports as ::ffff:127.0.0.1.
    assert client_of(g, "d1", []) == "127.0.0.1"
    assert client_of(g, "d2", ["203.0.113.9"]) == "203.0.113.9"
    # An IPv6 peer is not 127.0.0.1: its header is ignored.
    s = socket.create_connection(("::1", g.port), timeout=budget(5))
    try:
        s.sendall(build_request("GET", "/healthz", [
            ("X-Request-Id", "d3"), ("X-Forwarded-For", "203.0.113.9"),
            ("Connection", "close")]))
        raw, _ = recv_all(s)
    finally:
        s.close()
    assert raw.startswith(b"HTTP/1.1 200 "), raw
    assert access_kv(g, "d3")["client"] == "::1"


def json_line(raw):
    """One log line as JSON: an object with the four members every line
    has, and no byte that was not UTF-8 (the capture decodes with
    'replace', so such a byte would show as U+FFFD)."""
    assert "\ufffd" not in raw, "a byte that is not UTF-8: %r" % raw
    obj = json.loads(raw)
    assert isinstance(obj, dict), raw
    for k in ("ts", "level", "req", "msg"):
        assert isinstance(obj.get(k), str), "%s: %r" % (k, raw)
    assert obj["level"] in ("error", "warn", "info", "debug"), raw
    return obj


def test_json_every_line_of_a_whole_run(t):
    m = t.mock()
    g = t.gateway(m, conf={"server": {"log_format": "json",
                                      "trusted_proxies": "127.0.0.1"}},
                  extra=TENANT)
    secret = "sk-in-the-query-77aa"
    assert g.post(CHAT + "?api_key=" + secret, chat_body("json"),
                  with_id(AUTH, "j-200")).status == 200
    assert_error(g.post(CHAT, chat_body("json"), with_id(AUTH, "j-429")),
                 429, "rate_limit_exceeded")
    assert_error(g.post(CHAT, chat_body("json"), with_id(WRONG, "j-401")),
                 401, "invalid_api_key")
    assert_error(g.get("/nope?key=" + secret), 404, "not_found")
    # What a client controls, hostile: a model name (its '"', control
    # characters and each byte past ASCII become '_', its '\' stays), a
    # path full of escapes, an X-Forwarded-For with quotes, a backslash
    # and a byte not UTF-8 (malformed, so the peer is the client).
    assert_error(g.post(CHAT, jbody(model='a\\"b\\\\\x01\u00e9}', messages=[]),
                        with_id(dict(AUTH, **{"X-Forwarded-For":
                                              '1.2.3.4, "}\\\xff'}),
                                "j-model")), 429, "rate_limit_exceeded")
    assert_error(g.get("/%22%5C%0A%7B?x=%22"), 404, "not_found")
    raw, _ = send_raw(g.port, b"GET / HTTP/1.1\r\n\"}\\\xff\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 "), raw
    # An error line: a reload of a file that no longer loads.
    with open(g.conf_path, "a") as f:
        f.write("[coalesce]\nmax_followers = lots\n")
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"max_followers: expected")
    assert g.stop() == 0

    objs = [json_line(l) for l in g.log_lines()]
    msgs = [o["msg"] for o in objs]
    for want in (r"^server: listening ", r"^main: infergw .* started ",
                 r"^coalesce: leader ", r"^reload: .*max_followers",
                 r"^server: drained", r"^main: exit status=0"):
        assert any(re.search(want, x) for x in msgs), (want, msgs)
    assert any(o["level"] == "error" for o in objs), msgs
    text = "\n".join(g.log_lines())
    assert secret not in text and KEY not in text, "a key in the log"

    access = {o["req"]: o for o in objs if o["msg"] == "access"}
    for o in access.values():
        missing = [k for k in FIELDS if k not in o]
        assert not missing, (missing, o)
        for k in ("status", "bytes", "duration_ms", "attempts"):
            assert type(o[k]) is int, (k, o)
        for k in ("ttft_ms", "upstream_status"):
            assert o[k] is None or type(o[k]) is int, (k, o)
        for k in ("method", "path", "tenant", "client", "model", "role",
                  "flight", "upstream"):
            assert o[k] is None or isinstance(o[k], str), (k, o)
        assert o["path"] is None or "?" not in o["path"], o
    ok = access["j-200"]
    assert (ok["path"], ok["tenant"], ok["client"], ok["status"],
            ok["upstream_status"], ok["attempts"], ok["role"]) == (
        "/v1/chat/completions", "acme", "127.0.0.1", 200, 200, 1,
        "leader"), ok
    assert (access["j-429"]["status"], access["j-429"]["upstream"],
            access["j-429"]["flight"]) == (429, None, None)
    assert (access["j-401"]["status"], access["j-401"]["tenant"],
            access["j-401"]["model"]) == (401, None, None)
    hostile = access["j-model"]
    assert hostile["model"] == 'a\\_b\\\\___}', hostile
    assert hostile["client"] == "127.0.0.1", hostile
    assert any(o.get("path") == "/%22%5C%0A%7B" for o in access.values())
    assert any(o.get("status") == 400 and o.get("error")
               for o in access.values())


def test_a_config_error_before_the_format_is_plain_text(t):
    # The file asks for json, but it does not load: there is no format
    # yet, so the message is the plain one on stderr (documented).
    path = os.path.join(t.tmp, "bad.conf")
    with open(path, "w") as f:
        f.write("[server]\nlog_format = json\nmax_connections = lots\n")
    rc, out = run_infergw(t.bin, ["-c", path])
    assert rc == 2, out
    assert out.startswith("infergw: %s:3: max_connections: expected"
                          % path), out


def test_a_reload_changes_the_format(t):
    g = t.gateway(t.mock())
    assert g.get("/healthz", headers={"X-Request-Id": "r-kv"}).status == 200
    access_kv(g, "r-kv")
    with open(g.conf_path, "w") as f:
        f.write(g.conf_text.replace("[server]\n",
                                    "[server]\nlog_format = json\n"))
    g.send_signal(signal.SIGHUP)
    line = g.wait_log(r'^\{.*"msg":"reload: configuration generation=2 in')
    json_line(line)
    assert g.get("/healthz", headers={"X-Request-Id": "r-js"}).status == 200
    line = g.wait_log(r'"req":"r-js","msg":"access"')
    assert json_line(line)["status"] == 200


# ---- a failure that repeats in the background (issue 26 item 3) ------------

PERIOD_MS = 1000        # log_repeat_interval in the outage below
TS = re.compile(r"^ts=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z ")

VLLM_METRICS = (b"vllm:num_requests_running{model_name=\"m\"} 0.0\n"
                b"vllm:num_requests_waiting{model_name=\"m\"} 0.0\n")


def ts_ms(line):
    """A kv line's timestamp, in ms since the epoch."""
    m = TS.match(line)
    assert m, "no timestamp: %r" % line
    return (calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
            * 1000 + int(m.group(2)))


def number(line, key):
    m = re.search(r" %s=(\d+)" % key, line)
    assert m, "no %s= in %r" % (key, line)
    return int(m.group(1))


class _Answers(http.server.BaseHTTPRequestHandler):
    """vLLM's /health, /v1/models and /metrics, kept alive."""
    protocol_version = "HTTP/1.1"
    bodies = {"/health": b"",
              "/v1/models": b'{"object":"list","data":[{"id":"m"}]}',
              "/metrics": VLLM_METRICS}

    def do_GET(self):
        body = self.bodies.get(self.path)
        self.send_response(404 if body is None else 200)
        body = body or b""
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class DownUpstream:
    """An upstream that refuses every connection until up() is called:
    a socket bound to its port that does not listen (as
    gwtest.refused_port()), then listens and answers on that same socket,
    so nothing else can take the port in between."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.srv = None
        gwtest._register(self)

    def up(self):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers,
                                              bind_and_activate=False)
        srv.socket.close()
        srv.socket = self.sock
        srv.daemon_threads = True
        self.sock.listen(16)
        self.srv = srv
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    def close(self):
        if self.srv is not None:
            self.srv.shutdown()
        self.sock.close()


def feed_lines(g, what):
    return [l for l in g.log_lines() if (" %s " % what) in l]


def check_one_failure(lines, what, why, level="warn"):
    """'lines' (one feed's) are one repeating failure, whole: a start
    saying 'why', summaries never closer than PERIOD_MS whose counts add
    up, an end with the count and the time it lasted; all at 'level'."""
    kinds = []
    for l in lines:
        rest = l.split(" %s " % what, 1)[1]
        kinds.append(rest.split(" ")[0] if not rest.startswith("still ")
                     else "still")
        assert " level=%s " % level in l, l
    assert kinds[0] == "failing" and kinds[-1] == "recovered" and \
        set(kinds[1:-1]) == {"still"} and len(kinds) >= 4, \
        "want one start, summaries, one end:\n%s" % "\n".join(lines)
    assert why in lines[0], lines[0]
    said = [ts_ms(l) for l in lines[:-1]]
    gaps = [b - a for a, b in zip(said, said[1:])]
    assert min(gaps) >= PERIOD_MS - 20, \
        "lines %r ms apart, the period is %d:\n%s" % (
            gaps, PERIOD_MS, "\n".join(lines))
    total = 1
    for l in lines[1:-1]:
        total += number(l, "new")
        assert number(l, "failures") == total, (total, l)
    end = lines[-1]
    assert number(end, "failures") >= total, end
    assert number(end, "for_ms") >= number(lines[-2], "for_ms"), end
    # The point: many failures, a few lines (a beat every 50 ms).
    assert number(end, "failures") >= 2 * len(lines), end


def test_an_upstream_down_is_one_failure_not_a_line_a_beat(t):
    """The only upstream refuses connections, for as long as the test
    says (until each beat has been summed up twice), while the health
    and load beats ask it every 50 ms; then it answers.  Each feed logs
    one start line, summaries at most once per log_repeat_interval with
    counts that add up, and one end line with the count; no line per
    attempt.  (Mutants: no period, each failure a line: "lines [50, ...]
    ms apart"; the per-attempt line at warn again: "upstream: failed".)"""
    up = DownUpstream()
    # load_timeout: once up, a slow answer of ours (Python, a busy
    # machine) must not pass for a new failure.
    g = t.gateway(up.port, conf={
        "server": {"log_repeat_interval": "%dms" % PERIOD_MS},
        "routing": {"health_interval": "50ms", "load_interval": "50ms",
                    "load_timeout": "5s"}})
    feeds = ("health: upstream default GET /health",
             "scrape: upstream default GET /metrics")
    for what in feeds:
        wait_for(lambda: len([l for l in feed_lines(g, what)
                              if " still failing " in l]) >= 2,
                 timeout=10, msg="two summaries of %s" % what)
    up.up()
    for what in feeds:
        g.wait_log(re.escape(what) + " recovered ", timeout=10)
    for what in feeds:
        check_one_failure(feed_lines(g, what), what,
                          'reason="connect failed"')
    assert not [l for l in g.log_lines() if "upstream: failed" in l], \
        "a line per attempt:\n%s" % "\n".join(g.log_tail())
    # The engine's load is read again, and that is said once.
    g.wait_log(r"scrape: upstream default reports its engine load")
    assert len([l for l in g.log_lines()
                if "reports its engine load" in l]) == 1, g.log_tail()


def test_a_server_without_vllm_metrics_is_not_failing(t):
    """GET /metrics answered 404 is what that server serves, said once
    (balancing on its open calls), not a failure summed up forever.
    The failure's line would come first, in the same scrape (with
    log_repeat_interval 0 at once).  (Mutant: any status but 200 a
    failure.)"""
    m = t.mock()
    assert request(m.port, "POST", "/control?metrics=off").status == 200
    g = t.gateway(m, conf={"server": {"log_repeat_interval": 0},
                           "routing": {"load_interval": "50ms"}})
    g.wait_log(r"scrape: upstream default has no engine load \(GET "
               r"/metrics: status 404\): balancing on its open calls")
    assert not feed_lines(g, "scrape: upstream default GET /metrics"), \
        "\n".join(g.log_tail())


def test_out_of_descriptors_is_one_failure_too(t):
    """The acceptor out of descriptors: accept() fails again after every
    50 ms backoff while a connection waits.  The test lowers the
    gateway's RLIMIT_NOFILE so that two descriptors are left, holds two
    connections and a third that cannot be accepted until the test has
    seen two summaries, then lets all three go.  (Mutants: a line per
    failure again: "lines [50, ...] ms apart"; any EMFILE a failure, the
    one of the try that finds nobody waiting too: a line before the
    third connection.)"""
    g = t.gateway(gwtest.refused_port(), conf={
        "server": {"log_repeat_interval": "%dms" % PERIOD_MS},
        "routing": {"health_interval": 0, "load_interval": 0}})
    # Its first GET /v1/models is over (the next is 30 s away): what it
    # holds now stays put.
    g.wait_log(r"health: upstream default GET /v1/models failing ")
    held = {int(fd) for fd in os.listdir("/proc/%d/fd" % g.proc.pid)}
    # The limit is on the numbers (a new descriptor takes the lowest one
    # free), and what was closed left holes: the one that leaves two.
    limit = free = 0
    while free < 2:
        free += limit not in held
        limit += 1
    _, hard = resource.prlimit(g.proc.pid, resource.RLIMIT_NOFILE)
    try:
        resource.prlimit(g.proc.pid, resource.RLIMIT_NOFILE, (limit, hard))
    except PermissionError as e:
        skip("cannot lower another process's RLIMIT_NOFILE here: %s" % e)
    what = "server: accept"

    def answered(c):
        assert c.request("GET", "/healthz").status == 200
        return c

    def fds():
        return len(os.listdir("/proc/%d/fd" % g.proc.pid))

    conns = [answered(Connection(g.port)) for _ in range(2)]
    # Every descriptor taken and nobody waiting: the accept() that finds
    # no connection fails too (EMFILE before EAGAIN), and is no failure.
    # One given back and taken again: that accept's line, had there been
    # a failure to end, comes before the new connection is answered.
    n = fds()
    conns.pop(0).close()
    wait_for(lambda: fds() == n - 1, msg="the gateway closes one")
    conns.append(answered(Connection(g.port)))
    assert not feed_lines(g, what), "\n".join(g.log_tail())

    # A connection waits that cannot be taken.
    conns.append(socket.create_connection(("127.0.0.1", g.port),
                                          timeout=budget(5)))
    try:
        wait_for(lambda: len([l for l in feed_lines(g, what)
                              if " still failing " in l]) >= 2,
                 timeout=10, msg="two summaries of %s" % what)
    finally:
        for c in conns:
            c.close()
    g.wait_log(r"server: accept recovered ", timeout=10)
    check_one_failure(feed_lines(g, what), what,
                      'err="Too many open files"', level="error")


def test_the_gateways_own_probes_are_never_a_warning(t):
    """A balancer asks /readyz every second; with no usable upstream the
    answer is a 503, and each is an access line at info, nothing more
    (a 503 of the gateway's own is no upstream's error)."""
    g = t.gateway(gwtest.refused_port(), conf={
        "routing": {"health_interval": "50ms", "eject_after": 1}})
    wait_for(lambda: g.get("/readyz").status == 503, timeout=10,
             msg="/readyz 503 with the only upstream refusing")
    for i in range(5):
        for path, status in (("/readyz", 503), ("/healthz", 200)):
            rid = "probe-%s-%d" % (path[1:], i)
            r = g.get(path, headers={"X-Request-Id": rid})
            assert r.status == status, r
            line = access_kv(g, rid)
            assert line["status"] == str(status), line
            mine = [l for l in g.log_lines() if " req=%s " % rid in l]
            assert len(mine) == 1 and " level=info " in mine[0], mine


def leader_leaves(g, conn):
    """The leader's client reads its first event and hangs up; returns
    the leader's line about it (the first one since)."""
    def gone():
        return [l for l in g.log_lines() if "coalesce: leader client" in l]
    before = len(gone())
    s = start(conn)
    assert s.next_event() is not None
    s.close()
    return wait_for(lambda: gone()[before:], msg="the leader's line")[0]


def test_the_leader_line_says_what_becomes_of_the_call(t):
    """The leader's client goes: with no follower the call stops, and
    the line says so (it used to say the flight continues for
    followers, then "call stopped" in the same millisecond); with two,
    it goes on for them, and they get it whole."""
    m = t.mock()
    g = t.gateway(m)
    # Past the role chunk the mock sends nothing until its gate opens
    # (mock_gate): each stream is still running when its leader's
    # client goes, on any machine.
    tag = new_tag()
    body = chat_body("alone", stream=True, mock_chunks=200,
                     mock_hold=tag, mock_gate=tag)
    lone = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    assert m.release(tag) == 1
    line = leader_leaves(g, lone)
    assert re.search(r"coalesce: leader client gone, no follower: the "
                     r"upstream call stops flight=flight-", line), line
    g.wait_log(r"upstream: call stopped, its clients hung up")
    wait_state(g, m, aborted=1, flights=0)

    tag = new_tag()
    body = chat_body("shared", stream=True, mock_chunks=20,
                     mock_hold=tag, mock_gate=tag)
    lead_c, f1, f2 = held_trio(g, m, body)
    line = leader_leaves(g, lead_c)
    assert re.search(r"coalesce: leader client gone, the upstream call "
                     r"goes on for 2 followers flight=flight-", line), line
    assert m.gate(tag, 20) == 20
    for c in (f1, f2):
        assert_complete_stream(finish(c), "a follower")
    assert not [l for l in g.log_lines() if "flight continues" in l]


RUN = os.path.join(REPO_ROOT, "tools", "run.sh")
BEAT = re.compile(r" mock: method=GET path=/(metrics|health|v1/models) ")


def test_make_run_mock_logs_completions_not_probes_or_scrapes(t):
    """tools/run.sh (make run) on free ports: once the gateway has read
    the mock's load, the mock's log has the completion the demo sends and
    none of the probes and scrapes, the gateway's nor ours (sent on the
    completion's connection first, so their lines, if any, would come
    before its)."""
    port, up, admin = closed_port(), closed_port(), closed_port()
    logpath = os.path.join(t.tmp, "run.log")
    env = dict(os.environ, BIN=t.bin, INFERGW=os.path.join(t.bin, "infergw"),
               RUN_DIR=t.tmp, PORT=str(port), UPSTREAM_PORT=str(up),
               ADMIN_PORT=str(admin))
    with open(logpath, "w") as out:
        proc = subprocess.Popen(["sh", RUN], cwd=REPO_ROOT, stdout=out,
                                stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    try:
        def scraped():
            r = request(admin, "GET", "/metrics")
            return r.status == 200 and has_metric(
                parse_metrics(r.text),
                "infergw_upstream_engine_load_age_seconds")
        wait_for(scraped, timeout=15, msg="the gateway reads the mock")
        c = Connection(up)
        try:
            for path in ("/metrics", "/health", "/v1/models"):
                r = c.request("GET", path)
                assert r.status == 200, (path, r)
            r = c.request("POST", CHAT, dict(JSON_HEADERS, **{
                "X-Request-Id": "run-demo"}), chat_body(
                    "demo", model="llama-3-8b", mock_first_ms=0,
                    mock_delay_ms=0))
            assert r.status == 200, r
        finally:
            c.close()

        def logged():
            with open(logpath) as f:
                text = f.read()
            return text if re.search(r" req=run-demo mock: method=POST "
                                     r"path=/v1/chat/completions ",
                                     text) else None
        text = wait_for(logged, msg="the mock's line for the completion")
        beat = [l for l in text.splitlines() if BEAT.search(l)]
        assert not beat, "probes and scrapes logged:\n%s" % "\n".join(
            beat[:5])
    finally:
        kill_group(proc)
