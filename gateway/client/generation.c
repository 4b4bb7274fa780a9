/* SPDX-License-Identifier: MIT */
/*
 * generation.c - generations of the configuration, and the reload
 * (generation.h).
 */
#include "client/generation.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "base/cluster.h"
#include "fleet/health.h"
#include "log.h"
#include "base/metrics.h"
#include "base/tenant.h"
#include "fleet/pool.h"
#include "fleet/scrape.h"
#include "wire/tls.h"
#include "upstream/upstream.h"
#include "util.h"

struct generations {
    int64_t started_unix_ms;        /* the process's, for heartbeats */
    struct tenants *tenants;        /* whose usage the beat flushes */
    struct gw_mutex lock;
    struct generation *cur;         /* (L) holds one reference */
    struct generation *gens;        /* (L) every generation alive */
    _Atomic uint64_t cur_id;        /* cur->id, for generation_current_id() */
    struct generation_status status;    /* (L) but 'id': the status view's */
};

struct generation_cert *
generation_cert_ref(struct generations *l, struct generation *g)
{
    gw_mutex_lock(&l->lock);
    g->cert->refs++;
    gw_mutex_unlock(&l->lock);
    return g->cert;
}

void
generation_cert_unref(struct generations *l, struct generation_cert *c)
{
    int last;

    if (c == NULL)
        return;
    gw_mutex_lock(&l->lock);
    last = --c->refs == 0;
    gw_mutex_unlock(&l->lock);
    if (last) {
        tls_server_free(c->tls);
        gw_free(c);
    }
}

/*
 * Load the certificate and key as the listener will (tls.h): unreadable,
 * not PEM, a key of another certificate, expired, not valid yet, TLS 1.3
 * are each a FILE:LINE error, so -t finds them before a start does.
 * Returns 0, GW_ENOMEM or GW_EINVAL, with "FILE[:LINE]: ..." in 'err'.
 */
static int
check_tls_files(const struct gw_config *c, char *err, size_t errlen)
{
    struct tls_server_opts o = {
        c->tls_cert, c->tls_key, c->tls_min_version,
        (int)c->tls_handshake_timeout_ms, NULL,
        (int)(c->tls_session_timeout_ms / 1000), NULL,
    };
    struct tls_server *s = NULL;
    char msg[256];
    int rc = tls_server_new(&o, &s, msg, sizeof(msg));
    int line;

    tls_server_free(s);
    if (rc == GW_ENOMEM) {
        snprintf(err, errlen, "%s: out of memory", c->path);
        return rc;
    }
    if (rc != 0) {
        line = c->tls_min_version == 13
               ? config_line(c, "server", "tls_min_version")
               : config_line(c, "server", "tls_cert");
        if (line > 0)
            snprintf(err, errlen, "%s:%d: %s", c->path, line, msg);
        else
            snprintf(err, errlen, "%s: %s", c->path, msg);
        return GW_EINVAL;
    }
    return 0;
}

int
generation_load_config(const char *path, struct gw_config *c, char *err,
                       size_t errlen)
{
    int rc = config_load(path, c, err, errlen);

    if (rc != 0)
        return rc;
    if (c->tls_listen[0] != '\0')
        rc = check_tls_files(c, err, errlen);
    if (rc != 0)
        config_release(c);
    return rc;
}

/* NULL-safe; the generation is no longer current nor used. */
static void
gen_free(struct generations *l, struct generation *g)
{
    if (g == NULL)
        return;
    health_free(g->health);
    scrape_free(g->scrape);
    cluster_unref(g->cluster);
    generation_cert_unref(l, g->cert);
    pool_free(g->pool);
    upstream_free(g->up);
    config_release(&g->cfg);
    gw_free(g);
}

/*
 * A generation from 'cfg' (moved in), with its objects, to follow 'prev'
 * (NULL for the first; borrowed): its TLS session ticket keys carry over
 * while tls_session_timeout stays the same (tls.h).  NULL (logged).
 */
