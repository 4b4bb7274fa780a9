#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_coalesce.sh - request coalescing under load (issue 3).
#
# Every scenario starts a fresh mock upstream with the tutorial's demo
# timing (-n 16 -f 100 -d 45: about 800 ms per streamed response) and a
# fresh gateway on port 0, drives it with tools/loadgen, reads the mock's
# /stats (upstream calls) and the gateway's /proc/PID/{status,stat}
# (peak RSS, CPU time), then stops both.
#
#   a. stretch (the tutorial's "Stretch" test): LOOP_C clients loop the
#      identical streaming request for LOOP_S seconds, each sending the
#      next request as soon as its previous response ended; once with
#      coalescing on and once with a gateway configured
#      "[coalesce] enabled = off".  Target: upstream calls <= ideal + 1,
#      ideal = LOOP_S / (one request's response time, measured first).
#   b. fan-out FAN_N: FAN_N connections opened first, then the identical
#      streaming request written on all of them at once.  Targets: one
#      upstream call, byte-identical bodies, follower TTFB p99 within
#      10 ms of the leader's TTFB (as loadgen's read() returned them; the
#      same gap by the kernel's arrival timestamps is reported beside it).
#      Also the gateway's peak RSS.  Run once per [coalesce]
#      leader_writes value in FAN_WRITES, interleaved (on: the upstream
#      thread and its helpers write each chunk to parked followers; off:
#      every follower's own thread does), to show the difference;
#      and, with FAN_FLOOR=1, once against tools/fanout_floor, a server
#      that does nothing but write the first bytes to all clients at
#      once from one thread per CPU: the gap this machine allows.
#   c. fan-out BIG_N (10,000): no errors; RSS per attached client =
#      (VmHWM - VmRSS after a warm-up request) / BIG_N.
#
# The gateway runs with the shipped logging defaults (log_level info,
# access log on) into a file, max_connections 12000, thread_stack_size
# 128k and [coalesce] max_followers 20000; see gw_conf() below.
#
# The load generator runs on the same cores as the gateway, and the
# machine may be shared: each run also records the CPU time the gateway,
# the mock and loadgen used and how busy the whole machine was
# (/proc/stat), so that a noisy number can be told from a slow gateway.
#
# Usage: sh tools/bench_coalesce.sh
# Environment:
#   BUILD=build/default  build directory (make BUILD=... is run first)
#   LOOP_S=10 LOOP_C=50 LOOP_REPS=3     stretch test
#   FAN_N=1000 FAN_REPS=3               fan-out
#   FAN_WRITES="on off"                 leader_writes values for fan-out
#   FAN_FLOOR=1                         also fan out against fanout_floor
#   BIG_N=10000 BIG_REPS=3              big fan-out
#   BIG_WRITES=on                       leader_writes values for big fan-out
#   SKIP="a b c"         scenarios to skip, e.g. SKIP=c
#   HOGS=0               busy loops run beside each measured run for its
#                        first 15 s: the gateway on CPUs it must share
#                        (their CPU shows as "others")
#   LOG_LEVEL=info       gateway log level
#   QUIET_PCT=30 QUIET_MAX=60   before each run, wait up to QUIET_MAX s
#                        for the machine to be under QUIET_PCT % busy
#   OUT=FILE             also write the markdown tables to FILE
#   KEEP=1               keep the temp dir (configs, logs, raw JSON)
# Defaults take about 5 minutes on a quiet machine.
set -eu

cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/default}
BIN=$BUILD/bin
LOOP_S=${LOOP_S:-10}
LOOP_C=${LOOP_C:-50}
LOOP_REPS=${LOOP_REPS:-3}
FAN_N=${FAN_N:-1000}
FAN_REPS=${FAN_REPS:-3}
BIG_N=${BIG_N:-10000}
BIG_REPS=${BIG_REPS:-3}
FAN_WRITES=${FAN_WRITES:-on off}
FAN_FLOOR=${FAN_FLOOR:-1}
BIG_WRITES=${BIG_WRITES:-on}
SKIP=${SKIP:-}
HOGS=${HOGS:-0}
LOG_LEVEL=${LOG_LEVEL:-info}
QUIET_PCT=${QUIET_PCT:-30}
QUIET_MAX=${QUIET_MAX:-60}
OUT=${OUT:-}
KEEP=${KEEP:-}
# The tutorial's request: no temperature field, so it coalesces under the
# shipped omitted_temperature = 0.
BODY='{"model":"llama-3-8b","messages":[{"role":"user","content":"identical"}],"stream":true}'
PATH_V1=/v1/chat/completions

