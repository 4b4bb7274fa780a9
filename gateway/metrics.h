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

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

struct gw_config;
struct tls_stats;

enum metrics_route {
    ROUTE_CHAT = 0,
    ROUTE_COMPLETIONS,
    ROUTE_EMBEDDINGS,
    ROUTE_MODELS,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_METRICS,
    ROUTE_OTHER,
    ROUTE_COUNT
};

enum metrics_bypass {
    BYPASS_DISABLED = 0,    /* coalescing off globally */
    BYPASS_TENANT,          /* off for this tenant */
    BYPASS_OPT_OUT,         /* X-Infergw-Coalesce: off / Cache-Control */
    BYPASS_SAMPLING,        /* temperature > 0 without seed */
    BYPASS_MAX_FOLLOWERS,
    BYPASS_MAX_FLIGHT_BYTES,
    BYPASS_MAX_FLIGHTS,
    BYPASS_NOMEM,
    BYPASS_COUNT
};

/* Why an idle upstream connection was closed (keepalive.h). */
enum metrics_keepalive_close {
    METRICS_KEEPALIVE_STALE = 0,    /* readable while idle: stray bytes,
                                       or the upstream closed it */
    METRICS_KEEPALIVE_TIMEOUT,      /* idle past keepalive_timeout */
    METRICS_KEEPALIVE_FULL,         /* more than keepalive were idle */
    METRICS_KEEPALIVE_COUNT
};

/* Label value for a route ("chat_completions", ...). */
const char *metrics_route_name(enum metrics_route r);

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

/* Current values, for tests and the drain log. */
int64_t metrics_connections_active(void);
int64_t metrics_flights_active(void);

/*
 * Append the Prometheus text exposition (format 0.0.4) to 'out'.
 * 'cfg' (borrowed) names the tenants.  Returns 0 or a buf error.
 */
int metrics_render(struct buf *out, const struct gw_config *cfg);

#endif
