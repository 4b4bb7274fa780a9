/* SPDX-License-Identifier: MIT */
/*
 * health.c - the health beat (health.h).
 *
 * Locking: none of its own.  struct health is immutable once started
 * but for 'failing', whose entries each upstream's thread alone reads
 * and writes (its own); each upstream's beat runs on its own thread
 * (beat.h) with its own probe, and hands what it learns to the pool,
 * which locks itself.
 */
#include "fleet/health.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "fleet/beat.h"
#include "buf.h"
#include "base/config.h"
#include "jsonx.h"
#include "log.h"
#include "fleet/pool.h"
#include "fleet/probe.h"
#include "upstream/upstream.h"
#include "util.h"

/* What each upstream's beat asks, each a failure of its own. */
enum { HEALTH, MODELS, NUM_PROBES };

struct health {
    const struct gw_config *cfg;
    struct pool *pool;
    struct upstream *up;
    int probe_health;           /* health_interval > 0 */
    struct beat *beat;          /* a thread per upstream */
    /* Per upstream and probe, its thread's: logged once when it starts
     * failing, then summed up (log.h), not a line a beat. */
    struct log_repeat failing[CONFIG_MAX_UPSTREAMS][NUM_PROBES];
};

/*
 * GET 'path' on upstream 'idx' into 'pr'.  Returns the outcome, as the
 * pool judges it; OUT *co: the call's.
 */
static enum pool_outcome
probe(struct health *h, size_t idx, const char *path, struct probe *pr,
      struct call_outcome *co)
{
    struct call_outcome o = probe_get(h->up, idx, path, HEALTH_PROBE_MAX_MS,
                                      pr);

    *co = o;

    /* A server without the endpoint says nothing about its health. */
    if (o.kind == CALL_OK
        && (o.status == 404 || o.status == 405 || o.status == 501))
        return POOL_NEUTRAL;
    if (o.kind == CALL_OK && (o.status < 200 || o.status > 299))
        return o.status == 429 ? POOL_FAIL_THROTTLED : POOL_FAIL_STATUS;
    if (o.kind == CALL_TOO_BIG)
        return POOL_FAIL_BROKEN;        /* an answer past our bound */
    return pool_outcome_of(&o);
}

/* Free the first n entries of the three arrays and the arrays. */
static void
free_models(char **ids, char **parents, char **texts, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        gw_free(ids[i]);
        gw_free(parents[i]);
        gw_free(texts[i]);
    }
    gw_free(ids);
    gw_free(parents);
    gw_free(texts);
}

/*
 * Keep upstream idx's GET /v1/models answer: each "data" entry that is an
 * object with a string "id", as compact JSON, and its "parent" when that
 * is a string (a LoRA adapter's base model, vLLM's lora_cards; a parent
 * longer than a model id is none).  Bad answers change nothing.
 * Returns NULL, or what was wrong with the answer (for the log line).
 */
