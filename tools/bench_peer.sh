#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_peer.sh - infergw beside a peer LLM gateway, on the same
# machine and the same origin (issue 31).
#
# One run sends, with wrk and keep-alive connections, the same tiny
# non-streaming chat completion
#   direct   straight to a fast origin,
#   infergw  through the gateway,
#   nginx    through Debian's nginx as a keep-alive reverse proxy (the
#            yardstick of docs/BENCHMARKS.md),
#   portkey  through Portkey's AI gateway (npm @portkey-ai/gateway, run
#            with node as its README starts it, 'npx @portkey-ai/gateway'),
# at 1 and 50 connections, and prints a markdown table of medians: req/s
# and its ratio to nginx's, p50 and p99, and the latency each path adds
# (its p50 minus direct's p50, its p99 minus direct's p99).
#
# The origin is an nginx answering POST /v1/chat/completions with a fixed
# small JSON body ('return 200', as in tools/bench_proxy.sh), so the
# origin costs next to nothing and the same for every path.  infergw runs
# with access_log = off and log_level = warn, and the request carries
# "temperature":0.7, so it is not coalesced: this measures the proxy
# path.  Portkey is pointed at the origin by its own request headers,
# 'x-portkey-provider: openai' and 'x-portkey-custom-host' (its config,
# as infergw's is a file), and needs no network beyond the loopback: its
# first answer must be the origin's body to the byte, or the script
# stops.  Portkey's server is one node process (one event loop), as
# started; it listens on every address, not only the loopback (it has no
# option for that), for as long as the script runs.
#
# Every wrk error and non-2xx answer is counted and shown in the table:
# a path that answers errors must not look fast.
#
# The four paths are interleaved for each connection count, and the
# whole sweep is repeated REPS times; before each group of four the
# script waits for a quiet machine (wait_quiet in tools/bench_lib.sh: the
# 1-minute load average under LOAD_MAX and a second under QUIET_PCT %
# busy), and reports what it saw.
#
# Portkey is installed with npm into PEER_DIR the first time; that needs
# the npm registry (nothing else).  Without npm or node, or when the
# install fails, the portkey path is left out with a message and the
# other three run.  LiteLLM is a Python package (PyPI), neither on npm
# nor in Debian, so it is not here.
#
# Usage: sh tools/bench_peer.sh        (make builds infergw first)
# Environment:
#   BIN=build/default/bin   where infergw is (INFERGW= overrides the file)
#   PEER_DIR=build/peer     npm's prefix for the peer (its node_modules)
#   PORTKEY_VERSION=1.15.2  the @portkey-ai/gateway release installed
#   DURATION=10s            one wrk run
#   CONNS="1 50"            connection counts
#   REPS=3                  repetitions of the interleaved sweep
#   ORIGIN_WORKERS=1        origin nginx workers
#   PROXY_WORKERS=auto      proxy nginx workers (one per core)
#   LOAD_MAX=1.5 QUIET_PCT=30 QUIET_MAX=150   the quiet wait before each
#                           group (tools/bench_lib.sh)
#   OUT=FILE                also write the table to FILE
#   KEEP=1                  keep the temp dir (configs, logs, raw wrk output)
# Defaults take about 5 minutes on a quiet machine, more while it waits.
set -eu

