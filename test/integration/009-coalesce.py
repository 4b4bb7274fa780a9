# SPDX-License-Identifier: MIT
"""009 - request coalescing: one upstream call serves identical concurrent
requests (DESIGN.md "Key and eligibility", the seed chapter's checkpoints).

Concurrency is made certain, never hoped for: the requests carry a
"mock_hold" tag, so the mock keeps the upstream request waiting until the
test has seen (in the gateway's /metrics and the mock's /stats) that every
client has joined, and only then releases it.
"""

import json
import re

from gwtest import (JSON_HEADERS, Connection, build_request, chat_body,
                    metric, normalise, sse_data, wait_for)

from coalesce_util import (BY_TENANT, CHAT, COMPLETIONS, HELPERS, PUSHED,
                           REQUESTS, assert_complete_stream,
                           assert_same_bodies, bypassed_trio, counter,
                           events_of, expect_state, finish, finish_all,
                           held_trio, hold_invariant, new_tag, role, roles,
                           send, start, wait_state)


def demo_body(tag, content="Explain request coalescing", **extra):
    """The seed's demo request: streaming, no temperature field."""
    return chat_body(content, stream=True, mock_hold=tag, **extra)


# ---- the seed's checkpoints ------------------------------------------------

def test_checkpoint1_three_identical_one_upstream_call(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag)
    conns = [send(g, body) for _ in range(3)]
    # All three are attached to one flight while the upstream is parked.
    wait_state(g, m, leaders=1, followers=2, held=1, flights=1)
    expect_state(g, m, completions=1, upstream=1)
    assert m.release(tag) == 1
    streams = finish_all(conns)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert roles(streams) == ["follower", "follower", "leader"], \
        roles(streams)
    wait_state(g, m, completions=1, upstream=1, leaders=1, followers=2,
               in_progress=0)


