/* SPDX-License-Identifier: MIT */
/*
 * engine.c - an engine's load and what it means (engine.h).
 */
#include "fleet/engine.h"

#include "base/config.h"

struct engine_mark
engine_mark(const struct engine_load *l)
{
    struct engine_mark mk = { l->started, l->ended };

    return mk;
}

void
engine_report(struct engine_load *l, const struct engine_report *r,
              const struct engine_mark *sent, int64_t now_ms)
{
    l->last = *r;
    /* The most it was seen running; known once two reads in a row found
     * it running that many with a queue (engine.h). */
    if (r->running > l->capacity)
        l->capacity = r->running;
    if (r->waiting > 0 && r->running >= l->capacity) {
        if (++l->full_reads >= 2)
            l->capacity_known = 1;
    } else {
        l->full_reads = 0;
    }
    l->at_ms = now_ms;
    l->started_then = sent->started;
    l->ended_then = sent->ended;
}

void
engine_unknown(struct engine_load *l)
{
    l->at_ms = 0;
    l->full_reads = 0;
}

int
engine_fresh(const struct engine_load *l, const struct gw_config *cfg,
             int64_t now_ms)
{
    return cfg->load_interval_ms > 0 && l->at_ms > 0
           && now_ms - l->at_ms <= cfg->load_stale_ms;
}

/* The calls the gateway started there since the scrape, less those ended. */
static double
since(const struct engine_load *l)
{
    return (double)(l->started - l->started_then)
           - (double)(l->ended - l->ended_then);
}

/*
 * The calls the gateway has open there.  Its engine holds at least these,
 * whatever a scrape says: one read while a request was still on its way
 * left that request out, though the gateway counted it as started
 * before the scrape went out (engine.h).
 */
static double
open_here(const struct engine_load *l)
{
    return (double)(l->started - l->ended);
}

/* What it runs now, as far as the gateway can tell. */
static double
running_now(const struct engine_load *l)
{
    double n = l->last.running + since(l);

    return n > 0 ? n : 0;
}

/* What it runs or queues now: a call that ends lets a waiting one in. */
static double
holding_now(const struct engine_load *l)
{
    double n = l->last.running + l->last.waiting + since(l);

    return n > open_here(l) ? n : open_here(l);
}

/* How many sequences its batch holds (engine.h: 'room'). */
static double
room_of(const struct engine_load *l, const struct gw_config *cfg)
{
    double room = l->capacity;

    if (!l->capacity_known) {
        room = 2 * l->capacity;         /* the slow start (engine.h) */
        if (room < (double)cfg->max_waiting)
            room = (double)cfg->max_waiting;
    }
    return room;
}

double
engine_score(const struct engine_load *l, const struct gw_config *cfg,
             int64_t now_ms, uint64_t inflight)
{
    double s;

    if (!engine_fresh(l, cfg, now_ms))
        return (double)inflight;
    s = 4 * l->last.waiting + running_now(l);
    return s > open_here(l) ? s : open_here(l);
}

int
engine_saturated(const struct engine_load *l, const struct gw_config *cfg,
                 int64_t now_ms)
{
    double queue;

    if (!engine_fresh(l, cfg, now_ms))
        return 0;
    queue = holding_now(l) - room_of(l, cfg);
    return queue >= (double)cfg->max_waiting
           || l->last.kv_usage > cfg->kv_high;
}

/* One more call within 'room', and the KV cache not too full (fresh). */
static int
place_within(const struct engine_load *l, const struct gw_config *cfg,
             int64_t now_ms, double room)
{
    if (!engine_fresh(l, cfg, now_ms))
        return 1;
    return holding_now(l) + 1 <= room && l->last.kv_usage <= cfg->kv_high;
}

int
engine_has_place(const struct engine_load *l, const struct gw_config *cfg,
                 int64_t now_ms)
{
    return place_within(l, cfg, now_ms, room_of(l, cfg));
}

int
engine_has_place_within(const struct engine_load *l,
                        const struct gw_config *cfg, int64_t now_ms,
                        double room)
{
    return place_within(l, cfg, now_ms, room);
}

int
engine_proven(const struct engine_load *l, const struct gw_config *cfg,
              int64_t now_ms, double *seen, double *holding)
{
    if (!engine_fresh(l, cfg, now_ms))
        return -1;
    *seen = l->capacity;
    *holding = holding_now(l);
    return 0;
}

int
engine_room_known(const struct engine_load *l)
{
    return l->capacity_known;
}