static struct generation *
gen_build(struct generations *l, struct gw_config *cfg,
          const struct generation *prev)
{
    struct generation *g = gw_calloc(1, sizeof(*g));
    struct generation *ret = NULL;
    uint64_t id = prev != NULL ? prev->id + 1 : 1;

    if (g == NULL) {
        config_release(cfg);
        log_msg(GW_LOG_ERROR, "generation: out of memory for a configuration");
        goto out;
    }
    memcpy(&g->cfg, cfg, sizeof(*cfg));
    memset(cfg, 0, sizeof(*cfg));
    g->id = id;
    g->refs = 1;                    /* the one 'cur' holds */
    if (g->cfg.tls_listen[0] != '\0') {
        struct tls_server_opts o = {
            g->cfg.tls_cert, g->cfg.tls_key, g->cfg.tls_min_version,
            (int)g->cfg.tls_handshake_timeout_ms, metrics_tls_stats(),
            (int)(g->cfg.tls_session_timeout_ms / 1000),
            prev != NULL && prev->cert != NULL ? prev->cert->tls : NULL,
        };
        char err[256];

        g->cert = gw_calloc(1, sizeof(*g->cert));
        if (g->cert == NULL) {
            log_msg(GW_LOG_ERROR, "generation: out of memory for TLS");
            goto out;
        }
        g->cert->refs = 1;          /* the generation's own */
        if (tls_server_new(&o, &g->cert->tls, err, sizeof(err)) != 0) {
            log_msg(GW_LOG_ERROR, "generation: TLS: %s", err);
            goto out;
        }
        if (prev != NULL && prev->cfg.tls_session_timeout_ms
                            != g->cfg.tls_session_timeout_ms)
            log_msg(GW_LOG_INFO, "generation: tls_session_timeout=%llds: new "
                    "session ticket keys; sessions from before make full "
                    "handshakes",
                    (long long)(g->cfg.tls_session_timeout_ms / 1000));
    }
    g->up = upstream_new(&g->cfg);
    g->pool = pool_new(&g->cfg);
    if (g->up == NULL || g->pool == NULL) {
        log_msg(GW_LOG_ERROR, "generation: out of memory for the upstreams");
        goto out;
    }
    /* What the beat in force knows of the upstreams holds until the new
     * beat knows better: a reload is no reason for /readyz to say 503. */
    if (prev != NULL)
        pool_carry_probes(g->pool, prev->pool);
    g->health = health_start(&g->cfg, g->pool, g->up);
    g->scrape = scrape_start(&g->cfg, g->pool, g->up);
    if (g->health == NULL || g->scrape == NULL)
        goto out;
    if (g->cfg.cluster && prev != NULL && prev->cluster != NULL
        && cluster_same_config(&prev->cfg, &g->cfg)) {
        /* Same Redis, same node: the same connections and beat go on. */
        g->cluster = cluster_ref(prev->cluster);
        cluster_set_generation(g->cluster, g->id);
    } else if (g->cfg.cluster) {
        struct cluster_self self = { g->id, l->started_unix_ms,
                                     tenants_after_beat, l->tenants };

        g->cluster = cluster_start(&g->cfg, &self);
        if (g->cluster == NULL)
            goto out;
    }
    ret = g;
    g = NULL;

out:
    gen_free(l, g);                 /* NULL-safe */
    return ret;
}

struct generations *
generations_new(struct gw_config *cfg, struct tenants *tenants)
{
    struct generations *l = gw_calloc(1, sizeof(*l));

    if (l == NULL) {
        config_release(cfg);
        return NULL;
    }
    gw_mutex_init(&l->lock);
    l->started_unix_ms = gw_wall_ms();
    l->tenants = tenants;
    l->cur = l->gens = gen_build(l, cfg, NULL);
    if (l->cur == NULL) {
        gw_mutex_destroy(&l->lock);
        gw_free(l);
        return NULL;
    }
    atomic_store(&l->cur_id, 1);
    metrics_config_loaded(1);
    l->status.started_ms = gw_now_ms();
    return l;
}

void
generations_free(struct generations *l)
{
    struct generation *g, *next;

    if (l == NULL)
        return;
    for (g = l->gens; g != NULL; g = next) {
        next = g->next;
        gen_free(l, g);
    }
    gw_mutex_destroy(&l->lock);
    gw_free(l);
    /* The clusters' beats end on their own (cluster.h): at the exit,
     * none may outlive this while it still touches a cluster, nor may
     * the exit wait for ever on one in a name's resolution. */
    if (cluster_wait_beats(gw_now_ms() + 3000) != 0)
        log_msg(GW_LOG_WARN, "generation: a cluster beat did not end in "
                "3 s");
}

struct generation *
generation_ref_current(struct generations *l)
{
    struct generation *g;

    gw_mutex_lock(&l->lock);
    g = l->cur;
    g->refs++;
    gw_mutex_unlock(&l->lock);
    return g;
}

void
generation_unref(struct generations *l, struct generation *g)
{
    struct generation **pp;
    int last;

    if (g == NULL)
        return;
    gw_mutex_lock(&l->lock);
    last = --g->refs == 0;
    if (last) {
        for (pp = &l->gens; *pp != g; pp = &(*pp)->next)
            ;
        *pp = g->next;
    }
    gw_mutex_unlock(&l->lock);
    if (last) {
        log_msg(GW_LOG_INFO, "generation: configuration generation=%llu "
                "freed, its last request is over", (unsigned long long)g->id);
        gen_free(l, g);
    }
}

uint64_t
generation_current_id(struct generations *l)
{
    return atomic_load_explicit(&l->cur_id, memory_order_acquire);
}

const struct generation *
generation_current(struct generations *l)
{
    return l->cur;              /* only the reloading thread writes it */
}

/* Keep the listener address in force in *now, saying so if it changed. */
static int
keep_listener(const char *name, const char *in_force, char **now)
{
    char *v;

    if (strcmp(in_force, *now) == 0)
        return 0;
    v = gw_strdup(in_force);
    if (v == NULL)
        return GW_ENOMEM;
    log_msg(GW_LOG_WARN, "reload: %s changed to '%s': that needs a "
            "restart, still '%s'", name, *now, in_force);
    gw_free(*now);
    *now = v;
    return 0;
}

