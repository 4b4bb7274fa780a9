# SPDX-License-Identifier: MIT
"""034 - a tenant's limits shared across gateways through Redis (issue 28,
items 3 and 7): requests_per_minute, tokens_per_minute and the day
budget hold for the tenant as a whole on three gateways; one Redis round
trip per admission (INFO commandstats); Redis SIGKILLed: the local share
(each limit divided by the gateways last seen) with on_error = local, 503
with Retry-After with on_error = deny; exact again once Redis is back.

Redis and the gateways are started as 033-cluster.py starts them (its
helpers); every wait polls with a deadline.
"""

import importlib
import itertools
import re
import threading
import time

from gwtest import budget, chat_body, metric, request, wait_for

c033 = importlib.import_module("033-cluster")
Redis, members, metrics, up = (c033.Redis, c033.members, c033.metrics,
                               c033.up)

KEY = "sk-shared-tenant-0001"
OPEN_KEY = "sk-open-tenant-0001"
AUTH = {"Authorization": "Bearer " + KEY,
        "Content-Type": "application/json"}
OPEN = {"Authorization": "Bearer " + OPEN_KEY,
        "Content-Type": "application/json"}
SEQ = itertools.count()


def tenants(limits):
    return ("[tenant acme]\napi_key = %s\n%s\n"
            "[tenant open]\napi_key = %s\n" % (KEY, limits, OPEN_KEY))


def gateways(t, m, r, limits, n=3, **more):
    gws = []
    for i in range(n):
        conf = {"admin": {"listen": "127.0.0.1:0"},
                "cluster": c033.cluster_conf(r, node="gw-%d" % i, **more)}
        gws.append(t.gateway(m, conf=conf, extra=tenants(limits),
                             admin_key=None))
    want = sorted("gw-%d" % i for i in range(n))
    for g in gws:
        wait_for(lambda g=g: members(g) == want, budget(5),
                 msg="every gateway sees the others")
    return gws


def ask(g, headers=AUTH):
    """One request of a body of its own (no coalescing): (status,
    seconds it took, response)."""
    t0 = time.monotonic()
    resp = g.post("/v1/chat/completions",
                  chat_body("q%d" % next(SEQ)), headers=headers)
    return resp.status, time.monotonic() - t0, resp


def test_requests_per_minute_across_three(t):
    """6 senders on each of 3 gateways for 10 s: the tenant is admitted
    its minute (60) plus the refill over the run, once, not 3 times."""
    r = Redis(t.tmp)
    m = t.mock()
    # A Redis round trip that fails is judged by the local share (its
    # own test, below): on this busy 2-core machine 20 ms is not always
    # enough for one, so this one gives Redis more and checks it failed
    # none.
    gws = gateways(t, m, r, "requests_per_minute = 60",
                   redis_timeout="500ms")
    counts = {}
    lock = threading.Lock()
    stop = time.monotonic() + 10.0
    t0 = time.monotonic()

    def sender(g):
        while time.monotonic() < stop:
            status, _, resp = ask(g)
            if status == 429:
                assert resp.headers.get("Retry-After", "").isdigit(), resp
            with lock:
                counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=sender, args=(g,))
               for g in gws for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    assert set(counts) <= {200, 429}, counts
    errors = sum(metric(metrics(g), "infergw_cluster_errors_total",
                        op="admit") for g in gws)
    assert errors == 0, errors
    # 60 at once, then one a second (60 a minute) for the run.
    assert 60 <= counts.get(200, 0) <= 60 + int(elapsed) + 1, \
        (counts, elapsed)
    assert counts.get(429, 0) > 0, counts
    # Each gateway counted its own refusals.
    refused = sum(metric(metrics(g), "infergw_tenant_rejected_total",
                         tenant="acme", limit="requests_per_minute")
                  for g in gws)
    assert refused == counts[429], (refused, counts)