die() { echo "bench_coalesce: $*" >&2; exit 1; }
note() { echo "bench_coalesce: $*" >&2; }

# ---- build and limits -------------------------------------------------

sh tools/install-deps.sh curl
# Name the three programs: plain 'make' would also copy ./infergw.
make --no-print-directory BUILD="$BUILD" -j2 \
    "$BIN/infergw" "$BIN/mock_upstream" "$BIN/loadgen" "$BIN/fanout_floor" >&2
for t in curl python3 ss timeout; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found"
done

# Each client is a descriptor in loadgen and one in the gateway (plus the
# gateway's upstream handles); both inherit this shell's limit.  dash
# and bash both take ulimit -H and -S.
need=$((BIG_N + 2000))
# shellcheck disable=SC3045
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$need" ]; then
    ulimit -Hn "$need" 2>/dev/null \
        || die "ulimit -Hn is $(ulimit -Hn), $need needed (run as root)"
fi
# shellcheck disable=SC3045
ulimit -Sn "$(ulimit -Hn)"
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)
threads_max=$(cat /proc/sys/kernel/threads-max)
pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$pid_max" -gt $((BIG_N + 2000)) ] \
    || note "pid_max $pid_max is tight for $BIG_N gateway threads"

# stop PID: SIGTERM, then SIGKILL after 5 s; only our own children.
stop() {
    kill "$1" 2>/dev/null || return 0
    i=0
    # kill -0 succeeds on a zombie: look at the state instead.
    while [ $i -lt 100 ]; do
        st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null || true)
        case $st in "" | Z) break ;; esac
        sleep 0.05
        i=$((i + 1))
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

TMP=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do
        stop "$p"
    done
    if [ -z "$KEEP" ]; then rm -rf "$TMP"; else note "kept $TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
RESULTS=$TMP/results.jsonl
: >"$RESULTS"

# ---- processes --------------------------------------------------------

# port_from FILE NAME: the port in the "NAME listening port=N" line a
# server started in the background prints to FILE (5 s at most; empty if
# none).  The background job opens FILE itself: it may not exist yet.
port_from() {
    pf_port=""
    pf_i=0
    while [ -z "$pf_port" ] && [ $pf_i -lt 100 ]; do
        pf_port=$(sed -n "s/^$2 listening port=//p" "$1" 2>/dev/null || true)
        [ -n "$pf_port" ] || sleep 0.05
        pf_i=$((pf_i + 1))
    done
    echo "$pf_port"
}

# start_mock DIR: sets MOCK_PID and MOCK_PORT.
start_mock() {
    "$BIN/mock_upstream" -l 127.0.0.1:0 -n 16 -f 100 -d 45 -q \
        >"$1/mock.out" 2>"$1/mock.err" &
    MOCK_PID=$!
    PIDS="$PIDS $MOCK_PID"
    MOCK_PORT=$(port_from "$1/mock.out" mock_upstream)
    [ -n "$MOCK_PORT" ] || die "mock did not start: $(cat "$1/mock.err")"
}

# gw_conf COALESCE(on|off) [LEADER_WRITES(on|off)]: the gateway's config
# on stdout.
gw_conf() {
    cat <<EOF
[server]
listen = 127.0.0.1:0
max_connections = 12000
thread_stack_size = 128k
log_level = $LOG_LEVEL
drain_timeout = 2s
[upstream]
url = http://127.0.0.1:$MOCK_PORT
[coalesce]
enabled = $1
max_followers = 20000
leader_writes = ${2:-on}
EOF
}

