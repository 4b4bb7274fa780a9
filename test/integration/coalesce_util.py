# SPDX-License-Identifier: MIT
"""coalesce_util - helpers for the request-coalescing integration tests
(009-coalesce.py, 010-coalesce-faults.py), on top of gwtest.

The pattern every coalescing test follows, so that nothing depends on
timing luck:

    tag = new_tag()
    conns = [send(g, body_with(mock_hold=tag)) for ...]   # heads not read
    wait_state(g, m, followers=2, held=1)                 # real signals
    m.release(tag)
    streams = [finish(c) for c in conns]                  # read it all

The mock holds the leader's upstream request until /release, so followers
join a flight that is certainly still running; the waits poll the
gateway's /metrics and the mock's /stats with deadlines (gwtest.wait_for).
"""

import json
import os
import re
import socket
import threading
import time

import gwtest
from gwtest import (JSON_HEADERS, Connection, Stream, budget, build_request,
                    has_metric, metric, sse_data, sse_events, wait_for)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROLE_HEADER = "X-Infergw-Coalesce"

# Metric names.
LEADERS = "infergw_coalesce_leaders_total"
FOLLOWERS = "infergw_coalesce_followers_total"
BY_TENANT = "infergw_coalesce_followers_by_tenant_total"
BYPASS = "infergw_coalesce_bypass_total"
FLIGHTS = "infergw_flights_active"
PARKED = "infergw_coalesce_parked"
PUSHED = "infergw_coalesce_pushed_chunks_total"
HELPERS = "infergw_coalesce_helpers_total"
UPSTREAM = "infergw_upstream_requests_total"
REQUESTS = "infergw_requests_total"


# What the gateway inserts right after the '{' of a coalesced stream's
# body that has no stream_options of its own (usage.h's USAGE_ASK).
USAGE_ASK = b'"stream_options":{"include_usage":true},'


def as_sent(body):
    """A coalesced request's body as the upstream receives it: a stream
    without stream_options asks for its usage (proxy.c, usage_ask());
    any other body goes as it is."""
    d = json.loads(body)
    if d.get("stream") is True and "stream_options" not in d:
        i = body.index(b"{") + 1
        return body[:i] + USAGE_ASK + body[i:]
    return body


def new_tag():
    """A hold tag no other request (or test) uses."""
    return "co-" + os.urandom(8).hex()


