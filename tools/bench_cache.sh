#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_cache.sh - the response cache against Varnish and nginx
# (issue 30).
#
# Four servers sit in front of the same kind of mock upstream, started
# fresh for every run with the tutorial's demo timing (-n 16 -f 100 -d 45:
# about 800 ms per streamed response):
#
#   ttl0     infergw, [cache] ttl = 0: no cache, coalescing only;
#   ttl10    infergw, [cache] ttl = 10s;
#   varnish  varnishd 7 with a VCL (written below) that caches POST
#            /v1/chat/completions keyed on the body (std.cache_req_body()
#            and varnish-modules' bodyaccess.hash_req_body(), the
#            documented way), keeps the method POST to the backend, ttl
#            10s; its waiting list (request coalescing) and its default
#            grace (10 s: an expired object is served while one
#            background fetch refreshes it) as they come;
#   nginx    nginx proxy_cache: proxy_cache_methods POST, proxy_cache_key
#            "$request_uri|$request_body" (client_body_buffer_size keeps
#            the body in memory, where $request_body needs it),
#            proxy_cache_valid 200 10s, proxy_cache_lock on (the followers
#            wait for the leader's answer to be cached, polling every
#            500 ms), worker_processes auto (one per CPU).
#
# Every infergw runs with log_level = warn and the access log off, as
# nginx (access_log off) and as the other CPU benchmarks do (Varnish
# writes its shared-memory log always).  Upstream calls are the mock's
# own count (GET /stats "completions").  Before each run a warm-up request
# with another body opens the upstream connections.
#
#   a. the stretch test: LOOP_C clients loop the identical streaming
#      request for LOOP_S seconds (tools/loadgen --loop), each sending the
#      next as soon as its previous response ended, against ttl0, ttl10,
#      varnish and nginx, interleaved.  Per run: client requests,
#      upstream calls, TTFB p50/p99 (loadgen's time to the first body
#      byte: the role chunk, the TTFT a client sees), completion p50/p99,
#      errors, distinct bodies, the server's CPU.  Then the same for
#      LONG_S seconds (ttl10, varnish, nginx), long enough for entries to
#      expire.  Target: 1 upstream call per ttl window.  A cached answer
#      lives ttl from the end of its call (infergw), so with clients
#      always waiting, call k starts at (k-1)(R + ttl), R the response
#      time measured by the warm-up: expected = ceil(S / (R + ttl)),
#      1 in 10 s and 3 in 25 s.
#   b. sequential identical requests: SEQ_N (e.g. 3, 20) identical
#      streaming requests one after another with curl, each sent once the
#      previous one ended, against all four.  Upstream calls and the
#      answers each server marked as hits (X-Infergw-Cache: hit; X-Cache:
#      HIT, set by the VCL and nginx config below).  Target: infergw with
#      a ttl costs 1 call, like Varnish.
#   c. the CPU of a hit: a cache warmed with one request (HIT_TTL = 60s
#      here, so that no entry expires during a run; what a hit costs does
#      not depend on it), then wrk with HIT_CONNS kept-alive connections
#      for HIT_S seconds of the same request against ttl10, nginx,
#      varnish and the floor, interleaved, once per body in HIT_BODIES
#      (the floor: tools/relay_floor -a, a thread per connection that
#      reads each request and writes the bytes of an infergw hit captured
#      first, in one write: the least the design's model does per hit;
#      what infergw costs above it is the gateway's own) (json: the
#      non-streamed answer, 382 bytes of body; stream: the SSE answer,
#      4,031 bytes in 19 events).  CPU time (utime + stime from
#      /proc/PID/stat, summed over nginx's master and workers, and over
#      Varnish's manager and child) per hit, in microseconds.  Every run
#      must make 0 upstream calls, so every answer counted was a hit.
#      Target: infergw's CPU per hit at most 1.5x nginx's.
#
# Before each measured run the script waits, at most QUIET_MAX s, for the
# 1-minute load average to be under LOAD_MAX and a one-second window with
# all CPUs less than QUIET_PCT % busy; the load average and the share of
# the CPUs others used during the run are reported.
#
# Usage: sh tools/bench_cache.sh   (make all first)
# Environment:
#   BIN=build/default/bin
#   LOOP_C=50 LOOP_S=10 LONG_S=25 REPS=3     a (LONG_S=0: no long run)
#   SEQ_N="3 20"                             b
#   HIT_S=10 HIT_CONNS=4 HIT_TTL=60 HIT_BODIES="json stream"     c
#   SKIP="a b c"   scenarios to skip
#   SERVERS="ttl0 ttl10 varnish nginx floor"   the servers to run (floor:
#                  c only)
#   NGINX_EXTRA=   more directives for nginx's cached location, e.g.
#                  'proxy_cache_use_stale updating;' (not in the defaults)
#   LOAD_MAX=1.5 QUIET_PCT=30 QUIET_MAX=150
#   OUT=FILE       also write the markdown tables to FILE
#   KEEP=1         keep the temp dir (configs, logs, raw JSON)
# Defaults take about 25 minutes on a quiet machine, some of it waiting
# for the load average to fall after the runs that keep both CPUs busy.
set -eu

