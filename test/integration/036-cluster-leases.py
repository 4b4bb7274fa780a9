# SPDX-License-Identifier: MIT
"""036 - max_inflight across gateways through Redis leases (issue 28,
item 4, and item 7's part for leases): max_inflight = 4 holds for the
tenant on three gateways and is used; a gateway SIGKILLed while holding
leases gives them back within 'lease' (and a beat); Redis restarted
empty while calls are open gets their leases back within two beats, and
none is left once the calls end; a coalesced follower takes no lease.

The calls stay open on the mock's hold (mock_hold, released by the
test), so what is open is the mock's "held" gauge and the sorted set
"infergw:{acme}:leases"; every wait polls with a deadline.  Redis and
the gateways are started as 033-cluster.py and 034 start them.
"""

import importlib
import itertools
import subprocess
import threading
import time

from gwtest import budget, chat_body, kill_process, wait_for

from coalesce_util import finish, new_tag, present, send

c033 = importlib.import_module("033-cluster")
c034 = importlib.import_module("034-cluster-limits")
Redis, members = c033.Redis, c033.members

KEY = c034.KEY
AUTH = {"Authorization": "Bearer " + KEY}
LEASES = "infergw:{acme}:leases"
LEASE_S = 1.0                   # the gateways' lease; a beat is a third
SEQ = itertools.count()


def gateways(t, m, r, limits, n=3):
    # redis_timeout: this busy 2-core machine sometimes needs more than
    # 20 ms for a round trip; a failed one would be judged locally (034
    # tests that), not by the leases this test looks at.
    return c034.gateways(t, m, r, limits, n=n, lease="1s",
                         redis_timeout="500ms")


def held_body(tag):
    """A body of its own (no coalescing) that the mock holds on 'tag'."""
    return chat_body("lease %d" % next(SEQ), mock_hold=tag)


def zcard(r):
    return int(r.run("ZCARD", LEASES) or 0)


def status_of(conn):
    return finish(conn).resp.status


def test_max_inflight_across_three_never_exceeded_and_used(t):
    """12 calls round the three gateways, each held open: the first 4
    reach the mock (used: 4 at once), the other 8 get 429; then
    under load (3 senders on each gateway, 3 s) the mock never has more
    than 4 open at once, and has at least 3."""
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "max_inflight = 4")
    tag = new_tag()
    held = []
    # Round the three: the first four are admitted (each is held open
    # before the next goes), every one after is refused, on any gateway.
    for i in range(12):
        g = gws[i % 3]
        c = send(g, held_body(tag), headers=AUTH)
        if i < 4:
            wait_for(lambda n=i + 1: m.stats()["held"] == n, budget(5),
                     msg="call %d held" % (i + 1))
            held.append(c)
        else:
            s = finish(c)
            assert s.resp.status == 429, (i, s.resp)
            assert b"max_inflight" in s.body, s.body
    assert m.stats()["held"] == 4
    assert zcard(r) == 4
    m.release(tag)
    for c in held:
        assert status_of(c) == 200
    wait_for(lambda: zcard(r) == 0, budget(5), msg="every lease released")

    # Under load: the mock's open calls, sampled, never pass 4.
    stop = time.monotonic() + 3.0
    peak = [0]
    counts = {}
    lock = threading.Lock()

    def sender(g):
        while time.monotonic() < stop:
            resp = g.post("/v1/chat/completions",
                          chat_body("load %d" % next(SEQ),
                                    mock_delay_ms=30),
                          headers=dict(AUTH, **{"Content-Type":
                                                "application/json"}))
            with lock:
                counts[resp.status] = counts.get(resp.status, 0) + 1

    def sampler():
        while time.monotonic() < stop:
            peak[0] = max(peak[0], m.stats()["in_progress"])

    threads = [threading.Thread(target=sender, args=(g,))
               for g in gws for _ in range(3)]
    threads.append(threading.Thread(target=sampler))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert set(counts) <= {200, 429}, counts
    assert 3 <= peak[0] <= 4, (peak[0], counts)
    wait_for(lambda: zcard(r) == 0, budget(5), msg="no lease left")