def test_checkpoint2_different_prompts_different_calls(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    prompts = ["first prompt", "second prompt", "third prompt"]
    conns = [send(g, demo_body(tag, p)) for p in prompts]
    wait_state(g, m, leaders=3, held=3, flights=3)
    # Control: a copy of the first prompt does join, so the three above
    # were kept apart by their prompts, not by coalescing being off.
    copy = send(g, demo_body(tag, prompts[0]))
    wait_state(g, m, followers=1, held=3)
    m.release(tag)
    streams = finish_all(conns + [copy])
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert [role(s) for s in streams[:3]] == ["leader"] * 3, \
        [role(s) for s in streams]
    assert role(streams[3]) == "follower", role(streams[3])
    assert streams[3].body == streams[0].body, "the copy got other bytes"
    texts = {normalise(s.body) for s in streams[:3]}
    assert len(texts) == 3, "different prompts gave the same answer"
    wait_state(g, m, completions=3, upstream=3, leaders=3, followers=1)


def test_checkpoint3_followers_byte_identical_in_order(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag, "same chunks in order", mock_chunks=12)
    streams = finish_all(held_trio(g, m, body))
    assert [role(s) for s in streams] == ["leader", "follower",
                                          "follower"], roles(streams)
    assert_same_bodies(streams, "leader vs followers")
    evs = assert_complete_stream(streams[0], "leader")
    # The order is the upstream's: role chunk, 12 content chunks, finish,
    # [DONE] (compared with the mock's answer to the same body).
    docs = [sse_data(e) for e in evs[:-1]]
    assert len(docs) == 1 + 12 + 1, len(docs)
    assert docs[0]["choices"][0]["delta"].get("role") == "assistant"
    assert docs[-1]["choices"][0]["finish_reason"] == "stop"
    assert len({d["id"] for d in docs}) == 1, "chunks of several calls"
    wait_state(g, m, completions=1)
    direct = m.call("POST", CHAT, body)      # the tag is released: no hold
    assert direct.status == 200 and direct.clean_end, direct
    assert normalise(streams[0].body) == normalise(direct.body), \
        "relayed stream differs from the upstream's:\n via: %r\n mock: %r" % (
            streams[0].body[:300], direct.body[:300])
    for i, s in enumerate(streams):
        assert s.body.count(b"data: [DONE]") == 1, "client %d: [DONE] x%d" % (
            i, s.body.count(b"data: [DONE]"))
        assert s.body.endswith(b"\n\ndata: [DONE]\n\n"), s.body[-80:]


def test_checkpoint4_map_cleans_up_not_a_cache(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag, "cleanup")
    conns = held_trio(g, m, body)
    streams = finish_all(conns)
    for s in streams:
        assert_complete_stream(s)
    # The flight leaves the map when its stream ends.
    wait_state(g, m, flights=0, completions=1, upstream=1)
    # Identical requests one after the other: each a fresh leader and a
    # fresh upstream call (the tag stays released: no hold).
    for n in range(2, 5):
        s = finish(send(g, body))
        assert_complete_stream(s, "sequential request %d" % n)
        assert role(s) == "leader", "request %d after completion is %r" % (
            n, role(s))
        wait_state(g, m, flights=0, completions=n, upstream=n, leaders=n,
                   followers=2)
        assert normalise(s.body) == normalise(streams[0].body)
        assert s.body != streams[0].body, \
            "same id/created bytes as the earlier call: served from a cache"


def test_late_joiner_replays_from_chunk_zero(t):
    """An identical request that comes mid-stream joins the flight and
    gets every byte from chunk 0.  Mid-stream by construction: the mock
    sends the first two content chunks, then waits at its gate
    (mock_gate) until the late one has joined."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("late joiner", stream=True, mock_chunks=30,
                     mock_gate=tag)
    m.gate(tag, 2)
    lead = start(send(g, body))
    assert role(lead) == "leader", role(lead)
    got = []
    for ev in lead.events():
        got.append(ev)
        if len(got) >= 3:
            break
    assert len(got) == 3, "leader stream ended early: %r" % got
    expect_state(g, m, flights=1, in_progress=1)
    late = send(g, body)
    wait_state(g, m, followers=1)
    m.gate(tag, 30)
    late = start(late)
    assert role(late) == "follower", \
        "identical request mid-stream is %r, not a follower" % role(late)
    late.read_all()
    lead.read_all()
    assert_complete_stream(lead, "leader")
    assert_complete_stream(late, "late follower")
    assert late.body == lead.body, \
        "late follower's body differs from the leader's:\n L: %r\n F: %r" % (
            lead.body[:300], late.body[:300])
    assert late.body.startswith(b"".join(e + b"\n\n" for e in got)), \
        "late follower did not replay from the first chunk"
    wait_state(g, m, completions=1, upstream=1, leaders=1, followers=1,
               flights=0)


def test_200_concurrent_identical_one_call(t):
    m = t.mock()
    g = t.gateway(m)
    n = 200
    tag = new_tag()
    body = demo_body(tag, "thundering herd", mock_chunks=6)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    conns = [lead] + [send(g, body) for _ in range(n - 1)]
    wait_state(g, m, followers=n - 1, held=1, parked=n - 1, timeout=20)
    assert m.release(tag) == 1
    streams = finish_all(conns, timeout=30)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert_same_bodies(streams, "200 clients")
    assert role(streams[0]) == "leader"
    assert [role(s) for s in streams[1:]] == ["follower"] * (n - 1)
    wait_state(g, m, completions=1, upstream=1, leaders=1,
               followers=n - 1, flights=0, parked=0)
    # Every follower was parked when the first chunk came: the upstream
    # thread and its helpers (one per CPU, woken for lists this long)
    # wrote it.
    assert counter(g, PUSHED) >= n - 1, counter(g, PUSHED)
    assert counter(g, HELPERS) >= 1, counter(g, HELPERS)


def test_leader_writes_for_parked_followers(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag, "written by the upstream thread", mock_chunks=6)
    conns = [send(g, body) for _ in range(3)]
    # Both followers have sent everything there is (nothing yet): parked.
    wait_state(g, m, leaders=1, followers=2, held=1, parked=2)
    expect_state(g, m, pushed=0)
    m.release(tag)
    streams = finish_all(conns)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert_same_bodies(streams, "leader vs followers")
    wait_state(g, m, completions=1, flights=0, parked=0)
    assert counter(g, PUSHED) >= 2, counter(g, PUSHED)
    # Two followers are too few to wake a helper thread for.
    expect_state(g, m, helpers=0)


def test_http10_follower_pushed_close_delimited(t):
    """An HTTP/1.0 client knows no chunked framing: parked on a flight, it
    is written the same bytes as the leader, delimited by the close."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag, "an HTTP/1.0 follower", mock_chunks=6)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    old = Connection(g.port, 15.0)
    old.send(build_request("POST", CHAT, JSON_HEADERS, body,
                           version="HTTP/1.0"))
    wait_state(g, m, followers=1, held=1, parked=1)
    m.release(tag)
    sl, so = finish_all([lead, old])
    assert_complete_stream(sl, "leader")
    assert role(so) == "follower", role(so)
    assert so.resp.status == 200, so.resp
    assert so.resp.framing == "close", so.resp
    assert "Transfer-Encoding" not in so.resp.headers, so.resp
    assert so.body == sl.body, "HTTP/1.0 follower got other bytes"
    assert old.wait_closed(5), "HTTP/1.0 connection left open"
    assert counter(g, PUSHED) >= 1, counter(g, PUSHED)
    wait_state(g, m, completions=1, upstream=1, flights=0, parked=0)


def test_leader_writes_off_followers_write_their_own(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"leader_writes": "off"}})
    tag = new_tag()
    body = demo_body(tag, "each follower writes its own", mock_chunks=6)
    conns = [send(g, body) for _ in range(3)]
    wait_state(g, m, leaders=1, followers=2, held=1, parked=2)
    m.release(tag)
    streams = finish_all(conns)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "client %d" % i)
    assert_same_bodies(streams, "leader vs followers")
    assert roles(streams) == ["follower", "follower", "leader"], \
        roles(streams)
    wait_state(g, m, completions=1, upstream=1, flights=0, parked=0)
    expect_state(g, m, pushed=0)