ORIG=$(pwd)
cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
LOOP_C=${LOOP_C:-50}
LOOP_S=${LOOP_S:-10}
LONG_S=${LONG_S:-25}
REPS=${REPS:-3}
SEQ_N=${SEQ_N:-3 20}
HIT_S=${HIT_S:-10}
HIT_CONNS=${HIT_CONNS:-4}
HIT_TTL=${HIT_TTL:-60}
HIT_BODIES=${HIT_BODIES:-json stream}
SKIP=${SKIP:-}
SERVERS=${SERVERS:-ttl0 ttl10 varnish nginx floor}
NGINX_EXTRA=${NGINX_EXTRA:-}
LOAD_MAX=${LOAD_MAX:-1.5}
QUIET_PCT=${QUIET_PCT:-30}
QUIET_MAX=${QUIET_MAX:-150}
OUT=${OUT:-}
case $OUT in '' | /*) ;; *) OUT=$ORIG/$OUT ;; esac
KEEP=${KEEP:-}
TTL_S=10
PATH_V1=/v1/chat/completions
# The tutorial's request: no temperature, so it coalesces (and is cached)
# under the shipped omitted_temperature = 0.
BODY_STREAM='{"model":"llama-3-8b","messages":[{"role":"user","content":"identical"}],"stream":true}'
BODY_JSON='{"model":"llama-3-8b","messages":[{"role":"user","content":"identical"}]}'
BODY_WARM='{"model":"llama-3-8b","messages":[{"role":"user","content":"warm-up"}],"stream":true}'

die() { echo "bench_cache: $*" >&2; exit 1; }
note() { echo "bench_cache: $*" >&2; }

if ! [ -x /usr/sbin/varnishd ] || ! [ -x /usr/sbin/nginx ] \
    || ! command -v wrk >/dev/null 2>&1 \
    || ! ls /usr/lib/*/varnish/vmods/libvmod_bodyaccess.so >/dev/null 2>&1
then
    sh tools/install-deps.sh varnish varnish-modules nginx-light wrk curl \
        iproute2 || die "cannot install varnish, varnish-modules, nginx"
fi
for t in /usr/sbin/varnishd /usr/sbin/nginx wrk curl python3 timeout; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found"
done
for t in infergw mock_upstream loadgen; do
    [ -x "$BIN/$t" ] || die "$BIN/$t not built (make all, or set BIN=)"
done

. tools/bench_lib.sh
bench_tmp
RESULTS=$TMP/results.jsonl
: >"$RESULTS"
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)

# ---- processes --------------------------------------------------------

# children PID: its child processes (nginx's workers, Varnish's child).
children() {
    pgrep -P "$1" 2>/dev/null | tr '\n' ' ' || true
}

# wait_http URL: until it answers 200 (10 s at most; Varnish compiles its
# VCL first).
wait_http() {
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null)" \
        = 200 ]; do
        i=$((i + 1))
        [ $i -lt 200 ] || return 1
        sleep 0.05
    done
}

# start_mock DIR: sets MOCK_PID and MOCK_PORT.
start_mock() {
    "$BIN/mock_upstream" -l 127.0.0.1:0 -n 16 -f 100 -d 45 -q \
        >"$1/mock.out" 2>"$1/mock.err" &
    MOCK_PID=$!
    PIDS="$PIDS $MOCK_PID"
    wait_line "$1/mock.out" 'listening port='
    MOCK_PORT=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$1/mock.out")
}

# start_infergw DIR TTL: sets SRV_PID, SRV_PORT, SRV_PIDS.
start_infergw() {
    SRV_PORT=$(free_port)
    cat >"$1/gateway.conf" <<EOF
[server]
listen = 127.0.0.1:$SRV_PORT
log_level = warn
access_log = off
max_connections = 4096
[upstream]
url = http://127.0.0.1:$MOCK_PORT
[cache]
ttl = $2
EOF
    "$BIN/infergw" -c "$1/gateway.conf" >"$1/gateway.log" 2>&1 &
    SRV_PID=$!
    PIDS="$PIDS $SRV_PID"
    wait_http "http://127.0.0.1:$SRV_PORT/readyz" \
        || die "infergw not ready: $(cat "$1/gateway.log")"
    SRV_PIDS=$SRV_PID
}

