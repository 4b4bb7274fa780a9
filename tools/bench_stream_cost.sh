#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_stream_cost.sh - what relaying a stream costs (issue 9):
# C concurrent distinct (never coalesced) streams of 100 chunks, 10 ms
# apart, from the bundled mock, through infergw and through nginx (one
# worker per core) in the same run.
#
# For each proxy and connection count it reports streams/s, the p99
# stream time, and the proxy's CPU per relayed chunk (utime + stime of
# the proxy's processes over the run, from /proc, divided by the chunks
# relayed: 103 per stream, the role chunk, 100 content chunks, the finish
# chunk and [DONE]).  With SYSCALLS=1 it also counts the proxy's system
# calls per chunk under strace -c (a separate, shorter run: strace slows
# what it traces).
#
# Beside them runs tools/relay_floor, the least a thread-per-connection
# relay does per chunk (one read, one write), and relay_floor -c
# ("cfloor"), the same reaching the mock through libcurl as the design
# card has infergw do (one easy handle per thread, set once, infergw's
# request lines; a chunk is one libcurl write callback and one writev):
# the floors of the design card's model, to tell the model's cost from
# the gateway's.
# BASE=path/to/an/older/infergw adds another infergw, to compare a
# change of the transfer loop in one run.
#
# Usage: sh tools/bench_stream_cost.sh   (make first)
# Environment: BIN=build/default/bin, CONNS="100 500", DURATION=10,
#   REPS=3, SYSCALLS=0 (1: strace -c at 50 connections for 5 s),
#   BASE=, OUT=FILE, KEEP=1
set -eu

