# SPDX-License-Identifier: MIT
"""037 - Redis slow or gone while the gateways are under load (issue 28,
item 7 and its "Faults" test): two gateways serve a tenant with every
shared limit (requests_per_minute, tokens_per_minute, max_inflight)
from three senders each while Redis is SIGSTOPped for 3 s, and again
while it is SIGKILLed and restarted empty 3 s later.  With on_error =
local: no client error, no request slower than redis_timeout plus its
own work, infergw_cluster_up 0 then 1, the limits exact again within two
beats of Redis's return, and no lease left in Redis once the calls end.

Why under load: a stopped Redis is the case TCP does not report.  The
round trips already on the pool's connections when it stops, and every
try of the beat meanwhile, wait for their deadlines, not for an error;
their bytes sit in Redis's socket buffers and run when it continues,
after the gateway gave up on them (an admission that adds a lease
nobody will release unless the gateway remembers it).

The lease is the default (10 s, a beat every 3.3 s), so that a lease
left behind outlives this test's wait for none; every wait polls with a
deadline.  Redis and the gateways are started as 033 and 034 start them.
"""

import importlib
import itertools
import os
import signal
import threading
import time

from gwtest import budget, chat_body, has_metric, metric, wait_for

c033 = importlib.import_module("033-cluster")
c034 = importlib.import_module("034-cluster-limits")
Redis, metrics = c033.Redis, c033.metrics

KEY = c034.KEY
AUTH = c034.AUTH
TIGHT_KEY = "sk-tight-tenant-0001"
TIGHT = {"Authorization": "Bearer " + TIGHT_KEY,
         "Content-Type": "application/json"}
LEASES = "infergw:{acme}:leases"
LEASE_S = 10.0
BEAT_S = LEASE_S / 3
TIMEOUT_MS = 50                 # redis_timeout
FIRST_MS = 20                   # the mock's work per call
# Per gateway.  Each gateway's local share of max_inflight (12 / 2) is
# twice its senders: a call whose answer a sender has read still holds
# its place until its thread gives it back, and the sender's next call
# may be admitted first.
SENDERS = 3
SEQ = itertools.count()

LIMITS = ("requests_per_minute = 1000000\ntokens_per_minute = 100000000\n"
          "max_inflight = 12\n"
          "[tenant tight]\napi_key = %s\nrequests_per_minute = 20\n"
          % TIGHT_KEY)


def up(g):
    """infergw_cluster_up, which must exist (0 is not "missing")."""
    h = metrics(g)
    assert has_metric(h, "infergw_cluster_up"), "no infergw_cluster_up"
    return metric(h, "infergw_cluster_up")


def zcard(r):
    return int(r.run("ZCARD", LEASES) or 0)


class Load:
    """SENDERS threads on each gateway sending distinct requests back
    to back (each held FIRST_MS by the mock) until stopped; every
    answer's status and time kept."""

    def __init__(self, gws):
        self.got = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.sender, args=(g,))
                        for g in gws for _ in range(SENDERS)]
        for th in self.threads:
            th.start()

    def sender(self, g):
        while not self.done.is_set():
            t0 = time.monotonic()
            resp = g.post("/v1/chat/completions",
                          chat_body("load %d" % next(SEQ),
                                    mock_first_ms=FIRST_MS),
                          headers=AUTH)
            took = time.monotonic() - t0
            with self.lock:
                self.got.append((t0, took, resp.status,
                                 resp.body[:200]))

    def count(self):
        with self.lock:
            return len(self.got)

    def stop(self):
        self.done.set()
        for th in self.threads:
            th.join()
        return self.got


def fault(t, how):
    r = Redis(t.tmp)
    m = t.mock()
    gws = c034.gateways(t, m, r, LIMITS, n=2, lease="%ds" % LEASE_S,
                        redis_timeout="%dms" % TIMEOUT_MS)
    for g in gws:
        assert up(g) == 1
    load = Load(gws)
    try:
        wait_for(lambda: load.count() >= 30, budget(10),
                 msg="the load under way")
        before = load.count()
        if how == "stop":
            os.kill(r.proc.pid, signal.SIGSTOP)
        else:
            r.kill()
        down = time.monotonic()
        for g in gws:
            wait_for(lambda g=g: up(g) == 0, budget(3), interval=0.05,
                     msg="cluster_up 0 while Redis is %s" % how)
        # 3 s without Redis, served all along.
        wait_for(lambda: time.monotonic() - down >= 3.0, 4,
                 interval=0.05)
        served_down = load.count() - before
        if how == "stop":
            os.kill(r.proc.pid, signal.SIGCONT)
        else:
            r.start()                   # empty: no persistence
        back = time.monotonic()
        # A while with Redis back under the same load.
        wait_for(lambda: time.monotonic() - back >= 0.5, 2, interval=0.05)
    finally:
        got = load.stop()

    # No client error, and nobody waited on Redis past its deadline.
    statuses = {}
    for _, _, status, body in got:
        statuses[status] = statuses.get(status, 0) + 1
    assert set(statuses) == {200}, (statuses, [
        b for _, _, s, b in got if s != 200][:3])
    assert served_down >= 2 * len(gws) * SENDERS, served_down
    slowest = max(took for _, took, _, _ in got)
    own_work = budget(0.5)          # the call (FIRST_MS) on a busy machine
    assert slowest < TIMEOUT_MS / 1000 + own_work, slowest

    # Redis back: every gateway sees it within two beats ...
    for g in gws:
        wait_for(lambda g=g: up(g) == 1, budget(2 * BEAT_S), interval=0.05,
                 msg="cluster_up 1 after Redis is back")
    seen_back = time.monotonic() - back
    assert seen_back <= budget(2 * BEAT_S), seen_back

    # ... gives back every lease, those Redis took for admissions the
    # gateway had already given up on included (they would otherwise
    # stay until their lease, LEASE_S, after Redis ran them) ...
    wait_for(lambda: zcard(r) == 0, budget(2 * BEAT_S), interval=0.05,
             msg="no lease left once the calls ended")
    assert time.monotonic() - back < LEASE_S, \
        "too late to tell a release from an expiry"

    # ... and judges the limits in Redis again: tight's 20 a minute for
    # both gateways, all asked of one (its local share would be 10).
    admitted = 0
    for _ in range(30):
        resp = gws[0].post("/v1/chat/completions",
                           chat_body("tight %d" % next(SEQ)), headers=TIGHT)
        assert resp.status in (200, 429), resp
        admitted += resp.status == 200
    assert 20 <= admitted <= 21, admitted
    errors = sum(metric(metrics(g), "infergw_cluster_errors_total")
                 for g in gws)
    assert errors >= 1, "the fault was not seen as one"


def test_redis_stopped_3s_under_load(t):
    fault(t, "stop")


def test_redis_killed_and_restarted_empty_under_load(t):
    fault(t, "kill")
