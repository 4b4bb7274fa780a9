/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - process-wide counters and their Prometheus text rendering.
 *
 * Design: every counter is a relaxed _Atomic in one static struct, so the
 * hot path pays one atomic add per event and takes no lock.  Rendering
 * reads each counter once; a scrape is not a consistent snapshot across
 * counters (Prometheus does not need one).
 *
 * Names met at run time (models, upstreams) get a slot each, for the
 * life of the process, in a bounded table: a slot is added under one
 * mutex (taken when a configuration is built, an upstream lists its
 * models, or an upstream answers for the first time) and found without
 * it, by a scan of the names published so far.  A slot is never reused,
 * so its counters never go back (a configuration that drops a name and
 * a later one that brings it back continue the same series).
 *
 * The model label of the request histograms keeps cardinality bounded:
 * a request's model is its own name only when the gateway knows it (a
 * model an upstream's configuration lists, or one an upstream's
 * GET /v1/models reported, up to METRICS_MODELS_MAX names of at most
 * METRICS_MODEL_NAME_MAX bytes); any other model is
 * METRICS_MODEL_OTHER, and a request that names none (GET /v1/models,
 * /metrics, a body without "model") is METRICS_MODEL_NONE.
 */
#ifndef INFERGW_GATEWAY_BASE_METRICS_H
#define INFERGW_GATEWAY_BASE_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "window.h"

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
    METRICS_ROUTE_RESPONSES,        /* the other vLLM routes (issue 19) */
    METRICS_ROUTE_TOKENIZE,
    METRICS_ROUTE_DETOKENIZE,
    METRICS_ROUTE_RERANK,           /* /v1/rerank, /rerank, /v2/rerank */
    METRICS_ROUTE_SCORE,            /* /v1/score, /score */
    METRICS_ROUTE_POOLING,
    METRICS_ROUTE_TRANSCRIPTIONS,
    METRICS_ROUTE_TRANSLATIONS,
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

/* infergw_cache_requests_total{result}: what the cache did for a
 * request ([cache] ttl > 0; X-Infergw-Cache says the same). */
enum metrics_cache_result {
    METRICS_CACHE_HIT = 0,          /* answered from an entry */
    METRICS_CACHE_MISS,             /* could be, was not; may be stored */
    METRICS_CACHE_BYPASS,           /* the cache does not apply to it */
    METRICS_CACHE_RESULT_COUNT
};

/* infergw_cache_evictions_total{reason}: why an entry went. */
enum metrics_cache_evict {
    METRICS_EVICT_EXPIRED = 0,      /* past the ttl */
    METRICS_EVICT_SIZE,             /* least recently used, max_bytes */
    METRICS_EVICT_REPLACED,         /* a newer answer for its key */
    METRICS_EVICT_RELOAD,           /* a reload dropped it */
    METRICS_EVICT_COUNT
};

/* Label value ("hit", "miss", "bypass"). */
const char *metrics_cache_result_name(enum metrics_cache_result r);

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

#define METRICS_MODELS_MAX 64
#define METRICS_MODEL_NAME_MAX 63       /* and handler_req.model */
#define METRICS_MODEL_OTHER "(other models)"    /* a blank: no client's
                                   model name has one (route.c) */
#define METRICS_MODEL_NONE "-"
/* Upstream names kept over every configuration of the process: four
 * full configurations' worth (CONFIG_MAX_UPSTREAMS each). */
#define METRICS_UPSTREAMS_MAX 256

/*
 * Start the process's own series: build info ('version', borrowed; a
 * literal) and process_start_time_seconds (now).  Once, in main(),
 * before any thread.
 */
void metrics_start(const char *version);

/*
 * Configuration generation 'generation' is in force, from the start or
 * a reload: infergw_config_generation, and
 * infergw_config_last_reload_success = 1 with its timestamp (now).
 */
void metrics_config_loaded(uint64_t generation);

/* A reload failed: infergw_config_last_reload_success = 0. */
void metrics_config_reload_failed(void);

/*
 * 'model' (borrowed, copied) is one the gateway knows: it gets its own
 * label value in the request histograms from now on.  Called when a
 * configuration is built (its upstreams' models) and when an upstream
 * lists its models.  Takes the names mutex: not under another lock.  A
 * name that is empty, longer than METRICS_MODEL_NAME_MAX, or past
 * METRICS_MODELS_MAX names is not added (its requests are
 * METRICS_MODEL_OTHER).
 */
void metrics_model_known(const char *model);

/*
 * A finished client request: route, the body's model (NULL or "": none;
 * borrowed), whether it asked for a stream, status, and its total and
 * first-byte time (-1: none).
 */