# start_varnish DIR TTL_S: sets SRV_PID (the manager), SRV_PORT, SRV_PIDS
# (manager and child).  -j none: no privilege separation, so it runs as
# whoever runs the script, root included, with its work dir (-n) in TMP.
start_varnish() {
    SRV_PORT=$(free_port)
    cat >"$1/cache.vcl" <<EOF
vcl 4.1;
import std;
import bodyaccess;

backend mock { .host = "127.0.0.1"; .port = "$MOCK_PORT"; }

sub vcl_recv {
    if (req.url == "/bench-ready") {
        return (synth(200));
    }
    if (req.method == "POST" && req.url == "$PATH_V1") {
        # Keep the body (bodyaccess hashes it, the fetch resends it) and
        # remember the method: Varnish turns a cacheable miss into a GET.
        std.cache_req_body(1MB);
        set req.http.x-method = req.method;
        return (hash);
    }
}

sub vcl_hash {
    bodyaccess.hash_req_body();
    # The built-in vcl_hash then adds the URL and Host.
}

sub vcl_backend_fetch {
    if (bereq.http.x-method == "POST") {
        set bereq.method = "POST";
    }
    unset bereq.http.x-method;
}

sub vcl_backend_response {
    if (beresp.status == 200) {
        set beresp.ttl = ${2}s;
    }
}

sub vcl_deliver {
    if (obj.hits > 0) {
        set resp.http.X-Cache = "HIT";
    } else {
        set resp.http.X-Cache = "MISS";
    }
}
EOF
    /usr/sbin/varnishd -F -j none -n "$1/varnish" -T none \
        -a "127.0.0.1:$SRV_PORT" -f "$1/cache.vcl" -s malloc,256m \
        >"$1/varnish.log" 2>&1 &
    SRV_PID=$!
    PIDS="$PIDS $SRV_PID"
    wait_http "http://127.0.0.1:$SRV_PORT/bench-ready" \
        || die "varnishd not ready: $(cat "$1/varnish.log")"
    SRV_PIDS="$SRV_PID $(children "$SRV_PID")"
}

# start_nginx DIR TTL_S: sets SRV_PID (the master), SRV_PORT, SRV_PIDS
# (master, workers, cache manager and loader).
start_nginx() {
    SRV_PORT=$(free_port)
    nd=$1/nginx
    mkdir -p "$nd/logs" "$nd/tmp" "$nd/cache"
    # Started as root, nginx runs its workers as nobody: they must be
    # able to reach the temp dir (mktemp's is 0700) and write the cache.
    nuser=""
    if [ "$(id -u)" -eq 0 ]; then
        nuser="user nobody nogroup;"
        chmod 0711 "$TMP"
        chown -R nobody:nogroup "$nd/tmp" "$nd/cache"
    fi
    cat >"$nd/nginx.conf" <<EOF
$nuser
worker_processes auto;
pid $nd/nginx.pid;
error_log $nd/logs/error.log warn;
events { worker_connections 4096; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $nd/tmp/body;
    proxy_temp_path $nd/tmp/proxy;
    fastcgi_temp_path $nd/tmp/fastcgi;
    uwsgi_temp_path $nd/tmp/uwsgi;
    scgi_temp_path $nd/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    proxy_cache_path $nd/cache levels=1:2 keys_zone=llm:10m max_size=256m
                     inactive=10m use_temp_path=off;
    upstream mock {
        server 127.0.0.1:$MOCK_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$SRV_PORT backlog=4096;
        location = /bench-ready { return 200; }
        location = $PATH_V1 {
            # \$request_body exists only for a body kept in memory.
            client_body_buffer_size 1m;
            client_max_body_size 1m;
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache llm;
            proxy_cache_methods POST;
            proxy_cache_key "\$request_uri|\$request_body";
            proxy_cache_valid 200 ${2}s;
            proxy_cache_lock on;
            add_header X-Cache \$upstream_cache_status;
            $NGINX_EXTRA
        }
    }
}
EOF
    /usr/sbin/nginx -p "$nd" -e "$nd/logs/error.log" -c "$nd/nginx.conf" \
        -g 'daemon off;' >"$nd/logs/stdout.log" 2>&1 &
    SRV_PID=$!
    PIDS="$PIDS $SRV_PID"
    wait_http "http://127.0.0.1:$SRV_PORT/bench-ready" \
        || die "nginx not ready: $(cat "$nd/logs/error.log")"
    SRV_PIDS="$SRV_PID $(children "$SRV_PID")"
}

# start_floor DIR: tools/relay_floor -a ANSWER (set by hit_case): the
# model's floor for a hit, every request answered with ANSWER's bytes.
start_floor() {
    SRV_PORT=$(free_port)
    "$BIN/relay_floor" -l "127.0.0.1:$SRV_PORT" -a "$ANSWER" \
        >"$1/floor.out" 2>"$1/floor.err" &
    SRV_PID=$!
    PIDS="$PIDS $SRV_PID"
    wait_line "$1/floor.out" 'listening port='
    SRV_PIDS=$SRV_PID
}

