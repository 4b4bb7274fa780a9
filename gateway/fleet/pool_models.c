/* SPDX-License-Identifier: MIT */
/*
 * pool_models.c - which upstreams serve a model (pool.h "Models"), from
 * their configured lists or what their GET /v1/models said (a LoRA
 * adapter's parent too), and the /v1/models answer: the union over the
 * upstreams not ejected.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <stdatomic.h>
#include <string.h>

#include "alloc.h"
#include "base/config.h"
#include "base/metrics.h"
#include "buf.h"
#include "util.h"

void
pool_models_free(struct member *m)
{
    size_t i;

    for (i = 0; i < m->num_models; i++) {
        gw_free(m->ids[i]);
        gw_free(m->texts[i]);
        if (m->parents != NULL)
            gw_free(m->parents[i]);
    }
    gw_free(m->ids);
    gw_free(m->texts);
    gw_free(m->parents);
    m->ids = m->texts = m->parents = NULL;
    m->num_models = 0;
    m->num_adapters = 0;
}

/* Does the configuration of 'u' list 'model'? */
static int
configured(const struct config_upstream *u, const char *model)
{
    for (size_t i = 0; i < u->num_models; i++)
        if (strcmp(u->models[i], model) == 0)
            return 1;
    return 0;
}

/*
 * The parent m's GET /v1/models gave 'model' (a LoRA adapter's base
 * model), or NULL: not listed, or listed with none.
 */
static const char *
parent_of(const struct member *m, const char *model)
{
    for (size_t i = 0; m->parents != NULL && i < m->num_models; i++)
        if (m->parents[i] != NULL && strcmp(m->ids[i], model) == 0)
            return m->parents[i];
    return NULL;
}

int
pool_member_serves_locked(struct pool *p, const struct member *m,
                          const char *model)
{
    const struct config_upstream *u = m->cfg;
    const char *parent;
    size_t i;

    /* Either lock is enough to read the models (pool_impl.h). */
    assert(gw_mutex_held(&p->lock) || gw_mutex_held(&p->models_lock));
    if (model == NULL)
        return 1;
    if (u->num_models > 0) {
        if (configured(u, model))
            return 1;
        /* An adapter of a model it serves (pool.h "Models"). */
        parent = parent_of(m, model);
        return parent != NULL && configured(u, parent);
    }
    if (!m->models_known)
        return 1;               /* not asked yet: it may */
    for (i = 0; i < m->num_models; i++)
        if (strcmp(m->ids[i], model) == 0)
            return 1;
    return 0;
}

#ifdef INFERGW_UNIT_TEST
static _Atomic uint64_t sets_computed;

uint64_t
pool_sets_computed(void)
{
    return atomic_load(&sets_computed);
}
#endif

uint64_t
pool_serving_mask_locked(struct pool *p, const char *model)
{
    uint64_t mask = 0;
    size_t i;

    assert(gw_mutex_held(&p->lock) || gw_mutex_held(&p->models_lock));
#ifdef INFERGW_UNIT_TEST
    atomic_fetch_add(&sets_computed, 1);
#endif
    for (i = 0; i < p->n; i++)
        if (pool_member_serves_locked(p, &p->m[i], model))
            mask |= UINT64_C(1) << i;
    return mask;
}

uint64_t
pool_want_set_locked(struct pool *p, const struct pool_want *want)
{
    const struct pool_admission *a = want->admission;

    assert(gw_mutex_held(&p->lock));
    if (a != NULL && a->pool == p && a->models_gen == p->models_gen)
        return a->set;
    return pool_serving_mask_locked(p, want->model);
}

int
pool_serves(struct pool *p, const char *model, struct pool_admission *adm)
{
    uint64_t mask, gen;

    /* The models' own lock, not the pool's: the request takes that one
     * once, for its slot (pool_impl.h). */
    gw_mutex_lock(&p->models_lock);
    mask = pool_serving_mask_locked(p, model);
    gen = p->models_gen;
    gw_mutex_unlock(&p->models_lock);
    if (adm != NULL) {
        adm->pool = p;
        adm->models_gen = gen;
        adm->set = mask;
    }
    return mask != 0;
}

int
pool_is_adapter_locked(struct pool *p, const char *model)
{
    assert(gw_mutex_held(&p->lock));
    for (size_t i = 0; i < p->n; i++)
        if (p->m[i].num_adapters > 0 && parent_of(&p->m[i], model) != NULL)
            return 1;
    return 0;
}

