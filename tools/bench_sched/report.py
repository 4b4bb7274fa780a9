# SPDX-License-Identifier: MIT
"""The report of tools/bench_sched.py (its docstring is the
documentation): the tables of a workload's runs, the notes under them,
and the targets of issues 18 and 29, checked from the medians."""

import math
import os
import statistics

MODES = ("round_robin", "least_inflight", "prefix", "least_load")
BASELINE = "least_inflight"     # what every ratio compares with


def median_of(runs, path):
    """The median over runs of the number at 'path' (keys), None-safe."""
    vals = []
    for r in runs:
        v = r
        for k in path:
            v = v[k] if v is not None else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def f(v, fmt="%.0f"):
    return "-" if v is None else fmt % v


def ms(v):
    """Seconds as ms; a miss (inf: an error or unfinished) as "miss"."""
    if v is not None and math.isinf(v):
        return "miss"
    return f(None if v is None else v * 1000.0)


def ms_or_miss(v):
    m = ms(v)
    return m if m in ("miss", "-") else m + " ms"


def ratio(v, base):
    if v is None or not base or math.isinf(v) or math.isinf(base):
        return "-"
    return "%.2f" % (v / base)


def error_text(runs, cls):
    """A class's errors in the window, summed over the runs, by kind."""
    kinds = {}
    for r in runs:
        for k, n in r["classes"][cls]["errors_by_kind"].items():
            kinds[k] = kinds.get(k, 0) + n
    total = sum(kinds.values())
    if not total:
        return "0"
    return "%d (%s)" % (total, ", ".join("%s: %d" % kv
                                         for kv in sorted(kinds.items())))


