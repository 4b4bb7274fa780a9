#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/profile_request.sh - where a request and a chunk go (issue 31).
#
# Counts what infergw executes for one tiny non-streamed POST and for one
# relayed chunk of a stream, split into the phases issue 31 names (parse,
# route and policy, key hash, dispatch and pick, libcurl set-up, transfer,
# usage scan, reply, logging and metrics, keep-alive wait, other), and
# prints markdown tables:
#
#   1. instructions (valgrind --tool=callgrind, Ir), by phase, per request
#      and per chunk, summed by tools/callgrind_phases.py, and in total
#      beside the design card's floor for the same work (tools/relay_floor
#      -c: a thread per connection and libcurl, nothing else, sending the
#      request lines infergw sends);
#   2. system calls per request and per chunk (strace -f -c, attached to
#      the warm gateway); context switches and CPU per request and per
#      chunk (perf stat -e context-switches,task-clock, attached); and
#      the share of CPU samples by object, kernel, libcurl, libc ...
#      (perf record -e cpu-clock: this VM has no hardware counters).
#
# Origins: the request is the one of tools/bench_proxy.sh (temperature
# 0.7, so never coalesced) answered by an nginx 'return 200' with the
# same small JSON body, so that its figures compare with "Proxy overhead"
# and issue 16's in docs/BENCHMARKS.md, and the origin costs nothing
# that could leak into the gateway's count.  Streams come from the
# bundled mock (nginx cannot pace an SSE stream): content chunks DELAY
# ms apart, so that every chunk is its own read even under valgrind.
# The gateway has one upstream for each (by model), access_log = off,
# log_level = warn, health_interval = 0 and load_interval = 0, so no
# beat runs during a count.
#
# Every count covers only the work asked for: the client first warms
# its connection (WARM requests), then the count is zeroed
# (callgrind_control -z, or strace/perf attached only now), the requests
# are sent one after another on that one kept-alive connection, and the
# count is dumped.  A chunk's cost is (S streams of 100 content chunks -
# S streams of 1) / (99 S): the role chunk, the finish chunk, [DONE],
# the request and the reply's head cancel out.  Two stream paths: direct
# (temperature 0.7, the path bench_stream_cost.sh measures) and leader
# (temperature 0, a distinct prompt each, so each request leads its own
# flight: flight append and fanout push).
#
# Usage: sh tools/profile_request.sh        (make all first)
# Environment:
#   BIN=build/default/bin  N=2000 (requests)  STREAMS=10 (per count)
#   DELAY=5 (ms between a stream's chunks)  WARM=50 WARM_STREAMS=3
#   CALLGRIND=1 SYSCALLS=1 PERF=1 (0: skip callgrind, strace, perf stat)
#   MAX_LOAD=1.5 (strace and perf wait up to 120 s for the 1-minute
#   load average to fall under it; callgrind's counts do not depend
#   on load)  KEEP=1 (keep the temp dir: profiles, configs, logs)
# Defaults take about 5 minutes.
set -eu

cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
N=${N:-2000}
STREAMS=${STREAMS:-10}
DELAY=${DELAY:-5}
WARM=${WARM:-50}
WARM_STREAMS=${WARM_STREAMS:-3}
SYSCALLS=${SYSCALLS:-1}
PERF=${PERF:-1}
CALLGRIND=${CALLGRIND:-1}
MAX_LOAD=${MAX_LOAD:-1.5}
TOOLS=$(pwd)/tools

die() { echo "profile_request: $*" >&2; exit 1; }
for t in valgrind callgrind_control python3 curl /usr/sbin/nginx; do
    command -v "$t" >/dev/null 2>&1 \
        || die "no $t: sh tools/install-deps.sh valgrind nginx-light curl"
done
[ "$SYSCALLS" = 0 ] || command -v strace >/dev/null 2>&1 \
    || die "strace not found (SYSCALLS=0 skips it)"
for t in "$BIN/infergw" "$BIN/mock_upstream"; do
    [ -x "$t" ] || die "$t not built (make all, or set BIN=)"
