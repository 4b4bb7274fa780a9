/* SPDX-License-Identifier: MIT */
/*
 * engine.h - an upstream's load as its engine reports it, and what the
 * gateway makes of it: a score to balance on, and whether it is
 * saturated (DESIGN.md "Fleet-aware scheduling").
 *
 * vLLM's GET /metrics says how many requests it runs and how many wait in
 * its own queue, and how full its KV cache is (scrape.c reads them every
 * load_interval).  Between two scrapes the gateway adds what it did
 * itself: the calls it started there since, and those that ended.
 * "Since" is since the scrape was sent, not since its answer came: the
 * engine read its counts somewhere in between, and a call that ended
 * while the answer was on its way must not come back to life with it.
 * What is left are the calls that started (or ended) between the scrape
 * going out and the engine reading its counts: counted twice (or not
 * at all) until the next scrape, a window of one round trip.  "Not at
 * all" has a floor: the engine holds at least the gateway's own open
 * calls there ('open' below).
 *
 *   now       = max(0, running + started - ended)   what it runs now
 *   open      = every call the gateway started there and that has not
 *               ended, whenever it started: the engine holds at least
 *               these (a read taken while one was on its way missed it)
 *   score     = max(4 x waiting + now, open)   (vLLM's own
 *               data-parallel weighting; lower is lighter)
 *   holding   = max(running + waiting + started - ended, open)
 *               (all it has)
 *   queue     = holding - room: what found no place in the batch (a
 *               call that ends lets the first waiting one in)
 *   saturated = queue >= max_waiting, or kv_usage > kv_high
 *   a place:  holding + 1 <= room and kv_usage <= kv_high: one more
 *             call would run at once, ahead of nothing (all that
 *             competing tenants get, pool.h)
 *
 * 'room' is how many sequences the batch holds, learned from the
 * scrapes: the most the engine was ever seen running.  It is known once
 * two reads in a row found it running that many with a queue (vLLM
 * queues when its batch is full; one read is no proof: a request that
 * came between two steps waits for the next one, however empty the
 * batch).  Known, it is not lowered by a read that shows a queue with
 * fewer running (a place just freed, or a KV cache too full, which is
 * kv_high's business): nothing would raise it again while tenants
 * compete and no call goes past it (pool.h).  Until then it is twice
 * the most seen running, and at least max_waiting: a burst on an idle
 * engine goes out in a slow start that doubles with every scrape (as
 * TCP's), not all into vLLM's own queue before a scrape could tell.
 * While tenants compete, the pool counts on no more than the most seen
 * running (engine_proven()) but where it learns a room (pool_share.c
 * "Places").
 *
 * A scrape older than load_stale, or one without the series, is not
 * fresh: then the score is the gateway's own open calls (so least_load
 * is least_inflight for a fleet without engine metrics) and only
 * max_inflight saturates (pool.h).
 *
 * Values only: no state of its own, no locks.  A struct engine_load lives
 * in the pool's member and is read and changed under the pool's lock.
 */
#ifndef INFERGW_GATEWAY_FLEET_ENGINE_H
#define INFERGW_GATEWAY_FLEET_ENGINE_H

#include <stdint.h>

struct gw_config;

/* What one scrape found, summed over the engine's models. */
struct engine_report {
    double waiting;             /* vllm:num_requests_waiting */
    double running;             /* vllm:num_requests_running */
    double kv_usage;            /* vllm:kv_cache_usage_perc, 0..1; < 0:
                                   not reported */
};

struct engine_load {
    struct engine_report last;  /* the last good scrape */
    double capacity;            /* the most it was seen running */
    int capacity_known;         /* that is its batch's room */
    int full_reads;             /* reads in a row at 'capacity' with a
                                   queue */
    int64_t at_ms;              /* when it came; 0 never */
    uint64_t started;           /* calls the gateway started there, ever */
    uint64_t ended;             /* ... and that ended, ever */
    uint64_t started_then;      /* 'started' when 'last' was sent */
    uint64_t ended_then;        /* 'ended' when 'last' was sent */
};

/* The gateway's own counts as a scrape goes out. */
struct engine_mark {
    uint64_t started;
    uint64_t ended;
};

struct engine_mark engine_mark(const struct engine_load *l);

/*
 * The scrape sent at 'sent' came back with 'r' at 'now_ms': it replaces
 * the last, and the counts since are those since 'sent'.
 */
void engine_report(struct engine_load *l, const struct engine_report *r,
                   const struct engine_mark *sent, int64_t now_ms);

/* The scrape failed or lacked the series: nothing fresh is known. */
void engine_unknown(struct engine_load *l);

/*
 * Is the last scrape usable at 'now_ms': load_interval on, one came, and
 * it is no older than load_stale?  (What came with it, lora.h's report,
 * is as fresh.)
 */
int engine_fresh(const struct engine_load *l, const struct gw_config *cfg,
                 int64_t now_ms);

/*
 * The score above, or 'inflight' when not fresh.  Compare two as
 * score / weight (pool_pick.c's power of two choices).
 */
double engine_score(const struct engine_load *l, const struct gw_config *cfg,
                    int64_t now_ms, uint64_t inflight);

/* Saturated by the engine's own numbers (max_inflight is the pool's). */
int engine_saturated(const struct engine_load *l,
                     const struct gw_config *cfg, int64_t now_ms);

/*
 * Would one more call run at once, ahead of nothing: holding + 1 <= room
 * and kv_usage <= kv_high?  Not fresh: yes (nothing says no).
 */
int engine_has_place(const struct engine_load *l,
                     const struct gw_config *cfg, int64_t now_ms);

/*
 * Would one more call run at once within 'room' places: holding + 1 <=
 * room and kv_usage <= kv_high?  Not fresh: yes.  (What the pool asks
 * of a room it presumes, pool_share.c.)
 */
int engine_has_place_within(const struct engine_load *l,
                            const struct gw_config *cfg, int64_t now_ms,
                            double room);

/*
 * What its reads have proven: OUT *seen, the most it was seen running
 * ('capacity': the batch's room once that is known), and *holding, what
 * it runs or queues now (above).  -1 when not fresh, and then neither
 * is set.
 */
int engine_proven(const struct engine_load *l, const struct gw_config *cfg,
                  int64_t now_ms, double *seen, double *holding);

/* Is the batch's room known (two reads in a row at it with a queue)? */
int engine_room_known(const struct engine_load *l);

#endif
