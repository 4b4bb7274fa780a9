/*
 * health.c - the health beat (health.h).
 *
 * Locking: 'lock' guards 'stop'; the thread waits on 'cv' between beats.
 * Everything else belongs to the thread.
 */
#include "health.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "config.h"
#include "dispatch.h"
#include "jsonx.h"
#include "log.h"
#include "pool.h"
#include "upstream.h"
#include "util.h"

struct health {
    const struct gw_config *cfg;
    struct pool *pool;
    struct upstream *up;
    pthread_t thread;
    struct gw_mutex lock;
    pthread_cond_t cv;
    int stop;                   /* guarded by lock */
    _Atomic int stopping;       /* the same, for the probes' tick */
};

/* A probe's sink: the status, and the body up to a bound. */
struct probe {
    struct health *h;
    int status;
    struct buf body;
};

static int
probe_head(void *arg, const struct upstream_head *h)
{
    struct probe *pr = arg;

    pr->status = h->status;
    return 0;
}

static int
probe_data(void *arg, const char *p, size_t n)
{
    struct probe *pr = arg;
    int rc = buf_append(&pr->body, p, n);

    return rc == 0 ? 0 : rc == GW_ENOMEM ? GW_ENOMEM : GW_ETOOBIG;
}

static int
probe_tick(void *arg)
{
    struct probe *pr = arg;

    return atomic_load(&pr->h->stopping) ? GW_ESTOPPING : 0;
}

/* GET 'path' on upstream 'idx' into 'pr'.  Returns the outcome. */
static enum pool_outcome
probe(struct health *h, size_t idx, const char *path, struct probe *pr)
{
    struct upstream_request req = { "GET", path, NULL, 0, NULL, NULL };
    struct upstream_sink sink = { pr, probe_head, probe_data, probe_tick,
                                  NULL };
    struct upstream_opts opts = {
        .total_timeout_ms = HEALTH_PROBE_MAX_MS,
        .watch_fd = -1,
        .stop_fd = -1,
    };
    struct upstream_result res;

    pr->h = h;
    pr->status = 0;
    buf_reset(&pr->body);
    upstream_perform(h->up, idx, &req, &opts, &sink, &res);
    /* A server without the endpoint says nothing about its health. */
    if (res.rc == 0 && (res.status == 404 || res.status == 405
                        || res.status == 501))
        return POOL_NEUTRAL;
    if (res.rc == 0 && (res.status < 200 || res.status > 299))
        return res.status == 429 ? POOL_FAIL_THROTTLED : POOL_FAIL_STATUS;
    if (res.rc == GW_ETOOBIG)
        return POOL_FAIL_BROKEN;        /* an answer past our bound */
    return dispatch_judge(&res);
}

/* Free the first n entries of the two arrays and the arrays. */
static void
free_models(char **ids, char **texts, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        gw_free(ids[i]);
        gw_free(texts[i]);
    }
    gw_free(ids);
    gw_free(texts);
}

/*
 * Keep upstream idx's GET /v1/models answer: each "data" entry that is an
 * object with a string "id", as compact JSON.  Bad answers change nothing.
 */
static void
take_models(struct health *h, size_t idx, const struct buf *body)
{
    json_t *root = NULL, *data, *e;
    char **ids = NULL, **texts = NULL, *dumped, err[128];
    size_t n = 0, i;
    const char *id;

    /* At most JSONX_MAX_DEPTH deep, as client bodies: we relay this. */
    if (jsonx_parse_object(buf_ptr(body), buf_len(body), JSONX_MAX_DEPTH,
                           &root, err, sizeof(err)) != 0)
        root = NULL;
    data = json_object_get(root, "data");
    if (!json_is_array(data)) {
        log_msg(GW_LOG_WARN, "health: upstream %s: GET /v1/models is not "
                "a model list", h->cfg->upstreams[idx].name);
        goto out;
    }
    ids = gw_calloc(HEALTH_MODELS_MAX, sizeof(*ids));
    texts = gw_calloc(HEALTH_MODELS_MAX, sizeof(*texts));
    if (ids == NULL || texts == NULL)
        goto out;
    json_array_foreach(data, i, e) {
        id = json_string_value(json_object_get(e, "id"));
        if (id == NULL || n == HEALTH_MODELS_MAX || strlen(id) > 256)
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
        if (ids[n] == NULL || texts[n] == NULL) {
            gw_free(ids[n]);
            gw_free(texts[n]);
            goto out;
        }
        n++;
    }
    /* No usable entry: as if it had not answered (it may take any
     * model), rather than an upstream that serves none. */
    if (n > 0) {
        pool_set_models(h->pool, idx, ids, texts, n);
        ids = texts = NULL;
        n = 0;
    }

out:
    if (ids != NULL || texts != NULL)
        free_models(ids, texts, n);
    json_decref(root);
}

static void
beat(struct health *h, int probe_health)
{
    struct probe pr;
    enum pool_outcome o;
    size_t i;
    uint64_t trial;

    buf_init(&pr.body, HEALTH_MODELS_MAX_BYTES);
    for (i = 0; i < pool_size(h->pool) && !atomic_load(&h->stopping); i++) {
        if (probe_health && pool_probe_begin(h->pool, i, &trial)) {
            o = probe(h, i, "/health", &pr);
            pool_probe_end(h->pool, i, trial, o);
            if (o != POOL_OK && o != POOL_NEUTRAL) {
                log_msg(GW_LOG_WARN, "health: upstream %s failed GET "
                        "/health kind=%s status=%d",
                        h->cfg->upstreams[i].name, pool_outcome_name(o),
                        pr.status);
                continue;       /* no models from a failing upstream */
            }
        }
        if (probe(h, i, "/v1/models", &pr) == POOL_OK)
            take_models(h, i, &pr.body);
    }
    buf_release(&pr.body);
}

static void *
run(void *arg)
{
    struct health *h = arg;
    int64_t every = h->cfg->health_interval_ms;
    int probe_health = every > 0;
    int64_t next;

    if (!probe_health)
        every = HEALTH_MODELS_ONLY_MS;
    gw_mutex_lock(&h->lock);
    while (!h->stop) {
        next = gw_now_ms() + every;
        gw_mutex_unlock(&h->lock);
        beat(h, probe_health);
        gw_mutex_lock(&h->lock);
        while (!h->stop && gw_cond_timedwait(&h->cv, &h->lock, next) == 0)
            ;
    }
    gw_mutex_unlock(&h->lock);
    return NULL;
}

struct health *
health_start(const struct gw_config *cfg, struct pool *pool,
             struct upstream *up)
{
    struct health *h;
    int err;

    h = gw_calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->cfg = cfg;
    h->pool = pool;
    h->up = up;
    gw_mutex_init(&h->lock);
    gw_cond_init(&h->cv);
    err = pthread_create(&h->thread, NULL, run, h);
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "health: pthread_create");
        pthread_cond_destroy(&h->cv);
        gw_mutex_destroy(&h->lock);
        gw_free(h);
        return NULL;
    }
    return h;
}

void
health_stop(struct health *h)
{
    if (h == NULL)
        return;
    atomic_store(&h->stopping, 1);
    gw_mutex_lock(&h->lock);
    h->stop = 1;
    pthread_cond_signal(&h->cv);
    gw_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->cv);
    gw_mutex_destroy(&h->lock);
    gw_free(h);
}
