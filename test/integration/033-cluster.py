# SPDX-License-Identifier: MIT
"""033 - [cluster]: gateways that know each other through Redis (issue
28, items 2, 6, 7 and 8 as far as they go without shared limits).

Each test starts its own redis-server (tools: redis-server, Debian's
redis-server package), without persistence, on a unix socket in the
test's directory or on a loopback port found free by binding port 0
first; one with requirepass, its password given by redis_password_file.
Every wait polls with a deadline.
"""

import hashlib
import os
import re
import signal
import subprocess
import time

import socket
import threading

import gwtest
from gwtest import (budget, chat_body, metric, parse_metrics, request, tool,
                    wait_for)

TENANT_KEY = "sk-cluster-tenant-key-0001"
PASSWORD = "redis-pw-7f3a9c"


def free_port():
    """A loopback port nobody listens on now: bound on port 0, freed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server of the test's own: unix socket, or a loopback TCP
    port when 'tcp' (found free first), with requirepass 'password'."""

    def __init__(self, tmp, name="redis", password=None, tcp=False):
        self.exe = tool("redis-server", "redis-server")
        self.cli = tool("redis-cli", "redis-server")
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "redis.sock")
        self.password = password
        self.port = free_port() if tcp else 0
        self.proc = None
        self.start()

    def url(self):
        if self.port:
            return "redis://127.0.0.1:%d" % self.port
        return "unix:%s" % self.sock

    def start(self):
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1",
                "--unixsocket", self.sock, "--save", "", "--appendonly",
                "no", "--dir", self.dir]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        gwtest._register(self)
        wait_for(lambda: self.run("PING") == "PONG", 10,
                 msg="redis-server did not start")

    def run(self, *args):
        """redis-cli over the socket: its output, stripped ("" if down)."""
        cmd = [self.cli, "-s", self.sock, "--no-auth-warning"]
        if self.password:
            cmd += ["-a", self.password]
        r = subprocess.run(cmd + list(args), capture_output=True, text=True,
                           timeout=budget(5), check=False)
        return r.stdout.strip()

    def info(self, field):
        m = re.search(r"^%s:(\d+)" % field, self.run("INFO"), re.M)
        return int(m.group(1)) if m else None

    def kill(self):
        gwtest.kill_process(self.proc)

    def close(self):
        self.kill()


def cluster_conf(r, **more):
    c = {"redis": r.url(), "lease": "1s"}
    c.update(more)
    return c


def status(g):
    resp = request(g.admin_port, "GET", "/status.json")
    assert resp.status == 200, resp
    return resp.json()


def members(g):
    return sorted(m["node"] for m in status(g)["cluster"]["members"])


def metrics(g):
    """/metrics on the admin listener (no key asked there)."""
    resp = request(g.admin_port, "GET", "/metrics")
    assert resp.status == 200, resp
    return parse_metrics(resp.body.decode())


def up(g):
    return metric(metrics(g), "infergw_cluster_up")


def gateway(t, m, r, node, **more):
    conf = {"admin": {"listen": "127.0.0.1:0"},
            "cluster": cluster_conf(r, node=node, **more)}
    return t.gateway(m, conf=conf, admin_key=None)


def test_no_cluster_section_connects_nothing(t):
    r = Redis(t.tmp)
    before = r.info("total_connections_received")
    m = t.mock()
    g = t.gateway(m, conf={"admin": {"listen": "127.0.0.1:0"}},
                  admin_key=None)
    assert g.post("/v1/chat/completions", chat_body()).status == 200
    assert status(g)["cluster"] is None
    resp = request(g.admin_port, "GET", "/metrics")
    assert "infergw_cluster" not in resp.body.decode()
    # The only connections Redis saw since: redis-cli's own.
    after = r.info("total_connections_received")
    assert after == before + 1, (before, after)


