#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/bench_tls.sh - what TLS costs in infergw against nginx (issue 10).
#
# One run, with the same certificate and key for both servers (from
# mkcert: EC P-256, SAN localhost and 127.0.0.1), TLS 1.2 only on both,
# measures with wrk:
#
# 1. New connections per second.  GET /healthz with "Connection: close"
#    on every request, so every request is a new TCP connection and a
#    TLS handshake: infergw's own /healthz against an nginx server
#    block answering return 200 '{"status":"ok"}'.  Full handshakes with
#    session resumption off on both (an infergw with tls_session_timeout
#    = 0; nginx ssl_session_cache off, ssl_session_tickets off), and
#    resumed ones from session tickets on both (a second infergw with
#    tls_session_timeout = 1h; an nginx server with ssl_session_tickets
#    on, ssl_session_timeout 1h, no cache): wrk keeps each connection's
#    TLS session when it reconnects (SSL_clear() keeps it), so after its
#    first handshake each of its connections offers the ticket back.  The
#    check before the runs counts how many resumed, and infergw's resumed
#    share of every run is in the table.  The same over plain HTTP, so
#    the TLS share of a connection shows.  Each server's CPU
#    (utime + stime from /proc, every process and thread) over the run
#    is divided by the connections it accepted (infergw's /metrics, nginx's
#    stub_status), and infergw's handshake counter and nginx's accepts are
#    compared with wrk's request count (one each per request).
#    The two libraries do not pick the same key exchange from the same
#    ClientHello (the check before the runs prints what each negotiates),
#    so beside the defaults there are rows with the parameters made equal:
#      nginx, P-521 + ChaCha20   nginx set to what mbedTLS picks by default
#                                (ssl_ecdh_curve secp521r1, ssl_ciphers
#                                ECDHE-ECDSA-CHACHA20-POLY1305);
#      client offers P-256 only  wrk's OpenSSL limited to P-256 through
#                                OPENSSL_CONF (Groups = P-256), against
#                                both servers at their defaults.
# 2. Streaming over TLS.  C concurrent clients (wrk, keep-alive, a Lua
#    script for the POST) each loop a streaming chat completion from the
#    bundled mock (-n 100 -d 10: 103 SSE chunks 10 ms apart, about 1 s a
#    stream; "temperature":0.7 so that infergw never coalesces them),
#    through infergw and through nginx as a reverse proxy (HTTP/1.1,
#    proxy_buffering off, keep-alive upstream), each over TLS and over
#    plain HTTP.  It reports streams/s, p50/p99 stream time and the
#    proxy's CPU per relayed chunk, two ways:
#      steady state  the CPU from 2 s after the start (every connection
#                    open and, over TLS, its handshake done: checked) to
#                    1 s before the end, over the chunks of
#                    window x C / mean stream time streams (every
#                    connection always has one stream in flight);
#      whole run     all the CPU, the C handshakes at the start included,
#                    over the chunks in the bytes wrk read (exact, from
#                    wrk's done() summary, divided by the bytes of one
#                    whole response through the same proxy), so streams
#                    cut off when wrk stops count for what they got.
#    Over plain HTTP, where there is no handshake, the two agree.
#
# Fairness: nginx runs worker_processes auto (one per core, the CPU the
# gateway's threads can use) and access_log off; infergw access_log = off
# and log_level = warn.  Targets are interleaved inside each repetition,
# REPS repetitions, medians in the table.  Before every group the script
# waits up to QUIET_MAX s for the machine to be under QUIET_PCT % busy and
# records what it saw; wrk, both servers and the mock share the cores.
#
# Usage: sh tools/bench_tls.sh        (make first; BIN= for another build)
# Environment:
#   BIN=build/default/bin   infergw, mock_upstream and mkcert
#   HS_DURATION=5           seconds of one new-connection run
#   HS_CONNS=16             wrk connections of the new-connection runs
#   DURATION=10             seconds of one streaming run
#   CONNS="50 200"          streaming client counts; empty: none
#   REPS=3                  interleaved repetitions
#   QUIET_PCT=30 QUIET_MAX=10
#   OUT=FILE                also write the tables to FILE
#   KEEP=1                  keep the temp dir (configs, logs, raw output)
# Defaults: 9 x 3 new-connection runs of 5 s and 2 x 4 x 3 streaming runs
# of 10 s; with the checks, the warm-up and the quiet waits about 8 minutes
# on a quiet machine (6 min 53 s on the reference machine before the two
# resumed targets came); with CONNS= about 2.5 minutes.
set -eu

