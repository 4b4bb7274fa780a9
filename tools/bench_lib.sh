# SPDX-License-Identifier: MIT
# tools/bench_lib.sh - shared by the benchmark scripts (sourced, not run).
#
# free_port: a free loopback port (the kernel's pick, released before use,
# so a tiny race with other programs is possible and shows as a start-up
# failure).  wait_line FILE REGEX: until FILE has a line matching REGEX,
# 5 s at most, else the script's die().  stop PID...: SIGTERM, then
# SIGKILL after 5 s, and reaped; only the script's own processes.
#
# bench_tmp: a temp dir in $TMP and $PIDS, the background processes the
# script starts; on exit every one is killed and reaped and the dir
# removed (kept, and named, when KEEP is set).
#
# wait_http URL: until it answers 200, 5 s at most.  nginx_start NAME
# WORKERS PORT HTTP_EXTRA SERVER_EXTRA: an nginx of the script's own under
# $TMP/NAME ($NGINX, as the current user, logging nothing); origin_start
# and proxy_start, the two nginx of the relay benchmarks.  wait_quiet:
# until the machine is quiet enough to measure.  wrk_summary FILE: the
# figures of one wrk run.
#
# FLOOR_H1..3: the request lines infergw sends upstream besides
# Content-Type and "Expect:" (gateway/upstream/upstream_request.c), for
# tools/relay_floor -c's -H: libcurl spends some 3.8k instructions per
# request on each, so the model's floor sends the same request.

FLOOR_H1='Accept: application/json, text/event-stream'
FLOOR_H2='Accept-Encoding: identity'
FLOOR_H3='X-Request-Id: 0123456789abcdef'

bench_tmp() {
    TMP=$(mktemp -d)
    PIDS=""
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    if [ -z "${KEEP:-}" ]; then rm -rf "$TMP"; else echo "kept $TMP" >&2; fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() {
    i=0
    while [ $i -lt 100 ]; do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null)" = 200 ]; then
            return 0
        fi
        i=$((i + 1))
        sleep 0.05
    done
    return 1
}

wait_line() {   # wait_line FILE REGEX
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 250 ] || die "no '$2' in $1: $(tail -3 "$1")"
        sleep 0.02
    done
}

stop() {        # stop PID...
    for p in "$@"; do
        kill "$p" 2>/dev/null || continue
        i=0
        # kill -0 succeeds on a zombie: look at the state instead.
        while [ $i -lt 100 ]; do
            st=$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null || true)
            case $st in "" | Z) break ;; esac
            sleep 0.05
            i=$((i + 1))
        done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}

# wait_quiet: before a measurement, wait at most QUIET_MAX s (default
# 150) until the 1-minute load average is under LOAD_MAX (default 1.5)
# and one second passes with all CPUs together under QUIET_PCT % busy
# (default 30), whoever used them.  Leaves what it last saw in
# QUIET_LOAD and QUIET_BUSY and the seconds it waited in QUIET_WAITED,
# for the script to report beside its numbers; says so on stderr when
# it gives up and measures anyway.
wait_quiet() {
    QUIET_WAITED=0
    while :; do
        q0=$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat)
        sleep 1
        q1=$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat)
        QUIET_BUSY=$(((q1 - q0) * 100 / ($(getconf CLK_TCK) * $(nproc))))
        QUIET_LOAD=$(cut -d' ' -f1 /proc/loadavg)
        if [ "$QUIET_BUSY" -lt "${QUIET_PCT:-30}" ] && awk -v l="$QUIET_LOAD" \
            -v m="${LOAD_MAX:-1.5}" 'BEGIN { exit !(l < m) }'; then
            return 0
        fi
        QUIET_WAITED=$((QUIET_WAITED + 1))
        if [ "$QUIET_WAITED" -ge "${QUIET_MAX:-150}" ]; then
            echo "wait_quiet: load average $QUIET_LOAD, ${QUIET_BUSY}% busy" \
                "after ${QUIET_WAITED}s; measuring" >&2
            return 0
        fi
    done
}

nginx_start() {  # nginx_start NAME WORKERS PORT HTTP_EXTRA SERVER_EXTRA
    d=$TMP/$1
    mkdir -p "$d/logs" "$d/tmp"
    cat >"$d/nginx.conf" <<EOF
worker_processes $2;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 4096; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    $4
    server {
        listen 127.0.0.1:$3;
$5
    }
}
EOF
    "$NGINX" -p "$d" -e "$d/logs/error.log" -c "$d/nginx.conf" \
        -g 'daemon off;' >"$d/logs/stdout.log" 2>&1 &
    PIDS="$PIDS $!"
}

# origin_start WORKERS: the origin of the relay benchmarks, an nginx that
# answers POST /v1/chat/completions with $CHAT_BODY and GET /v1/models
# with $MODELS_BODY ('return 200': no think time, no parsing), and
# /health for the gateway's health beat.  Sets ORIGIN_PORT.
origin_start() {
    ORIGIN_PORT=$(free_port)
    nginx_start origin "$1" "$ORIGIN_PORT" "" "
        default_type application/json;
        location = /v1/chat/completions {
            client_body_buffer_size 16k;
            return 200 '$CHAT_BODY';
        }
        location = /v1/models { return 200 '$MODELS_BODY'; }
        location = /health { return 200 'ok'; }"
    wait_http "http://127.0.0.1:$ORIGIN_PORT/v1/models" \
        || die "origin nginx did not start: $(cat "$TMP/origin/logs/"*.log)"
}

# proxy_start WORKERS: nginx as a reverse proxy to the origin, keeping
# its upstream connections alive (HTTP/1.1, Connection "", keepalive 64)
# as the gateway's libcurl pool does.  Sets PROXY_PORT.
proxy_start() {
    PROXY_PORT=$(free_port)
    nginx_start proxy "$1" "$PROXY_PORT" "
    upstream origin {
        server 127.0.0.1:$ORIGIN_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }" "
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }"
    wait_http "http://127.0.0.1:$PROXY_PORT/v1/models" \
        || die "proxy nginx did not start: $(cat "$TMP/proxy/logs/"*.log)"
}

# wrk_summary FILE: one wrk --latency run's output as "req/s, p50 µs,
# p99 µs, requests, errors" (tab-separated), where errors counts the
# non-2xx answers and the socket errors together.
wrk_summary() {
    python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
unit = {"us": 1.0, "ms": 1e3, "s": 1e6}
def pct(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)\s*$" % p, t, re.M)
    return float(m.group(1)) * unit[m.group(2)]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
n = int(re.search(r"(\d+) requests in", t).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
sock = re.search(r"Socket errors: (.*)", t)
errs = int(bad.group(1)) if bad else 0
if sock:
    errs += sum(int(x) for x in re.findall(r"\d+", sock.group(1)))
print("%.1f\t%.1f\t%.1f\t%d\t%d" % (rps, pct(50), pct(99), n, errs))
PY
}