/*
 * The settings only start-up reads keep the values in force, and a change
 * to one is logged.  Returns 0, GW_ENOMEM, or GW_EINVAL (logged) when the
 * TLS listener in force would be left without a certificate.
 */
static int
keep_startup_settings(const struct gw_config *old, struct gw_config *c)
{
    if (keep_listener("listen", old->listen, &c->listen) != 0
        || keep_listener("tls_listen", old->tls_listen, &c->tls_listen) != 0
        || keep_listener("[admin] listen", old->admin_listen,
                         &c->admin_listen) != 0)
        return GW_ENOMEM;
    if (c->tls_listen[0] != '\0'
        && (c->tls_cert[0] == '\0' || c->tls_key[0] == '\0')) {
        log_msg(GW_LOG_ERROR, "reload: the TLS listener %s stays until a "
                "restart, so tls_cert and tls_key are needed",
                c->tls_listen);
        return GW_EINVAL;
    }
    if (old->thread_stack_size != c->thread_stack_size) {
        log_msg(GW_LOG_WARN, "reload: thread_stack_size changed to %llu: "
                "that needs a restart, still %llu",
                (unsigned long long)c->thread_stack_size,
                (unsigned long long)old->thread_stack_size);
        c->thread_stack_size = old->thread_stack_size;
    }
    return 0;
}

/*
 * The last reload's outcome: 'g' (NULL if it failed, with 'err') goes in
 * force, and the status view and /metrics say so, before the log line
 * does.  One locked section: a status reader never sees the new
 * generation with the previous reload's result.
 */
static void
end_reload(struct generations *l, struct generation *g, const char *err)
{
    gw_mutex_lock(&l->lock);
    if (g != NULL) {
        g->next = l->gens;
        l->gens = g;
        l->cur = g;
        atomic_store_explicit(&l->cur_id, g->id, memory_order_release);
    }
    l->status.reloaded = 1;
    l->status.reload_unix_ms = gw_wall_ms();
    l->status.reload_ok = g != NULL;
    snprintf(l->status.reload_error, sizeof(l->status.reload_error), "%s",
             g == NULL ? err : "");
    gw_mutex_unlock(&l->lock);
    if (g != NULL)
        metrics_config_loaded(g->id);
    else
        metrics_config_reload_failed();
}

int
generations_reload(struct generations *l)
{
    struct generation *old = l->cur, *g;
    struct gw_config cfg;
    char err[512];
    int rc;

    rc = generation_load_config(old->cfg.path, &cfg, err, sizeof(err));
    if (rc != 0) {
        end_reload(l, NULL, err);
        log_msg(GW_LOG_ERROR, "reload: %s; the configuration in force "
                "stays generation=%llu", err, (unsigned long long)old->id);
        return rc;
    }
    rc = keep_startup_settings(&old->cfg, &cfg);
    if (rc != 0) {
        config_release(&cfg);
        end_reload(l, NULL, rc == GW_ENOMEM ? "out of memory"
                       : "refused: the TLS listener in force needs "
                         "tls_cert and tls_key");
        log_msg(GW_LOG_ERROR, "reload: %s; the configuration in force "
                "stays generation=%llu", rc == GW_ENOMEM ? "out of memory"
                : "refused", (unsigned long long)old->id);
        return rc;
    }
    g = gen_build(l, &cfg, old);
    if (g == NULL) {
        end_reload(l, NULL, "cannot start the new configuration");
        log_msg(GW_LOG_ERROR, "reload: cannot start the new configuration; "
                "the one in force stays generation=%llu",
                (unsigned long long)old->id);
        return GW_ENOMEM;
    }
    end_reload(l, g, NULL);
    /* The old generation's requests finish without its health and load
     * beats (its pool no longer balances new calls). */
    health_free(old->health);
    old->health = NULL;
    scrape_free(old->scrape);
    old->scrape = NULL;
    /* A replaced cluster writes no more heartbeats; its pool serves the
     * old generation's requests until the last one ends. */
    if (old->cluster != NULL && old->cluster != g->cluster)
        cluster_stop(old->cluster);
    log_set_level(g->cfg.log_level);
    log_set_format(g->cfg.log_format);
    log_msg(GW_LOG_INFO, "reload: configuration generation=%llu in force "
            "config=%s upstreams=%zu tenants=%zu",
            (unsigned long long)g->id, g->cfg.path, g->cfg.num_upstreams,
            g->cfg.num_tenants);
    generation_unref(l, old); /* the reference 'cur' held */
    return 0;
}

void
generations_status(struct generations *l, struct generation_status *out)
{
    gw_mutex_lock(&l->lock);
    *out = l->status;
    out->id = l->cur->id;
    gw_mutex_unlock(&l->lock);
}

void
generations_stop(struct generations *l)
{
    gw_mutex_lock(&l->lock);
    for (struct generation *g = l->gens; g != NULL; g = g->next)
        pool_stop(g->pool);
    gw_mutex_unlock(&l->lock);
}