ORIG=$(pwd)
cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
INFERGW=${INFERGW:-$BIN/infergw}
case $INFERGW in /*) ;; *) [ -e "$ORIG/$INFERGW" ] && INFERGW=$ORIG/$INFERGW ;; esac
PEER_DIR=${PEER_DIR:-build/peer}
case $PEER_DIR in /*) ;; *) PEER_DIR=$(pwd)/$PEER_DIR ;; esac
PORTKEY_VERSION=${PORTKEY_VERSION:-1.15.2}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-1 50}
REPS=${REPS:-3}
ORIGIN_WORKERS=${ORIGIN_WORKERS:-1}
PROXY_WORKERS=${PROXY_WORKERS:-auto}
OUT=${OUT:-}
case $OUT in ''|/*) ;; *) OUT=$ORIG/$OUT ;; esac

die() { echo "bench_peer: $*" >&2; exit 1; }
note() { echo "bench_peer: $*" >&2; }

if ! command -v wrk >/dev/null 2>&1 || ! [ -x /usr/sbin/nginx ] \
    || ! command -v curl >/dev/null 2>&1; then
    sh tools/install-deps.sh wrk nginx-light curl \
        || die "cannot install wrk, nginx-light, curl"
fi
NGINX=$(command -v nginx || true)
[ -n "$NGINX" ] || NGINX=/usr/sbin/nginx
[ -x "$INFERGW" ] || die "$INFERGW not built (make, or set BIN=)"

. tools/bench_lib.sh
bench_tmp

# Portkey: installed once into PEER_DIR, left out (with the reason) when
# it cannot be.
PORTKEY_JS=$PEER_DIR/node_modules/@portkey-ai/gateway/build/start-server.js
if ! command -v node >/dev/null 2>&1; then
    note "node not found: the portkey path is left out"
    PORTKEY_JS=""
elif ! [ -f "$PORTKEY_JS" ]; then
    if command -v npm >/dev/null 2>&1; then
        note "installing @portkey-ai/gateway@$PORTKEY_VERSION into $PEER_DIR"
        mkdir -p "$PEER_DIR"
        npm install --prefix "$PEER_DIR" --no-audit --no-fund \
            "@portkey-ai/gateway@$PORTKEY_VERSION" >"$TMP/npm.log" 2>&1 \
            || note "npm install failed: $(tail -3 "$TMP/npm.log")"
    else
        note "npm not found"
    fi
    if ! [ -f "$PORTKEY_JS" ]; then
        note "no @portkey-ai/gateway: the portkey path is left out"
        PORTKEY_JS=""
    fi
fi

CHAT_BODY='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
MODELS_BODY='{"object":"list","data":[{"id":"m","object":"model","created":1700000000,"owned_by":"bench"}]}'
REQ_BODY='{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.7}'

origin_start "$ORIGIN_WORKERS"
proxy_start "$PROXY_WORKERS"

GW_PORT=$(free_port)
cat >"$TMP/gateway.conf" <<EOF
[server]
listen = 127.0.0.1:$GW_PORT
log_level = warn
access_log = off
[upstream]
url = http://127.0.0.1:$ORIGIN_PORT
EOF
"$INFERGW" -c "$TMP/gateway.conf" >"$TMP/infergw.log" 2>&1 &
GW_PID=$!
PIDS="$PIDS $GW_PID"
wait_http "http://127.0.0.1:$GW_PORT/readyz" \
    || die "infergw not ready: $(cat "$TMP/infergw.log")"

TARGETS="direct:$ORIGIN_PORT:post infergw:$GW_PORT:post nginx:$PROXY_PORT:post"
if [ -n "$PORTKEY_JS" ]; then
    PK_PORT=$(free_port)
    node "$PORTKEY_JS" --port="$PK_PORT" --headless >"$TMP/portkey.log" 2>&1 &
    PK_PID=$!
    PIDS="$PIDS $PK_PID"
    # It answers "/" once it listens, after a 1 s banner.
    i=0
    until wait_http "http://127.0.0.1:$PK_PORT/"; do
        kill -0 "$PK_PID" 2>/dev/null \
            || die "portkey exited: $(tail -5 "$TMP/portkey.log")"
        i=$((i + 1))
        [ $i -lt 6 ] || die "portkey did not start: $(tail -5 "$TMP/portkey.log")"
    done
    TARGETS="$TARGETS portkey:$PK_PORT:portkey"
fi

cat >"$TMP/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$REQ_BODY'
wrk.headers["Content-Type"] = "application/json"
EOF
# Portkey's configuration travels in each request: the provider's wire
# format, where it is, and a key it passes on (the origin ignores it).
cp "$TMP/post.lua" "$TMP/portkey.lua"
cat >>"$TMP/portkey.lua" <<EOF
wrk.headers["x-portkey-provider"] = "openai"
wrk.headers["x-portkey-custom-host"] = "http://127.0.0.1:$ORIGIN_PORT/v1"
wrk.headers["Authorization"] = "Bearer sk-bench"
EOF

# Every path answers the chat request with 200 and the origin's body, to
# the byte.
for t in $TARGETS; do
    name=${t%%:*}
    rest=${t#*:}
    port=${rest%%:*}
    set -- -H 'Content-Type: application/json'
    if [ "$name" = portkey ]; then
        set -- "$@" -H 'x-portkey-provider: openai' \
            -H "x-portkey-custom-host: http://127.0.0.1:$ORIGIN_PORT/v1" \
            -H 'Authorization: Bearer sk-bench'
    fi
    got=$(curl -s -w ' %{http_code}' "$@" -d "$REQ_BODY" \
        "http://127.0.0.1:$port/v1/chat/completions")
    [ "$got" = "$CHAT_BODY 200" ] || die "$name answered: $got"
done

RAW=$TMP/results.tsv
: >"$RAW"
QUIET=$TMP/quiet.tsv
: >"$QUIET"

# run NAME PORT SCRIPT CONNS REP: one wrk run, one line of $RAW.
run() {
    threads=2
    [ "$4" -lt 2 ] && threads=1
    f=$TMP/wrk-$1-c$4-r$5.txt
    wrk -t"$threads" -c"$4" -d"$DURATION" --latency -s "$TMP/$3.lua" \
        "http://127.0.0.1:$2/v1/chat/completions" >"$f" 2>&1 \
        || die "wrk failed: $(cat "$f")"
    sum=$(wrk_summary "$f") || die "cannot read $f"
    printf '%s\t%s\t%s\t%s\n' "$1" "$4" "$5" "$sum" >>"$RAW"
    tail -n 1 "$RAW" | awk -F'\t' '{ printf "  %-8s c=%-3s rep %s: %8.0f req/s  p50 %8.1f us  p99 %9.1f us%s\n", $1, $2, $3, $4, $5, $6, ($8 > 0 ? "  ERRORS " $8 : "") }' >&2
}

# Warm-up: opens the upstream connections, and lets node compile
# Portkey's hot path, before anything is measured.
for t in $TARGETS; do
    rest=${t#*:}
    wrk -t2 -c50 -d3s -s "$TMP/${rest#*:}.lua" \
        "http://127.0.0.1:${rest%%:*}/v1/chat/completions" >/dev/null 2>&1
done

START=$(date -u '+%Y-%m-%d %H:%M')
note "origin :$ORIGIN_PORT; $TARGETS; $REPS x c=[$CONNS] $DURATION"
rep=1
while [ "$rep" -le "$REPS" ]; do
    for c in $CONNS; do
        wait_quiet
        printf '%s\t%s\t%s\n' "$QUIET_LOAD" "$QUIET_BUSY" "$QUIET_WAITED" \
            >>"$QUIET"
        for t in $TARGETS; do
            name=${t%%:*}
            rest=${t#*:}
            run "$name" "${rest%%:*}" "${rest#*:}" "$c" "$rep"
        done
    done
    rep=$((rep + 1))
done
kill -0 "$GW_PID" 2>/dev/null || die "infergw died: $(cat "$TMP/infergw.log")"
END=$(date -u '+%H:%M')

python3 - "$RAW" "$QUIET" "$DURATION" "$REPS" "$ORIGIN_WORKERS" \
    "$PROXY_WORKERS" "$(nproc)" "$START" "$END" >"$TMP/table.md" <<'EOF'
import statistics, sys
from collections import defaultdict
raw, quietf, dur, reps, ow, pw, ncpu, start, end = sys.argv[1:]
runs = defaultdict(list)
conns, names = [], []
for line in open(raw):
    name, c, rep, rps, p50, p99, n, e = line.rstrip("\n").split("\t")
    c = int(c)
    conns += [c] if c not in conns else []
    names += [name] if name not in names else []
    runs[name, c].append((float(rps), float(p50), float(p99), int(n), int(e)))
def med(name, c, i):
    return statistics.median(r[i] for r in runs[name, c])
print("| conns | path | req/s | × nginx req/s | p50 / p99 µs "
      "| added p50 / p99 µs | non-2xx or errors / requests |")
print("|---|---|---|---|---|---|---|")
for c in conns:
    for name in names:
        if name == "direct":
            added = "—"
        else:
            added = "%+.0f / %+.0f" % (med(name, c, 1) - med("direct", c, 1),
                                      med(name, c, 2) - med("direct", c, 2))
        errs = sum(r[4] for r in runs[name, c])
        total = sum(r[3] for r in runs[name, c])
        print("| %d | %s | %.0f | %.2f | %.0f / %.0f | %s | %d / %d |" % (
            c, name, med(name, c, 0),
            med(name, c, 0) / med("nginx", c, 0), med(name, c, 1),
            med(name, c, 2), added, errs, total))
q = [l.split("\t") for l in open(quietf).read().splitlines()]
load = [float(x[0]) for x in q]
busy = [int(x[1]) for x in q]
waited = [int(x[2]) for x in q]
print()
print("Medians of %s interleaved runs of %s each (%s per connection "
      "count); %s CPUs; origin nginx %s worker(s), proxy nginx "
      "worker_processes %s; %s–%s UTC.  Added = the path's percentile "
      "minus direct's.  Before each group: load average %.2f–%.2f, "
      "%d–%d %% busy, waited %d s in all." % (
          reps, dur, ", ".join(names), ncpu, ow, pw, start, end,
          min(load), max(load), min(busy), max(busy), sum(waited)))
EOF
cat "$TMP/table.md"
[ -z "$OUT" ] || cp "$TMP/table.md" "$OUT"
