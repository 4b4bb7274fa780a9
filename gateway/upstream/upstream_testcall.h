/* SPDX-License-Identifier: MIT */
/*
 * upstream_testcall.h - test builds only (INFERGW_UNIT_TEST): a call
 * whose attempts have no libcurl transfer, so that a test
 * (test/fuzz/fuzz_upstream.c) can feed upstream.c's response callbacks
 * by hand, exactly as libcurl does.
 *
 * Ownership: a struct upstream_testcall is the caller's, from _new to
 * _free, and used by one thread.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_UPSTREAM_TESTCALL_H
#define INFERGW_GATEWAY_UPSTREAM_UPSTREAM_TESTCALL_H

#include <stddef.h>

#include "upstream/upstream.h"

#ifdef INFERGW_UNIT_TEST
/*
 * Test-only: a call whose attempts have no libcurl transfer, so that a
 * test (test/fuzz/fuzz_upstream.c) can feed the response callbacks by
 * hand, exactly as libcurl does: header lines one per call with their
 * line end, then body pieces.  The sink and opts are borrowed (opts NULL:
 * defaults); nothing is sent anywhere.
 */
struct upstream_testcall;

struct upstream_testcall *upstream_testcall_new(
    const struct upstream_opts *opts, const struct upstream_sink *sink);
void upstream_testcall_free(struct upstream_testcall *t);   /* NULL-safe */

/*
 * Start the next attempt, as upstream_perform() does: the first, or a
 * hedge while the first still runs and nothing has won.  Returns its
 * index (0 or 1), or -1 when no attempt may start.
 */
int upstream_testcall_start(struct upstream_testcall *t);

/* libcurl's CURLOPT_HEADERFUNCTION and CURLOPT_WRITEFUNCTION for
 * attempt 'i': 'n' to go on, anything else stops its transfer. */
size_t upstream_testcall_header(struct upstream_testcall *t, int i, char *p,
                                size_t n);
size_t upstream_testcall_body(struct upstream_testcall *t, int i, char *p,
                              size_t n);

/* Attempt 'i' was started and has not ended. */
int upstream_testcall_running(const struct upstream_testcall *t, int i);

/*
 * libcurl is done with attempt 'i' (a CURLcode: CURLE_WRITE_ERROR after
 * a callback stopped it): settle it as the transfer loop does.  Returns
 * its result (borrowed; also for an attempt that had already ended).
 */
const struct upstream_result *upstream_testcall_finish(
    struct upstream_testcall *t, int i, int curl_code);

/* What the loop does after every wake-up: end an attempt that lost. */
void upstream_testcall_reap(struct upstream_testcall *t);
#endif

#endif
