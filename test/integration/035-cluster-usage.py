# SPDX-License-Identifier: MIT
"""035 - usage across the fleet (issue 28, item 5): each gateway adds
its tenants' counts to Redis in batches from its cluster beat, and
/status.json shows the fleet's totals per tenant beside its own.

Redis and the gateways are started as 033-cluster.py starts them (its
Redis class: a redis-server of the test's own, without persistence).
Every wait polls with a deadline; a beat is lease / 3 (here 333 ms).
"""

import hashlib
import importlib

from gwtest import budget, chat_body, metric, wait_for

c033 = importlib.import_module("033-cluster")
Redis, metrics, status, up = (c033.Redis, c033.metrics, c033.status,
                              c033.up)

TENANT_KEY = "sk-usage-tenant-key-0001"
AUTH = {"Authorization": "Bearer " + TENANT_KEY}
EXTRA = "[tenant acme]\napi_key = %s\n" % TENANT_KEY
FIELDS = ("requests", "prompt_tokens", "completion_tokens")


def gateways(t, m, r):
    out = []
    for node in ("gw-a", "gw-b"):
        conf = {"admin": {"listen": "127.0.0.1:0"},
                "cluster": {"redis": r.url(), "lease": "1s", "node": node}}
        out.append(t.gateway(m, conf=conf, extra=EXTRA, admin_key=None))
    for g in out:
        wait_for(lambda g=g: up(g) == 1, budget(5), msg="cluster up")
    return out


def acme(g):
    """acme's entry of g's /status.json."""
    return [x for x in status(g)["tenants"] if x["name"] == "acme"][0]


def ask(g, n, tag):
    for i in range(n):
        resp = g.post("/v1/chat/completions",
                      chat_body("usage %s %d" % (tag, i)), headers=AUTH)
        assert resp.status == 200, resp


def own(gs):
    """The gateways' own counts, added up, once every one of them is in
    Redis (nothing unsent)."""
    views = [acme(g) for g in gs]
    for v in views:
        if any(v["usage_unsent"][f] for f in FIELDS):
            return None
    return {f: sum(v["usage"][f] for v in views) for f in FIELDS}


def fleet(g):
    c = acme(g)["cluster_usage"]
    return None if c is None else {f: c[f] for f in FIELDS}


def in_redis(r):
    text = r.run("HGETALL", "infergw:{acme}:usage").split()
    got = dict(zip(text[0::2], (int(x) for x in text[1::2])))
    return {f: got.get(f, 0) for f in FIELDS}


def flushes(g):
    return metric(metrics(g), "infergw_cluster_latency_seconds_count",
                  op="usage")


def fresh_read(g):
    """Wait until a flush that began after this call has ended: three
    more round trips of the beat's (one may be under way now, and the
    count moves before its answer is kept)."""
    n = flushes(g)
    wait_for(lambda: flushes(g) >= n + 3, budget(5),
             msg="a newer read of the fleet's totals")


def test_fleet_totals_are_both_gateways_counts(t):
    r = Redis(t.tmp)
    m = t.mock()
    a, b = gateways(t, m, r)
    ask(a, 3, "a")
    ask(b, 2, "b")

    def agreed():
        mine = own([a, b])
        return mine if mine and fleet(a) == mine == fleet(b) else None
    total = wait_for(agreed, budget(3),
                     msg="the fleet's totals are both gateways' counts")
    assert total["requests"] == 5, total
    assert total["prompt_tokens"] > 0 and total["completion_tokens"] > 0
    assert in_redis(r) == total, (in_redis(r), total)
    # A beat later (nothing new), still the same: nothing added twice.
    for g in (a, b):
        fresh_read(g)
        assert fleet(g) == total, (fleet(g), total)
    # /metrics stays per gateway: acme's requests there are a's own.
    assert metric(metrics(a), "infergw_tenant_requests_total",
                  tenant="acme", status="200") == 3
    assert metric(metrics(a), "infergw_cluster_latency_seconds_count",
                  op="usage") > 0
    # Named by the tenant's name: no API key, nor its hash, in Redis.
    digest = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
    for k in r.run("--scan").split():
        assert TENANT_KEY not in k and digest not in k, k


def test_redis_restarted_empty_counts_once(t):
    """Redis SIGKILLed and started again, empty: what it had is gone
    (no persistence), and what came meanwhile arrives, once."""
    r = Redis(t.tmp, tcp=True)
    m = t.mock()
    a, b = gateways(t, m, r)
    ask(a, 2, "before-a")
    ask(b, 1, "before-b")
    # (A request is counted just after its client has the answer.)
    wait_for(lambda: own([a, b]) and own([a, b])["requests"] == 3
             and fleet(a) == own([a, b]), budget(3),
             msg="everything in Redis before the kill")
    before = {f: sum(acme(g)["usage"][f] for g in (a, b)) for f in FIELDS}

    r.kill()
    for g in (a, b):
        wait_for(lambda g=g: up(g) == 0, budget(3), msg="cluster_up 0")
    ask(a, 2, "down-a")
    ask(b, 3, "down-b")

    def counted():
        now = {f: sum(acme(g)["usage"][f] for g in (a, b)) for f in FIELDS}
        d = {f: now[f] - before[f] for f in FIELDS}
        return d if d["requests"] >= 5 else None
    meanwhile = wait_for(counted, budget(3), msg="the 5 answers counted")
    assert meanwhile["requests"] == 5, meanwhile
    for g in (a, b):
        assert acme(g)["usage_unsent"]["requests"] > 0, acme(g)

    r.start()
    wait_for(lambda: own([a, b]) is not None and fleet(a) == meanwhile
             and fleet(b) == meanwhile, budget(5),
             msg="what came while Redis was gone, in its totals")
    assert in_redis(r) == meanwhile, (in_redis(r), meanwhile)
    for g in (a, b):
        fresh_read(g)
    assert in_redis(r) == meanwhile, (in_redis(r), meanwhile)
    assert metric(metrics(a), "infergw_cluster_errors_total",
                  op="heartbeat") > 0


def test_refused_batch_is_kept_for_the_next(t):
    """Redis up, heartbeats answered, but the usage script refused (the
    hash is a string now: WRONGTYPE): the batch stays unsent, one log
    line says so, and once Redis takes it again it arrives, once."""
    r = Redis(t.tmp)
    m = t.mock()
    a = gateways(t, m, r)[0]
    key = "infergw:{acme}:usage"
    r.run("SET", key, "not-a-hash")
    ask(a, 2, "refused")
    a.wait_log(r"usage: 1 of \d+ tenants' counts not added in Redis: "
               r"WRONGTYPE")
    # Beats go by: still unsent, the fleet's totals not read since.
    wait_for(lambda: up(a) == 1
             and acme(a)["usage_unsent"]["requests"] == 2
             and (acme(a)["cluster_usage"] is None
                  or acme(a)["cluster_usage"]["age_ms"] > 700),
             budget(3), msg="the batch kept, unsent")
    r.run("DEL", key)
    total = wait_for(lambda: own([a]) and fleet(a) == own([a]) and own([a]),
                     budget(3), msg="the kept batch arrives")
    assert total["requests"] == 2, total
    a.wait_log(r"usage: every tenant's counts added in Redis again")
    fresh_read(a)
    assert in_redis(r) == total, (in_redis(r), total)
