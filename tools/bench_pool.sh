#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_pool.sh - upstream pools under failure (issue 9): failover
# and hedging, with tools/loadgen as the clients and mocks as upstreams.
#
# failover: CLIENTS (50) clients loop streams for DURATION (20 s) through
#   one gateway over 3 upstreams (least_inflight); at KILL_AT (5 s) one
#   upstream is killed (SIGKILL).  Reports every client error and whether
#   its stream was open at the kill; how long after the kill the gateway
#   ejected the dead upstream (infergw_upstream_state, sampled every
#   50 ms), after which no new request goes to it; and the calls it still
#   got after that (the half-open trials, one per eject_time, doubling,
#   each refused and retried elsewhere unseen).
#   Target: errors only for streams open on the killed upstream.
#
# hedge: 3 upstreams, each delaying the first byte of every 20th completion
#   by 2 s (mock -s 20:2000; healthy first byte FIRST_MS).  HEDGE_CLIENTS
#   clients loop distinct (never coalesced) streams for HEDGE_SECS, first
#   with hedge_after = 0, then with hedge_after at the first run's p95
#   time to first byte.  Reports TTFT p50/p99/p99.9 for both and the
#   extra upstream calls (upstream completions - client requests).
#   Target: p99 within 2x the healthy p50; extra calls <= 10 %.
#
# Usage: sh tools/bench_pool.sh [failover|hedge|all]   (make first)
# Environment: BIN=build/default/bin, OUT=FILE (also write the report),
#   CLIENTS=50 DURATION=20 KILL_AT=5 CHUNKS=20 DELAY_MS=20 (failover),
#   HEDGE_CLIENTS=20 HEDGE_SECS=20 FIRST_MS=20 (hedge), KEEP=1.
set -eu

