/* SPDX-License-Identifier: MIT */
/*
 * probe.c - a GET of a small document from an upstream (probe.h).
 */
#include "fleet/probe.h"

#include <stdio.h>

#include "log.h"
#include "util.h"

static int
probe_head(void *arg, const struct http_head *h)
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
    pr->detail[0] = '\0';
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
        .quiet = 1,
        .detail = pr->detail,
        .detail_size = sizeof(pr->detail),
    };
    struct upstream_result res;

    pr->status = 0;
    pr->detail[0] = '\0';
    buf_reset(&pr->body);
    upstream_perform(up, idx, &req, &opts, &sink, &res);
    return res.outcome;
}

const char *
probe_why(const struct probe *pr, const struct call_outcome *o, char *out,
          size_t n)
{
    if (o->kind == CALL_OK)
        snprintf(out, n, "status=%d", pr->status);
    else
        snprintf(out, n, "reason=\"%s\" detail=\"%s\"",
                 call_kind_text(o->kind), pr->detail);
    return out;
}

void
probe_note(struct log_repeat *r, const char *feed, const char *name,
           const char *path, const char *why)
{
    char what[128];

    snprintf(what, sizeof(what), "%s: upstream %s GET %s", feed, name, path);
    if (why != NULL)
        log_repeat_fail(r, gw_now_ms(), what, why);
    else
        log_repeat_ok(r, gw_now_ms(), what);
}