class RcvbufConnection(Connection):
    """A client connection whose receive buffer is set small before
    connect (so the TCP window is small from the start): a client that
    stops reading makes the sender block soon."""

    def __init__(self, port, rcvbuf, timeout=10.0):
        self.port = port
        self.timeout = timeout
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.settimeout(budget(5))
            s.connect(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except Exception:
            s.close()
            raise
        self.sock = gwtest._register(s)
        self.reader = gwtest._Reader(s)


def send(g, body, path=CHAT, headers=None, timeout=15.0, rcvbuf=None):
    """Open a connection and send one POST; the response is not read.
    Returns the Connection (read it with finish())."""
    if isinstance(headers, list):
        # A list may repeat a name; a dict entry replaces the default.
        names = {k.lower() for k, _ in headers}
        h = [(k, v) for k, v in JSON_HEADERS.items()
             if k.lower() not in names] + headers
    else:
        h = dict(JSON_HEADERS)
        h.update(headers or {})
    if rcvbuf is None:
        c = Connection(g.port, timeout)
    else:
        c = RcvbufConnection(g.port, rcvbuf, timeout)
    c.send(build_request("POST", path, h, body))
    return c


def held_trio(g, m, body, path=CHAT, headers=None):
    """Three identical requests made concurrent with a hold: the first is
    sent, and once it leads a flight parked at the mock, two more join;
    then the hold is released.  'body' must carry a "mock_hold" tag no
    earlier request used.  Returns the three connections, leader's
    first (responses unread)."""
    tag = re.search(rb'"mock_hold":"([^"]+)"', body).group(1).decode()
    base = _state(g, m, {"leaders": 0, "followers": 0})
    lead = send(g, body, path, headers)
    wait_state(g, m, leaders=base["leaders"] + 1, held=1)
    rest = [send(g, body, path, headers) for _ in range(2)]
    wait_state(g, m, followers=base["followers"] + 2, held=1)
    assert m.release(tag) == 1
    return [lead] + rest


def bypassed_trio(g, m, body, reason, headers=None):
    """Three identical requests (with 'headers', as send() takes them)
    that must each go upstream alone, bypassed for 'reason': all three
    are held at the mock at once, none leads or follows, and each gets its
    own complete stream marked bypass.  'body' must carry a "mock_hold"
    tag no earlier request used.  Returns the three finished streams."""
    tag = re.search(rb'"mock_hold":"([^"]+)"', body).group(1).decode()
    names = {"leaders": 0, "followers": 0, "bypass_" + reason: 0,
             "completions": 0}
    base = _state(g, m, names)
    conns = [send(g, body, headers=headers) for _ in range(3)]
    wait_state(g, m, held=3, leaders=base["leaders"],
               followers=base["followers"],
               **{"bypass_" + reason: base["bypass_" + reason] + 3})
    m.release(tag)
    streams = finish_all(conns)
    for s in streams:
        assert_complete_stream(s)
    assert roles(streams) == ["bypass"] * 3, roles(streams)
    wait_state(g, m, completions=base["completions"] + 3)
    return streams


def start(conn, timeout=None):
    """Read the response head of a sent request: a gwtest.Stream."""
    return Stream(conn, "POST", timeout)


def read_rest(s):
    """Read a Stream to its end; returns its whole body."""
    return s.read_all()


def finish(conn, timeout=None):
    """Read the whole response of a sent request: a gwtest.Stream with
    .resp (status, headers), .body (de-chunked) and .clean_end."""
    s = start(conn, timeout)
    read_rest(s)
    return s


def hold_invariant(pred, seconds, interval=0.05, msg=None):
    """Assert pred() stays truthy, checked every 'interval', for 'seconds'
    (a scenario duration, e.g. how long a client stalls; not scaled)."""
    end = time.monotonic() + seconds
    n = 0
    while True:
        v = pred()
        assert v, "%s broke after %d checks (value %r)" % (
            msg or getattr(pred, "__name__", pred), n, v)
        n += 1
        if time.monotonic() >= end:
            return
        time.sleep(interval)


def finish_all(conns, timeout=None, workers=32):
    """finish() every connection, concurrently (bounded threads), in the
    order given.  Re-raises the first failure."""
    out = [None] * len(conns)
    errors = []
    lock = threading.Lock()
    todo = list(range(len(conns)))

    def worker():
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                out[i] = finish(conns[i], timeout)
            except BaseException as e:          # noqa: B902
                with lock:
                    errors.append((i, e))
                return

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(workers, len(conns)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(budget(60))
    if errors:
        i, e = errors[0]
        raise AssertionError("response %d of %d: %s" % (i, len(conns), e))
    assert all(s is not None for s in out), "a reader thread hung"
    return out


# ---- clients whose pace the test sets --------------------------------------

class Tail:
    """Reads the response of a sent request on a thread of its own, as
    fast as it can, and tells how far it has got, so that a test can
    wait for it before the upstream sends more (pace()).  .result() is
    the finished Stream (a failure in the thread is raised there)."""

    def __init__(self, conn, timeout=120):
        self._conn = conn
        self._timeout = timeout
        self._lock = threading.Lock()
        self._bytes = 0
        self._events = 0
        self._head = None
        self._out = None
        self._error = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            s = start(self._conn, self._timeout)
            with self._lock:
                self._head = s.resp
            tail = b""
            for piece in s.chunks():
                # Count whole "data: " lines: an event may span pieces.
                tail += piece
                n = tail.count(b"\n\n")
                tail = tail[tail.rfind(b"\n\n") + 2:] if n else tail[-8:]
                with self._lock:
                    self._bytes += len(piece)
                    self._events += n
            self._out = s
        except BaseException as e:          # noqa: B902
            self._error = e

    @property
    def length(self):
        """The response's Content-Length once its head has come, else
        None (the gateway holds a head until the first body byte)."""
        with self._lock:
            head = self._head
        cl = head.headers.get("Content-Length") if head else None
        return int(cl) if cl is not None else None

    @property
    def received(self):
        """Body bytes received so far."""
        with self._lock:
            return self._bytes

    @property
    def events(self):
        """SSE events (blank-line ended) received so far."""
        with self._lock:
            return self._events

    def has(self, events=0, received=0):
        """Whether it has 'events' SSE events and 'received' body bytes;
        raises if its reading failed or ended before."""
        alive = self._thread.is_alive()     # before the counts: see below
        with self._lock:
            ok = self._events >= events and self._bytes >= received
        if ok:
            return True
        if self._error is not None:
            raise AssertionError("the reader failed: %s" % self._error)
        # Counts read after the thread was seen dead are its last ones.
        assert alive, (
            "the reader's response ended at %d events, %d bytes"
            % (self._events, self._bytes))
        return False

    def head(self):
        """The response head, once it has come (waits for it)."""
        wait_for(lambda: self._head is not None or self._error is not None
                 or not self._thread.is_alive(), 30, msg="a response head")
        if self._error is not None:
            raise self._error
        assert self._head is not None, "the response ended without a head"
        return self._head

    def result(self):
        self._thread.join(budget(self._timeout))
        assert not self._thread.is_alive(), "the reader never finished"
        if self._error is not None:
            raise self._error
        return self._out


class HeldClient:
    """A client that sends its request and then reads nothing, through a
    small receive buffer, until the test lets it (read_all()): a reader
    that falls behind by construction, whatever the machine's speed."""

    def __init__(self, g, body, path=CHAT, rcvbuf=16384):
        self.conn = send(g, body, path,
                         headers={"Connection": "close"}, rcvbuf=rcvbuf)

    def read_all(self, timeout=60):
        """Read everything to the end; the parsed Response (de-chunked
        body; .clean_end says whether it ended as its framing says)."""
        return gwtest.read_response(self.conn.reader,
                                    self.conn.deadline(budget(timeout)),
                                    "POST")


def pace(m, tag, chunks, step, caught_up, what="the paced reader"):
    """Send a mock_gate'd response 'step' content chunks at a time: open
    gate 'tag' to k + step, then wait until caught_up(k + step) says the
    readers that must keep up have what was sent, until 'chunks' are
    open.  A reader waited for is never more than 'step' chunks behind
    the upstream, on any machine."""
    k = 0
    while k < chunks:
        k = min(chunks, k + step)
        m.gate(tag, k)
        wait_for(lambda: caught_up(k), 30,
                 msg="%s to have %d chunks" % (what, k))


def role(s):
    """The X-Infergw-Coalesce header of a Stream (or Response)."""
    resp = s.resp if isinstance(s, Stream) else s
    return resp.headers.get(ROLE_HEADER)


def roles(streams):
    return sorted(str(role(s)) for s in streams)


# ---- signals -------------------------------------------------------------

def present(gm, name, **labels):
    """metric(), after checking that the series exists at all: a missing
    metric must not pass for a zero."""
    assert has_metric(gm, name, **labels), \
        "no %s%s in /metrics" % (name, labels or "")
    return metric(gm, name, **labels)


def counter(g, name, **labels):
    return present(g.metrics(), name, **labels)


def _state(g, m, want):
    """The current values of the names in 'want' (see wait_state)."""
    have = {}
    gm = None
    st = None
    for k in want:
        if k in ("held", "completions", "aborted", "in_progress"):
            if st is None:
                st = m.stats()
            have[k] = st[k]
        else:
            if gm is None:
                gm = g.metrics()
            have[k] = _gateway_value(gm, k)
    return have


def _gateway_value(gm, k):
    if k == "leaders":
        return present(gm, LEADERS)
    if k == "followers":
        return present(gm, FOLLOWERS)
    if k == "flights":
        return present(gm, FLIGHTS)
    if k == "parked":
        return present(gm, PARKED)
    if k == "pushed":
        return present(gm, PUSHED)
    if k == "helpers":
        return present(gm, HELPERS)
    if k == "upstream":
        return present(gm, UPSTREAM)
    if k.startswith("bypass_"):
        return present(gm, BYPASS, reason=k[len("bypass_"):])
    if k.startswith("tenant_"):
        return present(gm, BY_TENANT, tenant=k[len("tenant_"):])
    raise KeyError(k)


def wait_state(g, m, timeout=10.0, **want):
    """Poll the gateway's /metrics and the mock's /stats until every named
    value equals the wanted one.  Names: held, completions, aborted,
    in_progress (mock); leaders, followers, flights, upstream, parked,
    pushed, helpers, bypass_<reason>, tenant_<name> (gateway).  Fails at
    once if a monotonic counter overshoots (more calls than wanted can
    never come back down), or if a gateway metric does not exist."""
    monotonic = {"completions", "aborted", "leaders", "followers",
                 "upstream", "pushed"}
    last = {}

    def check():
        have = _state(g, m, want)
        last.clear()
        last.update(have)
        for k, v in want.items():
            if (k in monotonic or k.startswith("bypass_")
                    or k.startswith("tenant_")) and have[k] > v:
                raise AssertionError("%s is %r, want %r (overshot): %r"
                                     % (k, have[k], v, have))
        return all(have[k] == v for k, v in want.items())

    try:
        wait_for(check, timeout, msg="state %r" % (want,))
    except AssertionError as e:
        raise AssertionError("%s; last seen %r" % (e, last))
    return last


def expect_state(g, m, **want):
    """Assert, once, that every named value equals the wanted one."""
    have = _state(g, m, want)
    assert have == want, "state %r, want %r" % (have, want)


# ---- bodies ----------------------------------------------------------------

def events_of(body):
    """The SSE events of a complete stream body."""
    return sse_events(body)


def assert_complete_stream(s, what="stream"):
    """A 200 SSE stream that ended cleanly with exactly one [DONE], last."""
    r = s.resp
    assert r.status == 200, "%s: status %r" % (what, r)
    ct = r.headers.get("Content-Type", "")
    assert ct.split(";")[0].strip() == "text/event-stream", \
        "%s: Content-Type %r" % (what, ct)
    assert s.clean_end, "%s: no clean end (no zero-length chunk): %r" % (
        what, s.body[-200:])
    assert s.body.count(b"data: [DONE]") == 1, \
        "%s: %d [DONE] events" % (what, s.body.count(b"data: [DONE]"))
    assert s.body.endswith(b"data: [DONE]\n\n"), \
        "%s: does not end with [DONE]: %r" % (what, s.body[-120:])
    evs = events_of(s.body)
    for ev in evs[:-1]:
        d = sse_data(ev)
        assert isinstance(d, dict) and "error" not in d, \
            "%s: unexpected event %r" % (what, ev[:200])
    return evs


def assert_same_bodies(streams, what="bodies"):
    """Every stream's de-chunked body is byte-identical to the first."""
    first = streams[0].body
    for i, s in enumerate(streams[1:], 1):
        if s.body != first:
            n = 0
            while n < min(len(s.body), len(first)) and s.body[n] == first[n]:
                n += 1
            raise AssertionError(
                "%s: body %d differs from body 0 at byte %d (lengths %d, "
                "%d):\n  0: %r\n  %d: %r" % (
                    what, i, n, len(first), len(s.body),
                    first[max(0, n - 40):n + 80], i,
                    s.body[max(0, n - 40):n + 80]))


# ---- the gateway's memory ----------------------------------------------------

def gateway_kib(g, field):
    """A field of the gateway's /proc/PID/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/%d/status" % g.proc.pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, g.proc.pid))


def measured_env():
    """The environment of a gateway whose RSS a test measures.  Under
    AddressSanitizer freed memory sits in a quarantine instead of being
    reused, so RSS would count every chunk ever freed: the quarantine is
    turned off (other builds ignore the variable)."""
    asan = [o for o in [os.environ.get("ASAN_OPTIONS", ""),
                        "quarantine_size_mb=0",
                        "thread_local_quarantine_size_kb=0"] if o]
    return {"ASAN_OPTIONS": ":".join(asan)}


def memory_factor(g):
    """How much RSS a byte of the gateway's heap costs: 5 under
    ThreadSanitizer (four bytes of shadow for each byte the program
    touches, and its metadata), else 1."""
    with open("/proc/%d/maps" % g.proc.pid) as f:
        return 5 if any("libtsan" in line for line in f) else 1