ORIG=$(pwd)
cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
WHAT=${1:-all}
CLIENTS=${CLIENTS:-50}
DURATION=${DURATION:-20}
KILL_AT=${KILL_AT:-5}
CHUNKS=${CHUNKS:-20}
DELAY_MS=${DELAY_MS:-20}
HEDGE_CLIENTS=${HEDGE_CLIENTS:-20}
HEDGE_SECS=${HEDGE_SECS:-20}
FIRST_MS=${FIRST_MS:-20}
OUT=${OUT:-}
case $OUT in ''|/*) ;; *) OUT=$ORIG/$OUT ;; esac
KEEP=${KEEP:-}

die() { echo "bench_pool: $*" >&2; exit 1; }
for t in "$BIN/infergw" "$BIN/mock_upstream" "$BIN/loadgen"; do
    [ -x "$t" ] || die "$t not built (make, or set BIN=)"
done
command -v curl >/dev/null 2>&1 || sh tools/install-deps.sh curl \
    || die "no curl"

. tools/bench_lib.sh
bench_tmp

report() {
    echo "$*"
    if [ -n "$OUT" ]; then echo "$*" >>"$OUT"; fi
}

# mock NAME ARGS...: start a mock on port 0; sets PORT and MOCK_PID.
mock() {
    name=$1
    shift
    "$BIN/mock_upstream" -l 127.0.0.1:0 -q "$@" >"$TMP/$name.out" 2>&1 &
    MOCK_PID=$!
    PIDS="$PIDS $MOCK_PID"
    i=0
    while ! grep -q 'listening port=' "$TMP/$name.out" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 200 ] || die "mock $name did not start"
        sleep 0.02
    done
    PORT=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/$name.out")
}

# gateway CONF_FILE: start infergw (its config names the port, GW_PORT,
# since log_level = warn does not log it); sets GW_PID.
gateway() {
    "$BIN/infergw" -c "$1" >"$1.log" 2>&1 &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    i=0
    until curl -s -o /dev/null "http://127.0.0.1:$GW_PORT/healthz"; do
        i=$((i + 1))
        [ $i -lt 200 ] || die "infergw did not start: $(cat "$1.log")"
        sleep 0.02
    done
}

# conf FILE ROUTING_LINES PORT...: a config over the given upstreams.
conf() {
    f=$1
    routing=$2
    shift 2
    {
        printf '[server]\nlisten = 127.0.0.1:%s\nlog_level = warn\n' "$GW_PORT"
        printf 'access_log = off\nmax_connections = 4096\n'
        printf '[routing]\n%b\n' "$routing"
        n=0
        for p in "$@"; do
            printf '[upstream u%d]\nurl = http://127.0.0.1:%s\n' "$n" "$p"
            n=$((n + 1))
        done
    } >"$f"
}

failover() {
    mock f0 -n "$CHUNKS" -d "$DELAY_MS"; P0=$PORT
    mock f1 -n "$CHUNKS" -d "$DELAY_MS"; P1=$PORT
    mock f2 -n "$CHUNKS" -d "$DELAY_MS"; P2=$PORT; VICTIM=$MOCK_PID
    GW_PORT=$(free_port)
    conf "$TMP/failover.conf" 'health_interval = 1s\neject_after = 3' \
        "$P0" "$P1" "$P2"
    gateway "$TMP/failover.conf"
    BODY='{"model":"mock-model","messages":[{"role":"user","content":"failover"}],"stream":true,"temperature":0.7}'
    # Sample the victim's call counter; each line: ms-since-start value.
    (
        t0=$(date +%s%3N)
        while :; do
            m=$(curl -s "http://127.0.0.1:$GW_PORT/metrics")
            v=$(echo "$m" \
                | sed -n 's/^infergw_upstream_calls_total{upstream="u2"} //p')
            st=$(echo "$m" \
                | sed -n 's/^infergw_upstream_state{upstream="u2"} //p')
            echo "$(( $(date +%s%3N) - t0 )) $v $st"
            sleep 0.05
        done
    ) >"$TMP/samples" &
    SAMPLER=$!
    PIDS="$PIDS $SAMPLER"
    T0=$(date +%s%3N)
    "$BIN/loadgen" -c "$CLIENTS" -u "http://127.0.0.1:$GW_PORT/v1/chat/completions" \
        -d "$BODY" --loop "$DURATION" -t 60 -o "$TMP/failover.json" \
        >"$TMP/failover.summary" 2>"$TMP/failover.err" &
    LG=$!
    sleep "$KILL_AT"
    KILL_MS=$(( $(date +%s%3N) - T0 ))
    kill -9 "$VICTIM"
    wait "$LG" || true
    kill "$SAMPLER" 2>/dev/null || true
    python3 - "$TMP" "$KILL_MS" "$CLIENTS" "$DURATION" <<'EOF' | while IFS= read -r line; do report "$line"; done
import json, sys
tmp, kill_ms, clients, duration = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
recs = json.load(open(tmp + "/failover.json"))
summ = json.load(open(tmp + "/failover.summary"))
# loadgen times are µs from its release; the sampler's from its own start.
kill_us = kill_ms * 1000
bad = [r for r in recs if r["error"] != "none" or not 200 <= r["status"] < 300]
open_at_kill = [r for r in bad if r["send_us"] <= kill_us]
after = [r for r in bad if r["send_us"] > kill_us]
samples = []
for line in open(tmp + "/samples"):
    parts = line.split()
    if len(parts) == 3:
        samples.append((int(parts[0]), float(parts[1]), int(parts[2])))
ejected = next((t for t, v, st in samples if t > kill_ms and st == 2), None)
at_eject = next((v for t, v, st in samples if t == ejected), None)
last = samples[-1][1] if samples else None
print("### failover: %s clients x %s s, 3 upstreams, one killed at %.1f s"
      % (clients, duration, kill_ms / 1000))
print("")
print("| requests | ok | client errors | of them started before the kill | started after | killed upstream ejected after | its calls after the ejection (half-open trials) |")
print("|---|---|---|---|---|---|---|")
print("| %d | %d | %d | %d | %d | %s | %s |" % (
    summ["requests"], summ["ok"], len(bad), len(open_at_kill), len(after),
    "%d ms" % (ejected - kill_ms) if ejected is not None else "never",
    "%d" % (last - at_eject) if at_eject is not None else "-"))
print("")
print("client errors by kind: %s" % json.dumps(summ["error_kinds"]))
EOF
    kill "$GW_PID" 2>/dev/null || true
}

hedge_run() {   # hedge_run HEDGE_AFTER LABEL: sets nothing, writes files
    mock h0 -f "$FIRST_MS" -s 20:2000; P0=$PORT
    mock h1 -f "$FIRST_MS" -s 20:2000; P1=$PORT
    mock h2 -f "$FIRST_MS" -s 20:2000; P2=$PORT
    GW_PORT=$(free_port)
    conf "$TMP/hedge-$2.conf" "hedge_after = $1\nretry_budget = 20%" \
        "$P0" "$P1" "$P2"
    gateway "$TMP/hedge-$2.conf"
    BODY='{"model":"mock-model","messages":[{"role":"user","content":"hedge"}],"stream":true,"temperature":0.7}'
    "$BIN/loadgen" -c "$HEDGE_CLIENTS" \
        -u "http://127.0.0.1:$GW_PORT/v1/chat/completions" -d "$BODY" \
        --loop "$HEDGE_SECS" -t 60 \
        -o "$TMP/hedge-$2.json" >"$TMP/hedge-$2.summary" \
        2>"$TMP/hedge-$2.err" || true
    calls=0
    for p in $P0 $P1 $P2; do
        c=$(curl -s "http://127.0.0.1:$p/stats" | python3 -c \
            'import json,sys; print(json.load(sys.stdin)["completions"])')
        calls=$((calls + c))
    done
    echo "$calls" >"$TMP/hedge-$2.calls"
    kill "$GW_PID" 2>/dev/null || true
}

hedge() {
    hedge_run 0 off
    P95=$(python3 - "$TMP/hedge-off.json" <<'EOF'
import json, math, sys
t = sorted(r["ttfb_us"] for r in json.load(open(sys.argv[1]))
           if r["error"] == "none")
print(max(1, round(t[math.ceil(0.95 * len(t)) - 1] / 1000)))
EOF
)
    hedge_run "${P95}ms" on
    python3 - "$TMP" "$P95" "$HEDGE_SECS" <<'EOF' | while IFS= read -r line; do report "$line"; done
import json, math, sys
tmp, p95, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def pct(v, q):
    return v[min(len(v) - 1, math.ceil(q * len(v)) - 1)] / 1000
rows = []
for label in ("off", "on"):
    recs = json.load(open("%s/hedge-%s.json" % (tmp, label)))
    t = sorted(r["ttfb_us"] for r in recs if r["error"] == "none")
    calls = int(open("%s/hedge-%s.calls" % (tmp, label)).read())
    rows.append((label, len(recs), len(t), pct(t, .5), pct(t, .99),
                 pct(t, .999), calls, 100.0 * (calls - len(recs)) / len(recs)))
healthy_p50 = rows[0][3]
print("### hedging: 3 upstreams, every 20th first byte of each delayed 2 s, "
      "%d s of closed-loop streams per setting" % n)
print("")
print("| hedge_after | requests | ok | TTFT p50 ms | p99 ms | p99.9 ms | upstream calls | extra calls | p99 / healthy p50 |")
print("|---|---|---|---|---|---|---|---|---|")
for label, nreq, ok, p50, p99, p999, calls, extra in rows:
    print("| %s | %d | %d | %.1f | %.1f | %.1f | %d | %.1f %% | %.2fx |" % (
        "off" if label == "off" else "%s ms (p95 of off)" % p95, nreq, ok,
        p50, p99, p999, calls, extra, p99 / healthy_p50))
EOF
}

case $WHAT in
failover) failover ;;
hedge) hedge ;;
all) failover; hedge ;;
*) die "usage: bench_pool.sh [failover|hedge|all]" ;;
esac
