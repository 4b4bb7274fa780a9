/* SPDX-License-Identifier: MIT */
/*
 * probe.h - a GET of a small document from one upstream, the gateway's
 * own (not a client's): health.c's /health and /v1/models, scrape.c's
 * /metrics.
 *
 * It runs on the calling thread through upstream_perform(), so it goes
 * over a kept connection like any call, bounded in time and size, and
 * ends early once '*stopping' is set.  Not counted as a call, and not
 * judged: the caller decides what an answer means.
 *
 * Ownership: a struct probe is its caller's, on one thread; probe_init
 * and probe_release bracket its body buffer.
 */
#ifndef INFERGW_GATEWAY_PROBE_H
#define INFERGW_GATEWAY_PROBE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "upstream.h"

struct probe {
    const _Atomic int *stopping;    /* borrowed: nonzero ends the GET */
    int status;                     /* OUT: the answer's; 0 none */
    struct buf body;                /* OUT: its body, up to the bound */
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

#endif
