#!/bin/sh
# Run each Check test binary given as an argument; fail if any fails.
# CK_RUN_CASE / CK_RUN_SUITE pick one case or suite; CK_FORK=no for gdb.
status=0
for t in "$@"; do
    "$t" || status=1
done
exit $status
