/* SPDX-License-Identifier: MIT */
/*
 * pool_lora.c - the pool's side of LoRA adapters (pool.h "LoRA
 * adapters", lora.h): each upstream's report from the load beat, the
 * calls sent for an adapter, the upstreams a call for one prefers, and
 * what the status view and /metrics show of them.
 *
 * A call is for an adapter when some upstream's GET /v1/models lists its
 * model with a parent, or some upstream's engine reports it running or
 * waiting: a base model is neither, and its calls are balanced as
 * before, on a fleet with adapters or without.
 */
#include "fleet/pool_impl.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "base/config.h"
#include "fleet/engine.h"
#include "fleet/lora.h"
#include "prom.h"
#include "util.h"

void
pool_set_lora(struct pool *p, size_t idx, struct lora_report *r,
              const struct engine_mark *sent)
{
    struct lora_report old;

    pool_lock(p);
    lora_set(&p->m[idx].lora, r, sent, &old);
    pool_unlock(p);
    lora_report_release(&old);          /* outside the lock */
}

/* Is 'model' (hashed 'h') an adapter, as far as the upstreams say? */
static int
is_adapter(struct pool *p, const char *model, uint64_t h)
{
    if (pool_is_adapter_locked(p, model))
        return 1;
    for (size_t i = 0; i < p->n; i++)
        if (p->m[i].lora.known && lora_reported(&p->m[i].lora, h))
            return 1;
    return 0;
}

/*
 * The upstreams of 'set' by what a call for 'model' makes of them
 * (lora_fit()) into by_fit[], with a balancer that reads engines and
 * lora_aware on.  Returns 0 when the rule does not apply: off, or
 * 'model' is no adapter (by_fit[] then all 0).
 */
static int
classify(struct pool *p, uint64_t set, const char *model, int64_t now,
         uint64_t by_fit[LORA_NEITHER + 1])
{
    const struct member *m;
    uint64_t h;

    memset(by_fit, 0, (LORA_NEITHER + 1) * sizeof(*by_fit));
    if (!p->cfg->lora_aware || !pool_engine_aware(p) || model == NULL)
        return 0;
    h = lora_hash(model);
    if (!is_adapter(p, model, h))
        return 0;
    for (size_t i = 0; i < p->n; i++) {
        m = &p->m[i];
        if (set & (UINT64_C(1) << i))
            by_fit[lora_fit(&m->lora, engine_fresh(&m->load, p->cfg, now),
                            h)] |= UINT64_C(1) << i;
    }
    return 1;
}

uint64_t
pool_lora_resident_locked(struct pool *p, uint64_t set, const char *model,
                          int64_t now)
{
    uint64_t by_fit[LORA_NEITHER + 1];

    assert(gw_mutex_held(&p->lock));
    classify(p, set, model, now, by_fit);
    return by_fit[LORA_RESIDENT];
}

int
pool_lora_waits_locked(struct pool *p, uint64_t room, uint64_t use,
                       const char *model, int64_t now)
{
    /* One classification of 'use' ('room' is a part of it, and an
     * upstream's fit does not depend on the set asked about): a call's
     * admission classifies its model once here, not twice. */
    uint64_t resident = pool_lora_resident_locked(p, use, model, now);

    return resident != 0 && (resident & room) == 0;
}

uint64_t
pool_lora_group_locked(struct pool *p, uint64_t room, const char *model,
                       int64_t now)
{
    static const enum lora_fit order[] = {
        LORA_RESIDENT, LORA_FREE, LORA_ROOM,
    };
    uint64_t by_fit[LORA_NEITHER + 1];

    assert(gw_mutex_held(&p->lock));
    if (!classify(p, room, model, now, by_fit))
        return room;
    for (size_t k = 0; k < GW_ARRAY_LEN(order); k++)
        if (by_fit[order[k]] != 0)
            return by_fit[order[k]];
    return room;
}

void
pool_lora_sent_locked(struct pool *p, size_t idx, const char *model,
                      int64_t now)
{
    struct member *m = &p->m[idx];
    uint64_t h;

    assert(gw_mutex_held(&p->lock));
    if (model == NULL)
        return;
    h = lora_hash(model);
    if (!is_adapter(p, model, h))
        return;
    lora_note_call(&m->lora, engine_fresh(&m->load, p->cfg, now), h,
                   m->load.started);
}

/*
 * names[from, to) of 'r', comma-separated, into out[0..size): as many as
 * fit whole with room for a ",..." after them, then that when one did
 * not ("..." alone when the first did not).
 */
static void
join_names(const struct lora_report *r, size_t from, size_t to, char *out,
           size_t size)
{
    const char *name, *sep;
    size_t len = 0;

    out[0] = '\0';
    for (size_t i = from; i < to; i++) {
        name = lora_report_name(r, i);
        sep = len > 0 ? "," : "";
        if (len + strlen(sep) + strlen(name) + 4 >= size) {
            snprintf(out + len, size - len, "%s...", sep);
            return;
        }
        len += (size_t)snprintf(out + len, size - len, "%s%s", sep, name);
    }
}

void
pool_lora_status_locked(struct pool *p, const struct member *m,
                        struct pool_upstream_status *st)
{
    const struct lora_report *r = &m->lora.last;

    assert(gw_mutex_held(&p->lock));
    st->lora_known = m->lora.known;
    st->lora_max = r->max_lora;
    st->lora_running = r->num_running;
    st->lora_waiting = r->num_waiting;
    join_names(r, 0, r->num_running, st->lora_running_names,
               sizeof(st->lora_running_names));
    join_names(r, r->num_running, r->num_running + r->num_waiting,
               st->lora_waiting_names, sizeof(st->lora_waiting_names));
    st->lora_loads = m->lora.loads;
}

void
pool_lora_render_locked(struct pool *p, struct prom *w)
{
    static const char *const states[] = { "running", "waiting" };
    size_t i, k;

    assert(gw_mutex_held(&p->lock));
    prom_family(w, "infergw_upstream_lora_max", PROM_GAUGE, "LoRA adapters "
                "a batch of the engine may hold (max_lora of "
                "vllm:lora_requests_info at the last scrape).");
    for (i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        if (p->m[i].lora.known)
            prom_uint(w, &l, 1, p->m[i].lora.last.max_lora);
    }
    prom_family(w, "infergw_upstream_lora_adapters", PROM_GAUGE, "LoRA "
                "adapters the engine's running and waiting requests used "
                "at the last scrape (the status view names them).");
    for (i = 0; i < p->n; i++) {
        const struct lora_load *lo = &p->m[i].lora;

        for (k = 0; lo->known && k < GW_ARRAY_LEN(states); k++) {
            const struct prom_label l[] = {
                { "upstream", p->m[i].cfg->name }, { "state", states[k] },
            };

            prom_uint(w, l, GW_ARRAY_LEN(l), k == 0 ? lo->last.num_running
                                                    : lo->last.num_waiting);
        }
    }
    prom_family(w, "infergw_upstream_lora_loads_total", PROM_COUNTER,
                "Calls for a LoRA adapter the gateway sent to the upstream "
                "while the adapter was not resident there (not running, "
                "waiting, sent since the scrape, nor in a slot as far as "
                "the gateway saw): each loads it.");
    for (i = 0; i < p->n; i++) {
        const struct prom_label l = { "upstream", p->m[i].cfg->name };

        prom_uint(w, &l, 1, p->m[i].lora.loads);
    }
}