done

. tools/bench_lib.sh
bench_tmp
[ -z "${KEEP:-}" ] || echo "temp dir: $TMP" >&2

CHAT_BODY='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'

ORIGIN=$(free_port)
mkdir -p "$TMP/origin/logs" "$TMP/origin/tmp"
cat >"$TMP/origin/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/origin/nginx.pid;
error_log $TMP/origin/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/origin/tmp/body;
    proxy_temp_path $TMP/origin/tmp/proxy;
    fastcgi_temp_path $TMP/origin/tmp/fastcgi;
    uwsgi_temp_path $TMP/origin/tmp/uwsgi;
    scgi_temp_path $TMP/origin/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    server {
        listen 127.0.0.1:$ORIGIN;
        default_type application/json;
        location = /v1/chat/completions {
            client_body_buffer_size 16k;
            return 200 '$CHAT_BODY';
        }
    }
}
EOF
/usr/sbin/nginx -p "$TMP/origin" -e "$TMP/origin/logs/error.log" \
    -c "$TMP/origin/nginx.conf" -g 'daemon off;' \
    >"$TMP/origin/logs/stdout.log" 2>&1 &
PIDS="$PIDS $!"

"$BIN/mock_upstream" -l 127.0.0.1:0 -q -n 100 -d "$DELAY" \
    >"$TMP/mock.out" 2>&1 &
PIDS="$PIDS $!"
wait_line "$TMP/mock.out" 'listening port='
MOCK=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/mock.out")

GW=$(free_port)
cat >"$TMP/gw.conf" <<EOF
[server]
listen = 127.0.0.1:$GW
log_level = warn
access_log = off
[routing]
health_interval = 0
load_interval = 0
[upstream origin]
url = http://127.0.0.1:$ORIGIN
models = m
[upstream mock]
url = http://127.0.0.1:$MOCK
models = mock-model
EOF

# The client: WARM requests, then "go" (the caller zeroes or attaches),
# then the counted ones on the same kept-alive connection.
cat >"$TMP/send.py" <<'EOF'
import http.client, json, sys
port, warm, n, kind, chunks = (int(sys.argv[1]), int(sys.argv[2]),
                               int(sys.argv[3]), sys.argv[4],
                               int(sys.argv[5]))
hook = sys.argv[6:]
c = http.client.HTTPConnection("127.0.0.1", port)

def one(i):
    if kind == "request":
        body = {"model": "m", "messages": [{"role": "user",
                "content": "hi"}], "temperature": 0.7}
    else:
        body = {"model": "mock-model", "messages": [{"role": "user",
                "content": "%s %d" % (kind, i)}], "stream": True,
                "max_tokens": chunks,
                "temperature": 0.7 if kind == "direct" else 0}
    c.request("POST", "/v1/chat/completions",
              json.dumps(body, separators=(",", ":")),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200 or (kind != "request"
                           and data.count(b"data: ") != chunks + 3):
        sys.exit("unexpected answer %d: %r" % (r.status, data[:200]))

for i in range(warm):
    one(-1 - i)
if hook:
    import subprocess
    subprocess.run(hook[0], shell=True, check=True)
for i in range(n):
    one(i)
if len(hook) > 1:
    subprocess.run(hook[1], shell=True, check=True)
EOF

start_gw() {    # start_gw [WRAPPER...]: sets GW_PID
    "$@" "$BIN/infergw" -c "$TMP/gw.conf" >"$TMP/gw.log" 2>&1 &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    i=0
    until curl -s -o /dev/null "http://127.0.0.1:$GW/healthz"; do
        i=$((i + 1))
        [ $i -lt 600 ] || die "infergw did not start: $(cat "$TMP/gw.log")"
        sleep 0.05
    done
}

# send KIND COUNT CHUNKS [BEFORE [AFTER]]: a new connection, WARM
# requests (WARM_STREAMS streams), BEFORE, COUNT requests, AFTER.
send() {
    w=$WARM
    [ "$1" = request ] || w=$WARM_STREAMS
    python3 "$TMP/send.py" "${TO:-$GW}" "$w" "$2" "$1" "$3" ${4:+"$4"} \
        ${5:+"$5"} || die "client failed ($1)"
}

quiet() {
    i=0
    while [ "$(awk -v m="$MAX_LOAD" '{ print ($1 < m) }' /proc/loadavg)" \
            = 0 ] && [ $i -lt 24 ]; do
        sleep 5
        i=$((i + 1))
    done
    cut -d' ' -f1 /proc/loadavg
}

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain -- gateway common 2>/dev/null)" ] \
    || COMMIT="$COMMIT+changes"
