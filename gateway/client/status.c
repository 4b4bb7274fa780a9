/* SPDX-License-Identifier: MIT */
/*
 * status.c - the status view: /status.json from each module's snapshot,
 * the ring of recent errors, and the /status page (status.h).
 *
 * Locking: the ring's mutex is the only lock of this module, and it is
 * never held while another is.  status_render_json() calls the other
 * modules' snapshot functions one at a time (each takes its own lock to
 * copy, and lets go), then builds the document with no lock held.  The
 * pool's and the tenants' copies are taken once, for the summary and
 * for their tables alike.
 */
#include "client/status.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "base/cluster.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "client/generation.h"
#include "base/handler.h"
#include "base/metrics.h"
#include "fleet/pool.h"
#include "client/status_page.h"
#include "base/tenant.h"
#include "util.h"
#include "window.h"

/* ---- the ring of recent errors ---- */

struct error_entry {
    int64_t unix_ms;
    int status;
    char request_id[65];
    char kind[40];
    char message[160];
    char upstream[CONFIG_NAME_MAX + 1];
    char path[96];
};

/*
 * Process-wide, as metrics.c's counters are: every connection thread
 * notes into it, whatever generation it runs on.  'lock' guards the rest;
 * statically initialised, so it is ready before any thread exists.
 */
static struct {
    struct gw_mutex lock;
    struct error_entry e[STATUS_ERRORS];
    size_t next;                    /* the slot the next note takes */
    size_t count;                   /* notes kept, <= STATUS_ERRORS */
} errors = { { PTHREAD_MUTEX_INITIALIZER, 0, 0 }, { { 0 } }, 0, 0 };

/* 's' (NULL: "") into out[0..n), cut, non-printable bytes as '?'. */
static void
copy_printable(char *out, size_t n, const char *s)
{
    size_t i = 0;

    for (; s != NULL && s[i] != '\0' && i + 1 < n; i++)
        out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    out[i] = '\0';
}

/*
 * 'url' into out[0..n) without its user info: an upstream URL may carry
 * user:password@ (config.c takes it, libcurl sends it), and the status
 * view is no place for a password.
 */
static void
copy_url(char *out, size_t n, const char *url)
{
    const char *auth = strstr(url, "://"), *end, *at = NULL;
    size_t head;

    if (auth == NULL) {
        copy_printable(out, n, url);
        return;
    }
    auth += 3;
    end = auth + strcspn(auth, "/?#");
    for (const char *p = auth; p < end; p++)
        if (*p == '@')
            at = p;
    if (at == NULL) {
        copy_printable(out, n, url);
        return;
    }
    head = (size_t)(auth - url);
    if (head >= n)
        head = n - 1;
    memcpy(out, url, head);
    copy_printable(out + head, n - head, at + 1);
}

void
status_note_error(const struct status_error_note *n)
{
    struct error_entry e;

    /* Formatted before the lock: the critical section is one copy. */
    e.unix_ms = gw_wall_ms();
    e.status = n->status;
    copy_printable(e.request_id, sizeof(e.request_id), n->request_id);
    copy_printable(e.kind, sizeof(e.kind), n->kind);
    copy_printable(e.message, sizeof(e.message), n->message);
    copy_printable(e.upstream, sizeof(e.upstream), n->upstream);
    copy_printable(e.path, sizeof(e.path), n->path);
    gw_mutex_lock(&errors.lock);
    errors.e[errors.next] = e;
    errors.next = (errors.next + 1) % STATUS_ERRORS;
    if (errors.count < STATUS_ERRORS)
        errors.count++;
    gw_mutex_unlock(&errors.lock);
}

/* Copy the kept errors, newest first, into out[]; returns how many. */
static size_t
errors_copy(struct error_entry out[STATUS_ERRORS])
{
    size_t n;

    gw_mutex_lock(&errors.lock);
    n = errors.count;
    for (size_t i = 0; i < n; i++)
        out[i] = errors.e[(errors.next + STATUS_ERRORS - 1 - i)
                          % STATUS_ERRORS];
    gw_mutex_unlock(&errors.lock);
    return n;
}