def table(wname, by_mode, cls_names):
    """Markdown tables of one workload: a row per mode and class (sent,
    completed and the percentiles are medians over the runs, errors the
    sum; the percentiles count every error and unfinished request as a
    miss), then a row per mode for the fleet."""
    lines = ["| mode | class | sent | completed | errors (all runs) | TTFT "
             "p50 / p90 / p99 ms | TTFT p99 of completed ms | e2e p99 ms | "
             "output tokens/s | tokens/s vs least_inflight | TTFT p99 vs "
             "least_inflight |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = by_mode.get(BASELINE)
    for mode in MODES:
        runs = by_mode.get(mode)
        if not runs:
            continue
        for c in cls_names:
            m = (lambda *p: median_of(runs, ("classes", c) + p))
            b = (lambda *p: median_of(base, ("classes", c) + p)
                 if base else None)
            lines.append("| %s | %s | %s | %s | %s | %s / %s / %s | %s | %s "
                         "| %s | %s | %s |" % (
                             mode, c, f(m("sent")), f(m("completed")),
                             error_text(runs, c), ms(m("ttft_p50")),
                             ms(m("ttft_p90")), ms(m("ttft_p99")),
                             ms(m("ttft_p99_completed")), ms(m("e2e_p99")),
                             f(m("tokens_per_s")),
                             ratio(m("tokens_per_s"), b("tokens_per_s")),
                             ratio(m("ttft_p99"), b("ttft_p99"))))
    lines += ["", "| mode | prefix hits | max vLLM queue | max gateway "
              "queue | calls per upstream |", "|---|---|---|---|---|"]
    for mode in MODES:
        runs = by_mode.get(mode)
        if not runs:
            continue
        hit = median_of(runs, ("prefix_hit_rate",))
        calls = [statistics.median(r["calls_per_upstream"][i] for r in runs)
                 for i in range(len(runs[0]["calls_per_upstream"]))]
        lines.append("| %s | %s | %s | %s | %s |" % (
            mode, "-" if hit is None else "%.1f %%" % (100 * hit),
            f(median_of(runs, ("max_vllm_waiting",))),
            f(median_of(runs, ("max_gateway_queued",))),
            " / ".join("%.0f" % n for n in calls)))
    return "\n".join(lines)


def notes(wname, by_mode, window, classes, reps):
    out = []
    for c in classes:
        n = c["name"]
        any_run = next(iter(by_mode.values()))[0]["classes"][n]
        out.append("- %s: target %.2f req/s (load %.2f, mean %g tokens), "
                   "%.2f in the seeded schedule; sent in the window, per "
                   "mode: %s" % (
                       n, c["rate"], c["load"], any_run["mean_tokens"],
                       any_run["scheduled_rate"],
                       ", ".join("%s %.2f" % (mo, median_of(
                           rs, ("classes", n, "achieved_rate")))
                           for mo, rs in by_mode.items())))
    if wname in ("c", "c0"):
        for n in ("a", "b"):
            out.append("- tenant %s: output tokens/s %s; gateway queue: "
                       "waits, mean wait s: %s" % (n, ", ".join(
                           "%s %s" % (mo, f(median_of(
                               rs, ("classes", n, "tokens_per_s"))))
                           for mo, rs in by_mode.items()), ", ".join(
                           "%s %s, %s" % (mo, f(median_of(
                               rs, ("classes", n, "gateway_queue_waits"))),
                               f(median_of([{"v": r["classes"][n][
                                   "gateway_queue_wait_s"] / max(1, r[
                                       "classes"][n]["gateway_queue_waits"])}
                                   for r in rs], ("v",)), "%.2f"))
                           for mo, rs in by_mode.items())))
    if wname == "a":
        out.append("- the direct streams' TTFT p99 ms (s0, s1): %s" % (
            ", ".join("%s %s" % (mo, ms(median_of(
                rs, ("classes", "direct", "ttft_p99"))))
                for mo, rs in by_mode.items())))
    allruns = [r for rs in by_mode.values() for r in rs]
    out.append("- client: lag behind the schedule p99 %s ms, max %s ms; "
               "client CPU %s %% of one core (median, max %s %%); gateway "
               "CPU %s s, mocks %s s per run; machine busy %s %% of %d CPUs, "
               "others' share %s %% (medians); %d run(s) per mode, window "
               "%g s" % (
                   f(max(r["lag_p99_ms"] or 0 for r in allruns), "%.1f"),
                   f(max(r["lag_max_ms"] or 0 for r in allruns), "%.1f"),
                   f(median_of(allruns, ("client_cpu_pct",))),
                   f(max(r["client_cpu_pct"] for r in allruns)),
                   f(median_of(allruns, ("gateway_cpu_s",)), "%.1f"),
                   f(median_of(allruns, ("mocks_cpu_s",)), "%.1f"),
                   f(median_of(allruns, ("machine_busy_pct",))),
                   os.cpu_count(),
                   f(median_of(allruns, ("others_busy_pct",))),
                   reps, window))
    for field, what in (("error_kinds", "in the window"),
                        ("errors_before_window",
                         "before the window (not measured)")):
        kinds = {}
        for r in allruns:
            for cn, cr in r["classes"].items():
                for k, v in cr[field].items():
                    key = "%s %s: %s" % (r["mode"], cn, k)
                    kinds[key] = kinds.get(key, 0) + v
        if kinds:
            out.append("- errors %s: %s" % (what, "; ".join(
                "%s (%d)" % kv for kv in sorted(kinds.items()))))
    return "\n".join(out)


def flood_targets(wn, by_mode, med):
    """Issue 29's targets for (c) or (c0), over every run of
    least_load."""
    out = []
    ll_c = by_mode.get("least_load", [])
    if ll_c:
        # Not one, in the window or before it: the flood's start counts.
        a_err = sum(r["classes"]["a"]["errors"]
                    + sum(r["classes"]["a"]["errors_before_window"].values())
                    for r in ll_c)
        out.append(("(%s) tenant a gets no error with least_load, from 0 s"
                    % wn, a_err == 0, "%d of %d sent, %d run(s)" % (
                        a_err, sum(r["classes"]["a"]["requests"]
                                   for r in ll_c), len(ll_c))))
        a99 = med(wn, "least_load", "classes", "a", "ttft_p99")
        worst = max(r["classes"]["a"]["ttft_p99"] for r in ll_c)
        out.append(("(%s) tenant a TTFT p99 < 3 s with least_load, errors "
                    "and unfinished requests counted as misses" % wn,
                    a99 < 3, "%s, worst run %s" % (ms_or_miss(a99),
                                                   ms_or_miss(worst))))
        b_kinds = set(k for r in ll_c
                      for k in r["classes"]["b"]["errors_by_kind"])
        out.append(("(%s) tenant b's excess is shed with 503 and "
                    "Retry-After, nothing else" % wn, b_kinds <= {"503"},
                    ", ".join(sorted(b_kinds)) or "no errors"))
    bll = med(wn, "least_load", "classes", "b", "tokens_per_s")
    bli = med(wn, "least_inflight", "classes", "b", "tokens_per_s")
    if bll is not None and bli:
        out.append(("(%s) tenant b keeps >= 0.8x its least_inflight "
                    "tokens/s with least_load" % wn, bll >= 0.8 * bli,
                    "%.0f vs %.0f: %.2fx" % (bll, bli, bll / bli)))
    return out


def targets(results):
    """Issues 18's and 29's targets, from the medians: [(text, met or
    None, how)]."""
    def med(w, mode, *p):
        rs = results.get(w, {}).get(mode)
        return median_of(rs, p) if rs else None
    out = []
    ll, li = med("a", "least_load", "classes", "gw", "ttft_p99"), \
        med("a", "least_inflight", "classes", "gw", "ttft_p99")
    if ll is not None and li:
        out.append(("(a) least_load TTFT p99 <= 0.35x least_inflight's",
                    ll <= 0.35 * li, "%.0f ms vs %.0f ms: %.2fx" % (
                        ll * 1000, li * 1000, ll / li)))
    for wn in ("c", "c0"):
        out += flood_targets(wn, results.get(wn, {}), med)
    hit = med("d70", "prefix", "prefix_hit_rate")
    pp, rr = med("d70", "prefix", "classes", "gw", "ttft_p99"), \
        med("d70", "round_robin", "classes", "gw", "ttft_p99")
    if hit is not None:
        out.append(("(d) at 70%, prefix cache hits >= 90% with prefix",
                    hit >= 0.9, "%.1f %%" % (100 * hit)))
    if pp is not None and rr:
        out.append(("(d) at 70%, prefix TTFT p99 <= 1.5x round_robin's",
                    pp <= 1.5 * rr, "%.0f ms vs %.0f ms: %.2fx" % (
                        pp * 1000, rr * 1000, pp / rr)))
    # b's 503s in (c) are the shedding its targets ask for.
    errs = sum(cr["errors"] for wn, w in results.items()
               for rs in w.values() for r in rs
               for cn, cr in r["classes"].items()
               if not (wn.startswith("c") and cn == "b"))
    out.append(("no request errors (but tenant b's in c)", errs == 0,
                "%d errors" % errs))
    return out


def finite(v):
    """'v' for --out's strict JSON: a miss (inf) as the string "miss"."""
    if isinstance(v, float) and math.isinf(v):
        return "miss"
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v