def test_one_round_trip_per_admission(t):
    """INFO commandstats: N admissions of a tenant with requests_per_
    minute alone cost N scripts, beside the heartbeats and the usage
    batches (035; one HGETALL each, which no other script calls); a
    tenant with no limit costs none."""
    r = Redis(t.tmp)
    m = t.mock()
    g, = gateways(t, m, r, "requests_per_minute = 1000", n=1,
                  lease="30s")

    def scripts():
        s = r.run("INFO", "commandstats")
        n = 0
        for cmd, sign in (("evalsha", 1), ("eval", 1), ("hgetall", -1)):
            f = re.search(r"^cmdstat_%s:calls=(\d+)" % cmd, s, re.M)
            n += sign * int(f.group(1)) if f else 0
        return n

    def beats():
        return metric(metrics(g), "infergw_cluster_latency_seconds_count",
                      op="heartbeat")

    for _ in range(3):
        assert ask(g)[0] == 200             # the script is loaded
    s0, b0 = scripts(), beats()
    for _ in range(40):
        assert ask(g, OPEN)[0] == 200
    assert scripts() - (beats() - b0) == s0, "a tenant without limits"
    s0, b0 = scripts(), beats()
    for _ in range(50):
        assert ask(g)[0] == 200
    assert scripts() - (beats() - b0) - s0 == 50
    h = metrics(g)
    assert metric(h, "infergw_cluster_latency_seconds_count",
                  op="admit") == 53
    assert metric(h, "infergw_cluster_errors_total", op="admit") == 0


def test_tokens_and_day_budget_on_every_gateway(t):
    """Usage charged on one gateway: tokens_per_minute, then the day's
    budget, refuse on the others too."""
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "tokens_per_minute = 40")
    # Until the charged usage passes 40 (the mock answers a few dozen
    # tokens a call).
    wait_for(lambda: ask(gws[0])[0] == 429, budget(5),
             msg="tokens_per_minute reached on gw-0")
    for g in gws[1:]:
        status, _, resp = ask(g)
        assert status == 429, resp
        assert resp.json()["error"]["type"] == "tokens", resp.body
        assert int(resp.headers.get("Retry-After")) >= 1

    r2 = Redis(t.tmp, name="redis2")
    gws = gateways(t, m, r2, "tokens_per_day = 40")
    wait_for(lambda: ask(gws[0])[0] == 429, budget(5),
             msg="tokens_per_day spent on gw-0")
    for g in gws[1:]:
        status, _, resp = ask(g)
        assert status == 429, resp
        assert resp.json()["error"]["code"] == "insufficient_quota", \
            resp.body
        # Until midnight UTC.
        assert 1 <= int(resp.headers.get("Retry-After")) <= 86400
    used = [k for k in r2.run("--scan").split() if ":tokens:day:" in k]
    assert len(used) == 1 and used[0].startswith("infergw:{acme}:"), used
    assert int(r2.run("GET", used[0])) >= 40
    ttl = int(r2.run("TTL", used[0]))
    assert 86400 < ttl <= 2 * 86400, ttl


def test_redis_killed_local_share_then_exact(t):
    """Redis SIGKILLed: each gateway serves on its share (30 / 3 = 10 a
    minute), with no error and no wait; back (empty): exact again."""
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "requests_per_minute = 30",
                   redis_timeout="20ms")
    g = gws[0]
    r.kill()
    wait_for(lambda: up(g) == 0, budget(3), msg="cluster_up 0")
    got = [ask(g) for _ in range(14)]
    statuses = [s for s, _, _ in got]
    # Its share, 10 (and at most the refill of the few seconds).
    assert 10 <= statuses.count(200) <= 11, statuses
    assert set(statuses) == {200, 429}, statuses
    slowest = max(took for _, took, _ in got)
    assert slowest < budget(0.5), slowest
    # A tenant without limits never notices.
    assert ask(g, OPEN)[0] == 200

    r.start()
    for x in gws:
        wait_for(lambda x=x: up(x) == 1, budget(8), msg="cluster_up 1")
    # An empty Redis: the tenant's 30 for the three together.
    admitted = 0
    for i in range(40):
        admitted += ask(gws[i % 3])[0] == 200
    assert 30 <= admitted <= 31, admitted


def test_deny_answers_503_while_redis_is_gone(t):
    r = Redis(t.tmp)
    m = t.mock()
    g, = gateways(t, m, r, "requests_per_minute = 30", n=1,
                  on_error="deny")
    assert ask(g)[0] == 200
    r.kill()
    wait_for(lambda: up(g) == 0, budget(3), msg="cluster_up 0")
    status, took, resp = ask(g)
    assert status == 503, resp
    assert resp.headers.get("Retry-After") == "1", resp.headers
    assert resp.json()["error"]["code"] == "cluster_unavailable"
    assert took < budget(0.5), took
    assert ask(g, OPEN)[0] == 200
    r.start()
    wait_for(lambda: up(g) == 1, budget(8), msg="cluster_up 1")
    assert ask(g)[0] == 200
    # Nothing of a key in Redis: the tenant by its name.  The tenant
    # without limits has no limit's key; only its usage is shared (035).
    for k in r.run("--scan").split():
        assert KEY not in k, k
        assert ("open" not in k
                or re.search(r"\{open\}:usage(-seen:[0-9a-f]+)?$", k)), k