# start_server DIR SERVER TTL_S: the mock, then SERVER (ttl0 | ttl10 |
# varnish | nginx | floor) in front of it; TTL_S is the cache's ttl (not
# ttl0's).
start_server() {
    start_mock "$1"
    case $2 in
    ttl0) start_infergw "$1" 0 ;;
    ttl10) start_infergw "$1" "${3}s" ;;
    varnish) start_varnish "$1" "$3" ;;
    nginx) start_nginx "$1" "$3" ;;
    floor) start_floor "$1" ;;
    *) die "unknown server $2" ;;
    esac
}

# stop_all: the server (its children after it) and the mock.
stop_all() {
    # shellcheck disable=SC2086
    stop $SRV_PIDS
    stop "$MOCK_PID"
    PIDS=""
}

# ---- measurements -----------------------------------------------------

upstream_calls() {
    curl -s -m 5 "http://127.0.0.1:$MOCK_PORT/stats" \
        | python3 -c 'import json, sys
print(json.load(sys.stdin)["completions"])'
}

# cpu_ticks PID...: utime + stime, every thread, of these processes.
cpu_ticks() {
    t=0
    for p in "$@"; do
        v=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)
        t=$((t + v))
    done
    echo "$t"
}

# busy_ticks: every CPU's non-idle time, whoever used it.
busy_ticks() {
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# wait_quiet: wait, at most QUIET_MAX seconds, until the 1-minute load
# average is under LOAD_MAX and one second passes with all CPUs together
# under QUIET_PCT % busy.  The runs of a and c that keep both CPUs busy
# raise the load average themselves: most of the script's time is spent
# here, letting it fall.
wait_quiet() {
    i=0
    pct=100
    load=99
    while [ $i -lt "$QUIET_MAX" ]; do
        q0=$(busy_ticks)
        sleep 1
        q1=$(busy_ticks)
        pct=$(((q1 - q0) * 100 / (HZ * NCPU)))
        load=$(cut -d' ' -f1 /proc/loadavg)
        if [ "$pct" -lt "$QUIET_PCT" ] \
            && awk -v l="$load" -v m="$LOAD_MAX" 'BEGIN { exit !(l < m) }'
        then
            return 0
        fi
        i=$((i + 1))
    done
    note "load average $load, ${pct}% busy after ${QUIET_MAX}s; measuring"
}

# warm_up DIR BODY: one request through the server, its response time.
warm_up() {
    curl -s -m 30 -o /dev/null -w '%{time_total}' \
        -H 'Content-Type: application/json' -d "$2" \
        "http://127.0.0.1:$SRV_PORT$PATH_V1" >"$1/warmup.txt" \
        || die "warm-up request failed"
}

# begin_run: the counters before a measured run.
begin_run() {
    up0=$(upstream_calls)
    # shellcheck disable=SC2086
    sv0=$(cpu_ticks $SRV_PIDS)
    mk0=$(cpu_ticks "$MOCK_PID")
    busy0=$(busy_ticks)
    load0=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s.%N)
}

# end_run: the counters after it.
end_run() {
    t1=$(date +%s.%N)
    busy1=$(busy_ticks)
    # shellcheck disable=SC2086
    sv1=$(cpu_ticks $SRV_PIDS)
    mk1=$(cpu_ticks "$MOCK_PID")
    # Responses are complete when the client ends; let the last upstream
    # call's accounting settle before reading /stats.
    sleep 0.2
    up1=$(upstream_calls)
}