/* ---- building the document ---- */

/*
 * json_object_set_new() for a builder that checks once at the end:
 * a NULL value (out of memory) marks the document failed.
 */
static void
put(json_t *o, const char *key, json_t *v, int *failed)
{
    if (o == NULL) {
        json_decref(v);             /* NULL-safe */
        *failed = 1;
    } else if (v == NULL || json_object_set_new(o, key, v) != 0) {
        *failed = 1;                /* set_new consumed 'v' */
    }
}

static void
append(json_t *a, json_t *v, int *failed)
{
    if (a == NULL) {
        json_decref(v);
        *failed = 1;
    } else if (v == NULL || json_array_append_new(a, v) != 0) {
        *failed = 1;
    }
}

/* An unsigned count as a JSON integer (jansson's are signed 64-bit). */
static json_t *
count(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

/* A string, or null for "". */
static json_t *
str_or_null(const char *s)
{
    return s != NULL && s[0] != '\0' ? json_string(s) : json_null();
}

/*
 * An upstream's time to first byte at quantile 'q' (0.5, 0.99), in ms:
 * metrics.h's estimate from infergw_upstream_time_to_first_byte_seconds,
 * over the process's life.  null before its first answer.
 */
static json_t *
ttft_ms(const char *upstream, double q)
{
    double s = metrics_upstream_ttfb_quantile(upstream, q);

    return s < 0 ? json_null() : json_real(s * 1000.0);
}

static const char *
phase_name(enum flight_phase p)
{
    switch (p) {
    case FLIGHT_PHASE_QUEUED:       return "queued";
    case FLIGHT_PHASE_WAITING:      return "waiting_first_byte";
    case FLIGHT_PHASE_STREAMING:    return "streaming";
    }
    return "?";
}

/* Oldest first: the flight stuck longest is the first row. */
static int
by_start(const void *a, const void *b)
{
    const struct coalesce_flight_status *x = a, *y = b;

    return (x->start_ms > y->start_ms) - (x->start_ms < y->start_ms);
}

static int
render_flights(const struct handler_ctx *ctx, json_t *doc, int64_t now)
{
    size_t max = (size_t)ctx->cfg->status_flights, total, n;
    struct coalesce_flight_status *v = NULL;
    json_t *a = json_array();
    int failed = 0;

    /* Allocated before the map lock is taken: it is held to copy only. */
    if (max > 0 && (v = gw_calloc(max, sizeof(*v))) == NULL) {
        json_decref(a);
        return GW_ENOMEM;
    }
    total = coalescer_status(ctx->co, v, max);
    n = total < max ? total : max;
    if (n > 1)
        qsort(v, n, sizeof(*v), by_start);
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_object();

        put(f, "key", json_string(v[i].key), &failed);
        put(f, "model", str_or_null(v[i].model), &failed);
        put(f, "tenant", json_string(v[i].tenant), &failed);
        put(f, "age_ms", json_integer(now - v[i].start_ms), &failed);
        put(f, "state", json_string(phase_name(v[i].phase)), &failed);
        put(f, "upstream", str_or_null(v[i].upstream), &failed);
        put(f, "followers", json_integer(v[i].followers), &failed);
        put(f, "followers_peak", json_integer(v[i].followers_peak),
            &failed);
        put(f, "bytes", count(v[i].bytes), &failed);
        append(a, f, &failed);
    }
    put(doc, "flights", a, &failed);
    put(doc, "flights_total", count(total), &failed);
    put(doc, "flights_not_listed", count(total - n), &failed);
    gw_free(v);
    return failed ? GW_ENOMEM : 0;
}

static const char *
state_name(enum pool_state s)
{
    switch (s) {
    case POOL_CLOSED:       return "up";
    case POOL_HALF_OPEN:    return "half_open";
    case POOL_OPEN:         return "ejected";
    }
    return "?";
}

