#!/bin/sh
# SPDX-License-Identifier: MIT
# 'make run': start the bundled mock vLLM upstream with the tutorial's demo
# timing (about 800 ms per response) on the port the config points at,
# then ./infergw -c CONF in the foreground.  Ctrl-C stops both.
#
#   make run                      etc/gateway.conf: gateway on 8080,
#                                 mock on 8000, admin listener on 8081
#   make run PORT=9080 UPSTREAM_PORT=9000 [ADMIN_PORT=9081]
#                                 the same on other ports (a copy of the
#                                 config with those ports, in build/)
#   make run CONF=FILE            your own config; its [upstream] url
#                                 tells where the mock listens
set -eu
BIN=${BIN:-build/default/bin}
INFERGW=${INFERGW:-./infergw}
CONF=${CONF:-etc/gateway.conf}
PORT=${PORT:-}
UPSTREAM_PORT=${UPSTREAM_PORT:-}
ADMIN_PORT=${ADMIN_PORT:-}
RUN_DIR=${RUN_DIR:-build}     # where the copy of the config goes

if [ ! -r "$CONF" ]; then
    echo "make run: cannot read CONF=$CONF" >&2
    exit 2
fi
if [ -n "$PORT$UPSTREAM_PORT$ADMIN_PORT" ]; then
    for p in $PORT $UPSTREAM_PORT $ADMIN_PORT; do
        case $p in
        ''|*[!0-9]*) echo "make run: '$p' is not a port number" >&2; exit 2 ;;
        esac
    done
    mkdir -p "$RUN_DIR"
    out=$RUN_DIR/run.conf
    # The first listen (in [server]) is the API port, the second (in
    # [admin]) the admin listener's; the first url the upstream's.
    awk -v port="$PORT" -v up="$UPSTREAM_PORT" -v admin="$ADMIN_PORT" '
        /^[[:space:]]*listen[[:space:]]*=/ {
            n++
            p = (n == 1) ? port : admin
            if (p != "") sub(/:[0-9]+[[:space:]]*$/, ":" p)
        }
        /^[[:space:]]*url[[:space:]]*=/ && !u {
            u = 1
            # The port: digits after a colon, then a slash or the end
            # (not the colons of an IPv6 host); a path stays as it was.
            if (up != "" && match($0, /:[0-9]+(\/|[[:space:]]*$)/)) {
                port_end = RSTART + 1
                while (substr($0, port_end, 1) ~ /[0-9]/) port_end++
                $0 = substr($0, 1, RSTART) up substr($0, port_end)
            }
        }
        { print }' "$CONF" > "$out"
    CONF=$out
    echo "infergw: ports from PORT/UPSTREAM_PORT/ADMIN_PORT in $CONF"
fi

# The mock listens where [upstream] url points (default 127.0.0.1:8000).
url=$(sed -n 's/^[[:space:]]*url[[:space:]]*=[[:space:]]*//p' "$CONF" | head -n 1)
hostport=${url#http://}
hostport=${hostport%%/*}
[ -n "$hostport" ] || hostport=127.0.0.1:8000

# Ctrl-C is for the gateway alone.  In a terminal, job control puts each
# command in a process group of its own and the gateway's in the
# foreground, so the terminal's SIGINT reaches the gateway only: it
# drains and exits 0, and so do this script and make (which would
# otherwise die of the signal too, "make: *** [run] Interrupt").  Without
# a terminal there is no job control to turn on.
if [ -t 0 ] && [ -t 1 ]; then
    set -m
fi

mkdir -p "$RUN_DIR"
# The mock logs each completion (the demo's) but not the gateway's own
# health probes and ten-a-second load scrapes: without -v it leaves
# those out, so they do not bury the coalesce: lines.
ready=$RUN_DIR/run-mock.out
: > "$ready"
"$BIN/mock_upstream" -l "$hostport" -n 16 -f 100 -d 45 > "$ready" &
mock=$!
# The mock goes with the script, however it ends (|| : so that set -e
# does not turn a mock already gone into a failure).
trap 'kill "$mock" 2>/dev/null || :; wait "$mock" 2>/dev/null || :' EXIT
trap 'exit 0' INT TERM

# It prints "mock_upstream listening port=N" once it listens; one that
# cannot bind (a vLLM already there, say) exits at once instead.
tries=0
until grep -q '^mock_upstream listening' "$ready"; do
    if ! kill -0 "$mock" 2>/dev/null || [ $tries -ge 100 ]; then
        echo "make run: the mock upstream could not listen on $hostport" >&2
        echo "  (is vLLM or another server on that port?).  Pick free ports:" >&2
        echo "    make run PORT=9080 UPSTREAM_PORT=9000 ADMIN_PORT=9081" >&2
        echo "  or run against your own vLLM with your own config:" >&2
        echo "    make run CONF=FILE" >&2
        exit 1
    fi
    tries=$((tries + 1))
    sleep 0.05
done

echo "infergw: mock vLLM upstream on $hostport (pid $mock); starting the gateway"
echo "infergw: try the demo in README.md; Ctrl-C stops both"
# The gateway's own exit status: 0 after Ctrl-C (or SIGTERM) and a clean
# drain, 1 when it cannot start (its message says why).
status=0
"$INFERGW" -c "$CONF" || status=$?
exit $status
