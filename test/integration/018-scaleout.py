# SPDX-License-Identifier: MIT
"""018 - several gateways behind HAProxy (issue 11), with the shipped
etc/haproxy/infergw.cfg: identical requests still meet on one gateway
(one upstream call, identical bodies), distinct ones spread over all of
them, and a gateway that drains leaves the ring with its open streams
finished and no client error.  Without haproxy the tests skip (make
check's install step installs it, and counts such a skip as a failure).
"""

import json
import os
import re
import signal
import socket
import subprocess
import threading

import gwtest
from gwtest import budget, chat_body, metric, request, tool, wait_for

from coalesce_util import (CHAT, FOLLOWERS, LEADERS, assert_complete_stream,
                           assert_same_bodies, finish_all, new_tag, present,
                           send)

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "..", "..", "etc", "haproxy", "infergw.cfg")


class HAProxy:
    """haproxy -db with the shipped config, its frontend on a socket we
    bound to port 0 (passed as fd@N: HAProxy 2.6 cannot bind port 0),
    its servers the given gateways, checks every 100 ms, each given
    budget(10) to answer."""

    def __init__(self, exe, tmp, gateways):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.stats = os.path.join(tmp, "haproxy.sock")
        with open(SHIPPED) as f:
            text = f.read()
        text = text.replace("bind 127.0.0.1:8090",
                            "bind fd@%d" % self.sock.fileno())
        # Checks every 100 ms, and one failure takes a server out.  A
        # check's answer may take as long as the machine needs (without
        # 'timeout check' its whole time would be 'inter', 100 ms): a
        # gateway slow to answer /readyz under the test's own load is
        # not down, and taking it out would move its share of the hash.
        text = text.replace("default-server inter 1s fall 2 rise 2",
                            "timeout check %ds\n    default-server inter "
                            "100ms fall 1 rise 1" % round(budget(10)))
        text = text.replace("global\n", "global\n    stats socket %s "
                            "level admin\n" % self.stats, 1)
        servers = "".join("    server gw%d 127.0.0.1:%d check\n"
                          % (i + 1, g.port) for i, g in enumerate(gateways))
        text = re.sub(r"(    server gw\d 127\.0\.0\.1:\d+ check\n)+",
                      servers, text)
        assert text.count("bind fd@") == 1
        assert len(re.findall(r"^    server gw", text, re.M)) == len(gateways)
        self.cfg = os.path.join(tmp, "haproxy.cfg")
        with open(self.cfg, "w") as f:
            f.write(text)
        self.log = open(os.path.join(tmp, "haproxy.log"), "w")
        self.proc = subprocess.Popen(
            [exe, "-db", "-f", self.cfg], stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(self.sock.fileno(),), start_new_session=True)
        gwtest._register(self)
        wait_for(lambda: self.states() == ["UP"] * len(gateways),
                 timeout=10, msg="haproxy's servers up")

    def states(self):
        """Each server's status (UP, DOWN, ...), in order; [] if the
        stats socket is not there yet."""
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(budget(2))
            s.connect(self.stats)
            s.sendall(b"show stat\n")
            out = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
            s.close()
        except OSError:
            return []
        rows = [l.split(",") for l in out.decode().splitlines()
                if l.startswith("gateways,gw")]
        return [r[17] for r in rows]

    def close(self):
        gwtest.kill_process(self.proc)
        self.sock.close()
        self.log.close()


def setup(t):
    """A mock, three gateways and HAProxy in front (or skip the test)."""
    exe = gwtest.tool("haproxy")
    m = t.mock()
    gws = [t.gateway(m) for _ in range(3)]
    return m, gws, HAProxy(exe, t.tmp, gws)


def per_gateway(gws, name):
    return [present(g.metrics(), name) for g in gws]


def test_shipped_config_is_valid(t):
    p = subprocess.run([gwtest.tool("haproxy"), "-c", "-f", SHIPPED],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=30)
    assert p.returncode == 0, p.stdout


def recipe_blocks():
    """The shell blocks of docs/SCALE-OUT.md ("Beyond one machine"): the
    set-up of its HAProxy recipe and the request sent through it."""
    with open(os.path.join(gwtest.REPO_ROOT, "docs", "SCALE-OUT.md")) as f:
        text = f.read()
    blocks = re.findall(r"\n```sh\n(.*?)```\n", text, re.S)
    assert len(blocks) == 4, \
        "docs/SCALE-OUT.md's recipe: %d sh blocks" % len(blocks)
    return blocks