/* What the health beat last said of it; null with the beat off. */
static json_t *
probe_json(const struct handler_ctx *ctx, enum pool_probe p)
{
    if (ctx->cfg->health_interval_ms == 0)
        return json_null();
    switch (p) {
    case POOL_PROBE_PENDING:    return json_string("pending");
    case POOL_PROBE_PASSED:     return json_string("passed");
    case POOL_PROBE_FAILED:     return json_string("failed");
    }
    return json_string("?");
}

static json_t *
engine_json(const struct pool_upstream_status *u, int *failed)
{
    json_t *e;

    if (!u->load_known)
        return json_null();
    e = json_object();
    put(e, "waiting", json_real(u->load.waiting), failed);
    put(e, "running", json_real(u->load.running), failed);
    put(e, "kv_usage", u->load.kv_usage >= 0 ? json_real(u->load.kv_usage)
                                            : json_null(), failed);
    put(e, "age_ms", json_integer(u->load_age_ms), failed);
    return e;
}

/*
 * A comma-separated list of adapter names (the status view's copy,
 * pool.h) as an array, each name printable (non-printable bytes as '?':
 * a JSON string must be UTF-8), a cut list ending in "...".
 */
static json_t *
names_json(const char *list, int *failed)
{
    char name[POOL_LORA_NAMES];
    json_t *a = json_array();
    const char *p = list, *comma;
    size_t n;

    while (*p != '\0') {
        comma = strchr(p, ',');
        n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        memcpy(name, p, n);             /* n < sizeof(name): a part of it */
        name[n] = '\0';
        copy_printable(name, sizeof(name), name);
        append(a, json_string(name), failed);
        p += n + (comma != NULL);
    }
    return a;
}

/* Its engine's LoRA adapters, as its last scrape said; null: none. */
static json_t *
lora_json(const struct pool_upstream_status *u, int *failed)
{
    json_t *o;

    if (!u->lora_known)
        return json_null();
    o = json_object();
    put(o, "max_lora", count(u->lora_max), failed);
    put(o, "running", names_json(u->lora_running_names, failed), failed);
    put(o, "waiting", names_json(u->lora_waiting_names, failed), failed);
    return o;
}

/*
 * What the summary and the tables show of the pool and the tenants:
 * each module's copy, taken once (status_render_json()).  Owned.
 */
struct copies {
    struct pool_upstream_status *up;
    size_t num_up;
    struct tenant_status *tenants;
    size_t num_tenants;
};

static int
render_upstreams(const struct handler_ctx *ctx, json_t *doc,
                 const struct copies *cp)
{
    json_t *a = json_array();
    char url[1024];                 /* shown cut past this */
    int failed = 0, any_ready = 0;

    for (size_t i = 0; i < cp->num_up; i++) {
        const struct pool_upstream_status *u = &cp->up[i];
        json_t *o = json_object(), *fails = json_object();

        put(o, "name", json_string(u->name), &failed);
        copy_url(url, sizeof(url), u->url);
        put(o, "url", json_string(url), &failed);
        put(o, "state", json_string(state_name(u->state)), &failed);
        put(o, "state_for_ms", json_integer(u->state_for_ms), &failed);
        put(o, "state_left_ms", u->state == POOL_OPEN
                                ? json_integer(u->state_left_ms)
                                : json_null(), &failed);
        put(o, "held_ms", json_integer(u->held_left_ms), &failed);
        put(o, "probe", probe_json(ctx, u->probe), &failed);
        put(o, "ready", json_boolean(u->ready), &failed);
        any_ready |= u->ready;
        put(o, "inflight", count(u->inflight), &failed);
        put(o, "max_inflight", u->max_inflight > 0 ? count(u->max_inflight)
                                                  : json_null(), &failed);
        put(o, "queued", count(u->queued), &failed);
        put(o, "engine", engine_json(u, &failed), &failed);
        put(o, "lora", lora_json(u, &failed), &failed);
        put(o, "lora_loads", count(u->lora_loads), &failed);
        put(o, "calls", count(u->calls), &failed);
        for (size_t k = POOL_FAIL_CONNECT; k < POOL_OUTCOME_COUNT; k++)
            put(fails, pool_outcome_name((enum pool_outcome)k),
                count(u->failures[k]), &failed);
        put(o, "failures", fails, &failed);
        put(o, "retries", count(u->retries), &failed);
        put(o, "hedges", count(u->hedges), &failed);
        put(o, "hedges_won", count(u->hedges_won), &failed);
        put(o, "ttft_p50_ms", ttft_ms(u->name, 0.5), &failed);
        put(o, "ttft_p99_ms", ttft_ms(u->name, 0.99), &failed);
        append(a, o, &failed);
    }
    put(doc, "upstreams", a, &failed);
    /* /readyz's word (route.c), from the rows above: the same instant. */
    put(doc, "readyz", json_string(handler_draining(ctx) ? "draining"
                                   : any_ready ? "ready" : "no_upstream"),
        &failed);
    return failed ? GW_ENOMEM : 0;
}

