# SPDX-License-Identifier: MIT
"""011 - the coalescing contract (coalesce.h, DESIGN.md "Key and
eligibility"): every byte the upstream receives for a coalesced call is a
constant of the configuration or derived from data in the key.  So clients
whose forwarded credentials differ never share a flight, no client header
reaches the upstream, the upstream request id is the flight's own, and a
request that asks for randomness is never shared.

The mock records every header of every request it gets (GET /recorded),
so the tests look at exactly what the upstream saw.
"""

import json
import re

from gwtest import chat_body, wait_for

from coalesce_util import (as_sent, assert_complete_stream,
                           assert_same_bodies, bypassed_trio, finish,
                           finish_all, held_trio, new_tag, role, roles,
                           send, wait_state)

FLIGHT_ID = re.compile(r"^flight-[0-9a-f]{24}$")

# Header names the upstream may see on a coalesced call, and where each
# value comes from.  A header that is not here fails the test: a new
# forwarded header must be made a constant or be put into the key.
CONSTANT = {
    "host",             # from [upstream] url
    "content-type",     # application/json
    "accept",           # fixed
    "accept-encoding",  # identity: no content coding (issue 16)
}
FROM_KEY = {
    "content-length",   # the body's length
    "authorization",    # configured key, or the forwarded credential
}
FROM_FLIGHT = {
    "x-request-id",     # the flight's id
}

