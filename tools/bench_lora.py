#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/bench_lora.py - workload (e) of tools/bench_sched.py (issue 29):
LoRA adapters on a fleet whose servers hold fewer adapters than are used.

    python3 tools/bench_sched.py --workload e [--quick] [--reps N]
        [--seed 1] [--out FILE]

What it measures.  SERVERS (4) engine-mode mocks, each `--max-loras 4`
serving the same ADAPTERS (16) adapters of the base model, an adapter
not in a slot costing LOAD_MS to load (the whole batch waits, as on
vLLM: docs/MOCK_UPSTREAM.md "LoRA adapters").  Open-loop streamed chat
completions through one gateway at 70% of the fleet's capacity (the
capacity of bench_sched.py's model, which counts no adapter load), each
naming an adapter drawn with Zipf popularity (s = 1: the first takes
30% of the requests, the last 2%), the same seeded arrivals for every
mode.  The modes are gateways that differ only in [routing]:

  round_robin           balance = round_robin
  least_load (no LoRA)  balance = least_load, lora_aware = off: the
                        engines' load alone (the baseline of the targets)
  least_load            balance = least_load, lora_aware = on (the
                        default): the adapter-aware rule of
                        docs/UPSTREAMS.md "LoRA adapters"

Per run: adapter loads per 1,000 requests, counted by the mocks
themselves (GET /stats lora_loads, the ground truth) and by the gateway
(infergw_upstream_lora_loads_total); TTFT p50 and p99 from the scheduled
arrival to the first content event; e2e p99; errors (as bench_sched.py
counts them); calls per upstream.  With --reps N every number is the
median of N runs, the modes interleaved.  Targets (issue 29): least_load
makes at least 5x fewer adapter loads than least_load (no LoRA), at a
TTFT p99 at most 0.7x of it; checked and printed, met or not.
"""

import os
import random
import statistics
import time

import gwtest

SERVERS = 4
ADAPTERS = 16
MAX_LORAS = 4
LOAD_MS = 200
ZIPF_S = 1.0
LOAD = 0.7
TOKENS = 50
MODES = (
    ("round_robin", {"balance": "round_robin"}),
    ("least_load (no LoRA)", {"balance": "least_load",
                              "lora_aware": "off"}),
    ("least_load", {"balance": "least_load", "lora_aware": "on"}),
)
BASELINE = "least_load (no LoRA)"
RULE = "least_load"


def adapter_names():
    return ["lora-%02d" % i for i in range(ADAPTERS)]


def zipf_weights():
    w = [1.0 / (k + 1) ** ZIPF_S for k in range(ADAPTERS)]
    return [x / sum(w) for x in w]


def workload(quick, short_prompt):
    """bench_sched.py's table entry: (window s, [class])."""
    return (6 if quick else 40, [
        dict(name="gw", to="gw", load=LOAD, mix=[(1.0, TOKENS)],
             prompt=short_prompt)])


def schedule(bs, window, cls, seed):
    """Poisson arrivals at cls's rate, each for an adapter by Zipf."""
    rng = random.Random("%d-e-%s" % (seed, cls["name"]))
    names, weights = adapter_names(), zipf_weights()
    rate = bs.rate_for(cls["load"], SERVERS, cls["mix"])
    cls["rate"] = rate
    out, t, i = [], rng.expovariate(rate), 0
    while t < window:
        a = bs.Arrival()
        a.t, a.cls, a.port_ix, a.tokens = t, cls, None, TOKENS
        model = rng.choices(names, weights)[0]
        a.data = gwtest.jbody(model=model,
                              messages=cls["prompt"](rng, model, i),
                              stream=True, max_tokens=TOKENS, temperature=1)
        out.append(a)
        t += rng.expovariate(rate)
        i += 1
    return out


def mock_loads(mocks):
    return [m.stats()["lora_loads"] for m in mocks]