def test_gateway_sigkilled_gives_its_leases_back_within_lease(t):
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "max_inflight = 4")
    tag = new_tag()
    conns = [send(gws[0], held_body(tag), headers=AUTH) for _ in range(4)]
    wait_for(lambda: m.stats()["held"] == 4, budget(5),
             msg="4 calls held on gw-0")
    assert zcard(r) == 4
    kill_process(gws[0].proc)
    killed = time.monotonic()
    for c in conns:
        c.close()
    # Its leases still count at first...
    assert status_of(send(gws[1], chat_body("x%d" % next(SEQ)),
                          headers=AUTH)) == 429
    # ...and are back within the lease (and the beat that last renewed
    # them, a third of it), with slack for this machine.
    wait_for(lambda: status_of(send(gws[1], chat_body("y%d" % next(SEQ)),
                                    headers=AUTH)) == 200,
             LEASE_S + LEASE_S / 3 + 1.0, interval=0.05,
             msg="gw-0's leases expired")
    took = time.monotonic() - killed
    assert took <= budget(LEASE_S + LEASE_S / 3 + 1.0), took
    m.release(tag)


def test_redis_restarted_empty_leases_reconciled(t):
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "max_inflight = 4")
    tag = new_tag()
    conns = [send(g, held_body(tag), headers=AUTH)
             for g in (gws[0], gws[0], gws[1], gws[2])]
    wait_for(lambda: m.stats()["held"] == 4, budget(5), msg="4 held")
    assert zcard(r) == 4
    r.kill()
    r.start()                       # empty: it has no persistence
    back = time.monotonic()
    # The gateways reconnect (backoff from 100 ms) and their first beat
    # re-adds the four calls still open, each exactly once.
    wait_for(lambda: zcard(r) == 4, budget(3), interval=0.02,
             msg="the open calls' leases re-added")
    took = time.monotonic() - back
    # Exact again: a fifth is refused, wherever it comes.
    for g in gws:
        assert status_of(send(g, chat_body("z%d" % next(SEQ)),
                              headers=AUTH)) == 429
    assert zcard(r) == 4
    m.release(tag)
    for c in conns:
        assert status_of(c) == 200
    wait_for(lambda: zcard(r) == 0, budget(5), msg="no lease leaked")
    # Nothing left in the book to re-add: still none two beats later.
    time.sleep(2 * LEASE_S / 3)     # a wait for absence, not for an event
    assert zcard(r) == 0
    assert took < budget(3)


def test_followers_take_no_lease(t):
    """max_inflight = 2: a leader and its follower on gw-0 hold one
    lease between them, so a call on gw-1 still gets the second."""
    r = Redis(t.tmp)
    m = t.mock()
    gws = gateways(t, m, r, "max_inflight = 2", n=2)
    tag = new_tag()
    body = chat_body("shared", stream=True, mock_hold=tag)
    c1 = send(gws[0], body, headers=AUTH)
    wait_for(lambda: m.stats()["held"] == 1, budget(5), msg="leader held")
    c2 = send(gws[0], body, headers=AUTH)
    wait_for(lambda: c034.metric(c033.metrics(gws[0]),
                                 "infergw_coalesce_followers_total") == 1,
             budget(5), msg="a follower")
    wait_for(lambda: zcard(r) == 1, budget(5), msg="the follower's lease "
             "given back")
    c3 = send(gws[1], held_body(tag), headers=AUTH)
    wait_for(lambda: m.stats()["held"] == 2, budget(5),
             msg="gw-1's call admitted")
    assert zcard(r) == 2
    m.release(tag)
    for c in (c1, c2, c3):
        assert status_of(c) == 200
    wait_for(lambda: zcard(r) == 0, budget(5), msg="no lease left")