echo "# profile_request: commit $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC')," \
    "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# N=$N STREAMS=$STREAMS DELAY=$DELAY WARM=$WARM" \
    "WARM_STREAMS=$WARM_STREAMS"
echo

# ---- 1. instructions ----
if [ "$CALLGRIND" = 1 ]; then
    start_gw valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out"
    CG="callgrind_control"
    part=0
    # counted PID DUMP KIND COUNT CHUNKS: send, with PID's callgrind
    # counts zeroed before the counted part and dumped after it; waits
    # for the dump's file DUMP.
    counted() {
        send "$3" "$4" "$5" "$CG -z $1 >/dev/null 2>&1" \
            "$CG -d $1 >/dev/null 2>&1"
        i=0
        while ! [ -s "$2" ] && [ $i -lt 100 ]; do
            sleep 0.1
            i=$((i + 1))
        done
    }
    count() {       # count NAME KIND COUNT CHUNKS: a dump of the counted part
        part=$((part + 1))
        counted "$GW_PID" "$TMP/cg.out.$part" "$2" "$3" "$4"
        mv "$TMP/cg.out.$part" "$TMP/$1.cg"
    }
    count request request "$N" 0
    count direct100 direct "$STREAMS" 100
    count direct1 direct "$STREAMS" 1
    count leader100 leader "$STREAMS" 100
    count leader1 leader "$STREAMS" 1
    stop "$GW_PID"

    # The model's floor on the same requests and chunks: relay_floor -c,
    # a thread per connection reaching the origin through libcurl with
    # nothing else (no parse, no policy, no reset, no usage, no logs).
    # Its total is compared, not its phases: it has none of infergw's.
    floor_count() { # floor_count NAME URL KIND COUNT CHUNKS [KIND COUNT CHUNKS]
        name=$1 url=$2
        shift 2
        valgrind --tool=callgrind --callgrind-out-file="$TMP/$name.cg" \
            "$BIN/relay_floor" -l 127.0.0.1:0 -c "$url" \
            -H "$FLOOR_H1" -H "$FLOOR_H2" -H "$FLOOR_H3" ${FL_J:+"$FL_J"} \
            >"$TMP/$name.log" 2>&1 &
        FL_PID=$!
        PIDS="$PIDS $FL_PID"
        wait_line "$TMP/$name.log" 'listening port='
        TO=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/$name.log")
        part=0
        while [ $# -ge 3 ]; do
            part=$((part + 1))
            counted "$FL_PID" "$TMP/$name.cg.$part" "$1" "$2" "$3"
            shift 3
        done
        TO=
        stop "$FL_PID"
    }
    total_of() {    # total_of FILE: the dump's instructions
        awk '/^(summary|totals):/ { if ($2 > t) t = $2 } END { print t + 0 }' \
            "$1"
    }
    floor_count floor_req "http://127.0.0.1:$ORIGIN/v1/chat/completions" \
        request "$N" 0
    # ... and checking each body with jansson (-j), as a gateway on the
    # card must before it forwards it.
    FL_J=-j
    floor_count floor_json "http://127.0.0.1:$ORIGIN/v1/chat/completions" \
        request "$N" 0
    FL_J=
    floor_count floor_chunk "http://127.0.0.1:$MOCK/v1/chat/completions" \
        direct "$STREAMS" 100 direct "$STREAMS" 1

    PH="python3 $TOOLS/callgrind_phases.py"
    echo "## Instructions per request (callgrind, $N requests)"
    echo
    $PH --per "$N" --title "phase, per request" "$TMP/request.cg"
    echo
    CH=$((99 * STREAMS))
    for p in direct leader; do
        echo "## Instructions per chunk, $p path (callgrind," \
            "($STREAMS streams of 100 content chunks - $STREAMS of 1) / $CH)"
        echo
        $PH --per "$CH" --base "$TMP/${p}1.cg" --title "phase, per chunk" \
            "$TMP/${p}100.cg"
        echo
    done
    echo "## Beside the model's floor (relay_floor -c: thread per" \
        "connection, libcurl, nothing else; callgrind, the same requests)"
    echo
    echo "| per | infergw | libcurl floor | infergw − floor | infergw / floor |"
    echo "|---|---|---|---|---|"
    python3 - "$N" "$CH" "$(total_of "$TMP/request.cg")" \
        "$(total_of "$TMP/floor_req.cg.1")" \
        "$(total_of "$TMP/direct100.cg")" "$(total_of "$TMP/direct1.cg")" \
        "$(total_of "$TMP/floor_chunk.cg.1")" \
        "$(total_of "$TMP/floor_chunk.cg.2")" \
        "$(total_of "$TMP/floor_json.cg.1")" <<'EOF'
import sys
n, ch, req, freq, d100, d1, f100, f1, fjson = (int(x) for x in sys.argv[1:])
for label, g, f in (("request", req / n, freq / n),
                    ("request, the floor checking the body with jansson "
                     "(-j)", req / n, fjson / n),
                    ("chunk, direct path", (d100 - d1) / ch,
                     (f100 - f1) / ch)):
    print("| %s | %.1fk | %.1fk | %.1fk | %.2fx |"
          % (label, g / 1e3, f / 1e3, (g - f) / 1e3, g / f))
EOF
    echo
fi

# ---- 2. system calls, context switches, CPU ----
# The tracer is attached by the client once its connection is warm, and
# stopped (SIGINT, then waited for: it writes its counts on the way
# out) once the counted requests are answered.  strace is attached to
# every thread of the gateway; the connection's thread is created later
# by one of them, and -f follows it (perf stat -p: inherited counters).
STOP='stop_tracer() { kill -INT $(cat "$1");
    while kill -0 $(cat "$1") 2>/dev/null; do sleep 0.1; done; };
    stop_tracer'
