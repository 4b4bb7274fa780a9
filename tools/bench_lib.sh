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
