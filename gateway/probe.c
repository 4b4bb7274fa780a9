/* SPDX-License-Identifier: MIT */
/*
 * probe.c - a GET of a small document from an upstream (probe.h).
 */
#include "probe.h"

#include "util.h"

static int
probe_head(void *arg, const struct upstream_head *h)
{
    struct probe *pr = arg;

    pr->status = h->status;
    return 0;
}

static int
probe_data(void *arg, const char *p, size_t n)
{
    struct probe *pr = arg;
    int rc = buf_append(&pr->body, p, n);

    return rc == 0 ? 0 : rc == GW_ENOMEM ? GW_ENOMEM : GW_ETOOBIG;
}

static int
probe_tick(void *arg)
{
    const struct probe *pr = arg;

    return atomic_load(pr->stopping) ? GW_ESTOPPING : 0;
}

void
probe_init(struct probe *pr, const _Atomic int *stopping, size_t max_body)
{
    pr->stopping = stopping;
    pr->status = 0;
    buf_init(&pr->body, max_body);
}

void
probe_release(struct probe *pr)
{
    buf_release(&pr->body);
}

struct call_outcome
probe_get(struct upstream *up, size_t idx, const char *path,
          int64_t timeout_ms, struct probe *pr)
{
    struct upstream_request req = { "GET", path, NULL, 0, NULL, NULL, NULL };
    struct upstream_sink sink = { pr, probe_head, probe_data, probe_tick,
                                  NULL };
    struct upstream_opts opts = {
        .total_timeout_ms = timeout_ms,
        .watch_fd = -1,
        .stop_fd = -1,
    };
    struct upstream_result res;

    pr->status = 0;
    buf_reset(&pr->body);
    upstream_perform(up, idx, &req, &opts, &sink, &res);
    return res.outcome;
}