def run_once(bs, args, window, cls, mode, routing, tmp):
    spec = ",".join("%s=%s" % kv for kv in sorted(bs.ENGINE.items()))
    tag = mode.replace(" ", "-").replace("(", "").replace(")", "")
    mocks, g = [], None
    try:
        for ix in range(SERVERS):
            mocks.append(gwtest.Mock(args.bin, [
                "-E", spec, "--max-loras", MAX_LORAS, "--lora",
                ",".join(adapter_names()), "--lora-load-ms", LOAD_MS],
                os.path.join(tmp, "e-%s-s%d.log" % (tag, ix))))
        conf = {"server": {"access_log": "off"},
                "routing": {"queue_timeout": "120s",
                            "first_byte_timeout": "120s"}}
        conf["routing"].update(routing)
        conf["routing"].update(args.routing)
        for ix, m in enumerate(mocks):
            conf["upstream s%d" % ix] = {"url": "http://127.0.0.1:%d"
                                         % m.port}
        g = gwtest.Gateway(args.bin, tmp, None, conf,
                           admin_key=gwtest.ADMIN_KEY, name="gw-e-%s" % tag)
        gwtest.wait_for(lambda: all(gwtest.has_metric(
            g.metrics(), "infergw_upstream_lora_max", upstream="s%d" % ix)
            for ix in range(SERVERS)), 10,
            msg="the gateway reads every engine's adapters")
        gwtest.wait_for(lambda: b"lora-15" in g.get("/v1/models").body, 10,
                        msg="the gateway knows the adapters")
        arrivals = schedule(bs, window, cls, args.seed)
        loads0 = mock_loads(mocks)
        loop = bs.Loop(g.port, [m.port for m in mocks])
        took = loop.run(arrivals, window)
        loads1 = mock_loads(mocks)
        gm = g.metrics()
        calls = [gwtest.metric(gm, "infergw_upstream_calls_total",
                               upstream="s%d" % ix) for ix in range(SERVERS)]
        gw_loads = sum(gwtest.metric(gm, "infergw_upstream_lora_loads_total",
                                     upstream="s%d" % ix)
                       for ix in range(SERVERS))
    finally:
        if g is not None:
            g.close()
        for m in mocks:
            m.close()
    done = loop.results
    ok = [s for s in done if s.err is None]
    ttft = [s.t_first - s.t_sched for s in ok if s.t_first]
    n = len(arrivals)
    errs = {}
    for s in done:
        if s.err is not None:
            errs[s.err] = errs.get(s.err, 0) + 1
    return {"mode": mode, "took_s": took, "requests": n,
            "errors": n - len(ok), "error_kinds": errs,
            "loads": sum(loads1) - sum(loads0),
            "loads_per_1000": 1000.0 * (sum(loads1) - sum(loads0)) / n,
            "gw_loads_per_1000": 1000.0 * gw_loads / n,
            "ttft_p50": bs.pct(ttft, 50), "ttft_p99": bs.pct(ttft, 99),
            "e2e_p99": bs.pct([s.t_end - s.t_sched for s in ok], 99),
            "calls_per_upstream": calls,
            "lag_p99_ms": (bs.pct(loop.lags, 99) * 1000.0
                           if loop.lags else None)}


def med(runs, key):
    vals = [r[key] for r in runs if r[key] is not None]
    return statistics.median(vals) if vals else None