# record DIR SCENARIO SERVER REP CLIENT_CPU_MS EXTRA_JSON: one line of
# RESULTS from the counters of begin_run and end_run.
record() {
    python3 - "$@" "$up0" "$up1" "$sv0" "$sv1" "$mk0" "$mk1" "$busy0" \
        "$busy1" "$t0" "$t1" "$HZ" "$NCPU" "$load0" >>"$RESULTS" <<'EOF'
import json, sys
(d, scen, server, rep, client_ms, extra, up0, up1, sv0, sv1, mk0, mk1, b0,
 b1, t0, t1, hz, ncpu, load) = sys.argv[1:]
hz = float(hz)
wall = float(t1) - float(t0)
sv_ms = (int(sv1) - int(sv0)) * 1000 / hz
mk_ms = (int(mk1) - int(mk0)) * 1000 / hz
busy_ms = (int(b1) - int(b0)) * 1000 / hz
other_ms = max(0.0, busy_ms - sv_ms - mk_ms - float(client_ms))
r = {"scenario": scen, "server": server, "rep": int(rep),
     "upstream_calls": int(up1) - int(up0), "server_cpu_ms": sv_ms,
     "mock_cpu_ms": mk_ms,
     "other_cpu_pct": 100.0 * other_ms / (wall * 1000 * int(ncpu)),
     "loadavg": float(load), "wall_s": wall,
     "response_s": float(open(d + "/warmup.txt").read() or "nan")}
r.update(json.loads(extra))
print(json.dumps(r))
EOF
    tail -n 1 "$RESULTS" | python3 -c 'import json, sys
r = json.loads(sys.stdin.read())
lg = r.get("loadgen")
s = "  %-6s %-8s #%d  upstream %d" % (r["scenario"], r["server"], r["rep"],
                                      r["upstream_calls"])
if lg:
    s += "  ok %d/%d  ttfb p50/p99 %.1f/%.1f ms" % (
        lg["ok"], lg["requests"], lg["ttfb_ms"]["all"]["p50"],
        lg["ttfb_ms"]["all"]["p99"])
if "hits" in r:
    s += "  hits %d/%d" % (r["hits"], r["requests"])
s += "  cpu %.0f ms  others %.0f%%  load %.2f" % (
    r["server_cpu_ms"], r["other_cpu_pct"], r["loadavg"])
print(s, file=sys.stderr)'
}

skipped() {
    case " $SKIP " in *" $1 "*) return 0 ;; esac
    return 1
}

# servers LIST: those of LIST that are in SERVERS, in LIST's order.
servers() {
    for sv in "$@"; do
        case " $SERVERS " in *" $sv "*) printf '%s ' "$sv" ;; esac
    done
}

# ---- a. the stretch test -----------------------------------------------

# loop_case SCENARIO SERVER REP SECONDS
loop_case() {
    d=$TMP/$1-$2-$3
    mkdir -p "$d"
    start_server "$d" "$2" "$TTL_S"
    warm_up "$d" "$BODY_WARM"
    wait_quiet
    begin_run
    rc=0
    timeout $(($4 + 120)) "$BIN/loadgen" -c "$LOOP_C" --loop "$4" -t 60 \
        -u "http://127.0.0.1:$SRV_PORT$PATH_V1" -d "$BODY_STREAM" \
        >"$d/loadgen.json" 2>"$d/loadgen.err" || rc=$?
    end_run
    [ -s "$d/loadgen.json" ] \
        || die "loadgen failed (rc $rc): $(cat "$d/loadgen.err")"
    cpu=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["cpu_ms"])' "$d/loadgen.json")
    record "$d" "$1" "$2" "$3" "$cpu" \
        "{\"seconds\": $4, \"loadgen\": $(cat "$d/loadgen.json")}"
    stop_all
}

if ! skipped a; then
    note "a. stretch: $LOOP_C clients x ${LOOP_S}s"
    rep=1
    while [ $rep -le "$REPS" ]; do
        for s in $(servers ttl0 ttl10 varnish nginx); do
            loop_case loop "$s" "$rep" "$LOOP_S"
        done
        rep=$((rep + 1))
    done
    if [ "$LONG_S" -gt 0 ]; then
        note "a. stretch: $LOOP_C clients x ${LONG_S}s"
        rep=1
        while [ $rep -le "$REPS" ]; do
            for s in $(servers ttl10 varnish nginx); do
                loop_case long "$s" "$rep" "$LONG_S"
            done
            rep=$((rep + 1))
        done
    fi
fi

# ---- b. sequential identical requests ------------------------------------

# seq_case SERVER N REP
seq_case() {
    d=$TMP/seq-$1-$2-$3
    mkdir -p "$d"
    start_server "$d" "$1" "$TTL_S"
    warm_up "$d" "$BODY_WARM"
    wait_quiet
    begin_run
    : >"$d/heads"
    i=0
    while [ $i -lt "$2" ]; do
        # One request at a time: curl returns once the response ended.
        curl -s -m 30 -o /dev/null -D - -H 'Content-Type: application/json' \
            -d "$BODY_STREAM" "http://127.0.0.1:$SRV_PORT$PATH_V1" \
            >>"$d/heads" || die "request $i failed"
        i=$((i + 1))
    done
    end_run
    hits=$(grep -ciE '^(x-infergw-cache|x-cache): hit' "$d/heads" || true)
    ok=$(grep -c '^HTTP/1.1 200' "$d/heads" || true)
    record "$d" seq "$1" "$3" 0 \
        "{\"n\": $2, \"hits\": $hits, \"requests\": $2, \"ok\": $ok}"
    stop_all
}

if ! skipped b; then
    note "b. sequential identical requests: $SEQ_N"
    rep=1
    while [ $rep -le "$REPS" ]; do
        for n in $SEQ_N; do
            for s in $(servers ttl0 ttl10 varnish nginx); do
                seq_case "$s" "$n" "$rep"
            done
        done
        rep=$((rep + 1))
    done
