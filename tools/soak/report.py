# SPDX-License-Identifier: MIT
"""The report of a run: responses by kind and form, the gateway's
resources, its /metrics and log, the chaos, and the verdicts that make
the exit status."""

import os
import re
import statistics

from .client import OPEN_CONNS
from .response import BAD, CATS, COMPLETE, GAVE_UP, HONEST
from .workload import text_mismatches


def percentile(xs, q):
    if not xs:
        return 0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def fmt_kb(kb):
    return "%.1f MiB" % (kb / 1024.0)


def metric_sum(text, name, label_filter=None):
    tot = 0.0
    found = False
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if label_filter and label_filter not in (m.group(2) or ""):
            continue
        try:
            tot += float(m.group(3))
            found = True
        except ValueError:
            pass
    return tot if found else None


def metric_by_label(text, name, label):
    out = {}
    for line in (text or "").splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        lm = re.search(r'%s="([^"]*)"' % label, m.group(2))
        k = lm.group(1) if lm else "?"
        out[k] = out.get(k, 0) + float(m.group(3))
    return out


def report(args, soak, base, samples, final, t_load, t_done, settle_s,
           stragglers, gw, gw_alive, metrics, still_serves, counts, chaos,
           mocks, tmp):
    res = soak.results
    print()
    print("=" * 78)
    print("infergw fault soak: %d s, %d clients, %d mocks, %s" % (
        args.seconds, args.clients, len(mocks),
        "plain + TLS" if args.tls else "plain"))
    print("=" * 78)
    # --- responses
    mism = text_mismatches(soak)
    bad = [r for r in res if r["cat"] == BAD]
    tot = {c: sum(1 for r in res if r["cat"] == c) for c in CATS}
    print("responses: %d   COMPLETE %d   HONEST ERROR %d   CLIENT GAVE UP "
          "%d   BAD %d" % (len(res), tot[COMPLETE], tot[HONEST],
                           tot[GAVE_UP], tot[BAD]))
    print("  (%.1f responses/s; peak concurrent client connections %d; "
          "coalesced groups %d)" % (len(res) / max(1, args.seconds),
                                    OPEN_CONNS[1], soak.groups))
    kinds = sorted(set(r["kind"] for r in res))
    print("\n%-34s %6s %8s %7s %7s %4s %7s %7s" % (
        "kind", "n", "COMPLETE", "HONEST", "GAVE_UP", "BAD", "p50 s",
        "max s"))
    for k in kinds:
        rs = [r for r in res if r["kind"] == k]
        durs = [r["dur"] for r in rs if r.get("dur")]
        print("%-34s %6d %8d %7d %7d %4d %7.2f %7.2f" % (
            k, len(rs), *[sum(1 for r in rs if r["cat"] == c) for c in CATS],
            percentile(durs, 0.5), max(durs) if durs else 0))
    if args.tls:
        for tr in ("plain", "tls"):
            rs = [r for r in res if r.get("transport") == tr]
            print("transport %-5s: %d responses, %s" % (
                tr, len(rs), ", ".join("%s %d" % (c, sum(
                    1 for r in rs if r["cat"] == c)) for c in CATS)))
    forms = {}
    for r in res:
        if r["cat"] in (HONEST, GAVE_UP):
            forms[r["cat"] + ": " + r["why"]] = forms.get(
                r["cat"] + ": " + r["why"], 0) + 1
    print("\nhonest errors and give-ups, by form:")
    for k, v in sorted(forms.items(), key=lambda kv: -kv[1]):
        print("  %6d  %s" % (v, k))
    roles = {}
    for r in res:
        if r["kind"].startswith("coalesced") and r.get("role"):
            roles[r["role"]] = roles.get(r["role"], 0) + 1
    print("coalesced-group members by X-Infergw-Coalesce: %s" % (
        ", ".join("%s %d" % kv for kv in sorted(roles.items())) or "none"))
    n_ident = sum(1 for b, t in soak.texts.items()
                  if len(t) == 1 and soak.text_kinds[b].startswith(
                      "coalesced"))
    print("identical bodies giving identical text: %d groups checked, %d "
          "mismatches" % (n_ident + len(mism), len(mism)))
    if bad or mism:
        soak.keep_tmp = True
        bd = os.path.join(tmp, "bad")
        os.makedirs(bd, exist_ok=True)
        print("\nBAD responses (first 25; raw bytes in %s):" % bd)
        for i, r in enumerate(bad):
            with open(os.path.join(bd, "%04d-%s.raw" % (i, r["kind"])),
                      "wb") as f:
                f.write(r.get("raw") or b"")
            if i < 25:
                print("  %-30s %-5s req=%s  %s" % (
                    r["kind"], r.get("transport"), r.get("rid"), r["why"]))
        for k, t in mism[:10]:
            print("  %-30s different completion texts for one body: %r"
                  % (k, t))
    # --- resources
    try:
        with open(os.path.join(tmp, "samples.csv"), "w") as f:
            keys = ["rss", "threads", "fds", "client", "upstream", "unix",
                    "othersock", "nonsock", "conns_client_side"]
            f.write("t," + ",".join(keys) + "\n")
            for s in samples:
                f.write("%.1f," % (s["t"] - t_load)
                        + ",".join(str(s[k]) for k in keys) + "\n")
    except OSError:
        pass
    print("\nresources of the gateway (pid %d), sampled every 1 s (%d "
          "samples):" % (gw.pid, len(samples)))
    dur = args.seconds
    warm = t_load + 0.2 * dur
    steady = [s for s in samples if warm <= s["t"] <= t_load + dur]
    q1 = [s for s in steady if s["t"] < warm + 0.25 * (t_load + dur - warm)]
    h2 = [s for s in steady if s["t"] >= warm + 0.5 * (t_load + dur - warm)]
    at_warm = min(samples, key=lambda s: abs(s["t"] - warm)) if samples \
        else None

    def row(name, key, conv=lambda v: str(v)):
        vals = [s[key] for s in steady]
        if not vals:
            return
        print("  %-22s %10s %10s %10s %10s %10s %10s" % (
            name, conv(base[key]), conv(at_warm[key]) if at_warm else "-",
            conv(min(vals)), conv(int(statistics.median(vals))),
            conv(max(vals)), conv(final[key]) if final else "-"))
    print("  %-22s %10s %10s %10s %10s %10s %10s" % (
        "", "baseline", "@warm-up", "min", "median", "max", "end"))
    row("RSS", "rss", fmt_kb)
    row("threads", "threads")
    row("descriptors", "fds")
    row("  client sockets", "client")
    row("  upstream sockets", "upstream")
    row("  unix sockets", "unix")
    row("  other sockets", "othersock")
    row("  non-socket fds", "nonsock")
    if steady and len(steady) > 5:
        xs = [s["t"] - t_load for s in steady]
        ys = [s["rss"] for s in steady]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        den = sum((x - mx) ** 2 for x in xs) or 1
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den
        print("  RSS trend over the steady part: %+.1f KiB/min" % (
            slope * 60))
    ups = {}
    for s in samples:
        for k, v in s["up_states"].items():
            ups[k] = max(ups.get(k, 0), v)
    print("  upstream socket states, max seen: %s; at the end: %s" % (
        ups, final["up_states"] if final else "-"))
    verdicts = []
    if q1 and h2:
        q1max = max(s["rss"] for s in q1)
        h2max = max(s["rss"] for s in h2)
        peak = OPEN_CONNS[1]
        thr_max = max(s["threads"] for s in steady)
        fd_max = max(s["fds"] for s in steady)
        thr_bound = base["threads"] + peak + 16
        fd_bound = base["fds"] + 3 * peak + 32
        flat = (h2max <= 1.2 * q1max and thr_max <= thr_bound
                and fd_max <= fd_bound)
        name = "flat after warm-up"
        if dur < 120:
            name += " (not judged: runs under 120 s are too short)"
            flat = True
        verdicts.append((name, flat,
                         "RSS max 2nd half %s <= 1.2 x %s (1st steady "
                         "quarter) = %s: %s; threads max %d <= %d "
                         "(baseline + peak clients %d + 16): %s; fds max %d "
                         "<= %d (baseline + 3 x %d + 32): %s" % (
                             fmt_kb(h2max), fmt_kb(q1max),
                             fmt_kb(1.2 * q1max), h2max <= 1.2 * q1max,
                             thr_max, thr_bound, peak, thr_max <= thr_bound,
                             fd_max, fd_bound, peak, fd_max <= fd_bound)))
    else:
        verdicts.append(("flat after warm-up", False, "too few samples"))
    if final:
        # What may stay: idle upstream sessions (upstream.c keeps up to
        # max_connections of them), each a libcurl multi handle with its
        # wake-up socketpair (2 unix sockets) and up to 4 kept-alive
        # upstream connections.  They are bounded by the peak number of
        # calls at once, not by time: judged against the steady maximum.
        sessions = final["unix"] // 2
        base_sessions = base["unix"] // 2
        unix_max = max([s["unix"] for s in steady] or [0])
        explained = (base["fds"] + (final["unix"] - base["unix"])
                     + (final["upstream"] - base["upstream"]))
        back = (final["threads"] == base["threads"] and final["client"] == 0
                and final["nonsock"] == base["nonsock"]
                and final["listen"] == base["listen"]
                and final["othersock"] <= base["othersock"]
                and final["unix"] <= unix_max
                and final["upstream"] <= 4 * max(1, sessions)
                and final["fds"] == explained)
        verdicts.append(("back to baseline", back,
                         "after %.1f s: threads %d (baseline %d); client "
                         "sockets %d; non-socket fds %d (baseline %d); fds "
                         "%d = baseline %d + %d idle upstream sessions' "
                         "socketpairs (%d -> %d sessions, steady max %d) + "
                         "%d more kept-alive upstream connections (%d, "
                         "baseline %d); RSS %s (baseline %s, +%s: not "
                         "judged, glibc keeps freed memory)" % (
                             settle_s, final["threads"], base["threads"],
                             final["client"], final["nonsock"],
                             base["nonsock"], final["fds"], base["fds"],
                             final["unix"] - base["unix"], base_sessions,
                             sessions, unix_max // 2,
                             final["upstream"] - base["upstream"],
                             final["upstream"], base["upstream"],
                             fmt_kb(final["rss"]), fmt_kb(base["rss"]),
                             fmt_kb(final["rss"] - base["rss"]))))
    else:
        verdicts.append(("back to baseline", False, "no final sample"))
    no_bad = not bad and not mism
    verdicts.append(("no BAD response", no_bad, "%d BAD, %d text mismatches"
                     % (len(bad), len(mism))))
    verdicts.append(("gateway alive at the end", gw_alive,
                     "exit status %r" % (gw.p.poll(),)))
    if gw_alive:
        verdicts.append(("gateway still serves after the soak",
                         bool(still_serves), ""))
    if stragglers:
        verdicts.append(("clients all finished", False,
                         "%d worker threads still running" % stragglers))
    # --- gateway's view
    if metrics:
        print("\ngateway /metrics at the end:")
        for name in ("infergw_connections_total", "infergw_connections_active",
                     "infergw_flights_active", "infergw_coalesce_parked",
                     "infergw_coalesce_leaders_total",
                     "infergw_coalesce_followers_total",
                     "infergw_upstream_retries_total",
                     "infergw_upstream_hedges_total",
                     "infergw_upstream_retry_budget_exhausted_total",
                     "infergw_upstream_unavailable_total",
                     "infergw_upstream_ejections_total"):
            v = metric_sum(metrics, name)
            print("  %-48s %s" % (name, "-" if v is None else "%g" % v))
        print("  %-48s %s" % ("infergw_upstream_failures_total by kind",
                              metric_by_label(
                                  metrics, "infergw_upstream_failures_total",
                                  "kind")))
        print("  %-48s %s" % ("infergw_coalesce_bypass_total by reason",
                              metric_by_label(
                                  metrics, "infergw_coalesce_bypass_total",
                                  "reason")))
        for name in ("infergw_connections_active", "infergw_flights_active",
                     "infergw_coalesce_parked", "infergw_upstream_open_calls",
                     "infergw_upstream_queued"):
            v = metric_sum(metrics, name) or 0
            b = metric_sum(getattr(soak, "base_metrics", ""), name) or 0
            verdicts.append(("%s back to baseline" % name, v == b,
                             "%g (baseline %g; the scrape itself counts as "
                             "one connection)" % (v, b)))
    print("\ngateway warn/error log lines (%d kinds):" % len(counts))
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:20]:
        print("  %6d  %s" % (v, k))
    print("\nchaos (%d actions):" % len(chaos.log))
    for t, msg in chaos.log:
        if "SIG" in msg or "restart" in msg or "FAILED" in msg or \
                "dead" in msg:
            print("  t=%5.1fs %s" % (t, msg))
    kinds_c = {}
    for t, msg in chaos.log:
        k = msg.split(" ", 1)[1].split(" ")[0]
        if "=" in k and not k.endswith("=0") and not k.endswith("none"):
            kinds_c[k] = kinds_c.get(k, 0) + 1
    print("  /control actions: %s" % kinds_c)
    print("\nverdicts:")
    ok = True
    for name, good, detail in verdicts:
        ok = ok and good
        print("  %-4s %s%s" % ("PASS" if good else "FAIL", name,
                               (": " + detail) if detail else ""))
    print("logs: %s%s" % (tmp, "" if (args.keep or getattr(
        soak, "keep_tmp", False)) else " (removed; --keep keeps it)"))
    if not ok:
        soak.keep_tmp = True
    return 0 if ok else 1
