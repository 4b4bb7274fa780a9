/* SPDX-License-Identifier: MIT */
/*
 * upstream_testcall.c - a call driven by hand, for the fuzzer
 * (upstream_testcall.h).  Built into test builds only.
 */
#include "upstream/upstream_testcall.h"

#ifdef INFERGW_UNIT_TEST
#include <assert.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "upstream/upstream_call.h"

/*
 * A call driven by hand (upstream_testcall.h).  Its attempts are
 * real struct xfer values fed through the real callbacks; only libcurl is
 * missing.  The session is an empty one, so attempt_end()'s
 * curl_multi_remove_handle() on its NULL handles does nothing, and the
 * handles have no CURL, which the callbacks never use.
 */
struct upstream_testcall {
    struct call c;
    struct upstream_session s;
    struct upstream_session_handle h[UP_ATTEMPTS];
};

static const struct config_upstream testcall_upstream = {
    .name = (char *)"test",
    .url = (char *)"http://upstream.test",
};

static const struct upstream_request testcall_request = {
    "POST", "/v1/chat/completions", "{}", 2, "test-id", NULL, NULL
};

struct upstream_testcall *
upstream_testcall_new(const struct upstream_opts *opts,
                      const struct upstream_sink *sink)
{
    struct upstream_testcall *t = gw_calloc(1, sizeof(*t));

    if (t == NULL)
        return NULL;
    t->c.req = &testcall_request;
    t->c.opts = opts != NULL ? opts : &upstream_default_opts;
    t->c.sink = sink;
    t->c.s = &t->s;
    t->s.timer_ms = -1;
    return t;
}

void
upstream_testcall_free(struct upstream_testcall *t)
{
    gw_free(t);
}

int
upstream_testcall_start(struct upstream_testcall *t)
{
    struct call *c = &t->c;
    struct xfer *x;
    int i = c->n;

    /* The second attempt only as maybe_hedge() starts one. */
    if (i == UP_ATTEMPTS
        || (i == 1 && (!c->x[0].running || c->winner != NULL)))
        return -1;
    x = &c->x[i];
    xfer_init(c, x, (size_t)i, &testcall_upstream);
    x->h = &t->h[i];
    x->start_us = gw_now_us();
    x->last_rx_ms = x->start_us / 1000;
    x->running = 1;
    return i;
}

size_t
upstream_testcall_header(struct upstream_testcall *t, int i, char *p,
                         size_t n)
{
    assert(i >= 0 && i < t->c.n);
    return header_cb(p, 1, n, &t->c.x[i]);
}

size_t
upstream_testcall_body(struct upstream_testcall *t, int i, char *p,
                       size_t n)
{
    assert(i >= 0 && i < t->c.n);
    return write_cb(p, 1, n, &t->c.x[i]);
}

int
upstream_testcall_running(const struct upstream_testcall *t, int i)
{
    return i >= 0 && i < t->c.n && t->c.x[i].running;
}

const struct upstream_result *
upstream_testcall_finish(struct upstream_testcall *t, int i, int curl_code)
{
    struct xfer *x = &t->c.x[i];

    assert(i >= 0 && i < t->c.n);
    if (x->running)
        attempt_finished(&t->c, x, (CURLcode)curl_code);
    return &x->res;
}

void
upstream_testcall_reap(struct upstream_testcall *t)
{
    end_lost(&t->c);
}

#endif