/* A limit of the configuration, or null for none (0) or no such tenant. */
static json_t *
limit(const struct config_tenant *ct, uint64_t v)
{
    return ct != NULL && v > 0 ? count(v) : json_null();
}

/* The usage counts u[] (enum tenant_usage_field) as a JSON object. */
static json_t *
usage_json(const uint64_t *u, int *failed)
{
    json_t *o = json_object();

    for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++)
        put(o, tenant_usage_field_name(f), count(u[f]), failed);
    return o;
}

/*
 * 'clustered': [cluster] is on, so the counts not yet in Redis mean
 * something ("usage_unsent"); the fleet's totals are shown whenever the
 * beat has read them, with their age.
 */
static json_t *
tenant_json(const struct tenant_status *t, const struct config_tenant *ct,
            int clustered, int *failed)
{
    json_t *o = json_object(), *tok = json_object();
    uint64_t rejected = 0;

    put(o, "name", json_string(t->name), failed);
    put(o, "inflight", count(t->inflight), failed);
    put(o, "max_inflight", limit(ct, ct != NULL ? ct->max_inflight : 0),
        failed);
    put(o, "requests_last_minute", count(t->last_minute), failed);
    put(o, "requests_per_minute",
        limit(ct, ct != NULL ? ct->requests_per_minute : 0), failed);
    for (size_t k = 0; k < TENANT_LIMITS; k++)
        rejected += t->rejected[k];
    put(o, "rejected_429", count(rejected), failed);
    put(o, "tokens_per_minute",
        limit(ct, ct != NULL ? ct->tokens_per_minute : 0), failed);
    /* The bucket's whole tokens, negative in debt; null: no bucket. */
    put(o, "tokens_bucket", t->tokens_bucket
        ? json_integer((json_int_t)t->tokens_credit) : json_null(), failed);
    put(o, "tokens_today", count(t->tokens_day), failed);
    put(o, "tokens_per_day", limit(ct, ct != NULL ? ct->tokens_per_day : 0),
        failed);
    put(o, "tokens_this_month", count(t->tokens_month), failed);
    put(o, "tokens_per_month",
        limit(ct, ct != NULL ? ct->tokens_per_month : 0), failed);
    put(tok, "prompt", count(t->prompt_tokens), failed);
    put(tok, "completion", count(t->completion_tokens), failed);
    put(o, "tokens", tok, failed);
    put(o, "tokens_saved", count(t->saved), failed);
    put(o, "usage", usage_json(t->usage, failed), failed);
    put(o, "usage_unsent", clustered ? usage_json(t->unsent, failed)
                                     : json_null(), failed);
    if (t->cluster_age_ms >= 0) {
        json_t *c = usage_json(t->cluster, failed);

        put(c, "age_ms", json_integer(t->cluster_age_ms), failed);
        put(o, "cluster_usage", c, failed);
    } else {
        put(o, "cluster_usage", json_null(), failed);
    }
    return o;
}

/*
 * Every configured tenant (the default one when none is), in the
 * configuration's order, then any other the counts know (a name a
 * reload removed: no limits).  A tenant with no request yet has zeros.
 */