def report(bs, results, window, cls, reps):
    """The markdown section and the targets: (text, [(what, met, how)])."""
    base = results.get(BASELINE)
    b_loads = med(base, "loads_per_1000") if base else None
    b_p99 = med(base, "ttft_p99") if base else None
    lines = ["Each mock: -E %s --max-loras %d --lora lora-00..lora-%02d "
             "--lora-load-ms %d; %d servers, %d adapters by Zipf (s = %g), "
             "%d-token outputs at %.0f%% load: %.2f requests/s for %g s."
             % (",".join("%s=%s" % kv for kv in sorted(bs.ENGINE.items())),
                MAX_LORAS, ADAPTERS - 1, LOAD_MS, SERVERS, ADAPTERS, ZIPF_S,
                TOKENS, 100 * LOAD, cls["rate"], window), "",
             "| mode | requests | adapter loads / 1,000 requests (mocks; "
             "gateway's count) | TTFT p50 / p99 ms | e2e p99 ms | errors | "
             "calls per upstream | loads vs no LoRA | TTFT p99 vs no LoRA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, _ in MODES:
        runs = results.get(mode)
        if not runs:
            continue
        loads, p99 = med(runs, "loads_per_1000"), med(runs, "ttft_p99")
        calls = [statistics.median(r["calls_per_upstream"][i] for r in runs)
                 for i in range(SERVERS)]
        lines.append("| %s | %s | %s (%s) | %s / %s | %s | %d | %s | %s | "
                     "%s |" % (
                         mode, bs.f(med(runs, "requests")),
                         bs.f(loads, "%.1f"),
                         bs.f(med(runs, "gw_loads_per_1000"), "%.1f"),
                         bs.ms(med(runs, "ttft_p50")), bs.ms(p99),
                         bs.ms(med(runs, "e2e_p99")),
                         sum(r["errors"] for r in runs),
                         " / ".join("%.0f" % c for c in calls),
                         "%.2fx" % (loads / b_loads) if b_loads else "-",
                         "%.2fx" % (p99 / b_p99) if p99 and b_p99 else "-"))
    kinds = {}
    for mode, runs in results.items():
        for r in runs:
            for k, v in r["error_kinds"].items():
                kinds["%s: %s" % (mode, k)] = kinds.get("%s: %s" % (mode, k),
                                                        0) + v
    lines.append("")
    lines.append("- %d run(s) per mode (medians); the client's lag behind "
                 "the schedule p99 %s ms at most" % (
                     reps, bs.f(max((r["lag_p99_ms"] or 0) for rs in
                                    results.values() for r in rs), "%.1f")))
    if kinds:
        lines.append("- errors: " + "; ".join(
            "%s (%d)" % kv for kv in sorted(kinds.items())))
    targets = []
    rule = results.get(RULE)
    if rule and base:
        loads, p99 = med(rule, "loads_per_1000"), med(rule, "ttft_p99")
        targets.append(("(e) least_load: at least 5x fewer adapter loads "
                        "than least_load without LoRA awareness",
                        loads * 5 <= b_loads, "%.1f vs %.1f per 1,000: %s"
                        % (loads, b_loads, "%.1fx fewer" % (b_loads / loads)
                           if loads else "none")))
        targets.append(("(e) least_load: TTFT p99 at most 0.7x least_load's "
                        "without LoRA awareness", p99 <= 0.7 * b_p99,
                        "%.0f ms vs %.0f ms: %.2fx" % (
                            p99 * 1000, b_p99 * 1000, p99 / b_p99)))
    return "\n".join(lines), targets


def run(bs, args, quick, tmp):
    """Every mode, args.reps times interleaved; (text, targets, results)."""
    window, classes = workload(quick, bs.short_prompt)
    cls = classes[0]
    results = {}
    for rep in range(args.reps):
        for mode, routing in MODES:
            r = run_once(bs, args, window, cls, mode, routing, tmp)
            results.setdefault(mode, []).append(r)
            print("bench_sched: rep %d e %-22s loads/1000 %.1f ttft_p99 %s "
                  "errors %d" % (rep + 1, mode, r["loads_per_1000"],
                                 bs.ms(r["ttft_p99"]), r["errors"]),
                  file=bs.sys.stderr, flush=True)
            gwtest.Ctx.cleanup()
            time.sleep(0.5)
    text, targets = report(bs, results, window, cls, args.reps)
    return text, targets, results
