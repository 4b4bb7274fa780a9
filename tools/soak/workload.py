# SPDX-License-Identifier: MIT
"""The workload: class Soak, whose worker threads run a weighted mix of
request kinds (its k_* methods) and record every result."""

import json
import random
import threading
import time
import uuid

from . import limits
from .client import (CHAT, COMP, EMB, Target, build_request, chat_body,
                     close_conn, comp_body, one_request, open_conn,
                     read_response)
from .limits import STUCK_PAUSE
from .response import BAD, COMPLETE, MUST_FAIL, classify, parse_http


class Soak:
    def __init__(self, args):
        self.args = args
        self.results = []
        self.rlock = threading.Lock()
        self.stop_at = None
        self.groups = 0
        self.texts = {}           # body -> set of texts (COMPLETE only)
        self.text_kinds = {}
        self.bad_server = None
        self.stuck_sem = threading.Semaphore(1)

    def record(self, res, body=None):
        with self.rlock:
            self.results.append(res)
            if body is not None and res.get("cat") == COMPLETE and \
                    res.get("text") is not None:
                self.texts.setdefault(body, set()).add(res["text"])
                self.text_kinds[body] = res["kind"]

    def targets(self, rng):
        if self.tls_target and rng.random() < 0.5:
            return self.tls_target
        return self.plain_target

    # -- kinds ------------------------------------------------------------
    def k_distinct_stream(self, rng):
        body = chat_body("distinct %s" % uuid.uuid4().hex,
                         mock_chunks=rng.randint(4, 16),
                         mock_delay_ms=rng.randint(5, 40))
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "distinct_stream", "stream": True,
                                 "route": "chat"}), body)

    def k_completions_stream(self, rng):
        body = comp_body("text %s" % uuid.uuid4().hex,
                         mock_chunks=rng.randint(4, 12),
                         mock_delay_ms=rng.randint(5, 30))
        self.record(one_request(self.targets(rng), COMP, body,
                                {"kind": "completions_stream",
                                 "stream": True, "route": "completions"}),
                    body)

    def k_nonstream(self, rng):
        # a small pool of prompts so that some coalesce by chance
        body = chat_body("nonstream %d" % rng.randint(0, 50), stream=False,
                         mock_chunks=rng.randint(2, 10), mock_delay_ms=10)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "nonstream", "stream": False,
                                 "route": "chat"}), body)

    def k_embeddings(self, rng):
        body = json.dumps({"model": "mock-model",
                           "input": ["emb %d" % rng.randint(0, 1000)]}
                          ).encode()
        self.record(one_request(self.targets(rng), EMB, body,
                                {"kind": "embeddings", "stream": False,
                                 "route": "embeddings"}), body)

    def k_hangup_mid_stream(self, rng):
        body = chat_body("hangup %s" % uuid.uuid4().hex, mock_chunks=20,
                         mock_delay_ms=30)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "hangup_mid_stream", "stream": True,
                                 "route": "chat"},
                                policy=("events", rng.randint(1, 4))))

    def k_hangup_before_answer(self, rng):
        body = chat_body("early %s" % uuid.uuid4().hex, mock_first_ms=400)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "hangup_before_answer",
                                 "stream": True, "route": "chat"},
                                hangup_before=rng.uniform(0.01, 0.3)))

    def k_slow_reader(self, rng):
        body = chat_body("slow %s" % uuid.uuid4().hex, mock_chunks=40,
                         mock_pad=32768, mock_delay_ms=2)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "slow_reader", "stream": True,
                                 "route": "chat"},
                                policy=("slow", 8192, 0.01), rcvbuf=8192),
                    body)

    def k_stuck_reader(self, rng):
        if not self.stuck_sem.acquire(blocking=False):
            return self.k_slow_reader(rng)    # one at a time (5 MiB each)
        try:
            self._stuck_reader(rng)
        finally:
            self.stuck_sem.release()

    def _stuck_reader(self, rng):
        # 5 MiB: more than the gateway's socket buffer (tcp_wmem max 4 MiB)
        body = chat_body("stuck %s" % uuid.uuid4().hex, mock_chunks=80,
                         mock_pad=65536, mock_delay_ms=5)
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": "stuck_reader", "stream": True,
                                 "route": "chat"},
                                policy=("stuck", 1000, STUCK_PAUSE),
                                rcvbuf=8192), body)

    def k_fault(self, rng):
        fault = rng.choice(sorted(MUST_FAIL))
        stream = rng.random() < 0.6
        body = chat_body("fault %s %s" % (fault, uuid.uuid4().hex),
                         stream=stream, mock_fault=fault, mock_chunks=6,
                         mock_delay_ms=10)
        kind = "fault_%s_%s" % (fault, "stream" if stream else "json")
        self.record(one_request(self.targets(rng), CHAT, body,
                                {"kind": kind, "stream": stream,
                                 "route": "chat", "fault": fault}), body)

    def k_keepalive_pair(self, rng):
        """Two requests on one connection (the first kept alive)."""
        t = self.targets(rng)
        t0 = time.monotonic()
        deadline = t0 + limits.REQ_DEADLINE
        b1 = chat_body("ka1 %s" % uuid.uuid4().hex, stream=False,
                       mock_chunks=3)
        b2 = chat_body("ka2 %s" % uuid.uuid4().hex, mock_chunks=5)
        r1 = {"kind": "keepalive_pair", "stream": False, "route": "chat"}
        r2 = {"kind": "keepalive_pair", "stream": True, "route": "chat"}
        try:
            s = open_conn(t, deadline)
        except Exception as e:
            cat, why, _, _ = classify(b"", "connect",
                                      dict(r1, connect_error=repr(e)))
            self.record({"kind": "keepalive_pair", "transport": t.name,
                         "cat": cat, "why": why, "raw": b"", "dur": 0})
            return
        try:
            s.settimeout(5)
            s.sendall(build_request(CHAT, b1, close=False))
            raw, end, _ = read_response(s, deadline, ("keepalive",))
            p = parse_http(raw)
            res1 = {"kind": "keepalive_pair", "transport": t.name, "t0": t0}
            if p.state == "complete":
                leftover = raw[p.consumed:]
                cat, why, p1, text = classify(raw[:p.consumed], "eof", r1)
                if leftover:
                    cat, why = BAD, "bytes after a kept-alive response"
                res1.update(cat=cat, why=why, raw=raw, text=text,
                            rid=p.header("x-request-id"), dur=0)
                self.record(res1, b1)
                if p.status == 200 and not leftover and not \
                        (p.header("connection") or "").lower() == "close":
                    s.sendall(build_request(CHAT, b2, close=True))
                    raw2, end2, _ = read_response(s, deadline)
                    cat, why, p2, text = classify(raw2, end2, r2)
                    self.record({"kind": "keepalive_pair",
                                 "transport": t.name, "cat": cat,
                                 "why": "2nd: " + why, "raw": raw2,
                                 "text": text, "dur": time.monotonic() - t0,
                                 "rid": p2.header("x-request-id")}, b2)
            else:
                cat, why, p1, text = classify(raw, end, r1)
                res1.update(cat=cat, why=why, raw=raw, text=text, dur=0,
                            rid=p1.header("x-request-id"))
                self.record(res1, b1)
        except Exception as e:
            self.record({"kind": "keepalive_pair", "transport": t.name,
                         "cat": BAD, "why": "client error %r" % e,
                         "raw": b"", "dur": 0})
        finally:
            close_conn(s)

    def k_coalesced(self, rng, fault=None):
        """3..6 identical streams at once; some join late, one may hang
        up, one may read slowly; plain and TLS mixed."""
        n = rng.randint(3, 6)
        big = rng.random() < 0.25
        kw = {"mock_chunks": 12, "mock_first_ms": 150, "mock_delay_ms": 25}
        if big:
            kw.update(mock_chunks=24, mock_pad=16384, mock_delay_ms=10)
        if fault:
            kw["mock_fault"] = fault
        stream = not (fault is None and rng.random() < 0.2)
        body = chat_body("group %s" % uuid.uuid4().hex, stream=stream, **kw)
        kind = "coalesced_" + (("fault_" + fault) if fault else
                               ("stream" if stream else "json"))
        roles = ["normal"] * n
        if stream and rng.random() < 0.35:
            roles[rng.randrange(n)] = "hangup"
        if stream and rng.random() < 0.35:
            roles[rng.randrange(n)] = "slow"
        barrier = threading.Barrier(n)
        with self.rlock:
            self.groups += 1

        def member(i):
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass
            if i >= n - 1 and rng.random() < 0.5:
                time.sleep(rng.uniform(0.05, 0.4))     # a late joiner
            pol, rcv = None, None
            if roles[i] == "hangup":
                pol = ("events", rng.randint(1, 3))
            elif roles[i] == "slow":
                pol, rcv = ("slow", 4096, 0.01), 8192
            tgt = (self.tls_target if self.tls_target and i % 2
                   else self.plain_target)
            res = one_request(tgt, CHAT, body,
                              {"kind": kind, "stream": stream,
                               "route": "chat", "fault": fault},
                              policy=pol, rcvbuf=rcv)
            res["group_role"] = roles[i]
            self.record(res, body)

        ths = [threading.Thread(target=member, args=(i,), daemon=True)
               for i in range(1, n)]
        for t in ths:
            t.start()
        member(0)
        for t in ths:
            t.join(limits.REQ_DEADLINE + 8)

    def k_coalesced_fault(self, rng):
        self.k_coalesced(rng, fault=rng.choice(
            ["die_mid_stream", "stall_mid_stream", "stall", "reset"]))

    def k_injected_bug(self, rng):
        body = chat_body("injected")
        self.record(one_request(Target(self.bad_server.port), CHAT, body,
                                {"kind": "injected_bug", "stream": True,
                                 "route": "chat"}))

    KINDS = [  # (weight, method name)
        (16, "k_coalesced"),
        (16, "k_distinct_stream"),
        (5, "k_completions_stream"),
        (9, "k_nonstream"),
        (3, "k_embeddings"),
        (7, "k_hangup_mid_stream"),
        (3, "k_hangup_before_answer"),
        (5, "k_slow_reader"),
        (1, "k_stuck_reader"),
        (7, "k_fault"),
        (2, "k_coalesced_fault"),
        (4, "k_keepalive_pair"),
    ]

    def worker(self, idx):
        rng = random.Random(self.args.seed * 1000 + idx)
        kinds = list(self.KINDS)
        if self.args.inject_bug:
            kinds.append((3, "k_injected_bug"))
        names = [k for _, k in kinds]
        weights = [w for w, _ in kinds]
        time.sleep(rng.uniform(0, 1.0))      # spread the start
        while time.monotonic() < self.stop_at:
            name = rng.choices(names, weights)[0]
            try:
                getattr(self, name)(rng)
            except Exception as e:
                self.record({"kind": name[2:], "transport": "?", "cat": BAD,
                             "why": "client exception %r" % e, "raw": b"",
                             "dur": 0})


def text_mismatches(soak):
    return [(soak.text_kinds[b], sorted(t)) for b, t in soak.texts.items()
            if len(t) > 1]