static int
render_tenants(const struct handler_ctx *ctx, json_t *doc,
               const struct copies *cp)
{
    const struct gw_config *cfg = ctx->cfg;
    const struct tenant_status *v = cp->tenants;
    struct tenant_status zero;
    size_t n = cp->num_tenants, i, k;
    size_t shown = cfg->num_tenants > 0 ? cfg->num_tenants : 1;
    unsigned char *used = NULL;
    json_t *a = json_array();
    int failed = 0;

    if (n > 0 && (used = gw_calloc(n, 1)) == NULL) {
        failed = 1;
        goto out;
    }
    for (i = 0; i < shown; i++) {
        const char *name = tenant_name(cfg, i < cfg->num_tenants
                                            ? i : CONFIG_MAX_TENANTS);
        const struct tenant_status *t = NULL;

        for (k = 0; k < n && t == NULL; k++)
            if (strcmp(v[k].name, name) == 0) {
                t = &v[k];
                used[k] = 1;
            }
        if (t == NULL) {
            memset(&zero, 0, sizeof(zero));
            snprintf(zero.name, sizeof(zero.name), "%s", name);
            zero.cluster_age_ms = -1;
            t = &zero;
        }
        append(a, tenant_json(t, i < cfg->num_tenants ? &cfg->tenants[i]
                                                      : NULL,
                              ctx->cluster != NULL, &failed),
               &failed);
    }
    for (k = 0; k < n; k++)
        if (!used[k])
            append(a, tenant_json(&v[k], NULL, ctx->cluster != NULL,
                                  &failed), &failed);

out:
    put(doc, "tenants", a, &failed);
    gw_free(used);
    return failed ? GW_ENOMEM : 0;
}

static int
render_errors(json_t *doc)
{
    struct error_entry *v = gw_calloc(STATUS_ERRORS, sizeof(*v));
    json_t *a = json_array();
    size_t n;
    int failed = 0;

    if (v == NULL) {
        json_decref(a);
        return GW_ENOMEM;
    }
    n = errors_copy(v);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object();

        put(o, "time_unix_ms", json_integer(v[i].unix_ms), &failed);
        put(o, "request_id", json_string(v[i].request_id), &failed);
        put(o, "status", json_integer(v[i].status), &failed);
        put(o, "kind", str_or_null(v[i].kind), &failed);
        put(o, "message", str_or_null(v[i].message), &failed);
        put(o, "upstream", str_or_null(v[i].upstream), &failed);
        put(o, "path", json_string(v[i].path), &failed);
        append(a, o, &failed);
    }
    put(doc, "errors", a, &failed);
    gw_free(v);
    return failed ? GW_ENOMEM : 0;
}

/*
 * "cluster": null without [cluster]; else Redis's state as the beat last
 * found it and the live gateways, this one marked.
 */
static int
render_cluster(const struct handler_ctx *ctx, json_t *doc)
{
    struct cluster_status *cs;
    char why[sizeof(cs->last_error)];
    json_t *o, *a;
    int failed = 0;

    if (ctx->cluster == NULL) {
        put(doc, "cluster", json_null(), &failed);
        return failed ? GW_ENOMEM : 0;
    }
    cs = gw_calloc(1, sizeof(*cs));
    if (cs == NULL)
        return GW_ENOMEM;
    cluster_status(ctx->cluster, cs);
    o = json_object();
    a = json_array();
    put(o, "node", json_string(cs->node), &failed);
    put(o, "redis", json_string(cs->redis), &failed);
    put(o, "up", json_boolean(cs->up), &failed);
    put(o, "since_unix_ms", cs->since_unix_ms > 0
        ? json_integer(cs->since_unix_ms) : json_null(), &failed);
    /* Redis's own words may be any bytes: json_string() wants UTF-8. */
    copy_printable(why, sizeof(why), cs->up ? "" : cs->last_error);
    put(o, "last_error", str_or_null(why), &failed);
    put(o, "connections", count(cs->connections), &failed);
    put(o, "connections_max", count(cs->connections_max), &failed);
    put(o, "lease_ms", json_integer(cs->lease_ms), &failed);
    put(o, "on_error", json_string(cs->on_error == ON_ERROR_DENY ? "deny"
                                   : "local"), &failed);
    for (size_t i = 0; i < cs->num_members; i++) {
        const struct cluster_member *m = &cs->members[i];
        json_t *e = json_object();

        put(e, "node", json_string(m->node), &failed);
        put(e, "self", json_boolean(strcmp(m->node, cs->node) == 0),
            &failed);
        put(e, "version", json_string(m->version), &failed);
        put(e, "generation", count(m->generation), &failed);
        put(e, "started_unix_ms", json_integer(m->started_unix_ms),
            &failed);
        put(e, "ttl_ms", json_integer(m->ttl_ms), &failed);
        append(a, e, &failed);
    }
    put(o, "members", a, &failed);
    put(doc, "cluster", o, &failed);
    gw_free(cs);
    return failed ? GW_ENOMEM : 0;
}