def test_the_recipe_as_written(t):
    """docs/SCALE-OUT.md's recipe, copied as it is: the mock, two
    gateways from etc/gateway.conf with their ports changed, the shipped
    HAProxy config, then a request through HAProxy.  It runs in a network
    namespace of its own (unshare), so its fixed ports are free whatever
    else runs here; the tree it runs in is the repository's etc/, with
    this build's binaries where the recipe looks for them."""
    tool("haproxy")
    unshare, ip, curl = tool("unshare", "util-linux"), tool(
        "ip", "iproute2"), tool("curl")
    if subprocess.run([unshare, "--net", "--map-root-user", "true"],
                      capture_output=True).returncode != 0:
        gwtest.skip("no network namespace for us here (unshare --net "
                    "--map-root-user refused)")
    setup_block, request_block, cluster_block, limit_block = \
        recipe_blocks()
    tool("redis-server", "redis-server")
    # Its ports are none of etc/gateway.conf's, so a 'make run' (or
    # the shipped config itself) fits beside it.
    with open(os.path.join(gwtest.REPO_ROOT, "etc", "gateway.conf")) as f:
        conf = set(re.findall(r"^(?:listen|url) = \S*:(\d+)", f.read(),
                              re.M))
    with open(SHIPPED) as f:
        ours = set(re.findall(r"^\s+(?:bind|server \w+) 127\.0\.0\.1:(\d+)",
                              f.read(), re.M))
    assert len(conf) == 3 and len(ours) == 4, (conf, ours)
    assert not conf & ours, "HAProxy's example uses %s, etc/gateway.conf's " \
        "ports" % sorted(conf & ours)
    tree = os.path.join(t.tmp, "tree")
    os.makedirs(os.path.join(tree, "build", "default"))
    os.symlink(t.bin, os.path.join(tree, "build", "default", "bin"))
    os.symlink(os.path.join(t.bin, "infergw"), os.path.join(tree, "infergw"))
    os.symlink(os.path.join(gwtest.REPO_ROOT, "etc"),
               os.path.join(tree, "etc"))
    # The test's own wait (a poll with a deadline) between the blocks:
    # HAProxy takes a gateway in after two good checks a second apart.
    script = "\n".join([
        "set -e", "%s link set lo up" % ip, "cd %s" % tree, setup_block,
        "n=0",
        "until %s -sf -o /dev/null http://127.0.0.1:8090/readyz; do" % curl,
        "    n=$((n + 1)); [ $n -lt %d ] || exit 99; sleep 0.1" % int(
            budget(30) * 10),
        "done",
        "echo '--- the request'", request_block,
        # The limit's part: Redis and the tenant, a reload, the test's
        # own wait until every gateway's beat reached Redis, and 14
        # requests of the tenant timed (a refill is one per 12 s).
        cluster_block,
        "n=0",
        "for p in 8191 8192; do",
        "    until %s -s http://127.0.0.1:$p/metrics | grep -q "
        "'^infergw_cluster_up 1'; do" % curl,
        "        n=$((n + 1)); [ $n -lt %d ] || exit 98; sleep 0.1" % int(
            budget(30) * 10),
        "    done",
        "done",
        # And until HAProxy has both gateways in its ring: each has
        # answered a third good check, a second after the second one
        # took it in (rise 2).
        "for i in 1 2; do",
        "    until [ $(grep -c 'path=/readyz .*status=200' "
        "build/gw$i.log) -ge 3 ]; do",
        "        n=$((n + 1)); [ $n -lt %d ] || exit 97; sleep 0.1" % int(
            budget(30) * 10),
        "    done",
        "done",
        "t0=$(date +%s)",
        "echo '--- the limit'", limit_block,
        "echo \"--- took $(( $(date +%s) - t0 ))\""])
    env = dict(os.environ, PATH=os.environ.get("PATH", "") +
               ":/usr/sbin:/sbin")
    # Output to a file: the servers it leaves running hold it open.
    out_path = os.path.join(t.tmp, "recipe.out")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([unshare, "--net", "--map-root-user", "sh",
                                 "-c", script], stdout=out,
                                stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    try:
        rc = proc.wait(timeout=budget(50))
    finally:
        # The recipe's servers run on in the namespace: end them all.
        gwtest.kill_process(proc)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with open(out_path, "rb") as f:
        text = f.read().decode(errors="replace")
    assert rc == 0, "exit %d:\n%s" % (rc, text)
    answer, limit = text.split("--- the request\n", 1)[1].split(
        "--- the limit\n", 1)
    # The answer is the request block's only output, before the limit's
    # set-up; Redis logs to its own file.
    # HAProxy's warnings (a server DOWN, then UP) share the output, and
    # the answer ends without a newline: the JSON document at its start.
    doc, _ = json.JSONDecoder().raw_decode(answer.strip())
    assert doc["object"] == "chat.completion", doc
    assert doc["model"] == "llama-3-8b", doc
    assert doc["choices"][0]["message"]["content"], doc
    logs = ""
    for i in (1, 2):
        with open(os.path.join(tree, "build", "gw%d.log" % i)) as f:
            logs += f.read()
    assert "path=/v1/chat/completions" in logs and "status=200" in logs, \
        logs[-2000:]
    # One limit for the gateways: 5 of 14 answered (plus one per 12 s
    # the requests took), not up to 5 each; both gateways had some of
    # them.
    counts, took = limit.split("--- took ", 1)
    codes = {c: int(n) for n, c in re.findall(r"(\d+) (\d{3})", counts)}
    refill = int(took.split()[0]) // 12
    assert sum(codes.values()) == 14, counts
    assert 5 <= codes.get("200", 0) <= 5 + refill, (counts, took)
    assert codes.get("429", 0) == 14 - codes.get("200", 0), counts
    served = []
    for i in (1, 2):
        with open(os.path.join(tree, "build", "gw%d.log" % i)) as f:
            if "tenant=demo" in f.read():
                served.append(i)
    assert len(served) == 2, "only gateways %s served the tenant" % served


def test_300_identical_streams_one_upstream_call(t):
    m, gws, hp = setup(t)
    tag = new_tag()
    body = chat_body("scale out", stream=True, mock_hold=tag)
    conns = [send(hp, body)]
    wait_for(lambda: sum(per_gateway(gws, LEADERS)) == 1
             and m.stats()["held"] == 1, msg="the leader held")
    conns += [send(hp, body) for _ in range(299)]
    wait_for(lambda: sum(per_gateway(gws, FOLLOWERS)) == 299, timeout=30,
             msg="299 followers")
    # All on one gateway: the one the body hashes to.
    assert sorted(per_gateway(gws, FOLLOWERS)) == [0, 0, 299]
    m.release(tag)
    streams = finish_all(conns, timeout=60)
    for st in streams:
        assert_complete_stream(st)
    assert_same_bodies(streams)
    assert m.stats()["completions"] == 1


def test_distinct_requests_spread_over_every_gateway(t):
    m, gws, hp = setup(t)
    for i in range(30):
        r = request(hp.port, "POST", CHAT, {"Content-Type":
                    "application/json"}, chat_body("distinct %d" % i))
        assert r.status == 200, r
    def ok_counts(total):
        """Each gateway's 200s, once they add up to 'total' (a request
        is counted after its client has the answer, so a gateway may
        have no such series yet: present() only once they add up)."""
        ms = [g.metrics() for g in gws]
        c = [metric(x, "infergw_requests_total", route="chat_completions",
                    status="200") for x in ms]
        if sum(c) != total:
            return None
        return [present(x, "infergw_requests_total",
                        route="chat_completions", status="200")
                for x in ms]
    counts = wait_for(lambda: ok_counts(30), msg="30 counted")
    assert min(counts) > 0, counts
    # The tenant's key is hashed too: one body from many keys spreads.
    for i in range(30):
        r = request(hp.port, "POST", CHAT, {
            "Content-Type": "application/json",
            "Authorization": "Bearer key-%d" % i}, chat_body("same body"))
        assert r.status == 200, r
    after = wait_for(lambda: ok_counts(60), msg="60 counted")
    assert min(a - c for a, c in zip(after, counts)) > 0, (counts, after)


def test_a_draining_gateway_leaves_without_a_client_error(t):
    m, gws, hp = setup(t)
    # Open streams on every gateway, held at the mock.
    tag = new_tag()
    held = [send(hp, chat_body("held %d" % i, stream=True, mock_hold=tag))
            for i in range(12)]
    wait_for(lambda: m.stats()["held"] == 12, msg="12 held")
    busy = [g for g in gws if present(g.metrics(),
                                      "infergw_connections_active") > 1]
    victim = busy[0]
    results, stop = [], threading.Event()

    def traffic():
        i = 0
        while not stop.is_set():
            r = request(hp.port, "POST", CHAT, {"Content-Type":
                        "application/json"}, chat_body("during %d" % i))
            results.append(r.status)
            i += 1
    th = threading.Thread(target=traffic, daemon=True)
    th.start()
    wait_for(lambda: len(results) >= 20, msg="traffic flowing")
    victim.send_signal(signal.SIGTERM)
    victim.wait_log(r"server: draining")
    i = gws.index(victim)
    wait_for(lambda: hp.states()[i] != "UP", msg="haproxy sees it go")
    n = len(results)
    wait_for(lambda: len(results) >= n + 20, msg="traffic after the drain")
    # Its open streams finish; the gateway then exits cleanly.
    m.release(tag)
    for st in finish_all(held):
        assert_complete_stream(st)
    assert victim.wait_exit(10) == 0
    stop.set()
    th.join(budget(10))
    assert results and set(results) == {200}, \
        "client errors: %r" % sorted(set(results))
