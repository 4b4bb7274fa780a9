/* SPDX-License-Identifier: MIT */
/*
 * scrape.c - the load beat (scrape.h).
 *
 * Locking: none of its own.  struct scrape is immutable once started but
 * for 'known' and 'failing', which each upstream's thread alone reads and
 * writes (its own entry); the pool locks itself.
 */
#include "fleet/scrape.h"

#include <stdatomic.h>
#include <stdio.h>

#include "alloc.h"
#include "fleet/beat.h"
#include "base/config.h"
#include "fleet/engine.h"
#include "fleet/lora.h"
#include "log.h"
#include "fleet/pool.h"
#include "fleet/probe.h"
#include "prom_read.h"
#include "util.h"

/* What the last scrape of an upstream said of its engine load. */
enum scrape_known {
    KNOWN_NOT_YET,              /* no scrape yet: the first is logged */
    KNOWN_NONE,                 /* answered without the series */
    KNOWN_LOAD,                 /* had the load */
};

struct scrape {
    const struct gw_config *cfg;
    struct pool *pool;
    struct upstream *up;
    struct beat *beat;
    /* Per upstream, its thread's: what its last scrape said. */
    enum scrape_known known[CONFIG_MAX_UPSTREAMS];
    /* Per upstream, its thread's: scrapes that got no answer, or a 5xx,
     * logged as one repeating failure (log.h).  An answer without the
     * series is what that server serves, not a failure: 'known' says
     * it, once. */
    struct log_repeat failing[CONFIG_MAX_UPSTREAMS];
    /* Per upstream, its thread's: what its last good scrape said of its
     * LoRA adapters (lora_report_read()'s code; GW_ENOTFOUND before the
     * first), so that a change is logged once. */
    int lora_rc[CONFIG_MAX_UPSTREAMS];
};

/* The series read; WAITING and RUNNING must be there. */
enum { WAITING, RUNNING, KV, KV_OLD, NUM_SERIES };

/*
 * Read the engine's load from a GET /metrics body into 'r'.  Returns
 * NULL, or why there is none (for the log line).
 */
static const char *
read_load(const struct probe *pr, struct engine_report *r)
{
    struct prom_read_sum s[NUM_SERIES] = {
        [WAITING] = { .name = "vllm:num_requests_waiting" },
        [RUNNING] = { .name = "vllm:num_requests_running" },
        [KV] = { .name = "vllm:kv_cache_usage_perc" },
        [KV_OLD] = { .name = "vllm:gpu_cache_usage_perc" },
    };

    prom_read_sums(buf_ptr(&pr->body), buf_len(&pr->body), s, NUM_SERIES);
    if (s[WAITING].samples == 0 || s[RUNNING].samples == 0)
        return "no vllm:num_requests_waiting and _running";
    if (s[WAITING].refused > 0 || s[RUNNING].refused > 0)
        return "a malformed vllm:num_requests sample";
    r->waiting = s[WAITING].sum;
    r->running = s[RUNNING].sum;
    r->kv_usage = -1;                   /* not reported */
    if (s[KV].samples > 0 && s[KV].refused == 0)
        r->kv_usage = s[KV].sum;
    else if (s[KV_OLD].samples > 0 && s[KV_OLD].refused == 0)
        r->kv_usage = s[KV_OLD].sum;
    return NULL;
}

/*
 * Log a change of what upstream 'name''s scrapes say of its LoRA
 * adapters: 'rc' is lora_report_read()'s now, 'was' the last one's.  A
 * server that never had LoRA is said nothing of.
 */
static void
note_lora(const char *name, int rc, int was, const struct lora_report *r)
{
    if (rc == was)
        return;
    if (rc == 0) {
        log_msg(GW_LOG_INFO, "scrape: upstream %s reports its LoRA "
                "adapters (vllm:lora_requests_info max_lora=%llu): calls "
                "for one prefer where it is", name,
                (unsigned long long)r->max_lora);
        if (r->dropped > 0)
            log_msg(GW_LOG_WARN, "scrape: upstream %s: %zu LoRA adapter "
                    "name(s) past the bounds not kept", name, r->dropped);
    } else if (rc == GW_ENOTFOUND) {
        log_msg(GW_LOG_INFO, "scrape: upstream %s no longer reports its "
                "LoRA adapters", name);
    } else {
        log_msg(GW_LOG_WARN, "scrape: upstream %s: vllm:lora_requests_info "
                "unread (%s): its adapters are not known", name,
                gw_strerror(rc));
    }
}