def test_non_streaming_coalesced(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("not a stream", mock_hold=tag, mock_chunks=5)
    streams = finish_all(held_trio(g, m, body))
    assert [role(s) for s in streams] == ["leader", "follower",
                                          "follower"], roles(streams)
    for i, s in enumerate(streams):
        r = s.resp
        assert r.status == 200, "client %d: %r" % (i, r)
        ct = r.headers.get("Content-Type", "")
        assert ct.split(";")[0].strip() == "application/json", \
            "client %d: Content-Type %r" % (i, ct)
        assert s.clean_end, "client %d: body cut short" % i
        doc = json.loads(s.body)
        assert doc["object"] == "chat.completion", doc
    assert_same_bodies(streams, "non-stream bodies")
    wait_state(g, m, completions=1, upstream=1, flights=0)


# ---- eligibility -----------------------------------------------------------

def test_temperature_without_seed_bypasses(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("creative", stream=True, temperature=0.7,
                     mock_hold=tag)
    # Each goes upstream alone: three holds, not one.
    bypassed_trio(g, m, body, "sampling")
    wait_state(g, m, completions=3, upstream=3)
    # Control: the same request at temperature 0 coalesces.
    tag2 = new_tag()
    streams = finish_all(held_trio(
        g, m, chat_body("creative", stream=True, temperature=0,
                        mock_hold=tag2)))
    assert roles(streams) == ["follower", "follower", "leader"]
    wait_state(g, m, completions=4, upstream=4, bypass_sampling=3)


def test_seed_makes_temperature_coalesce(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("seeded", stream=True, temperature=0.7, seed=42,
                     mock_hold=tag)
    streams = finish_all(held_trio(g, m, body))
    for s in streams:
        assert_complete_stream(s)
    assert roles(streams) == ["follower", "follower", "leader"], \
        roles(streams)
    assert_same_bodies(streams)
    wait_state(g, m, completions=1, upstream=1, bypass_sampling=0)


def test_omitted_temperature_strict_config_bypasses(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"omitted_temperature": "1.0"}})
    tag = new_tag()
    body = demo_body(tag, "no temperature here")
    bypassed_trio(g, m, body, "sampling")
    wait_state(g, m, completions=3, upstream=3)
    # Control: an explicit temperature 0 still coalesces in that config.
    tag2 = new_tag()
    streams = finish_all(held_trio(
        g, m, chat_body("no temperature here", stream=True, temperature=0,
                        mock_hold=tag2)))
    assert roles(streams) == ["follower", "follower", "leader"]
    wait_state(g, m, completions=4, followers=2)


TENANTS = """
[tenant acme]
api_key = sk-acme-1111-aaa
api_key = sk-acme-2222-aaa

[tenant beta]
api_key = sk-beta-3333-aaa

[tenant research]
api_key = sk-research-4444
coalesce = off
"""


def auth(key):
    return {"Authorization": "Bearer %s" % key}


def test_tenants_isolated(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANTS)
    tag = new_tag()
    body = demo_body(tag, "tenant isolation")
    a1 = send(g, body, headers=auth("sk-acme-1111-aaa"))
    b1 = send(g, body, headers=auth("sk-beta-3333-aaa"))
    # The same body from two tenants: two flights, two parked calls.
    wait_state(g, m, leaders=2, held=2, flights=2)
    a2 = send(g, body, headers=auth("sk-acme-2222-aaa"))    # acme's other key
    b2 = send(g, body, headers=auth("sk-beta-3333-aaa"))
    b3 = send(g, body, headers=auth("sk-beta-3333-aaa"))
    wait_state(g, m, followers=3, tenant_acme=1, tenant_beta=2,
               tenant_research=0, held=2)
    m.release(tag)
    sa1, sb1, sa2, sb2, sb3 = finish_all([a1, b1, a2, b2, b3])
    for s in (sa1, sb1, sa2, sb2, sb3):
        assert_complete_stream(s)
    assert [role(s) for s in (sa1, sb1)] == ["leader", "leader"]
    assert [role(s) for s in (sa2, sb2, sb3)] == ["follower"] * 3
    assert_same_bodies([sa1, sa2], "acme")
    assert_same_bodies([sb1, sb2, sb3], "beta")
    assert sa1.body != sb1.body, "two tenants got one upstream answer"
    wait_state(g, m, completions=2, upstream=2)
    gm = g.metrics()
    assert metric(gm, BY_TENANT, tenant="acme") == 1
    assert metric(gm, BY_TENANT, tenant="beta") == 2


def test_tenant_coalesce_off_bypasses(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANTS)
    tag = new_tag()
    body = demo_body(tag, "research is off")
    conns = [send(g, body, headers=auth("sk-research-4444"))
             for _ in range(3)]
    wait_state(g, m, held=3, bypass_tenant=3, leaders=0, followers=0)
    # Control: another tenant's identical requests do coalesce here.
    ctl = [send(g, body, headers=auth("sk-acme-1111-aaa")) for _ in range(2)]
    wait_state(g, m, held=4, leaders=1, followers=1, tenant_acme=1)
    m.release(tag)
    streams = finish_all(conns + ctl)
    for s in streams:
        assert_complete_stream(s)
    assert [role(s) for s in streams[:3]] == ["bypass"] * 3, roles(streams)
    assert roles(streams[3:]) == ["follower", "leader"]
    wait_state(g, m, completions=4, upstream=4, tenant_research=0)


def test_tenant_key_required(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANTS)
    body = chat_body("who are you", stream=True)
    for headers, what in (({}, "no key"),
                          (auth("sk-nobody-0000"), "unknown key"),
                          ({"Authorization": "sk-acme-1111-aaa"},
                           "no Bearer")):
        s = finish(send(g, body, headers=headers))
        assert s.resp.status == 401, "%s: %r" % (what, s.resp)
        assert b"invalid_api_key" in s.body, s.body
        assert role(s) is None, "%s: 401 has a role %r" % (what, role(s))
    expect_state(g, m, completions=0, upstream=0, leaders=0, followers=0)
    s = finish(send(g, body, headers=auth("sk-acme-1111-aaa")))
    assert_complete_stream(s)
    assert role(s) == "leader"


def test_opt_out_headers_bypass(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = demo_body(tag, "opt out")
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    outs = [send(g, body, headers=h) for h in (
        {"X-Infergw-Coalesce": "off"},
        {"Cache-Control": "no-cache"},
        {"Cache-Control": "max-age=0, no-store"})]
    # Each opt-out goes upstream on its own while the flight is open.
    wait_state(g, m, held=4, bypass_opt_out=3, followers=0)
    ctl = send(g, body)                 # control: a plain copy does join
    wait_state(g, m, followers=1, held=4)
    m.release(tag)
    streams = finish_all([lead] + outs + [ctl])
    for s in streams:
        assert_complete_stream(s)
    assert [role(s) for s in streams] == ["leader", "bypass", "bypass",
                                          "bypass", "follower"], \
        [role(s) for s in streams]
    wait_state(g, m, completions=4, upstream=4)


def test_globally_disabled_bypasses(t):
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"enabled": "off"}})
    tag = new_tag()
    body = demo_body(tag, "disabled")
    bypassed_trio(g, m, body, "disabled")
    wait_state(g, m, completions=3, upstream=3)