ORIG=$(pwd)
cd "$(dirname "$0")/.."
BIN=${BIN:-build/default/bin}
case $BIN in /*) ;; *) [ -d "$ORIG/$BIN" ] && BIN=$ORIG/$BIN ;; esac
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
HS_DURATION=${HS_DURATION:-5}
HS_CONNS=${HS_CONNS:-16}
DURATION=${DURATION:-10}
CONNS=${CONNS-50 200}
REPS=${REPS:-3}
QUIET_PCT=${QUIET_PCT:-30}
QUIET_MAX=${QUIET_MAX:-10}
OUT=${OUT:-}
case $OUT in ''|/*) ;; *) OUT=$ORIG/$OUT ;; esac
KEEP=${KEEP:-}
HS_DURATION=${HS_DURATION%s}
DURATION=${DURATION%s}
[ "$DURATION" -ge 5 ] || { echo "bench_tls: DURATION must be >= 5 (s)" >&2; exit 1; }
SESSION_TIMEOUT=1h      # the ticket lifetime of the resumed targets

die() { echo "bench_tls: $*" >&2; exit 1; }
say() { echo "bench_tls: $*" >&2; }

if ! command -v wrk >/dev/null 2>&1 || ! [ -x /usr/sbin/nginx ] \
    || ! command -v curl >/dev/null 2>&1; then
    sh tools/install-deps.sh wrk nginx-light curl \
        || die "cannot install wrk, nginx-light, curl"
fi
NGINX=$(command -v nginx || true)
[ -n "$NGINX" ] || NGINX=/usr/sbin/nginx
for t in wrk "$NGINX" python3 curl; do
    command -v "$t" >/dev/null 2>&1 \
        || die "$t not found: sh tools/install-deps.sh wrk nginx-light curl"
done
for t in "$BIN/infergw" "$BIN/mock_upstream" "$BIN/mkcert"; do
    [ -x "$t" ] || die "$t not built (make, or set BIN=)"
done
HAVE_OPENSSL=0
command -v openssl >/dev/null 2>&1 && HAVE_OPENSSL=1

. tools/bench_lib.sh
bench_tmp

wait_http() {   # wait_http URL [curl options]: until it answers 200 (5 s)
    u=$1
    shift
    i=0
    while [ $i -lt 100 ]; do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' "$@" "$u" \
            2>/dev/null)" = 200 ]; then
            return 0
        fi
        i=$((i + 1))
        sleep 0.05
    done
    return 1
}

# ---- certificate, mock, gateway, nginx ---------------------------------

mkdir "$TMP/cert"
"$BIN/mkcert" "$TMP/cert" >"$TMP/mkcert.out" 2>&1 \
    || die "mkcert failed: $(cat "$TMP/mkcert.out")"
CERT=$TMP/cert/server.pem
KEY=$TMP/cert/server.key
CA=$TMP/cert/ca.pem

# The client-side key exchange restriction of the "client offers P-256
# only" rows: OpenSSL reads it at start-up (wrk and s_client alike).
cat >"$TMP/p256.cnf" <<'EOF'
openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
Groups = P-256
EOF

"$BIN/mock_upstream" -l 127.0.0.1:0 -q -n 100 -d 10 >"$TMP/mock.out" 2>&1 &
PIDS="$PIDS $!"
wait_line "$TMP/mock.out" 'listening port='
MOCK=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$TMP/mock.out")

# log_level = warn keeps the per-request info lines out of the CPU
# figures, and with them the "listening" lines: so ports of ours.
# gateway NAME PLAIN_PORT TLS_PORT TLS_SESSION_TIMEOUT: start an infergw,
# its pid in $GW_STARTED.  Two of them: one with resumption off (full
# handshakes), one with session tickets.
gateway() {
    cat >"$TMP/$1.conf" <<EOF
[server]
listen = 127.0.0.1:$2
tls_listen = 127.0.0.1:$3
tls_cert = $CERT
tls_key = $KEY
tls_min_version = 1.2
tls_session_timeout = $4
log_level = warn
access_log = off
max_connections = 4096
[upstream]
url = http://127.0.0.1:$MOCK
[routing]
health_interval = 0
EOF
    "$BIN/infergw" -c "$TMP/$1.conf" >"$TMP/$1.log" 2>&1 &
    GW_STARTED=$!
    PIDS="$PIDS $GW_STARTED"
    wait_http "http://127.0.0.1:$2/healthz" \
        || die "infergw did not start: $(cat "$TMP/$1.log")"
}
GW_PLAIN=$(free_port)
GW_TLS=$(free_port)
GWR_PLAIN=$(free_port)
GWR_TLS=$(free_port)
gateway infergw "$GW_PLAIN" "$GW_TLS" 0
GW_PID=$GW_STARTED
gateway infergw-resumed "$GWR_PLAIN" "$GWR_TLS" "$SESSION_TIMEOUT"
GWR_PID=$GW_STARTED

NG_PLAIN=$(free_port)
NG_TLS=$(free_port)
NG_TLSM=$(free_port)
NG_CHK=$(free_port)
NG_CHKM=$(free_port)
NG_TLSR=$(free_port)
NG_CHKR=$(free_port)
N=$TMP/nginx
mkdir -p "$N/logs" "$N/tmp"
LOCS='
        location = /healthz {
            default_type application/json;
            return 200 '"'"'{"status":"ok"}'"'"';
        }
        location = /nginx_status { stub_status; }
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }'
MATCH='
        ssl_ecdh_curve secp521r1;
        ssl_ciphers ECDHE-ECDSA-CHACHA20-POLY1305;'
RESUME="
        ssl_session_tickets on;
        ssl_session_timeout $SESSION_TIMEOUT;"
# The two "check" servers are the measured ones plus an access log of
# what each connection negotiated; they serve only the checks.
cat >"$N/nginx.conf" <<EOF
worker_processes auto;
pid $N/nginx.pid;
error_log $N/logs/error.log warn;
events { worker_connections 8192; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $N/tmp/body;
    proxy_temp_path $N/tmp/proxy;
    fastcgi_temp_path $N/tmp/fastcgi;
    uwsgi_temp_path $N/tmp/uwsgi;
    scgi_temp_path $N/tmp/scgi;
    keepalive_requests 1000000;
    ssl_certificate $CERT;
    ssl_certificate_key $KEY;
    ssl_protocols TLSv1.2;
    ssl_session_cache off;
    ssl_session_tickets off;
    log_format tlscheck '\$ssl_protocol \$ssl_cipher \$ssl_curve \$ssl_session_reused \$status';
    upstream mock {
        server 127.0.0.1:$MOCK;
        keepalive 1024;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$NG_PLAIN backlog=4096;
        listen 127.0.0.1:$NG_TLS ssl backlog=4096;
$LOCS
    }
    server {
        listen 127.0.0.1:$NG_TLSM ssl backlog=4096;
$MATCH
$LOCS
    }
    server {
        listen 127.0.0.1:$NG_CHK ssl backlog=4096;
        access_log $N/logs/check.log tlscheck;
$LOCS
    }
    server {
        listen 127.0.0.1:$NG_CHKM ssl backlog=4096;
        access_log $N/logs/check-match.log tlscheck;
$MATCH
$LOCS
    }
    server {
        listen 127.0.0.1:$NG_TLSR ssl backlog=4096;
$RESUME
$LOCS
    }
    server {
        listen 127.0.0.1:$NG_CHKR ssl backlog=4096;
        access_log $N/logs/check-resumed.log tlscheck;
$RESUME
$LOCS
    }
}
EOF
"$NGINX" -p "$N" -e "$N/logs/error.log" -c "$N/nginx.conf" \
    -g 'daemon off;' >"$N/logs/stdout.log" 2>&1 &
NG_PID=$!
PIDS="$PIDS $NG_PID"
wait_http "http://127.0.0.1:$NG_PLAIN/healthz" \
    || die "nginx did not start: $(cat "$N/logs/error.log")"

# ---- targets --------------------------------------------------------------

# url_of TARGET PATH; pids_of TARGET; env_of TARGET (the client's OpenSSL)
url_of() {
    case $1 in
    infergw-tls|infergw-tls-p256) echo "https://127.0.0.1:$GW_TLS$2" ;;
    infergw-tls-resumed) echo "https://127.0.0.1:$GWR_TLS$2" ;;
    infergw-plain) echo "http://127.0.0.1:$GW_PLAIN$2" ;;
    nginx-tls|nginx-tls-p256) echo "https://127.0.0.1:$NG_TLS$2" ;;
    nginx-tls-p521) echo "https://127.0.0.1:$NG_TLSM$2" ;;
    nginx-tls-resumed) echo "https://127.0.0.1:$NG_TLSR$2" ;;
    nginx-plain) echo "http://127.0.0.1:$NG_PLAIN$2" ;;
    esac
}
pids_of() {
    case $1 in
    infergw-tls-resumed) echo "$GWR_PID" ;;
    infergw*) echo "$GW_PID" ;;
    nginx*) echo "$NG_PID $(pgrep -P "$NG_PID" | tr '\n' ' ')" ;;
    esac
}
env_of() {
    case $1 in
    *-p256) echo "OPENSSL_CONF=$TMP/p256.cnf" ;;
    *) echo "BENCH_TLS=1" ;;
    esac
}
# counters TARGET: "connections handshakes resumed" as the server counts
# them (nginx counts accepts only: resumed is -1).  Each query is itself
# one connection, counted in the next reading.
counters() {
    case $1 in
    infergw*)
        port=$GW_PLAIN
        [ "$1" = infergw-tls-resumed ] && port=$GWR_PLAIN
        curl -s "http://127.0.0.1:$port/metrics" | awk '
            /^infergw_connections_total / { c = $2 }
            /^infergw_tls_handshakes_total\{result="ok"\}/ { h = $2 }
            /^infergw_tls_resumed_total / { r = $2 }
            END { print c + 0, h + 0, r + 0 }' ;;
    nginx*)
        curl -s "http://127.0.0.1:$NG_PLAIN/nginx_status" | awk '
            NR == 3 { print $1, $1, -1 }' ;;
    esac
}
ticks() {       # CPU ticks (utime + stime, all threads) of the processes
    t=0
    for p in "$@"; do
        v=$(awk '{print $14 + $15}' "/proc/$p/stat")
        t=$((t + v))
    done
    echo "$t"
}
cpu_stat() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }

# busy_pct: how busy the whole machine is over one second (0-100).
busy_pct() {
    a=$(cpu_stat)
    sleep 1
    b=$(cpu_stat)
    echo "$a $b" | awk '{ t = ($3 - $1) + ($4 - $2);
        print (t > 0 ? int(100 * ($3 - $1) / t) : 0) }'
}
: >"$TMP/busy"
wait_quiet() {
    waited=0
    while :; do
        pct=$(busy_pct)
        if [ "$pct" -lt "$QUIET_PCT" ] || [ "$waited" -ge "$QUIET_MAX" ]; then
            break
        fi
        waited=$((waited + 1))
    done
    echo "$pct" >>"$TMP/busy"
}

BODY='{"model":"mock-model","messages":[{"role":"user","content":"tls"}],"stream":true,"temperature":0.7}'
DONE_LUA='
done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("RESULT %d %d %d %d %d %d %d %d\n",
        summary.requests, summary.bytes, summary.duration,
        e.connect + e.read + e.write + e.timeout, e.status,
        latency:percentile(50), latency:percentile(99), latency.mean))
end'
cat >"$TMP/hs.lua" <<EOF
wrk.headers["Connection"] = "close"
$DONE_LUA
EOF
cat >"$TMP/stream.lua" <<EOF
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
$DONE_LUA
EOF

# wrk_run OUTFILE TARGET CONNS SECONDS LUA PATH: wrk, with its own CPU
# (getrusage of the child) appended as "CLIENT_CPU_S s".
wrk_run() {
    # shellcheck disable=SC2046
    env $(env_of "$2") python3 -c '
import resource, subprocess, sys
out = open(sys.argv[1], "w")
rc = subprocess.call(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
out.write("CLIENT_CPU_S %.4f\n" % (u.ru_utime + u.ru_stime))
sys.exit(rc)' "$1" wrk -t2 -c"$3" -d"$4s" --timeout 10s -s "$5" \
        "$(url_of "$2" "$6")" || die "wrk failed: $(cat "$1")"
    grep -q '^RESULT ' "$1" || die "wrk printed no result: $(cat "$1")"
}

# ---- checks ---------------------------------------------------------------

CHECK=$TMP/check.md
: >"$CHECK"
for t in infergw-tls infergw-plain nginx-tls nginx-tls-p521 nginx-plain; do
    got=$(curl -s --cacert "$CA" "$(url_of "$t" /healthz)")
    [ "$got" = '{"status":"ok"}' ] || die "$t /healthz answered: $got"
done

# What each side negotiates from OpenSSL's default ClientHello (wrk's) and
# whether a client that offers its session back gets it resumed.
negotiated() {  # negotiated TARGET PORT: "cipher; key exchange; resumed n/6"
    if [ "$HAVE_OPENSSL" = 1 ]; then
        # shellcheck disable=SC2046
        env $(env_of "$1") openssl s_client -connect "127.0.0.1:$2" \
            -CAfile "$CA" -reconnect </dev/null >"$TMP/sc-$1" 2>&1 || true
        c=$(sed -n 's/^New, \(TLSv1\.[0-9]\), Cipher is \(.*\)/\1 \2/p' \
            "$TMP/sc-$1" | head -1)
        k=$(sed -n 's/^Server Temp Key: //p' "$TMP/sc-$1" | head -1)
        v=$(sed -n 's/^ *Verify return code: //p' "$TMP/sc-$1" | head -1)
        n=$(grep -c '^New,' "$TMP/sc-$1" || true)
        r=$(grep -c '^Reused,' "$TMP/sc-$1" || true)
        echo "$c; $k; verify $v; s_client -reconnect: $n new, $r reused"
    else
        # shellcheck disable=SC2046
        env $(env_of "$1") curl -sv --cacert "$CA" -o /dev/null \
            "https://127.0.0.1:$2/healthz" 2>&1 \
            | sed -n 's/.*SSL connection using //p' | head -1
    fi
}
{
    echo "Negotiated (openssl s_client, OpenSSL's default ClientHello as wrk sends it):"
    echo ""
    echo "- infergw: $(negotiated infergw-tls "$GW_TLS")"
    echo "- infergw, client offers P-256 only: $(negotiated infergw-tls-p256 "$GW_TLS")"
    echo "- nginx: $(negotiated nginx-tls "$NG_TLS")"
    echo "- nginx, P-521 + ChaCha20: $(negotiated nginx-tls-p521 "$NG_TLSM")"
    echo "- nginx, client offers P-256 only: $(negotiated nginx-tls-p256 "$NG_TLS")"
} >>"$CHECK"
grep -q ' [1-9][0-9]* reused' "$CHECK" && die "a session was resumed: $(cat "$CHECK")"
# The resumed targets: s_client -reconnect offers its session 5 times.
if [ "$HAVE_OPENSSL" = 1 ]; then
    for t in infergw-tls-resumed nginx-tls-resumed; do
        case $t in
        infergw*) port=$GWR_TLS ;;
        nginx*) port=$NG_TLSR ;;
        esac
        line=$(negotiated "$t" "$port")
        echo "- $t: $line" >>"$CHECK"
        echo "$line" | grep -q ': 1 new, 5 reused' \
            || die "$t did not resume sessions: $line"
    done
fi

# Does wrk make a new TLS handshake for every request with
# "Connection: close"?  infergw counts its handshakes; nginx logs
# $ssl_session_reused for each request on its check servers.
printf '\nHandshakes per request, wrk -c %s for 2 s with Connection: close:\n\n' \
    "$HS_CONNS" >>"$CHECK"
for t in infergw-tls infergw-tls-resumed; do
    # shellcheck disable=SC2046
    set -- $(counters $t)
    c0=$1 h0=$2 r0=$3
    wrk_run "$TMP/chk-$t" $t "$HS_CONNS" 2 "$TMP/hs.lua" /healthz
    # shellcheck disable=SC2046
    set -- $(counters $t)
    c1=$1 h1=$2 r1=$3
    # shellcheck disable=SC2046
    set -- $(sed -n 's/^RESULT //p' "$TMP/chk-$t")
    reqs=$1
    echo "- $t: $reqs requests, $((h1 - h0)) handshakes counted (infergw_tls_handshakes_total{result=\"ok\"}), $((r1 - r0)) of them resumed (infergw_tls_resumed_total), $((c1 - c0 - 1)) connections" >>"$CHECK"
    [ $((h1 - h0)) -ge $((reqs * 9 / 10)) ] \
        || die "$t counted $((h1 - h0)) handshakes for $reqs requests"
    if [ $t = infergw-tls ]; then
        [ $((r1 - r0)) -eq 0 ] || die "$t resumed $((r1 - r0)) sessions"
    else
        [ $((r1 - r0)) -ge $((reqs * 9 / 10)) ] \
            || die "$t resumed $((r1 - r0)) of $reqs"
    fi
done
for t in chk chkm chkp chkr; do
    case $t in
    chk) port=$NG_CHK log=$N/logs/check.log env=BENCH_TLS=1 name=nginx ;;
    chkr) port=$NG_CHKR log=$N/logs/check-resumed.log env=BENCH_TLS=1
        name="nginx, session tickets" ;;
    chkm) port=$NG_CHKM log=$N/logs/check-match.log env=BENCH_TLS=1
        name="nginx, P-521 + ChaCha20" ;;
    chkp) port=$NG_CHK log=$N/logs/check.log env=OPENSSL_CONF=$TMP/p256.cnf
        name="nginx, client offers P-256 only" ;;
    esac
    : >"$log"
    env "$env" python3 -c '
import subprocess, sys
sys.exit(subprocess.call(sys.argv[2:], stdout=open(sys.argv[1], "w"),
                         stderr=subprocess.STDOUT))' "$TMP/chk-$t" \
        wrk -t2 -c"$HS_CONNS" -d2s -s "$TMP/hs.lua" \
        "https://127.0.0.1:$port/healthz" || die "wrk failed on $name"
    sleep 0.3
    # shellcheck disable=SC2046
    set -- $(sed -n 's/^RESULT //p' "$TMP/chk-$t")
    reqs=$1
    lines=$(wc -l <"$log")
    reused=$(awk '$4 == "r"' "$log" | wc -l)
    what=$(awk '{ print $1, $2, $3 }' "$log" | sort | uniq -c | sort -rn \
        | awk '{ printf "%s%s %s %s (%d)", (NR > 1 ? ", " : ""), $2, $3, $4, $1 }')
    echo "- $name: $reqs requests, $lines logged, $reused with \$ssl_session_reused = r; negotiated by wrk: $what" >>"$CHECK"
    want_reused=0
    [ $t = chkr ] && want_reused=$((reqs * 9 / 10))
    if [ "$lines" -lt $((reqs * 9 / 10)) ] \
        || { [ $t != chkr ] && [ "$reused" -ne 0 ]; } \
        || [ "$reused" -lt "$want_reused" ]; then
        die "$name: $lines handshakes logged, $reused reused, for $reqs requests"
    fi
done

# One whole stream through each proxy: its SSE events and its bytes as
# wrk reads them (head and chunked framing, after TLS).
echo "" >>"$CHECK"
for t in infergw-tls infergw-plain nginx-tls nginx-plain; do
    for i in 1 2 3; do
        curl -s --raw -i --cacert "$CA" -H 'Content-Type: application/json' \
            -d "$BODY" "$(url_of "$t" /v1/chat/completions)" >"$TMP/one-$t-$i"
    done
    ev=$(grep -c '^data: ' "$TMP/one-$t-1" || true)
    [ "$ev" = 103 ] || die "$t: $ev SSE events in one stream, not 103: $(head -c 600 "$TMP/one-$t-1")"
    grep -q '^data: \[DONE\]' "$TMP/one-$t-1" || die "$t: no [DONE]"
    b=$(for i in 1 2 3; do wc -c <"$TMP/one-$t-$i"; done | sort -n | sed -n 2p)
    echo "$t $b" >>"$TMP/streambytes"
done
echo "One stream: 103 SSE events through every proxy; bytes of a whole response (head + chunked body) as wrk reads them: $(awk '{ printf "%s%s %d", (NR > 1 ? ", " : ""), $1, $2 }' "$TMP/streambytes")." >>"$CHECK"

# ---- runs -----------------------------------------------------------------

HZ=$(getconf CLK_TCK)
RAW=$TMP/raw
: >"$RAW"
# run KIND TARGET CONNS SECONDS REP: one wrk run, one line of $RAW.
# A streaming run also takes the proxy's CPU over a steady-state window,
# from SETTLE s after the start (every connection open, its handshake
# done: checked) to 1 s before the end.  wrk keeps every connection busy
# (the next request goes out as the last response ends), so by Little's
# law the window relayed window x C / (mean stream time) streams.
SETTLE=2
run() {
    lua=$TMP/hs.lua path=/healthz nq=1
    [ "$1" = stream ] && lua=$TMP/stream.lua path=/v1/chat/completions nq=2
    f=$TMP/wrk-$1-$2-c$3-r$5
    pids=$(pids_of "$2")
    # shellcheck disable=SC2046
    set -- "$@" $(counters "$2")
    # $6 $7 $8: connections, handshakes, resumed before the run
    cs0=$(cpu_stat)
    # shellcheck disable=SC2086
    t0=$(ticks $pids)
    w0=0 w1=0 u0=0 u1=0 open=0
    if [ "$1" = stream ]; then
        wrk_run "$f" "$2" "$3" "$4" "$lua" "$path" &
        wp=$!
        sleep "$SETTLE"
        # shellcheck disable=SC2086
        w0=$(ticks $pids)
        u0=$(cut -d' ' -f1 /proc/uptime)
        counters "$2" >"$TMP/mid"
        sleep $(($4 - SETTLE - 1))
        # shellcheck disable=SC2086
        w1=$(ticks $pids)
        u1=$(cut -d' ' -f1 /proc/uptime)
        # wrk's connections made (infergw over TLS: handshakes done) by
        # the window's start; the query itself is one more connection
        open=$(echo "$6 $7 $(cat "$TMP/mid")" | awk -v t="$2" '{
            print (t ~ /^infergw-tls/ ? $4 - $2 : $3 - $1 - 1) }')
        wait "$wp" || exit 1
    else
        wrk_run "$f" "$2" "$3" "$4" "$lua" "$path"
    fi
    sleep 0.3           # the servers finish closing what wrk dropped
    # shellcheck disable=SC2086
    t1=$(ticks $pids)
    cs1=$(cpu_stat)
    # shellcheck disable=SC2046
    set -- "$@" $(counters "$2")
    # $6 $7 $8 before, $9 $10 $11 after; every query of ours is one
    # connection
    hsd=$((${10} - $7))
    case $2 in nginx*) hsd=$((hsd - nq)) ;; esac    # accepts: our queries
    resd=$((${11} - $8))
    case $2 in nginx*) resd=-1 ;; esac              # not counted
    busy=$(echo "$cs0 $cs1" | awk '{ t = ($3 - $1) + ($4 - $2);
        print (t > 0 ? int(100 * ($3 - $1) / t) : 0) }')
    win=$(echo "$u0 $u1" | awk '{ printf "%.2f", $2 - $1 }')
    echo "$1 $2 $3 $5 $(sed -n 's/^RESULT //p' "$f") $((t1 - t0)) \
$(sed -n 's/^CLIENT_CPU_S //p' "$f") $(($9 - $6 - nq)) $hsd $busy \
$((w1 - w0)) $win $open $resd" >>"$RAW"
    tail -n 1 "$RAW" | awk '{ printf "  %-6s %-16s c=%-3s rep %s: %8.1f/s  p50 %8.2f ms  p99 %8.2f ms  errors %d/%d  busy %d%%\n", $1, $2, $3, $4, $5 / ($7 / 1e6), $10 / 1e3, $11 / 1e3, $8, $9, $17 }' >&2
}

HS_TARGETS="infergw-tls nginx-tls nginx-tls-p521 infergw-tls-p256 nginx-tls-p256 infergw-tls-resumed nginx-tls-resumed infergw-plain nginx-plain"
ST_TARGETS="infergw-tls nginx-tls infergw-plain nginx-plain"
max_c=0
for c in $CONNS; do [ "$c" -gt "$max_c" ] && max_c=$c; done
# Warm-up: the proxies' upstream connections and threads.
[ "$max_c" -gt 0 ] && for t in $ST_TARGETS; do
    wrk_run "$TMP/warm-$t" "$t" "$max_c" 2 "$TMP/stream.lua" /v1/chat/completions
done

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
say "infergw :$GW_TLS (plain :$GW_PLAIN), nginx :$NG_TLS / :$NG_TLSM (plain :$NG_PLAIN), mock :$MOCK; $REPS x (new connections c=$HS_CONNS ${HS_DURATION}s; streams c=[$CONNS] ${DURATION}s)"
rep=1
while [ "$rep" -le "$REPS" ]; do
    wait_quiet
    for t in $HS_TARGETS; do
        run hs "$t" "$HS_CONNS" "$HS_DURATION" "$rep"
    done
    for c in $CONNS; do
        wait_quiet
        for t in $ST_TARGETS; do
            run stream "$t" "$c" "$DURATION" "$rep"
        done
    done
    rep=$((rep + 1))
done
kill -0 "$GW_PID" 2>/dev/null || die "infergw died: $(cat "$TMP/infergw.log")"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
END=$(date -u +%Y-%m-%dT%H:%M:%SZ)

python3 - "$RAW" "$HZ" "$TMP/streambytes" "$TMP/busy" "$REPS" \
    "$HS_CONNS" "$HS_DURATION" "$DURATION" "$(nproc)" "$LOAD_BEFORE" \
    "$LOAD_AFTER" "$START" "$END" >"$TMP/table.md" <<'EOF'
import statistics, sys
(raw, hz, sbytes, busyf, reps, hs_conns, hs_dur, dur, ncpu, lb, la,
 start, end) = sys.argv[1:]
hz = int(hz)
CHUNKS = 103
sb = dict((l.split()[0], int(l.split()[1])) for l in open(sbytes))
busy = [int(x) for x in open(busyf).read().split()] or [0]
med = statistics.median
rows = {}
errs = 0
for line in open(raw):
    (kind, tgt, c, rep, reqs, nbytes, dur_us, err, status, p50, p99, mean,
     ticks, client_s, conns, hs, run_busy, wticks, win, opened,
     resumed) = line.split()
    reqs, dur_s = int(reqs), int(dur_us) / 1e6
    errs += int(err) + int(status)
    cpu_s = int(ticks) / hz
    r = dict(rate=reqs / dur_s, p50=int(p50) / 1e3, p99=int(p99) / 1e3,
             busy=int(run_busy), reqs=reqs)
    if kind == "hs":
        r["cpu"] = cpu_s * 1e6 / max(1, int(conns))
        r["client"] = float(client_s) * 1e6 / max(1, reqs)
        r["conn_per_req"] = int(conns) / max(1, reqs)
        r["hs_per_req"] = int(hs) / max(1, reqs)
        # infergw's resumed share of its handshakes; nginx: not counted
        r["resumed"] = (int(resumed) / max(1, int(hs))
                        if int(resumed) >= 0 else -1)
    else:
        # whole run: every byte wrk read, cut-off streams included
        chunks = int(nbytes) / sb[tgt] * CHUNKS
        r["whole"] = cpu_s * 1e6 / max(1, chunks)
        # steady state: C streams always in flight, each mean long
        wchunks = float(win) * int(c) / (float(mean) / 1e6) * CHUNKS
        r["steady"] = int(wticks) / hz * 1e6 / max(1, wchunks)
        r["hs"] = int(hs) if "tls" in tgt else 0
        r["late"] = int(opened) < int(c)
    rows.setdefault((kind, tgt, int(c)), []).append(r)
def m(kind, tgt, c, f):
    return med([r[f] for r in rows[(kind, tgt, c)]])

hc = int(hs_conns)
label = {
    "infergw-tls": ("infergw", "TLS, defaults"),
    "nginx-tls": ("nginx", "TLS, defaults"),
    "nginx-tls-p521": ("nginx", "TLS, P-521 + ChaCha20 (mbedTLS's own default choice)"),
    "infergw-tls-p256": ("infergw", "TLS, client offers P-256 only"),
    "nginx-tls-p256": ("nginx", "TLS, client offers P-256 only"),
    "infergw-tls-resumed": ("infergw", "TLS, resumed (session tickets)"),
    "nginx-tls-resumed": ("nginx", "TLS, resumed (session tickets)"),
    "infergw-plain": ("infergw", "plain HTTP"),
    "nginx-plain": ("nginx", "plain HTTP"),
}
plain = {"infergw": "infergw-plain", "nginx": "nginx-plain"}
print("### New connections: GET /healthz, Connection: close, %d connections, "
      "%s s a run" % (hc, hs_dur))
print()
print("| server | transport | conn/s | p50 / p99 ms | handshakes (TLS) or "
      "connections (plain) per request | resumed | server CPU µs per "
      "connection | TLS extra µs (over plain) | client (wrk) CPU µs per "
      "connection | machine busy |")
print("|---|---|---|---|---|---|---|---|---|---|")
HS_ORDER = ("infergw-tls", "nginx-tls", "nginx-tls-p521", "infergw-tls-p256",
            "nginx-tls-p256", "infergw-tls-resumed", "nginx-tls-resumed",
            "infergw-plain", "nginx-plain")
for t in HS_ORDER:
    k = ("hs", t, hc)
    if k not in rows:
        continue
    srv, tr = label[t]
    per = m("hs", t, hc, "hs_per_req" if "tls" in t else "conn_per_req")
    cpu = m("hs", t, hc, "cpu")
    extra = "" if "plain" in t else "%+.0f" % (
        cpu - m("hs", plain[srv], hc, "cpu"))
    res = m("hs", t, hc, "resumed")
    res = "" if "plain" in t else (
        "%.0f %%" % (100 * res) if res >= 0 else "(checked below)")
    print("| %s | %s | %.0f | %.2f / %.2f | %.2f | %s | %.0f | %s | %.0f "
          "| %d %% |" % (
        srv, tr, m("hs", t, hc, "rate"), m("hs", t, hc, "p50"),
        m("hs", t, hc, "p99"), per, res, cpu, extra,
        m("hs", t, hc, "client"), m("hs", t, hc, "busy")))
print()
print("| infergw / nginx, new connections | conn/s | server CPU per connection |")
print("|---|---|---|")
for a, b, what in (
        ("infergw-tls", "nginx-tls", "TLS, both at their defaults"),
        ("infergw-tls", "nginx-tls-p521", "TLS, same parameters (P-521 + ChaCha20)"),
        ("infergw-tls-p256", "nginx-tls-p256", "TLS, client offers P-256 only"),
        ("infergw-tls-resumed", "nginx-tls-resumed",
         "TLS, resumed (session tickets)"),
        ("infergw-plain", "nginx-plain", "plain HTTP")):
    if ("hs", a, hc) in rows and ("hs", b, hc) in rows:
        print("| %s | %.2f× | %.2f× |" % (
            what, m("hs", a, hc, "rate") / m("hs", b, hc, "rate"),
            m("hs", a, hc, "cpu") / m("hs", b, hc, "cpu")))
print()
print("| full against resumed handshakes | CPU µs per connection, full | "
      "resumed | resumed / full | TLS extra µs over plain, full | resumed "
      "| resumed / full | conn/s, full | resumed |")
print("|---|---|---|---|---|---|---|---|---|")
for srv in ("infergw", "nginx"):
    full, res, pl = srv + "-tls", srv + "-tls-resumed", plain[srv]
    if not all(("hs", x, hc) in rows for x in (full, res, pl)):
        continue
    cf, cr, cp = (m("hs", x, hc, "cpu") for x in (full, res, pl))
    print("| %s | %.0f | %.0f | %.2f× | %.0f | %.0f | %.2f× | %.0f | %.0f |"
          % (srv, cf, cr, cr / cf, cf - cp, cr - cp,
             (cr - cp) / max(1e-9, cf - cp), m("hs", full, hc, "rate"),
             m("hs", res, hc, "rate")))
print()
cs = sorted({k[2] for k in rows if k[0] == "stream"})
if cs:
    print("### Streaming: 103 SSE chunks 10 ms apart per stream, keep-alive, "
          "%s s a run" % dur)
    print()
    print("| conns | proxy | transport | streams/s | p50 / p99 stream ms | "
          "CPU µs per chunk, steady state | TLS / plain | CPU µs per chunk, "
          "whole run | TLS / plain | handshakes in the run | machine busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
for c in cs:
    for t in ("infergw-tls", "nginx-tls", "infergw-plain", "nginx-plain"):
        if ("stream", t, c) not in rows:
            continue
        srv, tr = label[t]
        st, wh = m("stream", t, c, "steady"), m("stream", t, c, "whole")
        rs = rw = hs = ""
        if "tls" in t:
            rs = "%.2f×" % (st / m("stream", plain[srv], c, "steady"))
            rw = "%.2f×" % (wh / m("stream", plain[srv], c, "whole"))
            hs = "%.0f" % m("stream", t, c, "hs")
        print("| %d | %s | %s | %.1f | %.0f / %.0f | %.1f | %s | %.1f | %s "
              "| %s | %d %% |" % (
            c, srv, "TLS" if "tls" in t else "plain", m("stream", t, c, "rate"),
            m("stream", t, c, "p50"), m("stream", t, c, "p99"), st, rs, wh,
            rw, hs, m("stream", t, c, "busy")))
if cs:
    print()
    print("| infergw / nginx, streaming | conns | streams/s | p99 stream | "
          "CPU per chunk, steady state | CPU per chunk, whole run |")
    print("|---|---|---|---|---|---|")
for c in cs:
    for a, b, what in (("infergw-tls", "nginx-tls", "TLS"),
                       ("infergw-plain", "nginx-plain", "plain")):
        print("| %s | %d | %.2f× | %.2f× | %.2f× | %.2f× |" % (
            what, c, m("stream", a, c, "rate") / m("stream", b, c, "rate"),
            m("stream", a, c, "p99") / m("stream", b, c, "p99"),
            m("stream", a, c, "steady") / m("stream", b, c, "steady"),
            m("stream", a, c, "whole") / m("stream", b, c, "whole")))
late = sum(r["late"] for k, v in rows.items() if k[0] == "stream" for r in v)
if cs:
    print()
    print("Steady state: the proxy's CPU from 2 s after the start to 1 s "
          "before the end, over C x window / mean stream time x 103 chunks; "
          "whole run: all its CPU, the C handshakes included, over the chunks "
          "in the bytes wrk read.  Runs whose window began before all C "
          "connections were made (to infergw over TLS: their handshakes "
          "done): %d." % late)
print()
print("Medians of %s interleaved runs, %s to %s; %s CPUs shared by wrk, the "
      "servers and the mock; nginx worker_processes auto.  wrk socket "
      "errors, timeouts or non-2xx: %d.  Other work on the machine before "
      "each group: median %d %% busy (max %d %%); load average before/after: "
      "%s / %s.  \"machine busy\" is the whole machine during the run, wrk "
      "and the mock included." % (
          reps, start, end, ncpu, errs, med(busy), max(busy), lb, la))
EOF
{
    cat "$TMP/table.md"
    echo ""
    cat "$CHECK"
} >"$TMP/out.md"
cat "$TMP/out.md"
[ -z "$OUT" ] || cp "$TMP/out.md" "$OUT"
