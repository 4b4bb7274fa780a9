/* SPDX-License-Identifier: MIT */
/*
 * handler.h - what a request handler (route.c, proxy.c) is given: the
 * process's shared objects, and the one request it answers.
 *
 * A header of types only.  server.c fills one struct handler_ctx at
 * start-up; conn.c fills a struct handler_req for each request and hands
 * it down.  So the handlers never see the server or the connection, and
 * the modules depend one way (DESIGN.md "Modules, one way"):
 *
 *   server -> conn -> route -> proxy -> {coalesce, flight, fanout,
 *                                        dispatch, reply, tenant, usage}
 *   dispatch -> {pool, upstream};  {server, conn} -> generation ->
 *   {health, tls, pool, upstream}
 */
#ifndef INFERGW_GATEWAY_BASE_HANDLER_H
#define INFERGW_GATEWAY_BASE_HANDLER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "http.h"
#include "base/metrics.h"

struct gw_config;
struct upstream;
struct pool;
struct coalescer;
struct reply;
struct tenants;
struct tenant_entry;
struct generations;
struct cluster;

/*
 * The server's is immutable once it starts, and shared by every thread;
 * the objects it points to are thread-safe.  The two flags are set once
 * each, and the descriptors become readable at the same moments.
 *
 * The first three come from the configuration generation a request runs
 * on (generation.h): the server's has them NULL, and conn.c gives each
 * request a copy with its generation's.
 */
struct handler_ctx {
    const struct gw_config *cfg;
    struct upstream *up;            /* the transfers */
    struct pool *pool;              /* which upstream, and its health */
    uint64_t generation;            /* the configuration's (coalesce.h) */
    struct generations *gens;       /* conn.c's: where generations come
                                       from */
    struct coalescer *co;
    struct tenants *tenants;        /* limits and bills (tenant.h) */
    struct cluster *cluster;        /* shared state in Redis (cluster.h);
                                       NULL without [cluster] */
    const _Atomic int *draining;    /* SIGTERM: readyz 503, no keep-alive,
                                       requests under way go on */
    const _Atomic int *stopping;    /* drain_timeout passed: every wait
                                       ends, every stream is cut */
    int wake_fd;                    /* readable once draining */
    int stop_fd;                    /* readable once stopping */
    unsigned ncpu;                  /* CPUs online at start, >= 1 */
};

/* Is the process stopping?  Part of every wait's predicate. */
static inline int
handler_stopping(const struct handler_ctx *x)
{
    return atomic_load_explicit(x->stopping, memory_order_relaxed);
}

static inline int
handler_draining(const struct handler_ctx *x)
{
    return atomic_load_explicit(x->draining, memory_order_relaxed);
}

/*
 * One request, owned by its connection's thread.  The views into the
 * head ('req') stay valid until the handler returns.
 */
struct handler_req {
    const struct handler_ctx *ctx;
    struct http_request *req;       /* the parsed head (reading the body
                                       sets its error fields) */
    struct buf *in;                 /* bytes read past the head: the body
                                       starts here (route.c reads it) */
    struct buf *body;               /* the body, once read */
    struct reply *reply;            /* the response */
    const char *request_id;         /* the client's, or made up */
    int admin;                      /* it came to [admin] listen: only
                                       /metrics, /healthz, /readyz and
                                       the status view (status.h) */

    /* Set by the handlers, for the access log. */
    enum metrics_route route;
    size_t tenant;                  /* config index, or CONFIG_MAX_TENANTS
                                       for "default" */
    int tenant_route;               /* a tenant's route: 'tenant' was
                                       looked up (route.c) */
    struct tenant_entry *pass;      /* admitted by the tenant's limits:
                                       the proxy bills it; or NULL */
    int64_t redis_left_ms;          /* what the admission left of
                                       redis_timeout for the charge
                                       and the lease's release
                                       (tenant.h, shared limits) */
    struct tenant_lease *lease;     /* the call's lease (tenant.h,
                                       "Leases"), or NULL */
    int64_t prompt_tokens;          /* the usage this client received, */
    int64_t completion_tokens;      /* or -1 */
    char model[METRICS_MODEL_NAME_MAX + 1];
    int stream;                     /* the body asked for a stream
                                       ("stream": true) */
    char flight_id[32];             /* leader or follower: a copy of the
                                       flight's id (the upstream's
                                       X-Request-Id); "" otherwise */
    const char *upstream;           /* direct or leader: the name of the
                                       upstream that answered last
                                       (config's); NULL otherwise */
    int attempts;                   /* ... and its calls, retries and
                                       hedges included */
};

#endif