# Headers a client might send, none of which may reach the upstream.
HOSTILE = [
    ("Content-Type", "application/json; charset=latin-1"),
    ("Accept", "application/x-evil"),
    ("User-Agent", "evil/1.0"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Retry-Count", "3"),
    ("OpenAI-Organization", "org-evil"),
    ("OpenAI-Beta", "assistants=v2"),
    ("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("X-Forwarded-For", "10.6.6.6"),
    ("Forwarded", "for=10.6.6.6"),
    ("Cookie", "session=evil"),
    ("Cache-Control", "max-age=0"),
    ("Pragma", "no-cache"),
    ("Priority", "u=0"),
    ("X-Infergw-Coalesce", "on"),
    ("Prefer", "wait=1"),
    ("Accept-Encoding", "gzip"),
    ("Accept-Language", "xx"),
    ("Origin", "http://evil"),
    ("Referer", "http://evil/"),
    ("Range", "bytes=0-1"),
    ("If-None-Match", "\"x\""),
    ("Via", "1.1 evil"),
    ("Max-Forwards", "1"),
    ("TE", "trailers"),
    ("Connection", "keep-alive, X-Hop"),
    ("X-Hop", "1"),
    ("Keep-Alive", "timeout=5"),
]


def recorded(m):
    """Every /v1 request the mock received since its last reset."""
    return json.loads(m.get("/recorded").body)["requests"]


def completions(m):
    return [r for r in recorded(m)
            if r["target"].startswith("/v1/chat/completions")
            or r["target"].startswith("/v1/completions")]


def headers_of(rec):
    """A recorded request's headers: {lower name: [values]}."""
    out = {}
    for name, value in rec["headers"]:
        out.setdefault(name.lower(), []).append(value)
    return out


def flight_ids_in_log(g):
    """{client request id: flight id} from the coalesce: log lines."""
    rx = re.compile(r"\breq=(\S+) .*coalesce: (?:leader|follower) "
                    r"key=[0-9a-f]{12} flight=(flight-[0-9a-f]{24})\b")
    out = {}
    for line in g.log_lines():
        mt = rx.search(line)
        if mt:
            out[mt.group(1)] = mt.group(2)
    return out


def assert_coalesced_call(rec, body, mock_port, auth=None):
    """The one upstream request of a flight carries nothing but constants
    and values derived from the key (and the flight's id).  'body' is
    the client's: a stream's asks for its usage upstream (as_sent()),
    and the key is taken over that."""
    h = headers_of(rec)
    allowed = CONSTANT | FROM_KEY | FROM_FLIGHT
    extra = set(h) - allowed
    assert not extra, "headers neither constant nor from the key reached " \
        "the upstream: %r (all: %r)" % (sorted(extra), rec["headers"])
    for name, values in h.items():
        assert len(values) == 1, "%s sent %d times: %r" % (
            name, len(values), values)
    assert h["host"] == ["127.0.0.1:%d" % mock_port], h["host"]
    assert h["content-type"] == ["application/json"], h["content-type"]
    assert h["accept"] == ["application/json, text/event-stream"], \
        h["accept"]
    assert h["accept-encoding"] == ["identity"], h["accept-encoding"]
    assert h["content-length"] == [str(len(as_sent(body)))], \
        h["content-length"]
    assert FLIGHT_ID.match(h["x-request-id"][0]), h["x-request-id"]
    if auth is None:
        assert "authorization" not in h, h.get("authorization")
    else:
        assert h.get("authorization") == [auth], h.get("authorization")
    values = {v for vs in h.values() for v in vs}
    for name, value in HOSTILE:
        if name.lower() in ("content-type", "accept", "accept-encoding"):
            continue        # the constants might coincide; checked above
        assert value not in values, "client's %s value %r reached the " \
            "upstream" % (name, value)
    return h["x-request-id"][0]


def test_upstream_sees_only_constants_and_key_data(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("contract", stream=True, mock_hold=tag)
    ids = ["client-a-1111", "client-b-2222", "client-c-3333"]
    conns = []
    for i, rid in enumerate(ids):
        hs = HOSTILE + [("X-Request-Id", rid),
                        ("Authorization", "Bearer sk-client-%d" % i)]
        conns.append(send(g, body, headers=hs))
        if i == 0:
            wait_state(g, m, leaders=1, held=1)
    wait_state(g, m, leaders=1, followers=2, held=1)
    m.release(tag)
    streams = finish_all(conns)
    for s in streams:
        assert_complete_stream(s)
    assert roles(streams) == ["follower", "follower", "leader"]
    assert_same_bodies(streams)
    # Each client still gets its own request id back.
    for s, rid in zip(streams, ids):
        assert s.resp.headers.get("X-Request-Id") == rid, s.resp.headers
    recs = completions(m)
    assert len(recs) == 1, recs
    fid = assert_coalesced_call(recs[0], body, m.port)
    assert m.stats()["last_body"].encode() == as_sent(body), \
        m.stats()["last_body"]
    assert fid not in ids
    # The body is the flight's: vLLM (and the mock) build the completion
    # id from the request id, so no client's trace id is in it.
    for rid in ids:
        assert rid.encode() not in streams[0].body, \
            "a client's request id is in the shared body"
    assert fid.encode() in streams[0].body, streams[0].body[:200]
    # The log ties every client's id to the flight's.
    wait_for(lambda: len(flight_ids_in_log(g)) >= 3,
             msg="three coalesce: lines with flight=")
    logged = flight_ids_in_log(g)
    assert {rid: logged.get(rid) for rid in ids} == \
        {rid: fid for rid in ids}, logged
    # The access lines carry it too (each is written once its response
    # is out, so perhaps after the client has read it).
    wait_for(lambda: len([l for l in g.access_lines()
                          if "flight=%s" % fid in l]) == 3,
             msg="three access lines with flight=%s" % fid)


def test_direct_request_keeps_the_clients_request_id(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions",
               chat_body("direct", stream=True, temperature=0.9),
               headers=[("Content-Type", "text/plain"),
                        ("X-Request-Id", "direct-id-42")])
    assert r.status == 200, r
    assert r.headers.get("X-Infergw-Coalesce") == "bypass"
    (rec,) = completions(m)
    h = headers_of(rec)
    assert h["x-request-id"] == ["direct-id-42"], h
    # The constants hold for every call, coalesced or not.
    assert h["content-type"] == ["application/json"], h
    assert set(h) <= CONSTANT | FROM_KEY | FROM_FLIGHT, h


def test_forwarded_credentials_never_share_a_flight(t):
    """With forward_client_auth the client's credential reaches the
    upstream, so it must be part of the key: a client with another key,
    or none, never receives a flight led by someone else's key."""
    m = t.mock()
    g = t.gateway(m, {"upstream": {"forward_client_auth": "on",
                                   "api_key": "sk-gateway"}})
    tag = new_tag()
    body = chat_body("whose key", stream=True, mock_hold=tag)
    good = [("Authorization", "Bearer sk-good")]
    lead = send(g, body, headers=good)
    wait_state(g, m, leaders=1, held=1)
    twin = send(g, body, headers=good)
    wait_state(g, m, leaders=1, followers=1, held=1)
    bad = send(g, body, headers=[("Authorization", "Bearer sk-bad")])
    wait_state(g, m, leaders=2, held=2)
    none = send(g, body)
    wait_state(g, m, leaders=3, held=3)
    # An empty credential is no credential: it gets the gateway's key,
    # so it shares that flight.
    empty = send(g, body, headers=[("Authorization", "")])
    wait_state(g, m, leaders=3, held=3, followers=2)
    m.release(tag)
    sl, st, sb, sn, se = finish_all([lead, twin, bad, none, empty])
    for s in (sl, st, sb, sn, se):
        assert_complete_stream(s)
    assert [role(s) for s in (sl, st, sb, sn, se)] == \
        ["leader", "follower", "leader", "leader", "follower"]
    assert_same_bodies([sl, st])
    assert_same_bodies([sn, se])
    assert sl.body != sb.body and sl.body != sn.body
    recs = completions(m)
    assert len(recs) == 3, recs
    auths = sorted(headers_of(r)["authorization"][0] for r in recs)
    assert auths == ["Bearer sk-bad", "Bearer sk-gateway",
                     "Bearer sk-good"], auths
    for r in recs:
        a = headers_of(r).get("authorization", [None])[0]
        assert_coalesced_call(r, body, m.port, auth=a)
    # The credential is hashed into the key, never logged in clear.
    log = "\n".join(g.log_lines())
    assert "sk-good" not in log and "sk-bad" not in log


def test_forwarded_credentials_of_one_tenant_do_not_share(t):
    """Two keys of one tenant are one tenant, but two credentials: with
    forward_client_auth they are two flights."""
    m = t.mock()
    g = t.gateway(m, {"upstream": {"forward_client_auth": "on"}},
                  extra="[tenant acme]\napi_key = sk-acme-1-abcdef\n"
                        "api_key = sk-acme-2-abcdef\n")
    tag = new_tag()
    body = chat_body("one tenant two keys", stream=True, mock_hold=tag)
    a = send(g, body, headers=[("Authorization", "Bearer sk-acme-1-abcdef")])
    wait_state(g, m, leaders=1, held=1)
    b = send(g, body, headers=[("Authorization", "Bearer sk-acme-2-abcdef")])
    wait_state(g, m, leaders=2, held=2, followers=0)
    c = send(g, body, headers=[("Authorization", "Bearer sk-acme-1-abcdef")])
    wait_state(g, m, leaders=2, held=2, followers=1)
    m.release(tag)
    sa, sb, sc = finish_all([a, b, c])
    assert [role(s) for s in (sa, sb, sc)] == ["leader", "leader",
                                               "follower"]
    assert_same_bodies([sa, sc])
    assert sorted(headers_of(r)["authorization"][0]
                  for r in completions(m)) == ["Bearer sk-acme-1-abcdef",
                                               "Bearer sk-acme-2-abcdef"]


def test_client_headers_do_not_split_flights(t):
    """The constant Content-Type and Accept: clients that differ only in
    those headers share one flight, and the upstream sees the constants."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("headers vary", mock_hold=tag)
    variants = [[("Content-Type", "application/json")],
                [("Content-Type", "application/json; charset=utf-8"),
                 ("Accept", "text/event-stream")],
                [("Content-Type", "text/plain"), ("Accept", "*/*")]]
    lead = send(g, body, headers=variants[0])
    wait_state(g, m, leaders=1, held=1)
    rest = [send(g, body, headers=v) for v in variants[1:]]
    wait_state(g, m, leaders=1, followers=2, held=1)
    m.release(tag)
    streams = finish_all([lead] + rest)
    assert [s.resp.status for s in streams] == [200] * 3
    assert_same_bodies(streams)
    (rec,) = completions(m)
    assert_coalesced_call(rec, body, m.port)


def test_repeated_opt_out_lines_count(t):
    """RFC 9110 5.3: repeated field lines are one list, so a no-cache on a
    second Cache-Control line opts out as well as one on the first."""
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    bypassed_trio(g, m, chat_body("split cache-control", stream=True,
                                  mock_hold=tag), "opt_out",
                  headers=[("Cache-Control", "max-age=0"),
                           ("Cache-Control", "no-cache")])
    tag = new_tag()
    bypassed_trio(g, m, chat_body("split coalesce header", stream=True,
                                  mock_hold=tag), "opt_out",
                  headers=[("X-Infergw-Coalesce", "on"),
                           ("X-Infergw-Coalesce", "off")])


# ---- sampling -------------------------------------------------------------

def test_other_sampling_controls_bypass_without_temperature(t):
    """With temperature omitted (the default config treats that as
    greedy), top_p < 1, top_k > 0, min_p > 0, n > 1 ask for sampling."""
    m = t.mock()
    g = t.gateway(m)
    for extra in ({"top_p": 0.9}, {"top_k": 40}, {"min_p": 0.05},
                  {"n": 2}, {"top_p": "1"}):
        tag = new_tag()
        bypassed_trio(g, m, chat_body("knob %r" % (extra,), stream=True,
                                      mock_hold=tag, **extra), "sampling")
    # Control: neutral values still coalesce.
    tag = new_tag()
    streams = finish_all(held_trio(
        g, m, chat_body("neutral knobs", stream=True, mock_hold=tag,
                        top_p=1, top_k=-1, min_p=0, n=1)))
    assert roles(streams) == ["follower", "follower", "leader"]


def test_negative_seed_bypasses(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    bypassed_trio(g, m, chat_body("negative seed", stream=True,
                                  temperature=0.8, seed=-1, mock_hold=tag),
                  "sampling")
    tag = new_tag()
    streams = finish_all(held_trio(
        g, m, chat_body("seed zero", stream=True, temperature=0.8, seed=0,
                        mock_hold=tag)))
    assert roles(streams) == ["follower", "follower", "leader"]


def test_duplicate_keys_refused(t):
    m = t.mock()
    g = t.gateway(m)
    r = g.post("/v1/chat/completions",
               b'{"model":"mock-model","messages":[],"temperature":0.9,'
               b'"temperature":0}')
    assert r.status == 400, r
    assert json.loads(r.body)["error"]["code"] == "invalid_json"
    assert completions(m) == []
    s = finish(send(g, chat_body("after", stream=True)))
    assert_complete_stream(s)


def test_retries_and_hedges_send_only_constants_and_key_data(t):
    """A coalesced flight that is retried (u0 answers 503) and then hedged
    (u1 holds its answer, u2 wins): every attempt, on every upstream,
    carries the same flight id, that upstream's own configured key, the
    client's body and the constants; no client's header, id or
    credential.  Each mock holds the call ("mock_hold", released per
    mock) until the test has seen what it waits for, so the four clients
    are in the flight before its first attempt is answered."""
    from gwtest import request
    mocks = [t.mock() for _ in range(3)]
    assert request(mocks[0].port, "POST", "/control?status=503").status \
        == 200
    conf = {"routing": {"balance": "round_robin", "hedge_after": "1s",
                        "eject_after": 100}}
    for i, m in enumerate(mocks):
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % m.port,
                                    "api_key": "sk-up-%d" % i}
    g = t.gateway(None, conf)
    tag = new_tag()
    body = chat_body("contract, retried and hedged", stream=True,
                     mock_hold=tag)
    ids = ["client-r-%d" % i for i in range(4)]

    def client(i):
        return send(g, body, headers=HOSTILE + [
            ("X-Request-Id", ids[i]),
            ("Authorization", "Bearer sk-client-%d" % i)])

    def held(i):
        return mocks[i].stats()["held"] == 1
    conns = [client(0)]
    wait_for(lambda: held(0), msg="the call held on u0")
    conns += [client(i) for i in range(1, 4)]
    wait_state(g, mocks[0], followers=3, leaders=1)
    assert mocks[0].release(tag) == 1          # its 503: the retry
    wait_for(lambda: held(1), msg="the retry held on u1")
    wait_for(lambda: held(2), msg="the hedge held on u2")
    assert mocks[2].release(tag) == 1          # the hedge wins
    streams = finish_all(conns)
    for s in streams:
        assert_complete_stream(s)
    assert sorted(roles(streams)) == ["follower"] * 3 + ["leader"]
    assert_same_bodies(streams)
    recs = [(m, completions(m)) for m in mocks]
    assert [len(r) for _, r in recs] == [1, 1, 1], \
        "want one attempt on each: the call, its retry, its hedge"
    fids = {assert_coalesced_call(r[0], body, m.port,
                                  auth="Bearer sk-up-%d" % i)
            for i, (m, r) in enumerate(recs)}
    assert len(fids) == 1, "attempts of one flight with different ids"
    fid = fids.pop()
    assert fid not in ids
    for rid in ids:
        assert rid.encode() not in streams[0].body
    # The hedge won on u2; the held u1 saw the abort.
    wait_for(lambda: json.loads(mocks[1].get("/stats").body)["aborted"] == 1)