fi

# ---- c. the CPU of a hit ------------------------------------------------

# capture_answer BODY(json|stream) FILE: the bytes of one infergw hit of
# BODY, head and body as its client receives them, into FILE: what the
# floor answers.
capture_answer() {
    d=$TMP/capture-$1
    mkdir -p "$d"
    case $1 in
    json) body=$BODY_JSON ;;
    stream) body=$BODY_STREAM ;;
    esac
    start_server "$d" ttl10 "$HIT_TTL"
    warm_up "$d" "$body"
    python3 - "$SRV_PORT" "$PATH_V1" "$body" "$2" <<'EOF' \
        || die "no hit to capture"
import socket, sys
port, path, body, out = sys.argv[1:]
req = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
       "application/json\r\nContent-Length: %d\r\n\r\n%s"
       % (path, len(body), body)).encode()
s = socket.create_connection(("127.0.0.1", int(port)))
s.sendall(req)
got = b""
while True:
    b = s.recv(65536)
    if not b:
        sys.exit(1)
    got += b
    end = got.find(b"\r\n\r\n")
    if end < 0:
        continue
    head = got[:end].decode().lower()
    assert "x-infergw-cache: hit" in head, head
    if "transfer-encoding: chunked" in head:
        if got.endswith(b"\r\n0\r\n\r\n"):
            break
    else:
        n = int(head.split("content-length:")[1].split("\r\n")[0])
        if len(got) >= end + 4 + n:
            break
open(out, "wb").write(got)
EOF
    stop_all
}

# hit_case SERVER BODY(json|stream) REP
hit_case() {
    d=$TMP/hit-$1-$2-$3
    mkdir -p "$d"
    case $2 in
    json) body=$BODY_JSON ;;
    stream) body=$BODY_STREAM ;;
    esac
    ANSWER=$TMP/answer-$2
    start_server "$d" "$1" "$HIT_TTL"
    cat >"$d/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
    io.write(string.format("BENCH %d %d %d %d %d %d\\n", summary.requests,
        summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.timeout, summary.errors.status,
        summary.bytes, latency:percentile(50), latency:percentile(99)))
end
EOF
    wait_quiet
    # Warm the cache: the one upstream call; then the hits.
    warm_up "$d" "$body"
    begin_run
    # wrk's own CPU (from the kernel's count of its children's time) is
    # told apart from the rest of the machine.
    python3 - "$HIT_S" "$HIT_CONNS" "http://127.0.0.1:$SRV_PORT$PATH_V1" \
        "$d/post.lua" >"$d/wrk.out" 2>"$d/wrk.err" <<'EOF' || true
import resource, subprocess, sys
secs, conns, url, script = sys.argv[1:]
subprocess.run(["timeout", str(int(secs) + 60), "wrk", "-t1", "-c" + conns,
                "-d" + secs + "s", "-s", script, url])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("CPU %.1f" % ((r.ru_utime + r.ru_stime) * 1000))
EOF
    end_run
    line=$(grep '^BENCH ' "$d/wrk.out" || true)
    [ -n "$line" ] || die "wrk failed: $(cat "$d/wrk.out" "$d/wrk.err")"
    wcpu=$(sed -n 's/^CPU //p' "$d/wrk.out")
    # shellcheck disable=SC2086
    set -- "$1" "$2" "$3" $line
    record "$d" "hit-$2" "$1" "$3" "$wcpu" \
        "{\"requests\": $5, \"hits\": $5, \"errors\": $6, \"non_2xx\": $7,
          \"bytes\": $8, \"lat_p50_us\": $9, \"lat_p99_us\": ${10},
          \"seconds\": $HIT_S, \"conns\": $HIT_CONNS}"
    stop_all
}

if ! skipped c; then
    note "c. CPU of a hit: wrk -c$HIT_CONNS for ${HIT_S}s, $HIT_BODIES"
    if [ -n "$(servers floor)" ]; then
        for b in $HIT_BODIES; do
            capture_answer "$b" "$TMP/answer-$b"
        done
    fi
    rep=1
    while [ $rep -le "$REPS" ]; do
        for b in $HIT_BODIES; do
            for s in $(servers ttl10 nginx varnish floor); do
                hit_case "$s" "$b" "$rep"
            done
        done
        rep=$((rep + 1))
    done
fi

# ---- report -------------------------------------------------------------

python3 - "$RESULTS" "$LOOP_C" "$TTL_S" "$HIT_TTL" "$NCPU" \
    >"$TMP/report.md" <<'EOF'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loop_c, ttl, hit_ttl, ncpu = (int(sys.argv[2]), int(sys.argv[3]),
                              int(sys.argv[4]), int(sys.argv[5]))