# start_gw DIR on|off [LEADER_WRITES]: sets GW_PID and GW_PORT.
start_gw() {
    gw_conf "$2" "${3:-on}" >"$1/gateway.conf"
    "$BIN/infergw" -c "$1/gateway.conf" 2>"$1/gateway.log" &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    GW_PORT=""
    i=0
    while [ -z "$GW_PORT" ] && [ $i -lt 100 ]; do
        kill -0 "$GW_PID" 2>/dev/null \
            || die "infergw exited: $(cat "$1/gateway.log")"
        # The log line at info; the kernel's socket table otherwise.
        GW_PORT=$(sed -n 's/.*server: listening .* port=\([0-9]*\).*/\1/p' \
            "$1/gateway.log" 2>/dev/null | head -n 1)
        [ -n "$GW_PORT" ] || GW_PORT=$(ss -Hltnp 2>/dev/null \
            | awk -v p="pid=$GW_PID," \
                'index($0, p) { n = split($4, a, ":"); print a[n]; exit }')
        [ -n "$GW_PORT" ] || sleep 0.05
        i=$((i + 1))
    done
    [ -n "$GW_PORT" ] || die "cannot find infergw's port"
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' \
        "http://127.0.0.1:$GW_PORT/readyz")" = 200 ]; do
        i=$((i + 1))
        [ $i -lt 100 ] || die "infergw not ready: $(cat "$1/gateway.log")"
        sleep 0.05
    done
}

stop_all() {
    stop "$GW_PID"
    stop "$MOCK_PID"
    PIDS=""
}

# ---- measurements -----------------------------------------------------

upstream_calls() {
    curl -s "http://127.0.0.1:$MOCK_PORT/stats" \
        | python3 -c 'import json, sys
print(json.load(sys.stdin)["completions"])'
}