static const char *
take_models(struct health *h, size_t idx, const struct buf *body)
{
    const char *why = NULL;
    json_t *root = NULL, *data, *e;
    char **ids = NULL, **parents = NULL, **texts = NULL, *dumped, err[128];
    size_t n = 0, i;
    const char *id, *parent;

    /* At most JSONX_MAX_DEPTH deep, as client bodies: we relay this. */
    if (jsonx_parse_object(buf_ptr(body), buf_len(body), JSONX_MAX_DEPTH,
                           &root, err, sizeof(err)) != 0)
        root = NULL;
    data = json_object_get(root, "data");
    if (!json_is_array(data)) {
        why = "reason=\"not a model list\"";
        goto out;
    }
    ids = gw_calloc(HEALTH_MODELS_MAX, sizeof(*ids));
    parents = gw_calloc(HEALTH_MODELS_MAX, sizeof(*parents));
    texts = gw_calloc(HEALTH_MODELS_MAX, sizeof(*texts));
    if (ids == NULL || parents == NULL || texts == NULL)
        goto out;
    json_array_foreach(data, i, e) {
        id = json_string_value(json_object_get(e, "id"));
        if (id == NULL || n == HEALTH_MODELS_MAX
            || strlen(id) > POOL_MODEL_ID_MAX)
            continue;
        dumped = json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (dumped != NULL && strlen(dumped) > HEALTH_MODEL_MAX_BYTES) {
            free(dumped);       /* one model's entry: not a novel */
            continue;
        }
        /* Kept on our allocator, like every string the pool frees. */
        texts[n] = dumped != NULL ? gw_strdup(dumped) : NULL;
        free(dumped);           /* jansson's malloc */
        ids[n] = gw_strdup(id);
        parent = json_string_value(json_object_get(e, "parent"));
        if (parent != NULL && strlen(parent) > POOL_MODEL_ID_MAX)
            parent = NULL;
        parents[n] = parent != NULL ? gw_strdup(parent) : NULL;
        if (ids[n] == NULL || texts[n] == NULL
            || (parent != NULL && parents[n] == NULL)) {
            gw_free(ids[n]);
            gw_free(parents[n]);
            gw_free(texts[n]);
            goto out;           /* frees the n entries before this one */
        }
        n++;
    }
    /* No usable entry: as if it had not answered (it may take any
     * model), rather than an upstream that serves none. */
    if (n > 0) {
        pool_set_models(h->pool, idx, ids, parents, texts, n);
        ids = parents = texts = NULL;
        n = 0;
    }

out:
    if (ids != NULL || parents != NULL || texts != NULL)
        free_models(ids, parents, texts, n);
    json_decref(root);
    return why;
}

/*
 * One upstream's beat (beat.h): /health, then /v1/models.  A probe cut
 * by the stop says nothing, and is not logged.
 */
static void
beat(void *arg, size_t i, const _Atomic int *stopping)
{
    struct health *h = arg;
    const char *name = h->cfg->upstreams[i].name;
    const char *bad = NULL;
    char why[PROBE_WHY_MAX];
    struct call_outcome co;
    struct probe pr;
    enum pool_outcome o;
    uint64_t trial;

    probe_init(&pr, stopping, HEALTH_MODELS_MAX_BYTES);
    if (h->probe_health && pool_probe_begin(h->pool, i, &trial)) {
        o = probe(h, i, "/health", &pr, &co);
        pool_probe_end(h->pool, i, trial, o, pr.status);
        if (atomic_load(stopping))
            goto out;
        if (o != POOL_OK && o != POOL_NEUTRAL)
            bad = probe_why(&pr, &co, why, sizeof(why));
        probe_note(&h->failing[i][HEALTH], "health", name, "/health", bad);
        if (bad != NULL)
            goto out;           /* no models from a failing upstream */
    }
    if (atomic_load(stopping))
        goto out;
    o = probe(h, i, "/v1/models", &pr, &co);
    if (atomic_load(stopping))
        goto out;
    if (o == POOL_OK)
        bad = take_models(h, i, &pr.body);
    else if (o != POOL_NEUTRAL)
        bad = probe_why(&pr, &co, why, sizeof(why));
    probe_note(&h->failing[i][MODELS], "health", name, "/v1/models", bad);

out:
    probe_release(&pr);
}

struct health *
health_start(const struct gw_config *cfg, struct pool *pool,
             struct upstream *up)
{
    struct health *h;
    int64_t every = cfg->health_interval_ms;

    h = gw_calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->cfg = cfg;
    h->pool = pool;
    h->up = up;
    h->probe_health = every > 0;
    for (size_t i = 0; i < CONFIG_MAX_UPSTREAMS; i++)
        for (size_t k = 0; k < NUM_PROBES; k++)
            log_repeat_init(&h->failing[i][k], GW_LOG_WARN,
                            cfg->log_repeat_interval_ms);
    if (!h->probe_health)
        every = HEALTH_MODELS_ONLY_MS;
    h->beat = beat_start("health", pool_size(pool), every, beat, h);
    if (h->beat == NULL) {
        gw_free(h);
        return NULL;
    }
    return h;
}

void
health_free(struct health *h)
{
    if (h == NULL)
        return;
    beat_free(h->beat);
    gw_free(h);
}