NAN = float("nan")
NAMES = {"ttl0": "infergw, ttl = 0 (coalescing only)",
         "ttl10": "infergw, ttl = %ds" % ttl,
         "varnish": "Varnish, ttl %ds" % ttl,
         "nginx": "nginx proxy_cache, valid %ds" % ttl,
         "floor": "floor (relay_floor -a)"}

def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else NAN

def pick(scen, server, **kw):
    return [r for r in rows if r["scenario"] == scen
            and r["server"] == server
            and all(r.get(k) == v for k, v in kw.items())]

def ok(flag):
    return "met" if flag else "**missed**"

def lat(r, kind, q):
    d = r["loadgen"][kind]["all"]
    return d[q] if d.get("n", 0) > 0 else NAN

def noise(rs):
    return ("others used %.0f%% of the CPUs during these runs (median, "
            "at most %.0f%%); load average at the start %.2f (median, at "
            "most %.2f)" % (med([r["other_cpu_pct"] for r in rs]),
                            max(r["other_cpu_pct"] for r in rs),
                            med([r["loadavg"] for r in rs]),
                            max(r["loadavg"] for r in rs)))

out = []
for scen in ("loop", "long"):
    rs_all = [r for r in rows if r["scenario"] == scen]
    if not rs_all:
        continue
    secs = rs_all[0]["seconds"]
    reps = max(r["rep"] for r in rs_all)
    out.append("### a. %d clients looping the identical streaming request "
               "for %g s (%d runs, medians)\n" % (loop_c, secs, reps))
    out.append("| server | client requests | upstream calls (per run) | "
               "expected | requests per call | TTFB p50 / p99 ms | "
               "completion p50 / p99 ms | errors | distinct bodies | "
               "server CPU s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for s in ("ttl0", "ttl10", "varnish", "nginx"):
        rs = pick(scen, s)
        if not rs:
            continue
        resp = med([r["response_s"] for r in rs])
        exp = ("%d" % math.ceil(secs / (resp + ttl)) if s != "ttl0"
               else "%.1f" % (secs / resp))
        req = med([r["loadgen"]["ok"] for r in rs])
        up = med([r["upstream_calls"] for r in rs])
        m = {"req": req, "up": up,
             "t50": med([lat(r, "ttfb_ms", "p50") for r in rs]),
             "t99": med([lat(r, "ttfb_ms", "p99") for r in rs])}
        base[s] = m
        out.append("| %s | %.0f | %g (%s) | %s | %.0f | %.1f / %.1f | "
                   "%.1f / %.1f | %d | %g | %.2f |" % (
            NAMES[s], req, up,
            ", ".join(str(r["upstream_calls"]) for r in rs), exp,
            req / up if up else NAN, m["t50"], m["t99"],
            med([lat(r, "complete_ms", "p50") for r in rs]),
            med([lat(r, "complete_ms", "p99") for r in rs]),
            sum(r["loadgen"]["errors"] + r["loadgen"]["non_2xx"]
                for r in rs),
            med([r["loadgen"]["distinct_bodies"] for r in rs]),
            med([r["server_cpu_ms"] for r in rs]) / 1000.0))
    out.append("")
    t = pick(scen, "ttl10")
    if t:
        resp = med([r["response_s"] for r in t])
        exp = math.ceil(secs / (resp + ttl))
        out.append("- expected upstream calls for a ttl of %d s: the first "
                   "call, then one each time the answer expires, which is "
                   "ttl after its call ended: ceil(%g / (%.3f + %d)) = %d "
                   "(R = %.3f s, the warm-up's response time, median)"
                   % (ttl, secs, resp, ttl, exp, resp))
        out.append("- target, 1 upstream call per ttl window: %s "
                   "(infergw per run: %s)" % (
                       ok(all(r["upstream_calls"] == exp for r in t)),
                       ", ".join(str(r["upstream_calls"]) for r in t)))
    for a, b in (("ttl10", "ttl0"), ("ttl10", "varnish"), ("ttl10", "nginx"),
                 ("varnish", "nginx")):
        if a in base and b in base:
            x, y = base[a], base[b]
            out.append("- %s against %s: %.2fx the requests, %.2fx the "
                       "upstream calls, TTFB p50 %.2fx, p99 %.2fx" % (
                           a, b, x["req"] / y["req"], x["up"] / y["up"],
                           x["t50"] / y["t50"], x["t99"] / y["t99"]))
    out.append("- " + noise(rs_all))
    out.append("")

seq = [r for r in rows if r["scenario"] == "seq"]
if seq:
    ns = sorted({r["n"] for r in seq})
    reps = max(r["rep"] for r in seq)
    out.append("### b. Sequential identical streaming requests, each sent "
               "once the previous one ended (%d runs, medians)\n" % reps)
    out.append("| server | " + " | ".join(
        "%d requests: upstream calls (per run) | hits" % n for n in ns)
        + " |")
    out.append("|---|" + "---|---|" * len(ns))
    for s in ("ttl0", "ttl10", "varnish", "nginx"):
        if not pick("seq", s):
            continue
        cells = []
        for n in ns:
            rs = pick("seq", s, n=n)
            cells.append("%g (%s) | %g" % (
                med([r["upstream_calls"] for r in rs]),
                ", ".join(str(r["upstream_calls"]) for r in rs),
                med([r["hits"] for r in rs])))
        out.append("| %s | %s |" % (NAMES[s], " | ".join(cells)))
    out.append("")
    t = [r for r in seq if r["server"] == "ttl10"]
    v = [r for r in seq if r["server"] == "varnish"]
    out.append("- target, infergw with a ttl costs 1 call like Varnish: %s "
               "(infergw: %s; Varnish: %s)" % (
                   ok(all(r["upstream_calls"] == 1 for r in t)),
                   ", ".join(str(r["upstream_calls"]) for r in t),
                   ", ".join(str(r["upstream_calls"]) for r in v)))
    bad = sum(r["requests"] - r["ok"] for r in seq)
    out.append("- answers other than 200: %d" % bad)
    out.append("- " + noise(seq))
    out.append("")

for body in ("json", "stream"):
    hr = [r for r in rows if r["scenario"] == "hit-" + body]
    if not hr:
        continue
    reps = max(r["rep"] for r in hr)
    r0 = hr[0]
    out.append("### c. CPU of a hit, %s answer: wrk, %d kept-alive "
               "connections, %d s a run (%d runs, medians)\n" % (
                   "non-streamed JSON" if body == "json"
                   else "streamed SSE", r0["conns"], r0["seconds"], reps))
    out.append("| server | hits/s | bytes per hit (head and body) | "
               "latency p50 / p99 µs | server CPU s | "
               "CPU µs per hit (per run) | / nginx | upstream calls | "
               "errors |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    per = {}
    for s in ("ttl10", "nginx", "varnish", "floor"):
        rs = pick("hit-" + body, s)
        if not rs:
            continue
        us = [r["server_cpu_ms"] * 1000 / max(1, r["requests"]) for r in rs]
        per[s] = med(us)
    for s in ("ttl10", "nginx", "varnish", "floor"):
        rs = pick("hit-" + body, s)
        if not rs:
            continue
        us = [r["server_cpu_ms"] * 1000 / max(1, r["requests"]) for r in rs]
        out.append("| %s | %.0f | %.0f | %g / %g | %.2f | %.1f (%s) | "
                   "%.2fx | %d | %d |" % (
            NAMES[s].split(",")[0] if s == "ttl10"
            else NAMES[s] if s == "floor" else s,
            med([r["requests"] / r["seconds"] for r in rs]),
            med([r["bytes"] / max(1, r["requests"]) for r in rs]),
            med([r["lat_p50_us"] for r in rs]),
            med([r["lat_p99_us"] for r in rs]),
            med([r["server_cpu_ms"] for r in rs]) / 1000.0,
            per[s], ", ".join("%.1f" % u for u in us),
            per[s] / per["nginx"] if per.get("nginx") else NAN,
            sum(r["upstream_calls"] for r in rs),
            sum(r["errors"] + r["non_2xx"] for r in rs)))
    out.append("")
    if per.get("ttl10") and per.get("nginx"):
        out.append("- target, infergw's CPU per hit at most 1.5x nginx's: "
                   "%s (%.1f / %.1f µs = %.2fx)" % (
                       ok(per["ttl10"] <= 1.5 * per["nginx"]), per["ttl10"],
                       per["nginx"], per["ttl10"] / per["nginx"]))
    if per.get("ttl10") and per.get("floor") and per.get("nginx"):
        out.append("- against the model's floor (a thread per connection "
                   "that only reads a request and writes the kept bytes): "
                   "the floor costs %.2fx nginx; infergw %.2fx the floor "
                   "(%.1f µs above it)" % (
                       per["floor"] / per["nginx"],
                       per["ttl10"] / per["floor"],
                       per["ttl10"] - per["floor"]))
    out.append("- every answer a hit: %s (upstream calls during the runs: "
               "%d)" % (ok(all(r["upstream_calls"] == 0 for r in hr)),
                        sum(r["upstream_calls"] for r in hr)))
    out.append("- " + noise(hr))
    out.append("")
print("\n".join(out))
EOF
cat "$TMP/report.md"
if [ -n "$OUT" ]; then
    cp "$TMP/report.md" "$OUT"
fi