# proc_kb PID FIELD: a "FIELD: N kB" line of /proc/PID/status.
proc_kb() {
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

# cpu_ticks PID: utime + stime, threads that already ended included.
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# busy_ticks: every CPU's non-idle time, whoever used it.
busy_ticks() {
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# wait_quiet: other sessions may share the machine.  Wait, at most
# QUIET_MAX seconds, for a one-second window in which all CPUs together
# are less than QUIET_PCT % busy, so that a run starts on a quiet machine.
# A run that had to start anyway shows it in its "others' CPU" column.
wait_quiet() {
    i=0
    pct=100
    while [ $i -lt "$QUIET_MAX" ]; do
        q0=$(busy_ticks)
        sleep 1
        q1=$(busy_ticks)
        pct=$(( (q1 - q0) * 100 / (HZ * NCPU) ))
        [ "$pct" -lt "$QUIET_PCT" ] && return 0
        i=$((i + 1))
    done
    note "machine still ${pct}% busy after ${QUIET_MAX}s; measuring anyway"
}

# loadgen ARGS...: bounded in time whatever -t says.
loadgen() {
    timeout 600 "$BIN/loadgen" "$@"
}

# run_case DIR SCENARIO REP LOADGEN-ARGS...: one measured loadgen run
# against the gateway started in DIR; appends a JSON line to RESULTS.
run_case() {
    d=$1 scen=$2 r_rep=$3
    shift 3
    url=http://127.0.0.1:$GW_PORT$PATH_V1
    # A warm-up request: the upstream connection, the first curl handle
    # and the allocator's arenas exist before the baseline is read, and
    # its completion time is the single-client response time.
    loadgen -c 1 -u "$url" -d "$BODY" >"$d/warmup.json" \
        || die "warm-up request failed: $(cat "$d/warmup.json")"
    wait_quiet
    rss0=$(proc_kb "$GW_PID" VmRSS)
    up0=$(upstream_calls)
    gw0=$(cpu_ticks "$GW_PID")
    mk0=$(cpu_ticks "$MOCK_PID")
    busy0=$(busy_ticks)
    hogs=""
    h=0
    while [ $h -lt "$HOGS" ]; do
        timeout 15 sh -c 'while :; do :; done' &
        hogs="$hogs $!"
        h=$((h + 1))
    done
    t0=$(date +%s.%N)
    rc=0
    loadgen -u "$url" -d "$BODY" -o "$d/records.json" "$@" \
        >"$d/loadgen.json" 2>"$d/loadgen.err" || rc=$?
    t1=$(date +%s.%N)
    for h in $hogs; do
        kill "$h" 2>/dev/null || true
        wait "$h" 2>/dev/null || true
    done
    busy1=$(busy_ticks)
    gw1=$(cpu_ticks "$GW_PID")
    mk1=$(cpu_ticks "$MOCK_PID")
    # Responses are complete once loadgen ends; let the last upstream
    # call's accounting settle before reading /stats.
    sleep 0.2
    up1=$(upstream_calls)
    hwm=$(proc_kb "$GW_PID" VmHWM)
    # The gateway's own view: how many requests led, followed, bypassed.
    curl -s -m 10 "http://127.0.0.1:$GW_PORT/metrics" >"$d/metrics.txt" \
        || true
    [ -s "$d/loadgen.json" ] \
        || die "loadgen failed (rc $rc): $(cat "$d/loadgen.err")"
    python3 - "$d" "$scen" "$r_rep" "$rc" "$rss0" "$hwm" "$up0" "$up1" \
        "$gw0" "$gw1" "$mk0" "$mk1" "$busy0" "$busy1" "$t0" "$t1" \
        "$HZ" "$NCPU" "$(cut -d' ' -f1 /proc/loadavg)" \
        >>"$RESULTS" <<'EOF'
import json, sys
(d, scen, rep, rc, rss0, hwm, up0, up1, gw0, gw1, mk0, mk1, b0, b1, t0, t1,
 hz, ncpu, load) = sys.argv[1:]
lg = json.load(open(d + "/loadgen.json"))
gm = {}
for line in open(d + "/metrics.txt"):
    for k in ("leaders", "followers"):
        name = "infergw_coalesce_%s_total " % k
        if line.startswith(name):
            gm[k] = int(line.split()[1])
warm = json.load(open(d + "/warmup.json"))
hz = float(hz)
wall = float(t1) - float(t0)
gw_ms = (int(gw1) - int(gw0)) * 1000 / hz
mock_ms = (int(mk1) - int(mk0)) * 1000 / hz
busy_ms = (int(b1) - int(b0)) * 1000 / hz
other_ms = max(0.0, busy_ms - gw_ms - mock_ms - lg["cpu_ms"])
print(json.dumps({
    "scenario": scen, "rep": int(rep), "loadgen_rc": int(rc),
    "loadgen": lg, "response_ms": warm["complete_ms"]["all"]["p50"],
    "upstream_calls": int(up1) - int(up0), "gw_coalesce": gm,
    "rss_base_kb": int(rss0), "rss_hwm_kb": int(hwm),
    "gw_cpu_ms": gw_ms, "mock_cpu_ms": mock_ms,
    "other_cpu_pct": 100.0 * other_ms / (wall * 1000 * int(ncpu)),
    "loadavg": float(load), "wall_s": wall}))
EOF
    python3 - "$RESULTS" <<'EOF'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
lg = r["loadgen"]
t = lg["ttfb_ms"]
lead = t.get("leader", {}).get("p50", -1)
fol = t.get("follower", {}).get("p99", -1)
print("  %-9s #%d  ok %d/%d  upstream %d  distinct %d  leader ttfb %.1f  "
      "follower ttfb p99 %.1f  complete p50 %.0f ms  gw cpu %.0f ms  "
      "others %.0f%%" % (r["scenario"], r["rep"], lg["ok"], lg["requests"],
                         r["upstream_calls"], lg["distinct_bodies"], lead,
                         fol, lg["complete_ms"]["all"]["p50"],
                         r["gw_cpu_ms"], r["other_cpu_pct"]),
      file=sys.stderr)
EOF
}

skipped() {
    case " $SKIP " in *" $1 "*) return 0 ;; esac
    return 1
}

# ---- scenarios --------------------------------------------------------

ready_url() { echo "http://127.0.0.1:$GW_PORT/metrics"; }

# floor_case DIR REP N: one fan-out of N clients against fanout_floor
# (the mock's 100 ms first-token delay); appends a JSON line to RESULTS.
floor_case() {
    "$BIN/fanout_floor" -c "$3" -f 100 >"$1/floor.out" 2>"$1/floor.err" &
    fl_pid=$!
    fl_port=$(port_from "$1/floor.out" fanout_floor)
    [ -n "$fl_port" ] || die "fanout_floor did not start: $(cat "$1/floor.err")"
    wait_quiet
    rc=0
    loadgen -c "$3" -t 120 -u "http://127.0.0.1:$fl_port$PATH_V1" \
        -d "$BODY" >"$1/loadgen.json" 2>"$1/loadgen.err" || rc=$?
    wait "$fl_pid" 2>/dev/null || true
    [ -s "$1/loadgen.json" ] \
        || die "loadgen failed (rc $rc): $(cat "$1/loadgen.err")"
    python3 - "$1" "$2" >>"$RESULTS" <<'EOF'
import json, sys
d, rep = sys.argv[1:]
print(json.dumps({"scenario": "fanout-floor", "rep": int(rep),
                  "loadgen": json.load(open(d + "/loadgen.json"))}))
EOF
    python3 - "$RESULTS" <<'EOF'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
t = r["loadgen"]["ttfb_ms"]
print("  %-9s #%d  ok %d/%d  leader ttfb %.1f  follower ttfb p99 %.1f"
      % (r["scenario"], r["rep"], r["loadgen"]["ok"],
         r["loadgen"]["requests"], t["leader"]["p50"],
         t["follower"]["p99"]), file=sys.stderr)
EOF
}

# fanout_runs LETTER SCENARIO N REPS WRITES [FLOOR]: REPS rounds of one
# fan-out run of N clients per leader_writes value in WRITES (and, with
# FLOOR 1, one against fanout_floor), interleaved.
fanout_runs() {
    f_rep=1
    while [ $f_rep -le "$4" ]; do
        if [ "${6:-0}" = 1 ]; then
            d=$TMP/$1-floor-$f_rep
            mkdir -p "$d"
            floor_case "$d" "$f_rep" "$3"
        fi
        for lw in $5; do
            d=$TMP/$1-$lw-$f_rep
            mkdir -p "$d"
            start_mock "$d"
            start_gw "$d" on "$lw"
            run_case "$d" "$2-$lw" "$f_rep" -c "$3" -t 120 \
                --ready "$(ready_url)"
            stop_all
        done
        f_rep=$((f_rep + 1))
    done
}

if ! skipped a; then
    note "a. stretch: $LOOP_C clients x ${LOOP_S}s, coalescing on and off"
    rep=1
    while [ $rep -le "$LOOP_REPS" ]; do
        for mode in on off; do
            d=$TMP/a-$mode-$rep
            mkdir -p "$d"
            start_mock "$d"
            start_gw "$d" "$mode"
            run_case "$d" "loop-$mode" "$rep" -c "$LOOP_C" \
                --loop "$LOOP_S" -t 60
            stop_all
        done
        rep=$((rep + 1))
    done
fi

if ! skipped b; then
    note "b. fan-out: $FAN_N identical streaming clients"
    fanout_runs b fanout "$FAN_N" "$FAN_REPS" "$FAN_WRITES" "$FAN_FLOOR"
fi

if ! skipped c; then
    note "c. fan-out: $BIG_N identical streaming clients"
    fanout_runs c fanout-big "$BIG_N" "$BIG_REPS" "$BIG_WRITES"
fi

# ---- report -----------------------------------------------------------

python3 - "$RESULTS" "$LOOP_S" "$LOOP_C" "$FAN_N" "$BIG_N" "$(nproc)" \
    "$pid_max" "$threads_max" >"$TMP/report.md" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loop_s, loop_c, fan_n, big_n = (float(sys.argv[2]), int(sys.argv[3]),
                                 int(sys.argv[4]), int(sys.argv[5]))

NAN = float("nan")

def med(xs):
    # A run where no client finished has no latencies (NaN): the median
    # is over the runs that have the value.
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else NAN

def lat(dist, q):
    # loadgen writes -1 for a percentile of an empty set.
    return dist[q] if dist.get("n", 0) > 0 else NAN

def pick(scen):
    return [r for r in rows if r["scenario"] == scen]

def ttfb(r, role, q):
    return lat(r["loadgen"]["ttfb_ms"].get(role, {}), q)

def gap(r):
    # Follower TTFB p99 minus the leader's, as loadgen read them.
    return ttfb(r, "follower", "p99") - ttfb(r, "leader", "p50")

def arrival_gap(r):
    # The same from the kernel's receive timestamps (loadgen's comment).
    a = r["loadgen"].get("arrival_ms", {})
    return (lat(a.get("follower", {}), "p99")
            - lat(a.get("leader", {}), "p50"))

def done(r, q):
    return lat(r["loadgen"]["complete_ms"]["all"], q)

def ok(flag):
    return "met" if flag else "**missed**"

def noise(rs):
    return ("machine: other processes (or the host, as steal time) took "
            "%.0f%% of the CPUs during these runs (median); load average "
            "%.1f" %
            (med([r["other_cpu_pct"] for r in rs]),
             med([r["loadavg"] for r in rs])))

out = []
on, off = pick("loop-on"), pick("loop-off")
if on:
    out.append("### a. Stretch: %d clients looping the identical streaming "
               "request for %g s (%d runs, medians)\n" %
               (loop_c, loop_s, len(on)))
    out.append("| gateway | client requests | upstream calls | "
               "requests per upstream call | ideal upstream calls | "
               "completion p50 / p99 (ms) | gateway CPU (s) |")
    out.append("|---|---|---|---|---|---|---|")
    resp = med([r["response_ms"] for r in on])
    ideal = loop_s / (resp / 1000.0)
    for name, rs in (("coalescing on", on), ("coalescing off", off)):
        if not rs:
            continue
        req = med([r["loadgen"]["ok"] for r in rs])
        up = med([r["upstream_calls"] for r in rs])
        out.append("| %s | %g | %g | %.1f | %.1f | %.0f / %.0f | %.2f |" % (
            name, req, up, req / up if up else float("nan"), ideal,
            med([done(r, "p50") for r in rs]),
            med([done(r, "p99") for r in rs]),
            med([r["gw_cpu_ms"] for r in rs]) / 1000.0))
    up_on = med([r["upstream_calls"] for r in on])
    up_off = med([r["upstream_calls"] for r in off]) if off else float("nan")
    errs = sum(r["loadgen"]["errors"] + r["loadgen"]["non_2xx"]
               for r in on + off)
    out.append("")
    out.append("- single request response time through the gateway: "
               "%.0f ms (median); ideal = %g s / %.3f s = %.1f" %
               (resp, loop_s, resp / 1000.0, ideal))
    out.append("- target upstream calls <= ideal + 1 = %.1f: %s "
               "(per run: %s)" % (ideal + 1, ok(max(r["upstream_calls"]
                                                   for r in on)
                                               <= ideal + 1),
                                  ", ".join(str(r["upstream_calls"])
                                            for r in on)))
    out.append("- upstream load, off vs on: %.0f / %.0f = %.1fx fewer "
               "upstream calls with coalescing" % (up_off, up_on,
                                                   up_off / up_on))
    out.append("- errors or non-2xx answers over all runs: %d" % errs)
    out.append("- " + noise(on + off))
    out.append("")

cases = [(s + lw, n, t, lw)
         for s, n, t in (("fanout-", fan_n, "b"), ("fanout-big-", big_n, "c"))
         for lw in ("on", "off")]
for scen, n, title, lw in cases:
    rs = pick(scen)
    if not rs:
        continue
    out.append("### %s. Fan-out: %d concurrent identical streaming clients, "
               "leader_writes = %s (%d runs, medians)\n"
               % (title, n, lw, len(rs)))
    out.append("| run | ok | errors | upstream calls | distinct bodies | "
               "leader TTFB | follower TTFB p50 / p99 / max | "
               "p99 - leader | same, by arrival | completion p50 / p99 | "
               "send spread | gateway peak RSS | RSS per client | "
               "gateway CPU | others' CPU |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
               "---|")
    for r in rs:
        lg = r["loadgen"]
        per = (r["rss_hwm_kb"] - r["rss_base_kb"]) / n
        out.append("| %d | %d | %d | %d | %d | %.1f ms | %.1f / %.1f / %.1f "
                   "ms | %.1f ms | %.1f ms | %.0f / %.0f ms | %.1f ms | "
                   "%.1f MiB | %.1f KiB | %.2f s | %.0f%% |" % (
                       r["rep"], lg["ok"], lg["errors"] + lg["non_2xx"],
                       r["upstream_calls"], lg["distinct_bodies"],
                       ttfb(r, "leader", "p50"), ttfb(r, "follower", "p50"),
                       ttfb(r, "follower", "p99"), ttfb(r, "follower", "max"),
                       gap(r), arrival_gap(r), done(r, "p50"),
                       done(r, "p99"), lg["send_spread_ms"],
                       r["rss_hwm_kb"] / 1024.0, per, r["gw_cpu_ms"] / 1000.0,
                       r["other_cpu_pct"]))
    def m(f):
        return med([f(r) for r in rs])
    out.append("| **median** | %g | %g | %g | %g | %.1f ms | "
               "%.1f / %.1f / %.1f ms | %.1f ms | %.1f ms | %.0f / %.0f ms | "
               "%.1f ms | %.1f MiB | %.1f KiB | %.2f s | %.0f%% |" % (
                   m(lambda r: r["loadgen"]["ok"]),
                   m(lambda r: r["loadgen"]["errors"]
                     + r["loadgen"]["non_2xx"]),
                   m(lambda r: r["upstream_calls"]),
                   m(lambda r: r["loadgen"]["distinct_bodies"]),
                   m(lambda r: ttfb(r, "leader", "p50")),
                   m(lambda r: ttfb(r, "follower", "p50")),
                   m(lambda r: ttfb(r, "follower", "p99")),
                   m(lambda r: ttfb(r, "follower", "max")),
                   m(gap), m(arrival_gap),
                   m(lambda r: done(r, "p50")),
                   m(lambda r: done(r, "p99")),
                   m(lambda r: r["loadgen"]["send_spread_ms"]),
                   m(lambda r: r["rss_hwm_kb"] / 1024.0),
                   m(lambda r: (r["rss_hwm_kb"] - r["rss_base_kb"]) / n),
                   m(lambda r: r["gw_cpu_ms"] / 1000.0),
                   m(lambda r: r["other_cpu_pct"])))
    out.append("")
    good = sum(1 for r in rs if r["loadgen"]["ok"] == n)
    allok = good == len(rs)
    one = all(r["upstream_calls"] == 1 for r in rs)
    # Every client of one upstream call must get the same bytes; a call
    # is a different completion (fresh id), so bodies == calls.
    same = all(r["loadgen"]["distinct_bodies"] == r["upstream_calls"]
               for r in rs if r["loadgen"]["ok"] > 0)
    g = m(gap)
    out.append("- every client a complete 200: %s (%d of %d runs); one "
               "upstream call: %s (per run: %s); byte-identical bodies for "
               "the clients of each upstream call (distinct FNV-1a body "
               "hashes == upstream calls): %s" % (
                   ok(allok), good, len(rs), ok(one),
                   ", ".join(str(r["upstream_calls"]) for r in rs),
                   ok(same)))
    if title == "b" and lw == "on":
        out.append("- follower TTFB p99 within 10 ms of the leader's TTFB, "
                   "as loadgen read them: %s (median gap %.1f ms; per run: "
                   "%s); by arrival at the client sockets: median %.1f ms"
                   % (ok(g <= 10.0), g,
                      ", ".join("%.1f" % gap(r) for r in rs),
                      m(arrival_gap)))
        fl = pick("fanout-floor")
        if fl:
            out.append("- the same fan-out against tools/fanout_floor (no "
                       "gateway: all first bytes written at once, one "
                       "thread per CPU): median gap %.1f ms (per run: %s); "
                       "by arrival: median %.1f ms"
                       % (med([gap(r) for r in fl]),
                          ", ".join("%.1f" % gap(r) for r in fl),
                          med([arrival_gap(r) for r in fl])))
    out.append("- requests the gateway had routed through coalescing when "
               "loadgen finished (leaders + followers from /metrics, the "
               "warm-up request included): %s" % ", ".join(
                   str(r.get("gw_coalesce", {}).get("leaders", 0)
                       + r.get("gw_coalesce", {}).get("followers", 0))
                   for r in rs))
    out.append("- gateway CPU per client: %.0f us (whole response, "
               "accept to close)" % m(lambda r: r["gw_cpu_ms"] * 1000 / n))
    out.append("- " + noise(rs))
    out.append("")
print("\n".join(out))
EOF
cat "$TMP/report.md"
if [ -n "$OUT" ]; then
    cp "$TMP/report.md" "$OUT"
fi