ORIG=$(pwd)
cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
CONNS=${CONNS:-100 500}
DURATION=${DURATION:-10}
REPS=${REPS:-3}
SYSCALLS=${SYSCALLS:-0}
BASE=${BASE:-}
case $BASE in ''|/*) ;; *) BASE=$ORIG/$BASE ;; esac
OUT=${OUT:-}
case $OUT in ''|/*) ;; *) OUT=$ORIG/$OUT ;; esac
KEEP=${KEEP:-}

die() { echo "bench_stream_cost: $*" >&2; exit 1; }
if ! [ -x /usr/sbin/nginx ] || ! command -v curl >/dev/null 2>&1; then
    sh tools/install-deps.sh nginx-light curl || die "cannot install nginx"
fi
if [ "$SYSCALLS" = 1 ] && ! command -v strace >/dev/null 2>&1; then
    sh tools/install-deps.sh strace || die "cannot install strace"
fi
for t in "$BIN/infergw" "$BIN/mock_upstream" "$BIN/loadgen"; do
    [ -x "$t" ] || die "$t not built (make, or set BIN=)"
done

. tools/bench_lib.sh
bench_tmp

"$BIN/mock_upstream" -l 127.0.0.1:0 -q -n 100 -d 10 >"$TMP/mock.out" 2>&1 &
PIDS="$PIDS $!"
wait_line "$TMP/mock.out" 'listening port='
MOCK=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/mock.out")

# log_level = warn keeps the per-request info lines out of the CPU
# figures, and with them the "listening port=" line: so a port of ours.
start_gw() {    # start_gw NAME BINARY: sets GW_PORT, GW_PID
    GW_PORT=$(free_port)
    cat >"$TMP/$1.conf" <<EOF
[server]
listen = 127.0.0.1:$GW_PORT
log_level = warn
access_log = off
max_connections = 4096
[upstream]
url = http://127.0.0.1:$MOCK
[routing]
health_interval = 0
EOF
    "$2" -c "$TMP/$1.conf" >"$TMP/$1.log" 2>&1 &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    i=0
    until curl -s -o /dev/null "http://127.0.0.1:$GW_PORT/healthz"; do
        i=$((i + 1))
        [ $i -lt 100 ] || die "$1 did not start: $(cat "$TMP/$1.log")"
        sleep 0.05
    done
}

start_gw infergw "$BIN/infergw"
IG_PORT=$GW_PORT
IG_PID=$GW_PID
TARGETS="infergw"
if [ -n "$BASE" ]; then
    [ -x "$BASE" ] || die "BASE=$BASE is not executable"
    start_gw base "$BASE"
    BASE_PORT=$GW_PORT
    BASE_PID=$GW_PID
    TARGETS="$TARGETS base"
fi

NG_PORT=$(free_port)
mkdir -p "$TMP/nginx/logs" "$TMP/nginx/tmp"
cat >"$TMP/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 8192; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/tmp/body;
    proxy_temp_path $TMP/nginx/tmp/proxy;
    fastcgi_temp_path $TMP/nginx/tmp/fastcgi;
    uwsgi_temp_path $TMP/nginx/tmp/uwsgi;
    scgi_temp_path $TMP/nginx/tmp/scgi;
    keepalive_requests 1000000;
    upstream mock {
        server 127.0.0.1:$MOCK;
        keepalive 1024;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$NG_PORT backlog=4096;
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF
/usr/sbin/nginx -p "$TMP/nginx" -e "$TMP/nginx/logs/error.log" \
    -c "$TMP/nginx/nginx.conf" -g 'daemon off;' >"$TMP/nginx/out" 2>&1 &
NG_PID=$!
PIDS="$PIDS $NG_PID"
i=0
until curl -s -o /dev/null "http://127.0.0.1:$NG_PORT/health"; do
    i=$((i + 1))
    [ $i -lt 100 ] || die "nginx did not start: $(cat "$TMP/nginx/logs/error.log")"
    sleep 0.05
done
TARGETS="$TARGETS nginx"

"$BIN/relay_floor" -l 127.0.0.1:0 -u "127.0.0.1:$MOCK" >"$TMP/floor.out" 2>&1 &
FL_PID=$!
PIDS="$PIDS $FL_PID"
wait_line "$TMP/floor.out" 'listening port='
FL_PORT=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/floor.out")
TARGETS="$TARGETS floor"

"$BIN/relay_floor" -l 127.0.0.1:0 \
    -c "http://127.0.0.1:$MOCK/v1/chat/completions" \
    -H "$FLOOR_H1" -H "$FLOOR_H2" -H "$FLOOR_H3" >"$TMP/cfloor.out" 2>&1 &
CF_PID=$!
PIDS="$PIDS $CF_PID"
wait_line "$TMP/cfloor.out" 'listening port='
CF_PORT=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/cfloor.out")
TARGETS="$TARGETS cfloor"

port_of() {
    case $1 in
    infergw) echo "$IG_PORT" ;;
    base) echo "$BASE_PORT" ;;
    nginx) echo "$NG_PORT" ;;
    floor) echo "$FL_PORT" ;;
    cfloor) echo "$CF_PORT" ;;
    esac
}
pids_of() {
    case $1 in
    infergw) echo "$IG_PID" ;;
    base) echo "$BASE_PID" ;;
    nginx) echo "$NG_PID $(pgrep -P "$NG_PID" | tr '\n' ' ')" ;;
    floor) echo "$FL_PID" ;;
    cfloor) echo "$CF_PID" ;;
    esac
}
# CPU ticks (utime + stime, all threads) of the given processes.
ticks() {
    t=0
    for p in "$@"; do
        v=$(awk '{print $14 + $15}' "/proc/$p/stat")
        t=$((t + v))
    done
    echo "$t"
}

BODY='{"model":"mock-model","messages":[{"role":"user","content":"cost"}],"stream":true,"temperature":0.7}'
HZ=$(getconf CLK_TCK)
echo "target conns rep ok wall_ms p99_ms cpu_ticks" >"$TMP/raw"
for rep in $(seq 1 "$REPS"); do
    for c in $CONNS; do
        for tgt in $TARGETS; do
            pids=$(pids_of "$tgt")
            # shellcheck disable=SC2086
            t0=$(ticks $pids)
            "$BIN/loadgen" -c "$c" \
                -u "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions" \
                -d "$BODY" --loop "$DURATION" -t 60 >"$TMP/lg.json" \
                2>"$TMP/lg.err" || true
            # shellcheck disable=SC2086
            t1=$(ticks $pids)
            python3 - "$TMP/lg.json" "$tgt" "$c" "$rep" "$((t1 - t0))" \
                >>"$TMP/raw" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], sys.argv[3], sys.argv[4], s["ok"], s["wall_ms"],
      s["complete_ms"]["all"]["p99"], sys.argv[5])
EOF
        done
    done
done

SYS=""
if [ "$SYSCALLS" = 1 ]; then
    for tgt in $TARGETS; do
        args=""
        for p in $(pids_of "$tgt"); do args="$args -p $p"; done
        # shellcheck disable=SC2086
        strace -f -c -o "$TMP/strace-$tgt" $args &
        ST=$!
        sleep 0.5
        "$BIN/loadgen" -c 50 \
            -u "http://127.0.0.1:$(port_of "$tgt")/v1/chat/completions" \
            -d "$BODY" --loop 5 -t 60 >"$TMP/st-$tgt.json" 2>/dev/null || true
        kill -INT "$ST" 2>/dev/null || true
        wait "$ST" 2>/dev/null || true
        SYS="$SYS $tgt"
    done
fi

python3 - "$TMP" "$HZ" "$SYS" <<'EOF' | { if [ -n "$OUT" ]; then tee -a "$OUT"; else cat; fi; }
import json, re, statistics, sys
tmp, hz, sys_targets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
CHUNKS = 103
rows = {}
for line in open(tmp + "/raw").read().split("\n")[1:]:
    if not line.strip():
        continue
    tgt, c, rep, ok, wall, p99, ticks = line.split()
    us_chunk = int(ticks) / hz * 1e6 / max(1, int(ok) * CHUNKS)
    rows.setdefault((tgt, int(c)), []).append(
        (int(ok) / (float(wall) / 1000), float(p99), us_chunk))
med = lambda v: statistics.median(v)
print("| conns | proxy | streams/s | p99 stream ms | CPU µs per chunk | CPU / nginx | CPU / floor | CPU / libcurl floor |")
print("|---|---|---|---|---|---|---|---|")
for c in sorted({k[1] for k in rows}):
    ng = med([r[2] for r in rows[("nginx", c)]])
    fl = med([r[2] for r in rows[("floor", c)]])
    cf = med([r[2] for r in rows[("cfloor", c)]])
    for tgt in ("infergw", "base", "nginx", "floor", "cfloor"):
        if (tgt, c) not in rows:
            continue
        v = rows[(tgt, c)]
        cpu = med([r[2] for r in v])
        print("| %d | %s | %.1f | %.0f | %.1f | %.2fx | %.2fx | %.2fx |" % (
            c, "libcurl floor" if tgt == "cfloor" else tgt,
            med([r[0] for r in v]), med([r[1] for r in v]), cpu,
            cpu / ng, cpu / fl, cpu / cf))
if sys_targets:
    print("")
    print("| proxy (50 conns, strace -c) | system calls per chunk | top calls |")
    print("|---|---|---|")
    for tgt in sys_targets:
        total, top = 0, []
        for line in open("%s/strace-%s" % (tmp, tgt)):
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$",
                         line)
            if m and m.group(2) != "total":
                total += int(m.group(1))
                top.append((int(m.group(1)), m.group(2)))
        ok = json.load(open("%s/st-%s.json" % (tmp, tgt)))["ok"]
        top.sort(reverse=True)
        per = lambda n: n / max(1, ok * CHUNKS)
        print("| %s | %.2f | %s |" % (tgt, per(total), ", ".join(
            "%s %.2f" % (name, per(n)) for n, name in top[:5])))
EOF
