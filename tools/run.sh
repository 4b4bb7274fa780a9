#!/bin/sh
# 'make run': start the bundled mock vLLM upstream with the tutorial's demo
# timing (about 800 ms per response) on the port etc/gateway.conf points
# at, then ./infergw -c etc/gateway.conf in the foreground.  Ctrl-C stops
# both.
set -eu
BIN=${BIN:-build/default/bin}
CONF=${CONF:-etc/gateway.conf}

# The mock listens where [upstream] url points (default 127.0.0.1:8000).
url=$(sed -n 's/^[[:space:]]*url[[:space:]]*=[[:space:]]*//p' "$CONF" | head -n 1)
hostport=${url#http://}
hostport=${hostport%%/*}
[ -n "$hostport" ] || hostport=127.0.0.1:8000

"$BIN/mock_upstream" -l "$hostport" -n 16 -f 100 -d 45 &
mock=$!
trap 'kill "$mock" 2>/dev/null; wait "$mock" 2>/dev/null' EXIT INT TERM

echo "infergw: mock vLLM upstream on $hostport (pid $mock); starting the gateway"
echo "infergw: try the demo in README.md; Ctrl-C stops both"
./infergw -c "$CONF" || true