tids() {
    for t in /proc/"$GW_PID"/task/*; do printf ' -p %s' "${t##*/}"; done
}
with_strace() { # with_strace NAME KIND COUNT CHUNKS: counts in NAME.st
    send "$2" "$3" "$4" \
        "strace -f -c -o $TMP/$1.st $(tids) 2>/dev/null &
         echo \$! >$TMP/tracer.pid; sleep 1" \
        "sleep 0.3; $STOP $TMP/tracer.pid"
}
with_perf() {   # with_perf NAME KIND COUNT CHUNKS: counts in NAME.perf
    send "$2" "$3" "$4" \
        "perf stat -e context-switches,task-clock -x, -o $TMP/$1.perf \
         -p $GW_PID 2>/dev/null & echo \$! >$TMP/tracer.pid; sleep 1" \
        "sleep 0.3; $STOP $TMP/tracer.pid"
}
with_record() { # with_record NAME KIND COUNT CHUNKS: samples in NAME.data
    send "$2" "$3" "$4" \
        "perf record -q -e cpu-clock -F 20000 -o $TMP/$1.data \
         -p $GW_PID >/dev/null 2>&1 & echo \$! >$TMP/tracer.pid; sleep 1" \
        "sleep 0.3; $STOP $TMP/tracer.pid"
}
units() {       # units FN: FN for the requests and each stream path
    "$1" request request "$N" 0
    for p in direct leader; do
        "$1" "${p}100" "$p" "$STREAMS" 100
        "$1" "${p}1" "$p" "$STREAMS" 1
    done
}
# per_unit EXT: a table of NAME.EXT's counts per request and per chunk.
per_unit() {
    python3 - "$TMP" "$1" "$N" "$STREAMS" <<'EOF'
import re, sys
tmp, ext, n, s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def counts(name):
    out = {}
    for line in open("%s/%s.%s" % (tmp, name, ext)):
        f = line.strip().split("," if ext == "perf" else None)
        if ext == "st" and len(f) >= 5 and re.match(r"^[0-9.]+$", f[0]) \
                and f[-1] != "total":
            out[f[-1]] = int(f[3])
        elif ext == "perf" and len(f) > 3 and f[0][:1].isdigit():
            out[f[2]] = float(f[0])
    return out

def diff(a, b):
    return {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}

units = [("request (%d, sequential, 1 connection)" % n, counts("request"), n)]
for p in ("direct", "leader"):
    units.append(("chunk, %s path" % p,
                  diff(counts(p + "100"), counts(p + "1")), 99 * s))
if ext == "st":
    print("| per | system calls | the calls |")
    print("|---|---|---|")
    for label, d, per in units:
        top = sorted(d.items(), key=lambda kv: -kv[1])
        print("| %s | %.2f | %s |" % (label, sum(d.values()) / per,
              ", ".join("%s %.2f" % (k, v / per) for k, v in top
                        if abs(v / per) >= 0.02)))
else:
    print("| per | context switches | CPU µs (task-clock) |")
    print("|---|---|---|")
    for label, d, per in units:
        print("| %s | %.2f | %.1f |" % (label,
              d.get("context-switches", 0) / per,
              d.get("task-clock", 0) * 1000 / per))
EOF
}