/* ---- the summary ---- */

/*
 * The cache's row of the summary, and the one place it is filled: shown
 * while the cache is on ([cache] ttl > 0), its hits as
 * infergw_cache_requests_total{result="hit"} counts them, and the tokens
 * they received (infergw_cache_tokens_saved_total, every tenant's).
 */
static void
summary_cache(const struct handler_ctx *ctx, const struct copies *cp,
              struct status_summary *s)
{
    s->cache_enabled = ctx->cfg->cache_ttl_ms > 0;
    s->cache_hits = s->m.cache_hits;
    s->cache_tokens_saved = 0;
    for (size_t i = 0; i < cp->num_tenants; i++)
        s->cache_tokens_saved += cp->tenants[i].cache_saved;
}

/* part / whole, or null when there is no whole yet. */
static json_t *
ratio(uint64_t part, uint64_t whole)
{
    return whole > 0 ? json_real((double)part / (double)whole)
                     : json_null();
}

/* Answers by class, c[i] counting the (i+1)xx ones (metrics.h). */
static json_t *
classes_json(const uint64_t c[WINDOW_CLASSES], int *failed)
{
    json_t *o = json_object();
    uint64_t all = 0;

    for (size_t i = 0; i < WINDOW_CLASSES; i++)
        all += c[i];
    put(o, "requests", count(all), failed);
    put(o, "2xx", count(c[1]), failed);
    put(o, "4xx", count(c[3]), failed);
    put(o, "5xx", count(c[4]), failed);
    return o;
}

/*
 * One way of answering without a call of one's own (followers, cache
 * hits): 'n' requests answered so, which received 'tokens', and their
 * shares (struct status_summary).  The same shape for both.
 */
static json_t *
saving_json(const struct status_summary *s, uint64_t n, uint64_t tokens,
            int *failed)
{
    uint64_t would = s->m.upstream_calls + s->m.followers + s->cache_hits;
    json_t *o = json_object();

    put(o, "requests", count(n), failed);
    put(o, "calls_saved_share", ratio(n, would), failed);
    put(o, "tokens_saved", count(tokens), failed);
    put(o, "tokens_saved_share", ratio(tokens, s->tokens), failed);
    return o;
}

GW_TESTABLE json_t *
summary_json(const struct status_summary *s)
{
    json_t *o = json_object();
    double window_s = (double)s->m.minute_ms / 1000.0;
    uint64_t minute = 0;
    int failed = 0;

    for (size_t i = 0; i < WINDOW_CLASSES; i++)
        minute += s->m.minute[i];
    put(o, "window_s", json_real(window_s), &failed);
    put(o, "requests_per_s", json_real((double)minute / window_s), &failed);
    put(o, "last_minute", classes_json(s->m.minute, &failed), &failed);
    put(o, "since_start", classes_json(s->m.total, &failed), &failed);
    put(o, "upstream_calls", count(s->m.upstream_calls), &failed);
    put(o, "proxied_requests", count(s->m.proxied), &failed);
    put(o, "calls_per_request", ratio(s->m.upstream_calls, s->m.proxied),
        &failed);
    put(o, "coalesced", saving_json(s, s->m.followers, s->tokens_saved,
                                    &failed), &failed);
    put(o, "cache_enabled", json_boolean(s->cache_enabled), &failed);
    put(o, "cache", saving_json(s, s->cache_hits, s->cache_tokens_saved,
                                &failed), &failed);
    if (failed) {
        json_decref(o);             /* NULL-safe */
        return NULL;
    }
    return o;
}