def test_different_params_different_flights(t):
    m = t.mock("-m", "mock-model,other-model")     # both served
    g = t.gateway(m)
    tag = new_tag()
    base = dict(stream=True, mock_hold=tag, mock_chunks=6)
    bodies = [
        chat_body("params", **base),
        chat_body("params", max_tokens=3, **base),
        chat_body("params", **dict(base, model="other-model")),
        chat_body("params", **dict(base, stream=False)),
    ]
    conns = [send(g, b) for b in bodies]
    wait_state(g, m, leaders=4, held=4, flights=4, followers=0)
    # Control: an exact copy of the first does join its flight.
    ctl = send(g, bodies[0])
    wait_state(g, m, followers=1, held=4)
    # The same body on the other completion route is another flight.
    other_route = send(g, bodies[0], path=COMPLETIONS)
    wait_state(g, m, leaders=5, held=5, flights=5)
    m.release(tag)
    streams = finish_all(conns + [ctl, other_route])
    assert [role(s) for s in streams] == ["leader"] * 4 + [
        "follower", "leader"], [role(s) for s in streams]
    for i in (0, 1, 2, 4, 5):
        assert_complete_stream(streams[i], "request %d" % i)
    assert streams[3].resp.status == 200 and streams[3].clean_end
    assert streams[3].resp.headers.get("Content-Type", "").startswith(
        "application/json"), "stream:false got %r" % streams[3].resp
    assert streams[4].body == streams[0].body
    last = sse_data(events_of(streams[1].body)[-2])
    assert last["choices"][0]["finish_reason"] == "length", last
    assert b'"model":"other-model"' in streams[2].body
    wait_state(g, m, completions=5, upstream=5)