def test_two_gateways_see_each_other(t):
    """With requirepass over TCP, the password from a file; each lists
    both; nothing in Redis names an API key or its hash."""
    r = Redis(t.tmp, password=PASSWORD, tcp=True)
    pw = t.write("redis.password", PASSWORD + "\n")
    os.chmod(pw, 0o600)         # refused while others may read it
    m = t.mock()
    extra = "[tenant acme]\napi_key = %s\n" % TENANT_KEY
    gws = []
    for node in ("gw-a", "gw-b"):
        conf = {"admin": {"listen": "127.0.0.1:0"},
                "cluster": cluster_conf(r, node=node,
                                        redis_password_file=pw,
                                        redis_connections=2)}
        gws.append(t.gateway(m, conf=conf, extra=extra, admin_key=None))
    for g in gws:
        wait_for(lambda g=g: members(g) == ["gw-a", "gw-b"], budget(5),
                 msg="both gateways in each one's status view")
        assert up(g) == 1
        assert metric(metrics(g), "infergw_cluster_members") == 2
        c = status(g)["cluster"]
        assert c["up"] is True and c["connections"] == 2, c
        assert PASSWORD not in str(c), c
        me = [x for x in c["members"] if x["self"]]
        assert len(me) == 1 and me[0]["version"], c
        assert me[0]["generation"] == 1, c
    g = gws[0]
    assert g.post("/v1/chat/completions", chat_body(),
                  headers={"Authorization": "Bearer " + TENANT_KEY}
                  ).status == 200
    # Every key under the prefix, the gateways' under their hash tag.
    keys = r.run("--scan").split()
    assert sorted(keys) == ["infergw:{@gateways}:members",
                            "infergw:{@gateways}:node:gw-a",
                            "infergw:{@gateways}:node:gw-b"], keys
    digest = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
    for k in keys:
        kind = r.run("TYPE", k)
        value = (r.run("GET", k) if kind == "string"
                 else r.run("ZRANGE", k, "0", "-1"))
        for secret in (TENANT_KEY, digest, PASSWORD):
            assert secret not in k + value, (k, value)
    # No connection per client thread: the pools' 2 each, and the cli.
    assert r.info("connected_clients") == 2 * 2 + 1


def test_killed_gateway_is_gone_within_the_lease(t):
    r = Redis(t.tmp)
    m = t.mock()
    a = gateway(t, m, r, "gw-a")
    b = gateway(t, m, r, "gw-b")
    wait_for(lambda: members(a) == ["gw-a", "gw-b"], budget(5),
             msg="gw-b seen by gw-a")
    b.proc.kill()
    t0 = time.monotonic()
    wait_for(lambda: members(a) == ["gw-a"], budget(5),
             msg="gw-b gone from gw-a's view")
    gone = time.monotonic() - t0
    # The lease (1 s), and one of gw-a's beats (lease / 3) to see it.
    assert gone < budget(1.0 + 0.34 + 0.5), gone
    assert metric(metrics(a), "infergw_cluster_members") == 1


def test_redis_lost_and_back(t):
    """Redis SIGKILLed, then SIGSTOPped: the gauge goes 0 then 1, one log
    line each way, and requests are served meanwhile without waiting."""
    r = Redis(t.tmp)
    m = t.mock()
    g = gateway(t, m, r, "gw-a", redis_timeout="20ms")
    wait_for(lambda: up(g) == 1, budget(5), msg="cluster up")

    def served_fast():
        t0 = time.monotonic()
        resp = g.post("/v1/chat/completions", chat_body())
        took = time.monotonic() - t0
        assert resp.status == 200, resp
        assert took < budget(0.5), took

    served_fast()
    r.kill()
    wait_for(lambda: up(g) == 0, budget(3), msg="cluster_up 0")
    for _ in range(5):
        served_fast()
    c = status(g)["cluster"]
    assert c["up"] is False and c["last_error"], c
    assert c["connections"] == 0, c
    # Several failed tries (100, 200, 400 ms apart), one log line.
    wait_for(lambda: metric(metrics(g), "infergw_cluster_errors_total")
             >= 3, budget(5), msg="three failed tries")
    r.start()
    # The backoff is at most 5 s; this one has failed for well under that.
    wait_for(lambda: up(g) == 1, budget(8), msg="cluster_up 1 again")
    served_fast()
    wait_for(lambda: members(g) == ["gw-a"], budget(3),
             msg="the heartbeat written again to an empty Redis")
    lost = [l for l in g.log_lines() if "cluster: redis lost" in l]
    back = [l for l in g.log_lines() if "cluster: redis back" in l]
    assert len(lost) == 1 and len(back) == 1, (lost, back)

    # Stopped, not gone: the beat's bound ends the wait, not TCP.
    os.kill(r.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: up(g) == 0, budget(3), msg="stopped: cluster_up 0")
        served_fast()
    finally:
        os.kill(r.proc.pid, signal.SIGCONT)
    wait_for(lambda: up(g) == 1, budget(8), msg="continued: cluster_up 1")
    lost = [l for l in g.log_lines() if "cluster: redis lost" in l]
    assert len(lost) == 2, lost
    h = metrics(g)
    assert metric(h, "infergw_cluster_latency_seconds_count",
                  op="heartbeat") >= 3


