#!/bin/sh
# SPDX-License-Identifier: MIT
# Run each Check test binary given as an argument; fail if any fails.
# CK_RUN_CASE / CK_RUN_SUITE pick one case or suite; CK_FORK=no for gdb.
# A sanitizer build runs slower: Check's per-test timeout is scaled by
# the factor the integration tests' budgets are (INFERGW_TEST_SLOW_FACTOR,
# .ci/run), unless CK_TIMEOUT_MULTIPLIER says otherwise.
if [ -z "${CK_TIMEOUT_MULTIPLIER:-}" ] && [ -n "${INFERGW_TEST_SLOW_FACTOR:-}" ]
then
    factor=${INFERGW_TEST_SLOW_FACTOR%%.*}     # Check takes an integer
    if [ "${factor:-0}" -gt 1 ] 2>/dev/null; then
        CK_TIMEOUT_MULTIPLIER=$factor
        export CK_TIMEOUT_MULTIPLIER
    fi
fi
status=0
for t in "$@"; do
    "$t" || status=1
done
exit $status
