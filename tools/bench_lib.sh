# tools/bench_lib.sh - shared by the benchmark scripts (sourced, not run).
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
