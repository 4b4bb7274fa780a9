/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the upstream fleet: which upstream takes a call, how healthy
 * each one is, how many calls each may have open, and the retry budget.
 *
 * Design (DESIGN.md "Upstream pools and resilience"): one struct pool for
 * the process, built from cfg->upstreams.  Everything it knows but the
 * retry budget is under one mutex, held for a few hundred instructions
 * per call (choose and count on the way in, judge and count on the way
 * out), never across I/O; the budget has a mutex of its own, never held
 * with the pool's.  pool_impl.h says which file does which job.
 *
 * Per upstream it keeps a circuit breaker:
 *
 *     CLOSED --eject_after failures in a row--> OPEN (eject_time, doubled
 *       ^                                        |   on each repeat, at
 *       |                                        |   most 5m: config.h's
 *       |                                        |   CONFIG_MAX_EJECT_MS)
 *       +---- the trial succeeds --- HALF_OPEN <-+ time is up
 *                                       | the trial fails: OPEN again
 *
 * In HALF_OPEN one call (the trial) or a health probe is let through.  A
 * 429 or 503 with Retry-After also holds an upstream back for that long
 * (at most HTTP_RETRY_AFTER_MAX_MS), counting as one failure however many
 * calls bring it back meanwhile.
 *
 * A model's upstreams (those that serve it) are a set, and two settings
 * bound what the breakers may do to a set (DESIGN.md; Envoy's outlier
 * detection and panic threshold):
 * - max_ejected: an ejection that would leave more than that share of
 *   some model's upstreams out (not CLOSED) at once does not happen: the
 *   failure is counted, the upstream stays in, and its next failure asks
 *   again.  One upstream of a set may always be out.
 * - panic_below: while fewer than that share of the set serving a call's
 *   model are usable (CLOSED, or HALF_OPEN with no trial out, and not
 *   held back), the call may go to any of them that is not held back,
 *   ejected or not: the breakers can be wrong (a poison request, below),
 *   and then the choice is between some answers and none.  A Retry-After
 *   is no guess of ours but the upstream's own word, so panic never
 *   overrules it: with every one held back a call fails at once, told
 *   the time left.  A call made so on an upstream that is not usable is
 *   no trial.
 * The sets in panic are noted as calls find them (up to POOL_PANIC_MAX
 * at once), logged when they enter and leave, and counted by a gauge.
 *
 * A call's failure counts toward ejection only when it is the upstream's.
 * dispatch.c, which sees every attempt of a request, may give a slot back
 * without a verdict (POOL_NEUTRAL) and judge it later (pool_judge), once
 * it knows whether the request failed the same way on another upstream.
 *
 * Balancing (balance): least_load (the default) and prefix score an
 * upstream by its engine's own load (engine.h: vLLM's queue and batch
 * from GET /metrics, plus the calls started since), falling back to its
 * open calls when that is not known; least_inflight scores open calls
 * only, round_robin nothing.
 *
 * Admission: an upstream is full at max_inflight, and (least_load,
 * prefix) while its engine is saturated (engine.h).  A call that finds
 * every usable candidate full waits in the gateway's queue for up to
 * queue_timeout, so vLLM's own FIFO stays short and the order of work is
 * decided here, fairly: when an upstream may take a call again, it goes
 * to the waiter of the highest [tenant] priority; within a priority, of
 * the tenant with the fewest slots held per unit of its weight; the
 * oldest of equals.  vLLM's queue knows no tenants: a call in it goes
 * before every later one, whoever sends that.  So while tenants compete
 * (more than one is active: calls open or waiting, or one started or
 * ended in the last POOL_TENANT_ACTIVE_MS), no call goes into an
 * engine's queue, only to a place its batch has now (engine.h), and
 * the calls that find none wait here, where the order above applies.
 * A tenant ahead of its share (one that another active one goes
 * before) counts only on the places the engines' reads proved, learns
 * a room on one engine at a time, and leaves the tenants before it a
 * reserve sized by their recent demand, so that their next calls start
 * at once (pool_share.c says how much, and why).  A lone tenant may
 * fill the engines' queues up to max_waiting.  A tenant with a negative
 * priority is sheddable: when every usable candidate is full or
 * saturated it gets GW_ESHED (429) at once instead of waiting.  A call
 * that finds no usable candidate at all (every one ejected or held back)
 * fails at once: it never waits for a timeout, and a waiter whose
 * candidates all go so is told at once.
 *
 * The retry budget: retries and hedges together, over the last
 * POOL_BUDGET_WINDOW_S seconds, may be at most retry_budget times the
 * calls started in that window (first attempts), or retry_budget_min,
 * whichever is more.
 *
 * Models: an upstream serves the models its config lists; with none
 * listed, the ones its GET /v1/models reported (health.c asks); until it
 * has answered, any model.  A LoRA adapter is a model whose entry there
 * names a "parent": an upstream whose config lists the parent serves
 * the adapter too, from the answer on (so an adapter loaded at run time
 * is routable from the next health beat).  /v1/models is the union over
 * upstreams that are not ejected, kept from those answers.
 *
 * LoRA adapters (lora.h): a call for an adapter is balanced (least_load,
 * prefix) among the upstreams of 'room' where the adapter is resident
 * (running or waiting by the last scrape, sent there since, or idle in
 * a slot as far as the gateway saw), else among those with a free slot,
 * else with room for another adapter, else among all; unless [routing]
 * lora_aware is off.  A load stalls a server's whole batch, so a call
 * whose adapter is resident only where there is no place now waits in
 * the queue for one there (not a retry or hedge, nor with queue_timeout
 * 0).  A place that comes free goes, among the calls of the tenant whose
 * turn it is (the order above is unchanged), to its oldest whose adapter
 * is resident there, then to its oldest whose adapter is resident
 * nowhere; to a call whose adapter waits elsewhere only once that call
 * has waited POOL_LORA_SPILL_MS (so a busy adapter spreads to a second
 * server); until then the place waits.
 *
 * Threads: every function is thread-safe.  Each configuration generation
 * has its own struct pool (generation.c makes it with the generation and
 * frees it when the generation's last holder lets go), so it outlives
 * every call made on it.
 */
#ifndef INFERGW_GATEWAY_FLEET_POOL_H
#define INFERGW_GATEWAY_FLEET_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "fleet/engine.h"
#include "fleet/lora.h"
#include "base/outcome.h"

struct gw_config;
struct pool;
struct tenants;

#define POOL_BUDGET_WINDOW_S 10
#define POOL_QUEUE_CHECK_MS 100

/* A call for a LoRA adapter waiting for a place where the adapter is
 * takes a place elsewhere (and loads it there) once it has waited this
 * long: about what a load costs (pool.h "LoRA adapters"). */
#define POOL_LORA_SPILL_MS 500

/* A tenant counts for the shares this long after its last call, and its
 * recent demand is its calls' average over about as long
 * (pool_share.c): a light tenant that pauses keeps its places. */
#define POOL_TENANT_ACTIVE_MS 10000
#define POOL_PANIC_MAX 64       /* sets of upstreams in panic, tracked */
/* The longest model id the pool routes by: one an upstream reports
 * longer is dropped (health.c), a form naming a longer one refused
 * (route.c); a configured one is at most CONFIG_NAME_MAX. */
#define POOL_MODEL_ID_MAX 256
#define POOL_LORA_NAMES 512     /* a status view's list of adapters */

enum pool_state {
    POOL_CLOSED = 0,
    POOL_HALF_OPEN = 1,
    POOL_OPEN = 2,
};

/* What the health beat last learned of an upstream (pool_ready()). */
enum pool_probe {
    POOL_PROBE_PENDING = 0,     /* not probed yet */
    POOL_PROBE_PASSED,          /* its last GET /health was answered */
    POOL_PROBE_FAILED,          /* its last GET /health failed */
};

/* How a call (or probe) went, as far as the upstream's health goes. */
enum pool_outcome {
    POOL_OK = 0,            /* an answer: any status but 5xx and 429 */
    POOL_NEUTRAL,           /* no verdict: the client left, the gateway
                               stopped or ran out of memory */
    POOL_FAIL_CONNECT,      /* connect refused, unreachable, TLS */
    POOL_FAIL_TIMEOUT,      /* connect, first byte, idle or total */
    POOL_FAIL_STATUS,       /* 5xx */
    POOL_FAIL_THROTTLED,    /* 429 */
    POOL_FAIL_BROKEN,       /* connection lost, bad response */
    POOL_OUTCOME_COUNT
};

/* Label value of a failure kind ("connect", ...). */
const char *pool_outcome_name(enum pool_outcome o);

/* How a call's outcome (outcome.h; borrowed) bears on its upstream's
 * health: for calls (dispatch.c) and probes (health.c) alike. */
enum pool_outcome pool_outcome_of(const struct call_outcome *o);

/* What a call asks for. */
struct pool_want {
    const char *model;      /* the body's "model"; NULL: any upstream */
    uint64_t prefix_hash;   /* for balance = prefix (dispatch.c) */
    uint64_t exclude;       /* bit i: upstream i was tried already */
    int no_wait;            /* never queue: GW_EUNAVAIL when all full */
    /* While queued, asked every POOL_QUEUE_CHECK_MS without the lock:
     * nonzero means nobody wants the call any more.  May be NULL. */
    int (*gone)(void *arg);
    void *gone_arg;
    size_t tenant;          /* index into cfg->tenants, or
                               CONFIG_MAX_TENANTS: the default tenant */
    /* Where what the queue does with the call is reported, for the
     * operator (tenants_note_queue(), tenant.h; borrowed); NULL: not. */
    struct tenants *tenants;
    /* pool_serves()'s for this request and this 'model' (borrowed), or
     * NULL: the set is computed here. */
    const struct pool_admission *admission;
};

/* A call's hold on an upstream: from pool_acquire to pool_give_back. */
struct pool_slot {
    int idx;                /* into cfg->upstreams; -1 none */
    uint64_t trial;         /* the half-open trial call: its generation
                               (a stale one clears nothing); 0 not one */
    int queued;             /* it waited in the queue */
    size_t tenant;          /* whose (pool_want.tenant) */
    int other;              /* as it was taken: another upstream could
                               take a retry at once (pool_acquire) */
};

/* Build the pool for cfg (borrowed; outlives the pool).  NULL: no memory. */
struct pool *pool_new(const struct gw_config *cfg);

void pool_free(struct pool *p);

/*
 * What pool_serves() found for a request, for the same request's
 * pool_acquire() (pool_want.admission), so that one request computes the
 * set of the upstreams that serve its model once: that set, and the
 * generation of the upstreams' models it holds for.  pool_acquire() uses
 * the set while that generation is the pool's (no upstream's GET
 * /v1/models answer changed its models since: pool_set_models()), and
 * computes it afresh otherwise, as it would without one; so the slot it
 * takes is the one it would have taken.  A plain copy: nothing to free.
 */
struct pool_admission {
    const struct pool *pool;    /* whose; NULL: none */
    uint64_t models_gen;        /* the models' generation ... */
    uint64_t set;               /* ... under which this is the set */
};

/*
 * Does any upstream serve 'model' (NULL: any)?  Ejected ones count: the
 * answer is about the configuration and the models seen, not health.
 * OUT *adm (unless NULL): the admission for pool_acquire().  Takes the
 * models' own lock, not the pool's: a request's admission takes the
 * pool's lock once, in pool_acquire().
 */
int pool_serves(struct pool *p, const char *model,
                struct pool_admission *adm);

/*
 * Take a slot on the upstream the balancer picks among those that serve
 * want->model, are usable, not excluded and not full; wait for one in
 * the queue up to queue_timeout while every such upstream is full.
 * The set of those that serve the model is want->admission's when it
 * still holds, else computed here (pool_admission).
 * OUT *slot, with slot->other: is there an upstream for 'want', other
 * than the slot's and the excluded ones, that is usable and has room,
 * so that a retry could go there at once?  Asked as the slot is taken,
 * in the same hold of the lock and of the same set (afresh after a wait
 * in the queue), so that the caller takes the lock no second time to
 * know it (pool_has_other() asks it alone, in test builds).
 * OUT *retry_after_s: for the 503 on GW_EUNAVAIL/GW_ETIMEDOUT
 * and the 429 on GW_ESHED (on GW_EUNAVAIL for want of a usable one, the
 * time until the first may take a call again: a hold's remaining time).
 * Returns 0, GW_ENOTFOUND (no upstream serves the model, or every one
 * that does is excluded), GW_EUNAVAIL (none usable; or, with no_wait,
 * all full), GW_ESHED (all full, and the tenant is sheddable), GW_ETIMEDOUT
 * (queue_timeout passed), GW_EABORTED (want->gone said so while queued:
 * a client that left never takes a slot) or GW_ESTOPPING (pool_stop).
 */
int pool_acquire(struct pool *p, const struct pool_want *want,
                 struct pool_slot *slot, int *retry_after_s);

/*
 * The call has its answer (its first body byte): judged a success now,
 * so a half-open upstream closes at once rather than when a long stream
 * ends.  The slot stays taken; pool_give_back still judges how it ended.
 */
void pool_note_answer(struct pool *p, struct pool_slot *slot);

/*
 * Give the slot back with the call's outcome; 'retry_after_ms' > 0 is
 * the upstream's Retry-After on a 429 or 503.  'slot' is reset.  With
 * POOL_NEUTRAL (no verdict) a half-open trial is over all the same, and
 * the slot may go to a waiter at once; pool_judge() may bring the
 * verdict later.
 */
void pool_give_back(struct pool *p, struct pool_slot *slot,
                    enum pool_outcome o, int64_t retry_after_ms);

/*
 * The verdict 'o' on a call to upstream 'idx' whose slot went back
 * without one: judged now as pool_give_back() would have (no Retry-After).
 * 'poison': the same request failed the same way on another upstream
 * too, so the failure is the request's, not the upstream's: it is
 * counted in infergw_upstream_failures_total and nowhere else (no
 * ejection, no failure in a row, no reset of them either).
 */
void pool_judge(struct pool *p, size_t idx, enum pool_outcome o,
                int poison);

/* A request found to be poison (dispatch.c), for /metrics. */
void pool_note_poison(struct pool *p);

/*
 * The call on 'slot' was sent once more, on a fresh connection, after a
 * reused one failed before any answer (upstream.h on_resend): one more
 * call the upstream receives, counted as a call and charged to the retry
 * budget, but never refused by it (it is not a retry of a failure: the
 * request had not reached the upstream).  Whether it may be made at all
 * is dispatch.c's to say: it is one of the request's 1 + retries
 * attempts.
 */
void pool_note_resend(struct pool *p, struct pool_slot *slot);

/* The hedge on 'slot' had the first body byte: it won (status view). */
void pool_note_hedge_won(struct pool *p, const struct pool_slot *slot);

/* A client request (not a retry) that will make upstream calls. */
void pool_note_request(struct pool *p);

/*
 * May one more retry or hedge run now, on 'slot' (its upstream counts
 * it among its retries or hedges, for the status view)?
 * pool_budget_take counts it when it may (1), and counts a refusal (0);
 * pool_budget_peek only asks.
 */
int pool_budget_take(struct pool *p, const struct pool_slot *slot,
                     int hedge);
int pool_budget_peek(struct pool *p);

/* A retry pool_budget_peek kept from happening: count the refusal. */
void pool_budget_refuse(struct pool *p);

/*
 * Can any upstream take a call now?  For /readyz, which answers 503 from
 * the moment none can.  One can while it is not ejected (OPEN), not held
 * back by a Retry-After and, with the health beat on (health_interval >
 * 0), its last GET /health answered (enum pool_probe): an upstream not
 * probed yet, or whose last probe failed, cannot, whatever its breaker
 * says (a failed probe is one failure toward eject_after; readiness
 * needs no more).  With the beat off nothing ever probes, so the
 * breakers and holds alone decide: a call is the only probe there is,
 * and a balancer sends none to a gateway that is not ready.  An upstream
 * that is full or saturated can (a call waits in the queue for it).
 * Panic makes none so: calls still go out, but to upstreams judged down.
 */
int pool_ready(struct pool *p);

/* End every queue wait with GW_ESTOPPING, now and from now on. */
void pool_stop(struct pool *p);

/* ---- for health.c (and scrape.c: pool_size) ---- */

/* Number of upstreams (cfg->num_upstreams). */
size_t pool_size(const struct pool *p);

/*
 * May upstream 'idx' be probed now?  Always while CLOSED or OPEN; in
 * HALF_OPEN only when no trial is out, and the probe then is the trial
 * (OUT *trial: its number, for pool_probe_end; else 0).
 */
int pool_probe_begin(struct pool *p, size_t idx, uint64_t *trial);

/*
 * A probe's outcome: judged like a call's (POOL_OK closes HALF_OPEN).
 * 'status': the HTTP status of its answer, 0 none.  It is also the
 * upstream's probe verdict (pool_ready()): a failure ('o') is
 * POOL_PROBE_FAILED; any other answer, a server's without the endpoint
 * (404, judged POOL_NEUTRAL) too, is POOL_PROBE_PASSED: it answers; no
 * answer and no failure (the probe was stopped) changes nothing.
 */
void pool_probe_end(struct pool *p, size_t idx, uint64_t trial,
                    enum pool_outcome o, int status);

/*
 * A reload's new pool 'to', before its health beat starts, takes from
 * 'from' (the generation in force) the probe verdict of each upstream
 * both have (the same name and url), so that /readyz does not turn 503
 * for as long as the new beat's first probes take.  Nothing else carries
 * over (the breakers start closed).  Borrows both; locks one at a time.
 */
void pool_carry_probes(struct pool *to, struct pool *from);

/*
 * Upstream 'idx' answered GET /v1/models: its "data" entries, each one
 * object's JSON text, its "id" and its "parent" (a LoRA adapter's base
 * model; NULL for none: a base model) (the arrays and their strings are
 * stolen; the old ones freed; 'parents' may be NULL: none has one).
 * Upstreams without a configured models list route by these ids; one
 * with a list serves, besides the models it lists, the adapters these
 * entries give one of them as parent ("Models" above).
 */
void pool_set_models(struct pool *p, size_t idx, char **ids, char **parents,
                     char **texts, size_t n);

/* ---- for scrape.c ---- */

/* Upstream 'idx''s own counts as a scrape goes out to it (engine.h). */
struct engine_mark pool_load_mark(struct pool *p, size_t idx);

/*
 * Upstream 'idx''s engine reported 'r' (borrowed) to the scrape sent at
 * 'sent', or (r NULL) its scrape failed or lacked the series: balancing
 * on its open calls until the next good one.  Waiters it can now take
 * get their slots.
 */
void pool_set_load(struct pool *p, size_t idx, const struct engine_report *r,
                   const struct engine_mark *sent);

/*
 * The same scrape's LoRA adapters (lora.h): 'r' (stolen, emptied), or
 * NULL when it had none or failed.  Called before pool_set_load() with
 * the same 'sent', which makes both fresh.
 */
void pool_set_lora(struct pool *p, size_t idx, struct lora_report *r,
                   const struct engine_mark *sent);

/* ---- for route.c ---- */

/* The /v1/models answer: {"object":"list","data":[...]}.  0 or buf error. */
int pool_models_json(struct pool *p, struct buf *out);

/* Append the per-upstream series of /metrics.  0 or a buf error. */
int pool_render_metrics(struct pool *p, struct buf *out);

/*
 * One upstream as the status view (status.h) shows it: a copy.  'name'
 * and 'url' are borrowed from the pool's configuration.
 */
struct pool_upstream_status {
    const char *name;
    const char *url;
    enum pool_state state;
    int64_t state_for_ms;       /* how long it has been in 'state': since
                                   the change, or since the pool was made
                                   (a reload's breakers start CLOSED) */
    int64_t state_left_ms;      /* OPEN: until it turns HALF_OPEN; else 0 */
    int64_t held_left_ms;       /* a Retry-After holds it back this long */
    enum pool_probe probe;      /* (meaningless with the health beat off) */
    int ready;                  /* it can take a call (pool_ready()) */
    uint64_t inflight;
    uint64_t max_inflight;      /* 0: no limit */
    uint64_t queued;            /* calls in the queue that could take it */
    int load_known;             /* its engine was scraped well once */
    struct engine_report load;  /* ... and reported this, */
    int64_t load_age_ms;        /* ... this long ago */
    uint64_t calls;
    uint64_t failures[POOL_OUTCOME_COUNT];
    uint64_t retries;           /* retries that went to it */
    uint64_t hedges;            /* hedges that went to it ... */
    uint64_t hedges_won;        /* ... and had the first body byte */
    int lora_known;             /* its last scrape had LoRA adapters: */
    uint64_t lora_max;          /* max_lora, */
    size_t lora_running;        /* how many run, */
    size_t lora_waiting;        /* how many wait, */
    char lora_running_names[POOL_LORA_NAMES];   /* which: comma-separated
                                                   (no kept name has a
                                                   comma), cut short with
                                                   ",..." */
    char lora_waiting_names[POOL_LORA_NAMES];
    uint64_t lora_loads;        /* calls the gateway sent there whose
                                   adapter was not resident */
};

/*
 * Copy every upstream's status into out[0..max) (max >= pool_size() for
 * all of them): its retries and hedges under the budget's lock, then the
 * rest under the pool's (one at a time).  Returns how many were copied.
 */
size_t pool_status(struct pool *p, struct pool_upstream_status *out,
                   size_t max);

#ifdef INFERGW_UNIT_TEST
/* ---- for tests: built into test binaries only ---- */

/* The state of upstream 'idx' now. */
enum pool_state pool_state_of(struct pool *p, size_t idx);

/* How long an ejection lasts after 'streak' others in a row
 * (pool_breaker.c, GW_TESTABLE): eject_time doubled, at most
 * CONFIG_MAX_EJECT_MS. */
int64_t eject_ms(int64_t eject_time_ms, unsigned streak);

/*
 * Is there an upstream for 'want', other than 'idx' and the excluded
 * ones, that is usable now and has room?  (Whether a retry could go
 * anywhere at once: pool_acquire's slot->other, asked on its own.)
 */
int pool_has_other(struct pool *p, const struct pool_want *want, size_t idx);

/* How many times any pool computed a model's set of upstreams so far
 * (pool_admission: a request does it once). */
uint64_t pool_sets_computed(void);

/* How many times any pool's lock was taken so far (a request's
 * admission takes it once: pool_serves() takes the models' lock). */
uint64_t pool_lock_holds(void);

/* Tenant t's recent demand now: its calls open and waiting, averaged
 * (pool_share.c). */
double pool_demand(struct pool *p, size_t t);

/* Make it 'm' from now, as if it had been so for ever: a test of the
 * reserve that way does not hang on how long each of its steps took. */
void pool_demand_set(struct pool *p, size_t t, double m);

/* Tenant t's last call started or ended 'ms' earlier than it did. */
void pool_tenant_age(struct pool *p, size_t t, int64_t ms);

/* The places a demand of 'm' needs: ceil(m + sqrt(m)) (pool_share.c,
 * GW_TESTABLE). */
double demand_need(double m);
#endif

#endif