def test_one_round_trip_on_the_way_in(t):
    """INFO commandstats: N calls of a tenant with max_inflight and
    requests_per_minute cost N scripts (the admission takes the lease in
    the rate limits' own script and round trip) and N ZREMs (the
    releases, after the responses), beside the beat's own: heartbeats,
    usage batches (one HGETALL each) and renewals (op="lease" round
    trips that were not releases)."""
    r = Redis(t.tmp)
    m = t.mock()
    g, = c034.gateways(t, m, r, "max_inflight = 4\n"
                       "requests_per_minute = 1000", n=1, lease="30s",
                       redis_timeout="500ms")

    def calls(cmd):
        s = r.run("INFO", "commandstats")
        f = c034.re.search(r"^cmdstat_%s:calls=(\d+)" % cmd, s, c034.re.M)
        return int(f.group(1)) if f else 0

    def scripts():
        return calls("evalsha") + calls("eval") - calls("hgetall")

    def ops(op):
        return c034.metric(c033.metrics(g),
                           "infergw_cluster_latency_seconds_count", op=op)

    def ask_one():
        """One call, and then its handler done: a sequential client can
        have its answer just before the gateway has let its place of
        max_inflight go (a leader's tail: charge, log)."""
        assert c034.ask(g)[0] == 200
        wait_for(lambda: present(c033.metrics(g),
                                 "infergw_tenant_requests_inflight",
                                 tenant="acme") == 0, budget(3),
                 msg="the call's place let go")

    for _ in range(3):
        ask_one()                           # the scripts are loaded
    # Redis counts a ZREM before the gateway counts its round trip: wait
    # for both.
    wait_for(lambda: calls("zrem") == 3 and ops("lease") >= 3, budget(5),
             msg="3 releases")
    s0, z0, b0, l0 = scripts(), calls("zrem"), ops("heartbeat"), ops("lease")
    for _ in range(50):
        ask_one()
    wait_for(lambda: calls("zrem") - z0 == 50
             and ops("lease") - l0 >= 50, budget(5), msg="50 releases")
    renewals = ops("lease") - l0 - 50
    beats = ops("heartbeat") - b0
    assert scripts() - s0 - beats - renewals == 50
    h = c033.metrics(g)
    assert c034.metric(h, "infergw_cluster_latency_seconds_count",
                       op="admit") == 53
    assert c034.metric(h, "infergw_cluster_errors_total", op="admit") == 0
    assert c034.metric(h, "infergw_cluster_errors_total", op="lease") == 0
    assert zcard(r) == 0


def test_lease_goes_back_before_the_charge(t):
    """A call's lease goes back as soon as its answer is complete, before
    its charge of tokens: a charge that waits on a slow Redis must not
    keep a place of max_inflight from the client's next call (037 shows
    that under a stopped Redis).  Redis's MONITOR gives the order of the
    gateway's commands: the admission, the release (ZREM), the charge."""
    r = Redis(t.tmp)
    m = t.mock()
    g, = c034.gateways(t, m, r, "max_inflight = 4\n"
                       "tokens_per_minute = 100000", n=1,
                       redis_timeout="500ms")
    assert c034.ask(g)[0] == 200            # the script is loaded
    mon = subprocess.Popen([r.cli, "-s", r.sock, "MONITOR"],
                           stdout=subprocess.PIPE, text=True)
    lines = []

    def reader():
        for line in mon.stdout:
            lines.append(line)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        wait_for(lambda: lines and lines[0].strip() == "OK", budget(5),
                 msg="MONITOR on")
        assert c034.ask(g)[0] == 200

        def order():
            # The gateway's own commands (not the scripts' inner ones,
            # which MONITOR shows as "[0 lua]").
            own = [l for l in lines[1:] if "[0 lua]" not in l]
            admit = [i for i, l in enumerate(own) if '"admit"' in l]
            zrem = [i for i, l in enumerate(own) if '"ZREM"' in l]
            charge = [i for i, l in enumerate(own) if '"charge"' in l]
            return (admit and zrem and charge) and (admit[0], zrem[0],
                                                    charge[0])

        a, z, c = wait_for(order, budget(5), msg="admit, release, charge")
        assert a < z < c, (a, z, c, lines)
    finally:
        mon.kill()
        mon.wait()
