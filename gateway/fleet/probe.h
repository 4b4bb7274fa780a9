/* SPDX-License-Identifier: MIT */
/*
 * probe.h - a GET of a small document from one upstream, the gateway's
 * own (not a client's): health.c's /health and /v1/models, scrape.c's
 * /metrics.
 *
 * It runs on the calling thread through upstream_perform(), so it goes
 * over a kept connection like any call, bounded in time and size, and
 * ends early once '*stopping' is set.  Not counted as a call, and not
 * judged: the caller decides what an answer means.  Nor logged (but at
 * debug): a probe runs every beat, so its caller logs a failure as one
 * repeating failure (log.h's log_repeat), with probe_why()'s text.
 *
 * Ownership: a struct probe is its caller's, on one thread; probe_init
 * and probe_release bracket its body buffer.
 */
#ifndef INFERGW_GATEWAY_FLEET_PROBE_H
#define INFERGW_GATEWAY_FLEET_PROBE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "upstream/upstream.h"

#define PROBE_DETAIL_MAX 256        /* libcurl's CURL_ERROR_SIZE */
#define PROBE_WHY_MAX (PROBE_DETAIL_MAX + 64)  /* probe_why()'s text */

struct log_repeat;

struct probe {
    const _Atomic int *stopping;    /* borrowed: nonzero ends the GET */
    int status;                     /* OUT: the answer's; 0 none */
    struct buf body;                /* OUT: its body, up to the bound */
    char detail[PROBE_DETAIL_MAX];  /* OUT: libcurl's text for a failure
                                       ("" none) */
};

/* 'max_body': the largest body read (more: CALL_TOO_BIG). */
void probe_init(struct probe *pr, const _Atomic int *stopping,
                size_t max_body);
void probe_release(struct probe *pr);

/*
 * GET 'path' on upstream 'idx' of 'up', within 'timeout_ms'.  OUT: the
 * status and body in 'pr' (reset first).  Returns the call's outcome.
 */
struct call_outcome probe_get(struct upstream *up, size_t idx,
                              const char *path, int64_t timeout_ms,
                              struct probe *pr);

/*
 * What the last probe_get() ('o', its outcome) failed of, as key=value
 * text for a log line, into out[0..n): 'status=503' for an answer,
 * else 'reason="connect failed" detail="..."'.  Returns 'out'.
 */
const char *probe_why(const struct probe *pr, const struct call_outcome *o,
                      char *out, size_t n);

/*
 * Feed 'feed' ("health", "scrape") probed 'path' on the upstream named
 * 'name': it failed ('why', probe_why()'s text or the like) or, with
 * 'why' NULL, it did not.  Logged as the repeating failure 'r' (log.h),
 * "FEED: upstream NAME GET PATH failing ...".  Borrows everything; 'r'
 * is the calling beat thread's.
 */
void probe_note(struct log_repeat *r, const char *feed, const char *name,
                const char *path, const char *why);

#endif