if [ "$SYSCALLS" = 1 ] || [ "$PERF" = 1 ]; then
    start_gw
fi
if [ "$SYSCALLS" = 1 ]; then
    echo "## System calls (strace -f -c; load $(quiet) before)"
    echo
    units with_strace
    per_unit st
    echo
fi
if [ "$PERF" = 1 ]; then
    if ! perf stat -e task-clock true >/dev/null 2>&1; then
        echo "perf stat does not run here: skipped"
    else
        echo "## Context switches and CPU (perf stat; load $(quiet) before)"
        echo
        units with_perf
        per_unit perf
        echo
        echo "## Where the CPU is (perf record -e cpu-clock, share of" \
            "samples by object)"
        echo
        with_record request request "$N" 0
        with_record direct100 direct "$STREAMS" 100
        with_record leader100 leader "$STREAMS" 100
        echo "| run | samples | kernel | libcurl | libc | jansson |" \
            "mbedcrypto | infergw | other |"
        echo "|---|---|---|---|---|---|---|---|---|"
        for r in request direct100 leader100; do
            perf report -i "$TMP/$r.data" --sort dso --stdio 2>/dev/null \
                | awk -v r="$r" '
                /^# Samples:/ { n = $3 }
                /^ *[0-9.]+%/ {
                    pct = $1; sub("%", "", pct); d = $2
                    if (d ~ /kernel/) k += pct
                    else if (d ~ /libcurl/) c += pct
                    else if (d ~ /^libc[.]so|^libc-/) l += pct
                    else if (d ~ /jansson/) j += pct
                    else if (d ~ /mbedcrypto/) m += pct
                    else if (d ~ /infergw/) g += pct
                    else o += pct
                }
                END {
                    printf "| %s | %s | %.1f %% | %.1f %% | %.1f %% |" \
                        " %.1f %% | %.1f %% | %.1f %% | %.1f %% |\n",
                        r, n, k, c, l, j, m, g, o
                }'
        done
        echo
    fi
fi
[ -z "${KEEP:-}" ] || echo "kept $TMP: python3 tools/callgrind_phases.py" \
    "--per N [--callees FUNC | --detail PHASE] $TMP/request.cg" >&2