void metrics_request(enum metrics_route r, const char *model, int stream,
                     int status, int64_t duration_us, int64_t ttfb_us);

/*
 * One attempt on upstream 'upstream' (a configured name; borrowed) that
 * got an answer is over: 'ttfb_us' from the start of the attempt to its
 * first body byte, 'duration_us' to its end.  An attempt without a
 * first body byte (ttfb_us < 0: a failure, a hedge that lost, a status
 * stopped for a retry) is not observed: infergw_upstream_failures_total
 * counts the failures.  The first attempt on a name takes the names
 * mutex; past METRICS_UPSTREAMS_MAX names, new ones are not observed.
 */
void metrics_upstream_attempt(const char *upstream, int64_t ttfb_us,
                              int64_t duration_us);

/*
 * An estimate of quantile 'q' (0..1) of upstream 'upstream''s (a
 * configured name; borrowed) time to first byte, in seconds, over every
 * attempt since the process started: infergw_upstream_time_to_first_byte
 * _seconds as Prometheus's histogram_quantile() reads it (the bucket the
 * rank falls in, then linear interpolation inside it; a rank in the
 * +Inf bucket gives the highest finite bound).  -1 when the upstream has
 * no observation yet, or q is outside 0..1.  Lock-free, any thread.
 */
double metrics_upstream_ttfb_quantile(const char *upstream, double q);

void metrics_upstream_call(void);

/*
 * A client request reached proxying: it is about to lead a flight,
 * follow one, bypass coalescing or take a route that never coalesces
 * (proxy.h), past every check that answers without an upstream (the
 * route's, the tenant's limits, a model no upstream serves).
 * infergw_proxied_requests_total; infergw_upstream_requests_total over
 * it is the upstream calls per client request.
 */
void metrics_proxied(void);

void metrics_connections_add(int delta);
void metrics_connection_rejected(void);     /* 503 at max_connections */
void metrics_coalesce_leader(void);
void metrics_coalesce_follower(void);   /* by tenant: tenant.h's */
void metrics_coalesce_bypass(enum metrics_bypass b);
void metrics_reader_cut_lag(void);      /* a client past max_reader_lag */
void metrics_flights_add(int delta);
void metrics_cache_result(enum metrics_cache_result r);
void metrics_cache_evicted(enum metrics_cache_evict why, uint64_t n);
/* The cache's size now (the coalescer sets it under its lock). */
void metrics_cache_size(uint64_t entries, uint64_t bytes);
void metrics_parked_add(int delta);     /* clients parked in flights */
void metrics_pushed(uint64_t chunks);   /* chunks written for parked ones */
void metrics_helpers(uint64_t n);       /* helper threads woken to write */
void metrics_keepalive_idle_add(int delta); /* idle upstream connections */
void metrics_keepalive_closed(enum metrics_keepalive_close why);

/*
 * What the status view's summary reads of these counters (status.h).
 * The answers are those of the client routes: every route but the
 * operator's (/healthz, /readyz, /metrics, /status.json and /status),
 * which a balancer or the status page itself asks every second or so;
 * a request no route took (a 404, a head that could not be read) is a
 * client's.  Index c of a class array counts statuses (c+1)xx.
 */
struct metrics_summary {
    uint64_t minute[WINDOW_CLASSES];    /* answered in the last minute */
    int64_t minute_ms;                  /* ... which covers this long */
    uint64_t total[WINDOW_CLASSES];     /* answered since the start: the
                                           sum of infergw_requests_total
                                           over the client routes */
    uint64_t upstream_calls;            /* infergw_upstream_requests_
                                           total: attempts, retries and
                                           hedges included */
    uint64_t proxied;                   /* infergw_proxied_requests_total */
    uint64_t followers;                 /* infergw_coalesce_followers_
                                           total */
    uint64_t cache_hits;                /* infergw_cache_requests_total
                                           {result="hit"} */
};

/* OUT *out: the summary's counts now.  Lock-free, any thread. */
void metrics_summary(struct metrics_summary *out);

/* The TLS handshake counters (tls.h), for every tls_server to share. */
struct tls_stats *metrics_tls_stats(void);

/*
 * Append the Prometheus text exposition (format 0.0.4) to 'out'.
 * 'cfg' (borrowed) names the upstreams, and gives the limits rendered as
 * gauges (a tenant's are tenant.h's, as every per-tenant family is).  Reads /proc/self for the process_* series (a
 * sample it cannot read is left out).  Returns 0 or a buf error.
 */
int metrics_render(struct buf *out, const struct gw_config *cfg);

#endif