/* One upstream's scrape (beat.h). */
static void
scrape_one(void *arg, size_t i, const _Atomic int *stopping)
{
    struct scrape *sc = arg;
    const char *name = sc->cfg->upstreams[i].name;
    struct engine_report r;
    struct lora_report lr = { 0 };
    struct engine_mark sent;
    struct probe pr;
    struct call_outcome o;
    const char *why = NULL;
    char what[64], fail[PROBE_WHY_MAX];
    int failed, lora_rc = GW_ENOTFOUND;

    probe_init(&pr, stopping, SCRAPE_MAX_BYTES);
    sent = pool_load_mark(sc->pool, i);
    o = probe_get(sc->up, i, "/metrics", sc->cfg->load_timeout_ms, &pr);
    if (o.kind != CALL_OK) {
        why = call_kind_text(o.kind);
    } else if (o.status != 200) {
        snprintf(what, sizeof(what), "status %d", o.status);
        why = what;
    } else {
        why = read_load(&pr, &r);
        if (why == NULL)
            lora_rc = lora_report_read(buf_ptr(&pr.body), buf_len(&pr.body),
                                       &lr);
    }
    /* No answer, or the server's own error: not what it serves. */
    failed = o.kind != CALL_OK || o.status >= 500;
    if (failed)
        probe_why(&pr, &o, fail, sizeof(fail));
    probe_release(&pr);
    if (atomic_load(stopping)) {
        lora_report_release(&lr);
        return;                         /* cut short: says nothing */
    }
    probe_note(&sc->failing[i], "scrape", name, "/metrics",
               failed ? fail : NULL);
    if (why == NULL) {
        note_lora(name, lora_rc, sc->lora_rc[i], &lr);
        sc->lora_rc[i] = lora_rc;
    }
    /* The adapters first, so that both are there once the load is. */
    pool_set_lora(sc->pool, i, lora_rc == 0 ? &lr : NULL, &sent);
    lora_report_release(&lr);           /* emptied when taken */
    pool_set_load(sc->pool, i, why == NULL ? &r : NULL, &sent);
    if (why == NULL && sc->known[i] != KNOWN_LOAD)
        log_msg(GW_LOG_INFO, "scrape: upstream %s reports its engine load "
                "(GET /metrics): balancing on it", name);
    else if (why != NULL && sc->known[i] != KNOWN_NONE)
        log_msg(GW_LOG_INFO, "scrape: upstream %s has no engine load "
                "(GET /metrics: %s): balancing on its open calls", name,
                why);
    sc->known[i] = why == NULL ? KNOWN_LOAD : KNOWN_NONE;
}

struct scrape *
scrape_start(const struct gw_config *cfg, struct pool *pool,
             struct upstream *up)
{
    struct scrape *sc;

    sc = gw_calloc(1, sizeof(*sc));
    if (sc == NULL)
        return NULL;
    sc->cfg = cfg;
    sc->pool = pool;
    sc->up = up;
    for (size_t i = 0; i < CONFIG_MAX_UPSTREAMS; i++) {
        sc->known[i] = KNOWN_NOT_YET;
        sc->lora_rc[i] = GW_ENOTFOUND;
        log_repeat_init(&sc->failing[i], GW_LOG_WARN,
                        cfg->log_repeat_interval_ms);
    }
    if (cfg->load_interval_ms == 0)
        return sc;                      /* off: no thread */
    sc->beat = beat_start("scrape", pool_size(pool), cfg->load_interval_ms,
                          scrape_one, sc);
    if (sc->beat == NULL) {
        gw_free(sc);
        return NULL;
    }
    return sc;
}

void
scrape_free(struct scrape *sc)
{
    if (sc == NULL)
        return;
    beat_free(sc->beat);
    gw_free(sc);
}
