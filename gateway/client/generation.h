/* SPDX-License-Identifier: MIT */
/*
 * generation.h - the configuration in force, and its reload (SIGHUP).
 *
 * A generation is one loaded configuration with the objects built from
 * it: the upstream transfers (upstream.h), the pool (pool.h), the
 * health beat (health.h), the load beat (scrape.h) and the cluster
 * (cluster.h, with [cluster] only; kept across a reload that leaves its
 * settings alone).  Each request
 * runs on the generation that was current when its head arrived, to its
 * access-log line, so:
 *  - new requests use the new settings at once;
 *  - requests, streams and flights under way finish on the old ones (a
 *    flight's key holds its generation, coalesce.h, so a new request
 *    never joins an old flight);
 *  - an old generation is freed by the last request that used it.
 * What lives longer than a generation is outside it: the coalescer (its
 * limits are updated), the tenants' counts (kept by name, tenant.h), the
 * process-wide metrics (metrics.h; the pool's per-upstream counters are
 * the generation's, and start again from 0).  A TLS connection holds
 * only its generation's certificate (struct generation_cert), so a
 * keep-alive TLS client does not keep an old generation alive.
 *
 * A reload reads the file again.  An invalid file changes nothing: its
 * "FILE:LINE: ..." is logged and the generation in force stays.  Settings
 * that only take effect at start-up (listen, tls_listen,
 * thread_stack_size) keep their old values; a reload that changes one
 * says so in the log.  The TLS certificate and key are read again with
 * the rest.  A new generation starts with fresh upstream state: breakers
 * closed, no model list until its health beat asks, no warm connections.
 * The reload joins the old health and load beats' threads, so the accept
 * loop may pause for a probe under way (at most about a second); a
 * replaced cluster's beat thread is joined by whoever drops the old
 * generation's last reference, as long (cluster.h).
 *
 * Locking: one mutex guards the current pointer, the list of live
 * generations and the reference counts of generations and certificates;
 * it is held for a few instructions and never across I/O.  generations_stop()
 * takes a pool's lock under it (the pool never calls back here).  Only
 * one thread reloads (the accept loop, server.c).
 */
#ifndef INFERGW_GATEWAY_CLIENT_GENERATION_H
#define INFERGW_GATEWAY_CLIENT_GENERATION_H

#include <stdint.h>

#include "base/config.h"

struct upstream;
struct pool;
struct cluster;
struct health;
struct generations;
struct tls_server;
struct tenants;

/*
 * A generation's TLS certificate, reference-counted on its own: a TLS
 * connection needs the tls_server it shook hands with for its whole
 * life, but not the rest of that generation.
 */
struct generation_cert {
    struct tls_server *tls;
    long refs;                      /* generation.c's, under its lock */
};

struct generation {
    uint64_t id;                    /* 1 at start, +1 per reload */
    struct gw_config cfg;           /* immutable */
    struct upstream *up;
    struct pool *pool;
    struct health *health;          /* freed when replaced (generation.c) */
    struct scrape *scrape;          /* the same */
    struct cluster *cluster;        /* [cluster]'s, or NULL; shared with
                                       the generation before when its
                                       settings are the same (cluster.h) */
    struct generation_cert *cert;   /* tls_listen's certificate; NULL if
                                       none (generation_cert_ref) */
    long refs;                      /* generation.c's, under its lock */
    struct generation *next;        /* generation.c's: every one alive */
};

/*
 * config_load() 'path' into 'c' (config.h), and check what the
 * generation will build from it that config.c cannot: the TLS
 * listener's certificate and key, loaded as the listener will.  Returns
 * 0, GW_ENOMEM, GW_EPARSE or GW_EINVAL with "FILE:LINE: ..." in 'err';
 * on failure 'c' is left empty.
 */
int generation_load_config(const char *path, struct gw_config *c,
                           char *err, size_t errlen);

/*
 * Generation 1 from 'cfg', which is moved in (*cfg is left empty).
 * Starts its health and load beats.  'tenants' (borrowed; it outlives
 * the generations) is whose usage every generation's cluster beat sends
 * to Redis (tenant.h: tenants_usage_flush()).  NULL on failure (logged;
 * *cfg released).
 */
struct generations *generations_new(struct gw_config *cfg,
                                    struct tenants *tenants);

/*
 * Free everything; no request may hold a generation any more (the drain
 * or the stop is over).  Waits up to 3 s for the clusters' beat threads
 * to end (cluster_wait_beats()).  NULL-safe.
 */
void generations_free(struct generations *l);

/* The current generation, with a reference for the caller. */
struct generation *generation_ref_current(struct generations *l);

/* Drop the caller's reference; the last one to a replaced generation
 * frees it.  NULL-safe. */
void generation_unref(struct generations *l, struct generation *g);

/*
 * The id of the current generation, without the lock: a connection that
 * waited for a head under an older one swaps before it serves it.
 */
uint64_t generation_current_id(struct generations *l);

/* g's certificate (non-NULL) with a reference, for a TLS connection. */
struct generation_cert *generation_cert_ref(struct generations *l,
                                            struct generation *g);

/* Drop the caller's reference; the last one frees the tls_server.
 * NULL-safe. */
void generation_cert_unref(struct generations *l,
                           struct generation_cert *c);

/*
 * The current generation, without a reference: only for the thread that
 * reloads (nothing else replaces it, so it stays valid there).
 */
const struct generation *generation_current(struct generations *l);

/*
 * Re-read the configuration file and, if it is valid, make it current.
 * Logs the outcome.  Returns 0 or the loader's error.
 */
int generations_reload(struct generations *l);

/* What the status view (status.h) shows of the configuration: a copy. */
struct generation_status {
    uint64_t id;                    /* the current generation's */
    int64_t started_ms;             /* gw_now_ms() at generations_new() */
    int reloaded;                   /* a reload was tried (SIGHUP) */
    int64_t reload_unix_ms;         /* ... the last one then (wall clock), */
    int reload_ok;                  /* ... made a new generation, */
    char reload_error[512];         /* ... or failed so ("FILE:LINE: ...",
                                       as logged) */
};

/* Copy it into *out, under the generations' lock alone. */
void generations_status(struct generations *l, struct generation_status *out);

/* pool_stop() on every generation alive: the process is stopping. */
void generations_stop(struct generations *l);

#endif