void
pool_set_models(struct pool *p, size_t idx, char **ids, char **parents,
                char **texts, size_t n)
{
    struct member *m = &p->m[idx];
    struct member old;
    size_t adapters = 0;

    /* Its models get their own label value in the request histograms
     * (metrics.h).  Before the pool lock: metrics takes its own (one
     * lock at a time). */
    for (size_t i = 0; i < n; i++) {
        metrics_model_known(ids[i]);
        adapters += parents != NULL && parents[i] != NULL;
    }
    /* Both locks, in this order: a reader holds either (pool_impl.h). */
    pool_lock(p);
    gw_mutex_lock(&p->models_lock);
    old.ids = m->ids;
    old.texts = m->texts;
    old.parents = m->parents;
    old.num_models = m->num_models;
    m->ids = ids;
    m->texts = texts;
    m->parents = parents;
    m->num_models = n;
    m->num_adapters = adapters;
    m->models_known = 1;
    p->models_gen++;            /* every set computed before is stale */
    gw_mutex_unlock(&p->models_lock);
    pool_unlock(p);
    pool_models_free(&old);     /* outside the lock */
}

/*
 * The ids put in the /v1/models answer so far: an open-addressed set of
 * borrowed strings, twice the size of what may go in, so a lookup is a
 * probe or two (64 upstreams of 320 models each stay cheap under the
 * pool lock).
 */
struct idset {
    const char **slot;
    size_t mask;
};

/* Add 'id'; 1 if it is new, 0 if it was there. */
static int
idset_add(struct idset *set, const char *id)
{
    size_t k = (size_t)pool_hash_str(id, 0) & set->mask;

    while (set->slot[k] != NULL) {
        if (strcmp(set->slot[k], id) == 0)
            return 0;
        k = (k + 1) & set->mask;
    }
    set->slot[k] = id;
    return 1;
}

/* The cached object for 'id' from m's GET /v1/models, or NULL. */
static const char *
model_text(const struct member *m, const char *id)
{
    size_t i;

    for (i = 0; i < m->num_models; i++)
        if (strcmp(m->ids[i], id) == 0)
            return m->texts[i];
    return NULL;
}

/*
 * One entry of the union, unless its id is in already.  A configured
 * model the upstream did not list (or was not asked about) gets a
 * minimal object; names are validated by config.c (no quotes,
 * backslashes or controls), so they need no escaping.
 */
static int
add_model(struct buf *out, const struct member *m, const char *id,
          const char *text, struct idset *done, size_t *ndone)
{
    int rc;

    if (!idset_add(done, id))
        return 0;
    if ((*ndone)++ > 0 && (rc = buf_append(out, ",", 1)) != 0)
        return rc;
    if (text != NULL)
        return buf_append(out, text, strlen(text));
    return buf_printf(out, "{\"id\":\"%s\",\"object\":\"model\","
                      "\"created\":0,\"owned_by\":\"%s\"}", id,
                      m->cfg->name);
}

int
pool_models_json(struct pool *p, struct buf *out)
{
    struct idset done = { NULL, 0 };
    size_t ndone = 0, cap = 0, size = 2, i, k;
    int64_t now = gw_now_ms();
    const struct member *m;
    int rc = GW_ENOMEM;

    pool_lock(p);
    for (i = 0; i < p->n; i++)
        cap += p->m[i].cfg->num_models + p->m[i].num_models;
    while (size < 2 * cap)
        size *= 2;
    done.slot = gw_calloc(size, sizeof(*done.slot));
    done.mask = size - 1;
    if (done.slot == NULL)
        goto out;
    rc = buf_append_str(out, "{\"object\":\"list\",\"data\":[");
    for (i = 0; i < p->n && rc == 0; i++) {
        m = &p->m[i];
        if (pool_state_now_locked(p, &p->m[i], now) == POOL_OPEN)
            continue;
        if (m->cfg->num_models > 0) {
            for (k = 0; k < m->cfg->num_models && rc == 0; k++)
                rc = add_model(out, m, m->cfg->models[k],
                               model_text(m, m->cfg->models[k]), &done,
                               &ndone);
            /* The adapters of those it serves too (pool.h "Models"). */
            for (k = 0; m->parents != NULL && k < m->num_models && rc == 0;
                 k++)
                if (m->parents[k] != NULL
                    && configured(m->cfg, m->parents[k]))
                    rc = add_model(out, m, m->ids[k], m->texts[k], &done,
                                   &ndone);
        } else {
            for (k = 0; k < m->num_models && rc == 0; k++)
                rc = add_model(out, m, m->ids[k], m->texts[k], &done,
                               &ndone);
        }
    }
    if (rc == 0)
        rc = buf_append(out, "]}", 2);

out:
    pool_unlock(p);
    gw_free(done.slot);
    return rc;
}
