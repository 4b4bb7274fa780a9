/*
 * metrics.h - process-wide counters and their Prometheus text rendering.
 *
 * Design: every counter is a relaxed _Atomic in one static struct, so the
 * hot path pays one atomic add per event and takes no lock.  Rendering
 * reads each counter once; a scrape is not a consistent snapshot across
 * counters (Prometheus does not need one).
 */
#ifndef INFERGW_GATEWAY_METRICS_H
#define INFERGW_GATEWAY_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

struct gw_config;

/*
 * TLS handshake counters for /metrics (tls.h counts into them).  The
 * caller owns the struct (metrics_tls_stats()) and passes it in
 * tls_server_opts, so the counts go on
 * across a certificate reload, which makes a new tls_server; several
 * servers may share one.  The fields are atomics: read them with
 * atomic_load() from any thread.
 */
struct tls_stats {
    _Atomic uint64_t handshakes;        /* completed */
    _Atomic uint64_t failed_timeout;    /* not done by the deadline */
    _Atomic uint64_t failed_protocol;   /* garbage, plain HTTP, no common
                                           version / cipher / ALPN, or the
                                           client sent a fatal alert */
    _Atomic uint64_t failed_other;      /* peer closed, drain, I/O, memory */
    _Atomic uint64_t resumed;           /* of 'handshakes': resumed from a
                                           session ticket */
};

/*
 * The label sets of the families below are metrics' own: each value is
 * one label value ("chat", "sampling", ...; metrics.c names them), and
 * the modules that know the cause tag with it (route.c's table, conn.c
 * for requests no route took, coalesce.c's eligibility).  A new route or
 * bypass reason is a new value here and a name in metrics.c.
 */

/* infergw_requests_total{route}, and the latency histograms. */
enum metrics_route {
    METRICS_ROUTE_CHAT = 0,
    METRICS_ROUTE_COMPLETIONS,
    METRICS_ROUTE_EMBEDDINGS,
    METRICS_ROUTE_MODELS,
    METRICS_ROUTE_HEALTHZ,
    METRICS_ROUTE_READYZ,
    METRICS_ROUTE_METRICS,
    METRICS_ROUTE_STATUS,           /* /status.json and /status */
    METRICS_ROUTE_OTHER,
    METRICS_ROUTE_COUNT
};

/* infergw_coalesce_bypass_total{reason}: why a request went alone. */
enum metrics_bypass {
    METRICS_BYPASS_DISABLED = 0,    /* coalescing off globally */
    METRICS_BYPASS_TENANT,          /* off for this tenant */
    METRICS_BYPASS_OPT_OUT,         /* X-Infergw-Coalesce: off or
                                       Cache-Control */
    METRICS_BYPASS_SAMPLING,        /* temperature > 0 without seed */
    METRICS_BYPASS_MAX_FOLLOWERS,
    METRICS_BYPASS_MAX_FLIGHT_BYTES,
    METRICS_BYPASS_MAX_FLIGHTS,
    METRICS_BYPASS_NOMEM,
    METRICS_BYPASS_COUNT
};

/* Why an idle upstream connection was closed (keepalive.h). */
enum metrics_keepalive_close {
    METRICS_KEEPALIVE_STALE = 0,    /* readable while idle: stray bytes,
                                       or the upstream closed it */
    METRICS_KEEPALIVE_TIMEOUT,      /* idle past keepalive_timeout */
    METRICS_KEEPALIVE_FULL,         /* more than keepalive were idle */
    METRICS_KEEPALIVE_COUNT
};

/* Label value for a bypass reason ("sampling", ...). */
const char *metrics_bypass_name(enum metrics_bypass b);

/* A finished client request: route, status, total and first-byte time. */
void metrics_request(enum metrics_route r, int status, int64_t duration_us,
                     int64_t ttfb_us);

void metrics_upstream_call(void);
void metrics_connections_add(int delta);
void metrics_connection_rejected(void);     /* 503 at max_connections */
void metrics_coalesce_leader(void);
void metrics_coalesce_follower(size_t tenant);  /* config tenant index, or
                                          CONFIG_MAX_TENANTS for "default" */
void metrics_coalesce_bypass(enum metrics_bypass b);
void metrics_reader_cut_lag(void);      /* a client past max_reader_lag */
void metrics_flights_add(int delta);
void metrics_parked_add(int delta);     /* clients parked in flights */
void metrics_pushed(uint64_t chunks);   /* chunks written for parked ones */
void metrics_helpers(uint64_t n);       /* helper threads woken to write */
void metrics_keepalive_idle_add(int delta); /* idle upstream connections */
void metrics_keepalive_closed(enum metrics_keepalive_close why);

/* The TLS handshake counters (tls.h), for every tls_server to share. */
struct tls_stats *metrics_tls_stats(void);

/*
 * Append the Prometheus text exposition (format 0.0.4) to 'out'.
 * 'cfg' (borrowed) names the tenants.  Returns 0 or a buf error.
 */
int metrics_render(struct buf *out, const struct gw_config *cfg);

#endif