/* "summary": its numbers, then each upstream's state and time in it. */
static int
render_summary(const struct handler_ctx *ctx, json_t *doc,
               const struct copies *cp)
{
    struct status_summary s;
    json_t *o, *a = json_array();
    int failed = 0;

    memset(&s, 0, sizeof(s));
    metrics_summary(&s.m);
    for (size_t i = 0; i < cp->num_tenants; i++) {
        s.tokens += cp->tenants[i].prompt_tokens
                    + cp->tenants[i].completion_tokens;
        s.tokens_saved += cp->tenants[i].saved;
    }
    summary_cache(ctx, cp, &s);
    o = summary_json(&s);
    for (size_t i = 0; i < cp->num_up; i++) {
        json_t *u = json_object();

        put(u, "name", json_string(cp->up[i].name), &failed);
        put(u, "state", json_string(state_name(cp->up[i].state)), &failed);
        put(u, "for_ms", json_integer(cp->up[i].state_for_ms), &failed);
        append(a, u, &failed);
    }
    put(o, "upstreams", a, &failed);
    put(doc, "summary", o, &failed);
    return failed ? GW_ENOMEM : 0;
}

static int
render_head(const struct handler_ctx *ctx, json_t *doc, int64_t now)
{
    struct generation_status gs;
    json_t *reload = json_null();
    char why[sizeof(gs.reload_error)];
    int failed = 0;

    generations_status(ctx->gens, &gs);
    put(doc, "version", json_string(INFERGW_VERSION), &failed);
    put(doc, "uptime_s", json_integer((now - gs.started_ms) / 1000),
        &failed);
    put(doc, "time_unix_ms", json_integer(gw_wall_ms()), &failed);
    put(doc, "generation", count(gs.id), &failed);
    if (gs.reloaded) {
        reload = json_object();
        put(reload, "time_unix_ms", json_integer(gs.reload_unix_ms),
            &failed);
        put(reload, "result", json_string(gs.reload_ok ? "ok" : "failed"),
            &failed);
        /* The loader quotes the bad value, which may be any bytes:
         * json_string() refuses what is not UTF-8. */
        copy_printable(why, sizeof(why), gs.reload_error);
        put(reload, "error", str_or_null(why), &failed);
    }
    put(doc, "last_reload", reload, &failed);
    return failed ? GW_ENOMEM : 0;
}

int
status_render_json(const struct handler_ctx *ctx, struct buf *out)
{
    int64_t now = gw_now_ms();
    struct copies cp = { NULL, 0, NULL, 0 };
    json_t *doc = json_object();
    char *text = NULL;
    int rc = GW_ENOMEM;

    if (doc == NULL)
        goto out;
    cp.up = gw_calloc(CONFIG_MAX_UPSTREAMS, sizeof(*cp.up));
    if (cp.up == NULL
        || tenants_status(ctx->tenants, ctx->cfg, gw_now_us(), gw_wall_s(),
                          &cp.tenants, &cp.num_tenants) != 0)
        goto out;
    cp.num_up = pool_status(ctx->pool, cp.up, CONFIG_MAX_UPSTREAMS);
    if (render_head(ctx, doc, now) != 0
        || render_summary(ctx, doc, &cp) != 0
        || render_flights(ctx, doc, now) != 0
        || render_upstreams(ctx, doc, &cp) != 0
        || render_tenants(ctx, doc, &cp) != 0
        || render_cluster(ctx, doc) != 0
        || render_errors(doc) != 0)
        goto out;
    text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL)
        goto out;
    rc = buf_append_str(out, text);

out:
    free(text);                     /* jansson's malloc */
    json_decref(doc);
    gw_free(cp.tenants);
    gw_free(cp.up);
    return rc;
}

const char *
status_page(size_t *len)
{
    *len = sizeof(status_page_html) - 1;
    return status_page_html;
}
