#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/callgrind_phases.py - a callgrind profile of infergw, by phase.

Sums a callgrind output file (valgrind --tool=callgrind, Ir only) into
the phases of a request that issue 31 names (parse, route and policy,
key hash, dispatch and pick, libcurl set-up, transfer, reply, logging
and metrics, keep-alive wait, other) and prints a markdown table of
instructions per unit (a request, a chunk).

    callgrind_phases.py [--per N] [--base FILE --base-per M] FILE
    callgrind_phases.py --callees FUNC [--per N] FILE

--per N divides every figure by N (the requests the profile covers).
With --base, the figures are (FILE - BASE) / N: two profiles that
differ by N units of work (a stream of 100 chunks against one of 1)
give the cost of a unit with everything else cancelled out.
--callees FUNC lists what FUNC calls, inclusive, per unit: how the
phase map below was drawn, and how to check it.

Design: a phase is the set of functions named in PHASES ("a>b": b
when called from a, for a helper that serves several phases).  A function's
own instructions go to the phase of the innermost named function on
its call path, so nothing counts twice: a metrics counter bumped inside
the transfer is "logging and metrics", the SHA-256 inside the key is
"key hash" and the rest of the transfer is "transfer".  callgrind keeps
call arcs, not whole stacks, so an unnamed function shared by several
phases (malloc, memcpy, buf_append) is split between them in
proportion to the instructions each caller's calls to it cost: exact
for a function called from one phase, an estimate for one called from
several.  The names were read from the code (gateway/, common/) and
checked with --callees; a function the map does not know falls to its
caller's phase, and "other" is what no named function reaches (the
thread's own loop, start-up left-overs).
"""

import argparse
import collections
import os
import re
import sys

# Phase -> function names (exact, or a regular expression when the
# entry starts with '^').  Order matters only for printing.
PHASES = [
    ("parse: request head, body, JSON check", [
        "http_read_head", "http_read_body", "read_body", "read_form",
        "^http_parse_", "serve>jsonx_parse_object", "serve>json_delete",
        "route_request>json_delete", "set_request_id", "start_request",
        "find_peer", "conn_serve>http_find_header", "conn_serve>buf_compact",
    ]),
    ("route and policy: route, tenant, admission, eligibility", [
        "route_request", "serve", "find_route", "admit", "leave",
        "note_model", "^tenant_", "^tenants_", "coalesce_eligible",
        "coalesce_cache_ask", "fwd_init", "fwd_release", "use_generation",
        "drop_generation", "^generation_", "proxy_forward", "coalesce",
        "bypass", "forward_direct", "charge", "cost_of", "bill",
        "usage_ask",
    ]),
    ("key hash: SHA-256 of the coalescing key", [
        "coalesce_key", "coalesce_key_hex", "^mbedtls_sha256",
    ]),
    ("dispatch and pick", [
        "dispatch_call", "dispatch_prefix_hash", "^pool_", "^breaker_",
        "^budget_", "give_back", "count_attempt", "attempt_done",
        "on_winner", "^coalescer_", "lead", "follow",
    ]),
    ("libcurl set-up: handle, reset, options, header lists", [
        "attempt_start", "upstream_request_prepare", "upstream_session_take",
        "upstream_session_put", "upstream_session_handle", "^keepalive_",
        "handle_setup", "xfer_init", "response_reset", "call_keepable",
        "curl_easy_reset", "curl_easy_setopt", "curl_slist_append",
        "curl_slist_free_all", "curl_multi_add_handle",
        "curl_multi_remove_handle",
    ]),
    ("transfer: libcurl's send, receive, parse; our callbacks", [
        "upstream_perform", "transfer_loop", "upstream_session_wait",
        "curl_multi_socket_action", "curl_multi_info_read", "header_cb",
        "write_cb", "prereq_cb", "attempt_end", "attempt_finished", "reap",
        "sock_cb", "timer_cb", "share_lock", "share_unlock",
        "curl_easy_getinfo", "deliver_head", "claim_win",
    ]),
    ("flight and fanout: append, wake, push (leader path)", [
        "^flight_", "^fanout_", "lead_data", "lead_piece", "lead_head",
        "lead_push_self", "lead_tick", "lead_peer", "^usage_split_",
    ]),
    ("usage scan: tokens from the answer", [
        "^usage_scan_", "take_usage",
    ]),
    ("reply: head, body, chunk framing, writes", [
        "^reply_", "direct_head", "direct_data", "^net_stream_write",
        "^net_stream_send", "^net_write",
    ]),
    ("logging and metrics: request id, client address, counters", [
        "^log_", "^metrics_", "access_log", "write_access", "note_error",
        "^prom_", "conn_serve>net_addr_format", "conn_serve>gw_random_hex",
        "set_client",
    ]),
    ("keep-alive wait: the next request", [
        "^net_stream_wait", "http_read_head>fill",
    ]),
]

RECURSION = re.compile(r"'\d+$")


def load(path):
    """-> (self cost per fn, {(caller, callee): inclusive}, summary)."""
    names = {"fn": {}, "ob": {}}
    self_cost = collections.Counter()
    arcs = collections.Counter()
    ncalls = collections.Counter()
    npos = 1
    ob = cob = ""
    fn = cfn = None
    pending_call = None
    summary = 0

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?: (.*))?$", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?" + m.group(1))

    def key(n, obj):
        n = RECURSION.sub("", n)
        if n.startswith("0x"):
            return n + "@" + os.path.basename(obj)
        return n

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if fn is None:
                    continue
                parts = line.split()
                cost = int(parts[npos]) if len(parts) > npos else 0
                if pending_call is not None:
                    if pending_call != fn:
                        arcs[(fn, pending_call)] += cost
                        ncalls[(fn, pending_call)] += pending_n
                    pending_call = None
                else:
                    self_cost[fn] += cost
                continue
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
            elif line.startswith("summary:") or line.startswith("totals:"):
                summary = max(summary, int(line.split()[1]))
            elif line.startswith("ob="):
                ob = name("ob", line[3:])
            elif line.startswith("cob="):
                cob = name("ob", line[4:])
            elif line.startswith("fn="):
                fn = key(name("fn", line[3:]), ob)
                cob = ob
            elif line.startswith("cfn="):
                cfn = key(name("fn", line[4:]), cob)
            elif line.startswith("calls="):
                pending_call = cfn
                pending_n = int(line[6:].split()[0])
                cob = ob
            # fl= fi= fe= cfi= cfl= jump= jcnd=: not needed
    return self_cost, arcs, ncalls, summary


def label_of(fn):
    base = fn.split("@")[0]
    for phase, pats in PHASES:
        for p in pats:
            if ">" in p:
                continue
            if p.startswith("^"):
                if re.match(p, base):
                    return phase
            elif base == p:
                return phase
    return None


ARC_LABELS = {tuple(p.split(">")): phase
              for phase, pats in PHASES for p in pats if ">" in p}


def attribute(self_cost, arcs, detail=None):
    """-> Counter phase -> instructions (the innermost-named rule); with
    'detail' a phase, a Counter of its instructions by function."""
    callers = collections.defaultdict(list)
    fns = set(self_cost)
    for (a, b), c in arcs.items():
        callers[b].append((a, c))
        fns.add(a)
        fns.add(b)
    labels = {f: label_of(f) for f in fns}
    dist = {f: {"other": 1.0} for f in fns}
    for _ in range(60):
        changed = 0.0
        for f in fns:
            if labels[f] is not None:
                continue
            ins = callers.get(f)
            if not ins:
                continue
            tot = sum(c for _, c in ins)
            if tot <= 0:
                continue
            d = collections.defaultdict(float)
            for a, c in ins:
                arc = ARC_LABELS.get((a.split("@")[0], f.split("@")[0]))
                if arc:
                    src = {arc: 1.0}
                else:
                    src = {labels[a]: 1.0} if labels[a] else dist[a]
                for k, v in src.items():
                    d[k] += v * c / tot
            old = dist[f]
            changed += sum(abs(d.get(k, 0) - old.get(k, 0))
                           for k in set(d) | set(old))
            dist[f] = dict(d)
        if changed < 1e-9:
            break
    out = collections.Counter()
    by_fn = collections.Counter()
    for f in fns:
        s = self_cost.get(f, 0)
        if not s:
            continue
        share = {labels[f]: 1.0} if labels[f] else dist[f]
        for k, v in share.items():
            out[k] += s * v
            if k == detail:
                name = f
                if "@" in f:    # a stripped library's internals, together
                    name = "%s (internal functions)" % (
                        f.split("@")[1] or "no object")
                by_fn[name] += s * v
    return (out, by_fn) if detail else out


def fmt(x):
    if abs(x) < 0.5:
        return "0"
    return "%.1fk" % (x / 1000.0) if abs(x) >= 100 else "%.0f" % x


def table(phases, total, per, title):
    order = [p for p, _ in PHASES] + ["other"]
    print("| %s | instructions | share |" % title)
    print("|---|---|---|")
    for p in order:
        v = phases.get(p, 0) / per
        share = 100.0 * v * per / total if total else 0.0
        print("| %s | %s | %.1f %% |" % (p, fmt(v),
                                         0.0 if abs(share) < 0.05 else share))
    print("| **total** | **%s** | 100 %% |" % fmt(total / per))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--base")
    ap.add_argument("--title", default="phase (per request)")
    ap.add_argument("--callees")
    ap.add_argument("--detail", metavar="PHASE",
                    help="list the functions whose own instructions make "
                    "up the phase whose name starts with PHASE")
    a = ap.parse_args()

    self_cost, arcs, ncalls, _ = load(a.file)
    if a.callees:
        own = self_cost.get(a.callees, 0)
        print("%s self %s" % (a.callees, fmt(own / a.per)))
        rows = sorted(((c, b, ncalls[(x, b)]) for (x, b), c in arcs.items()
                       if x == a.callees), reverse=True)
        for c, b, n in rows:
            print("  %10s  %8.2f calls  %s  [%s]" % (fmt(c / a.per), n / a.per,
                                                    b, label_of(b) or "-"))
        return 0
    phases = attribute(self_cost, arcs)
    total = sum(self_cost.values())
    if a.base:
        bs, ba, _, _ = load(a.base)
        bphases = attribute(bs, ba)
        for k in set(phases) | set(bphases):
            phases[k] = phases.get(k, 0) - bphases.get(k, 0)
        total -= sum(bs.values())
    table(phases, total, a.per, a.title)
    if a.detail:
        name = next((p for p, _ in PHASES if p.startswith(a.detail)),
                    a.detail)
        _, by_fn = attribute(self_cost, arcs, name)
        print()
        print("| %s: own instructions of | instructions |" % name)
        print("|---|---|")
        for f, s in by_fn.most_common(15):
            if s / a.per >= 50:
                print("| %s | %s |" % (f, fmt(s / a.per)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