def test_two_gateways_with_one_node_name_warn(t):
    """Two gateways given the same node overwrite one heartbeat key and
    hide each other; each heartbeat carries its process's random
    instance id, so they notice and say so."""
    r = Redis(t.tmp)
    m = t.mock()
    a = gateway(t, m, r, "gw-same")
    b = gateway(t, m, r, "gw-same")

    def warned(g):
        return [l for l in g.log_lines()
                if "writes heartbeats as node=gw-same too" in l]
    # lease 1 s: a beat every 333 ms, a second sighting within a second.
    wait_for(lambda: warned(a) and warned(b), budget(5),
             msg="both gateways warn of the other")
    # Rate-limited: one line each, not one per beat.
    time.sleep(budget(1))
    assert len(warned(a)) == 1 and len(warned(b)) == 1, (warned(a),
                                                         warned(b))
    ids = [re.search(r"this one is instance ([0-9a-f]{16})",
                     warned(g)[0]).group(1) for g in (a, b)]
    assert ids[0] != ids[1], ids


def test_reload(t):
    """A reload that keeps [cluster] keeps its connections and beat, and
    tells the heartbeat the new generation; one that renames the node
    replaces it, and the old name is gone within the lease."""
    r = Redis(t.tmp)
    m = t.mock()
    g = gateway(t, m, r, "gw-a")
    wait_for(lambda: members(g) == ["gw-a"], budget(5), msg="gw-a listed")
    received = r.info("total_connections_received")
    with open(g.conf_path, "a") as f:
        f.write("\n[coalesce]\nmax_followers = 7\n")
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")

    def generation():
        return [x["generation"] for x in status(g)["cluster"]["members"]]
    wait_for(lambda: generation() == [2], budget(3),
             msg="the heartbeat names generation 2")
    assert r.info("total_connections_received") <= received + 2
    ups = [l for l in g.log_lines() if "cluster: redis up" in l]
    assert len(ups) == 1, ups

    text = open(g.conf_path).read().replace("node = gw-a", "node = gw-b")
    with open(g.conf_path, "w") as f:
        f.write(text)
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=3 in force")
    wait_for(lambda: members(g) == ["gw-b"], budget(3),
             msg="the new node listed, the old one gone")


class SlowRedis:
    """A fake Redis on a loopback port: it answers a connection's hello
    (its PINGs, +PONG each) after 900 ms and never answers a heartbeat
    (EVAL or EVALSHA); 'in_heartbeat' is set once one waits."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.in_heartbeat = threading.Event()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,),
                             daemon=True).start()

    def serve(self, c):
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    return
                if b"EVAL" in d.upper():
                    self.in_heartbeat.set()
                    continue
                time.sleep(0.9)
                c.sendall(b"+PONG\r\n" * d.count(b"*"))
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.sock.close()


def test_reload_never_waits_for_the_old_beat(t):
    """The replaced cluster's beat may be in a connect or a heartbeat for
    a second each: the reload does not wait for it, so the accept loop
    answers /healthz at once."""
    fake = SlowRedis()
    m = t.mock()
    conf = {"admin": {"listen": "127.0.0.1:0"},
            "cluster": {"redis": "redis://127.0.0.1:%d" % fake.port,
                        "redis_timeout": "1s", "redis_connections": 1,
                        "node": "gw-a", "lease": "3s"}}
    g = t.gateway(m, conf=conf, admin_key=None)
    try:
        assert fake.in_heartbeat.wait(budget(5)), "no heartbeat sent"
        text = open(g.conf_path).read().replace("node = gw-a", "node = gw-b")
        with open(g.conf_path, "w") as f:
            f.write(text)
        t0 = time.monotonic()
        g.send_signal(signal.SIGHUP)
        g.wait_log(r"reload: configuration generation=2 in force")
        resp = g.get("/healthz")
        took = time.monotonic() - t0
        assert resp.status == 200, resp
        assert took < budget(0.3), took
    finally:
        fake.close()


def test_bad_cluster_settings_are_file_line_errors(t):
    cases = [
        ("redis = http://127.0.0.1:6379", "redis: expected"),
        ("redis = redis://:%s@127.0.0.1:0" % PASSWORD, "redis: expected"),
        ("redis = unix:/r.sock\nredis_timeout = 0ms",
         "redis_timeout: expected"),
        ("redis = unix:/r.sock\nredis_connections = 0",
         "redis_connections: expected"),
        ("redis = unix:/r.sock\nkey_prefix = a{b}", "key_prefix: expected"),
        ("redis = unix:/r.sock\non_error = maybe", "on_error: expected"),
    ]
    for body, want in cases:
        path = t.write("bad.conf", "[server]\nlisten = 127.0.0.1:0\n\n"
                                   "[cluster]\n" + body + "\n")
        rc, out = t.infergw("-t", "-c", path)
        line = 5 + body.count("\n")
        assert rc == 2, (body, rc, out)
        assert "%s:%d: %s" % (path, line, want) in out, (body, out)
        assert PASSWORD not in out, out
    path = t.write("none.conf", "[server]\nlisten = 127.0.0.1:0\n"
                                "[cluster]\n")
    rc, out = t.infergw("-t", "-c", path)
    assert rc == 2 and "%s:3: [cluster] needs redis" % path in out, out