def test_log_lines_leader_and_follower_same_key(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    streams = finish_all(held_trio(g, m, demo_body(tag, "log me")))
    for s in streams:
        assert_complete_stream(s)
    lead = g.wait_log(r"coalesce: leader\s+key=[0-9a-f]{12}\b")
    key = re.search(r"key=([0-9a-f]{12})\b", lead).group(1)

    def followers():
        rx = re.compile(r"coalesce: follower\s+key=%s\b.*\btenant=default\b"
                        % key)
        return len([l for l in g.log_lines() if rx.search(l)]) == 2
    wait_for(followers, msg="two 'coalesce: follower key=%s' lines" % key)
    leads = [l for l in g.log_lines() if "coalesce: leader" in l
             and "key=" in l]
    assert len(leads) == 1, leads
    # A different request logs a different key.
    s = finish(send(g, chat_body("another", stream=True)))
    assert_complete_stream(s)
    other = g.wait_log(r"coalesce: leader\s+key=(?!%s)[0-9a-f]{12}\b" % key)
    assert other


def big_stream_chunks():
    """Content chunks for a stream larger than what the kernel can buffer
    towards a client that does not read: the gateway's send buffer grows
    up to tcp_wmem's maximum, so go well past twice that (each chunk is
    over 200 bytes of SSE)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmax = int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmax = 4 << 20
    return min(100000, (2 * wmax + (1 << 20)) // 200)


def test_stalled_leader_client_does_not_stall_followers(t):
    """The leader's own client stops reading: the upstream transfer still
    runs to its end (the upstream loop never blocks on a client socket),
    the followers get the whole stream on time, and the leader's client
    gets every byte once it reads again.  (send_timeout is raised: the
    stalled client is held by the test for as long as the others take,
    and must not be dropped for that on a slow machine.)"""
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_flight_bytes": "64m"},
                      "server": {"send_timeout": "10m"}})
    tag = new_tag()
    body = chat_body("stalled leader", stream=True,
                     mock_chunks=big_stream_chunks(), mock_hold=tag)
    lead = send(g, body, rcvbuf=4096)   # small window; never read yet
    wait_state(g, m, leaders=1, held=1)
    fols = [send(g, body) for _ in range(2)]
    wait_state(g, m, followers=2, held=1)
    m.release(tag)
    streams = finish_all(fols, timeout=30)
    for i, s in enumerate(streams):
        assert_complete_stream(s, "follower %d" % i)
        assert role(s) == "follower", role(s)
    assert_same_bodies(streams, "followers")
    # The upstream call has ended although the leader's client has not
    # read a byte: its body is larger than every buffer on the way.
    wait_state(g, m, completions=1, flights=0)
    sl = finish(lead, timeout=30)
    assert role(sl) == "leader", role(sl)
    assert_complete_stream(sl, "stalled leader")
    assert sl.body == streams[0].body, "the stalled leader's body differs"
    wait_state(g, m, completions=1, upstream=1, in_progress=0)


def test_slow_follower_does_not_slow_others(t):
    # send_timeout raised: the slow client is held by the test for as
    # long as the others take, and must not be dropped for that.
    m = t.mock()
    g = t.gateway(m, {"coalesce": {"max_flight_bytes": "64m"},
                      "server": {"send_timeout": "10m"}})
    tag = new_tag()
    body = chat_body("slow reader", stream=True,
                     mock_chunks=big_stream_chunks(), mock_hold=tag)
    lead = send(g, body)
    wait_state(g, m, leaders=1, held=1)
    fast = send(g, body)
    slow = send(g, body, rcvbuf=4096)   # small window; never read yet
    wait_state(g, m, followers=2, held=1)
    m.release(tag)

    def done_200():
        return counter(g, REQUESTS, route="chat_completions", status="200")
    # The leader and the other follower finish while the slow client has
    # not read a byte: it does not hold them back.
    sl, sf = finish_all([lead, fast], timeout=30)
    for s, what in ((sl, "leader"), (sf, "fast follower")):
        assert_complete_stream(s, what)
    assert role(sl) == "leader" and role(sf) == "follower"
    assert_same_bodies([sl, sf])
    wait_for(lambda: done_200() >= 2, msg="two requests done")
    wait_state(g, m, completions=1, flights=0, in_progress=0)
    # The slow client stalls ~3 s more; meanwhile its response is neither
    # finished (its writes are blocked: the body is larger than every
    # buffer on the way) nor cut off (that would also end the request).
    hold_invariant(lambda: done_200() == 2, 3.0,
                   msg="slow follower's request still in progress")
    ss = finish(slow, timeout=30)
    assert role(ss) == "follower", role(ss)
    assert_complete_stream(ss, "slow follower")
    assert len(ss.body) == len(sl.body), \
        "slow follower got %d bytes of %d" % (len(ss.body), len(sl.body))
    assert ss.body == sl.body, "slow follower's body differs"
    wait_for(lambda: done_200() == 3, msg="slow follower's request done")
    wait_state(g, m, completions=1, upstream=1)
