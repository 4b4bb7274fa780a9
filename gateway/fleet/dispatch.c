/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c - an upstream call made on the pool, with retries
 * (dispatch.h).
 *
 * Poison (dispatch.h): a 5xx attempt gives its slot back at once with
 * no verdict, and the verdict waits in struct dispatch_state's 'held'
 * until another attempt of the same request shows whose failure it
 * was: the same status again (both are the request's: poison), an
 * answer (the held ones were their upstreams'), or the end of the call
 * (likewise).
 */
#include "fleet/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "log.h"
#include "base/metrics.h"
#include "fleet/pool.h"
#include "util.h"

/* Could this failed attempt be made again?  Nothing reached the sink. */
static int
retryable(const struct upstream_result *res)
{
    return res->outcome.kind != CALL_OK && !res->head_seen
           && res->outcome.fault == CALL_FAULT_UPSTREAM;
}

/* A 5xx attempt whose verdict waits (the file comment). */
struct held {
    size_t idx;                     /* its upstream */
    int status;
};

/* One dispatch_call(): the slots its attempts hold. */
struct dispatch_state {
    const struct dispatch_ctx *dc;
    const struct upstream_sink *sink;
    int watch_fd;
    struct upstream_opts *opts;     /* the call's, read by upstream.c at
                                       each response head */
    struct pool_want want;          /* .exclude: every upstream tried */
    struct pool_slot slot[2];       /* an attempt and its hedge */
    struct dispatch_result *out;
    int more;                       /* another attempt may follow the
                                       current one (the loop's) */
    /* Each attempt goes to another upstream, so there are at most as
     * many held verdicts as upstreams, each of another status. */
    struct held held[CONFIG_MAX_UPSTREAMS];
    size_t num_held;
    int poison_status;              /* the 5xx met twice; 0 none yet */
};

/*
 * May the request reach an upstream once more?  At most 1 + retries
 * times in all: a retry, a hedge and a resend on a fresh connection
 * (upstream.h on_resend) are each one more request the upstream
 * receives, whatever made it.
 */
static int
attempt_left(const struct dispatch_state *r)
{
    return (uint64_t)r->out->attempts <= r->dc->cfg->retries;
}

/*
 * One more request goes to an upstream: counted.  When it was the last
 * the retries allow, a retryable status it meets is relayed as it is
 * (upstream.h stop_on_retryable), not stopped at for a retry that can
 * no longer come.
 */
static void
count_attempt(struct dispatch_state *r)
{
    r->out->attempts++;
    metrics_upstream_call();
    if (!attempt_left(r)) {
        r->more = 0;
        r->opts->stop_on_retryable = 0;
    }
}

/* The slot held on upstream 'idx', or NULL. */
static struct pool_slot *
slot_of(struct dispatch_state *r, size_t idx)
{
    for (int i = 0; i < 2; i++)
        if (r->slot[i].idx >= 0 && (size_t)r->slot[i].idx == idx)
            return &r->slot[i];
    return NULL;
}

/* The held verdicts were their upstreams' after all: judge them so. */
static void
judge_held(struct dispatch_state *r)
{
    for (size_t i = 0; i < r->num_held; i++)
        pool_judge(r->dc->pool, r->held[i].idx, POOL_FAIL_STATUS, 0);
    r->num_held = 0;
}

/*
 * The request failed with 'status' on upstream 'idx' (its slot is back):
 * poison if it did so on another upstream too, else held until that is
 * known.
 */
static void
hold_or_poison(struct dispatch_state *r, size_t idx, int status)
{
    const struct gw_config *cfg = r->dc->cfg;
    size_t i;

    if (status == r->poison_status) {
        pool_judge(r->dc->pool, idx, POOL_FAIL_STATUS, 1);
        return;
    }
    for (i = 0; i < r->num_held && r->held[i].status != status; i++)
        ;
    if (i == r->num_held) {
        r->held[r->num_held].idx = idx;
        r->held[r->num_held].status = status;
        r->num_held++;
        return;
    }
    r->poison_status = status;
    pool_note_poison(r->dc->pool);
    /* Info, not warn: it is one request's fate, and a client sending
     * many would flood the log at warn (the counter says how many). */
    log_msg(GW_LOG_INFO, "dispatch: poison request status=%d upstreams=%s,%s"
            ": the same failure on both, counted against neither", status,
            cfg->upstreams[r->held[i].idx].name, cfg->upstreams[idx].name);
    pool_judge(r->dc->pool, r->held[i].idx, POOL_FAIL_STATUS, 1);
    pool_judge(r->dc->pool, idx, POOL_FAIL_STATUS, 1);
    r->held[i] = r->held[--r->num_held];
}

/*
 * Give an attempt's slot back with its verdict.  A 5xx verdict waits
 * (hold_or_poison), unless it comes with Retry-After: a 503 saying "not
 * now" is the upstream's word about itself, judged at once.  Every
 * attempt passes here once, so its times go to the upstream's
 * histograms here too.
 */
static void
give_back(struct dispatch_state *r, const struct upstream_result *res)
{
    struct pool_slot *s = slot_of(r, res->upstream);
    enum pool_outcome o = pool_outcome_of(&res->outcome);
    /* Only a 429 or a 503 has one (upstream.h). */
    int64_t retry_after = (int64_t)res->outcome.retry_after_s * 1000;

    metrics_upstream_attempt(r->dc->cfg->upstreams[res->upstream].name,
                             res->ttfb_us, res->duration_us);
    if (s == NULL)
        return;
    if (o != POOL_FAIL_STATUS || retry_after > 0) {
        pool_give_back(r->dc->pool, s, o, retry_after);
        return;
    }
    pool_give_back(r->dc->pool, s, POOL_NEUTRAL, 0);  /* the slot, now */
    hold_or_poison(r, res->upstream, res->outcome.status);
}

/* upstream_opts.attempt_done: the hedge that lost, or one that failed. */
static void
attempt_done(void *arg, const struct upstream_result *res)
{
    give_back(arg, res);
}

/* dispatch_ctx.on_upstream, if set: the call is on upstream 'idx' now. */
static void
note_upstream(const struct dispatch_ctx *dc, size_t idx)
{
    if (dc->on_upstream != NULL)
        dc->on_upstream(dc->arg, dc->cfg->upstreams[idx].name);
}

/*
 * upstream_opts.on_winner: this attempt's first body byte is in, so its
 * upstream answers: a half-open one closes now, not at the end of a
 * stream that may run for minutes, and the failures held before it were
 * their upstreams'.  An error answer is judged at the end.
 */
static void
on_winner(void *arg, size_t idx, int status)
{
    struct dispatch_state *r = arg;
    struct pool_slot *s = slot_of(r, idx);

    if (s != NULL && s == &r->slot[1]) {
        pool_note_hedge_won(r->dc->pool, s);
        note_upstream(r->dc, idx);
    }
    if (s != NULL && status < 500 && status != 429) {
        pool_note_answer(r->dc->pool, s);
        judge_held(r);
    }
}

/*
 * upstream_opts.on_resend: the attempt on 'idx' is to go out once more,
 * on a fresh connection, which is one more request the upstream
 * receives: an attempt like any, so not made when the request has none
 * left (-1; upstream.c then fails the attempt, CALL_NOT_RESENT, and logs
 * why).
 */
static int
on_resend(void *arg, size_t idx)
{
    struct dispatch_state *r = arg;
    struct pool_slot *s = slot_of(r, idx);

    if (!attempt_left(r))
        return -1;
    if (s != NULL)
        pool_note_resend(r->dc->pool, s);
    count_attempt(r);
    return 0;
}

/*
 * upstream_opts.hedge: while the request has an attempt left, a slot on
 * another upstream, at once (no queue), then the budget's leave.  0 with
 * *idx, or -1: no hedge.
 */
static int
hedge(void *arg, size_t first, size_t *idx)
{
    struct dispatch_state *r = arg;
    struct pool_want w = r->want;
    int retry_after;

    if (!attempt_left(r))
        return -1;
    w.exclude |= UINT64_C(1) << first;
    w.no_wait = 1;
    if (pool_acquire(r->dc->pool, &w, &r->slot[1], &retry_after) != 0)
        return -1;
    if (!pool_budget_take(r->dc->pool, &r->slot[1], 1)) {
        pool_give_back(r->dc->pool, &r->slot[1], POOL_NEUTRAL, 0);
        return -1;
    }
    *idx = (size_t)r->slot[1].idx;
    r->want.exclude |= UINT64_C(1) << *idx;
    count_attempt(r);
    return 0;
}

/*
 * pool_want.gone, while the call waits for a max_inflight slot: has
 * everyone who wanted it left?  The sink's on_peer says (for a leader,
 * only once no follower is left either).
 */
static int
waiting_gone(void *arg)
{
    const struct dispatch_state *r = arg;

    if (r->watch_fd < 0 || r->sink->on_peer == NULL)
        return 0;
    return r->sink->on_peer(r->sink->arg) < 0;
}

/* The pool said no before any attempt: why, for the client. */
static int
refuse(struct dispatch_result *out, int rc, int retry_after)
{
    enum call_kind kind;

    switch (rc) {
    case GW_ETIMEDOUT:  kind = CALL_ALL_FULL; break;
    case GW_ENOTFOUND:  kind = CALL_NOT_SERVED; break;
    case GW_ESTOPPING:  kind = CALL_STOPPING; break;
    case GW_EABORTED:   kind = CALL_QUEUE_GONE; break;
    case GW_ESHED:      kind = CALL_SHED; break;
    default:            kind = CALL_NO_UPSTREAM; break;
    }
    memset(&out->res, 0, sizeof(out->res));
    out->res.outcome = call_outcome_make(kind);
    out->res.outcome.retry_after_s = retry_after;
    out->res.ttfb_us = -1;
    out->res.duration_us = -1;
    return call_kind_rc(kind);
}

/*
 * The last attempt's outcome stands, for the clients; a request that
 * failed the same way on two upstreams is marked as its own fault.
 */
static int
stands(const struct dispatch_state *r, struct dispatch_result *out)
{
    struct call_outcome *o = &out->res.outcome;

    if (r->poison_status != 0 && o->status == r->poison_status)
        o->fault = CALL_FAULT_REQUEST;
    return call_kind_rc(o->kind);
}

int
dispatch_call(const struct dispatch_ctx *dc,
              const struct upstream_request *req, const char *model,
              const struct pool_admission *adm, uint64_t prefix_hash,
              size_t tenant,
              const struct upstream_sink *sink, int watch_fd,
              struct dispatch_result *out)
{
    const struct gw_config *cfg = dc->cfg;
    struct upstream_opts opts;
    struct pool_want next;
    struct dispatch_state r;
    int rc, retry_after, budget;
    size_t idx;

    memset(out, 0, sizeof(*out));
    memset(&r, 0, sizeof(r));
    r.dc = dc;
    r.want.model = model;
    r.want.admission = adm;
    r.want.prefix_hash = prefix_hash;
    r.want.tenant = tenant;
    r.want.tenants = dc->tenants;
    r.want.gone = waiting_gone;
    r.want.gone_arg = &r;
    r.sink = sink;
    r.watch_fd = watch_fd;
    r.opts = &opts;
    r.out = out;
    r.slot[0].idx = r.slot[1].idx = -1;
    memset(&opts, 0, sizeof(opts));
    opts.watch_fd = watch_fd;
    opts.stop_fd = dc->stop_fd;
    opts.hedge_after_ms = cfg->hedge_after_ms;
    opts.hedge = hedge;
    opts.attempt_done = attempt_done;
    opts.on_winner = on_winner;
    opts.on_resend = on_resend;
    opts.arg = &r;
    pool_note_request(dc->pool);
    rc = pool_acquire(dc->pool, &r.want, &r.slot[0], &retry_after);
    if (rc != 0)
        return refuse(out, rc, retry_after);
    for (;;) {
        /*
         * A retryable status stops the transfer unheard only when another
         * attempt may follow: one left (a hedge or a resend may still
         * take it, count_attempt()), an upstream with room now (the
         * slot's 'other', asked as it was taken), and the budget.  Else
         * the upstream's answer is relayed as it is.
         */
        idx = (size_t)r.slot[0].idx;
        r.want.exclude |= UINT64_C(1) << idx;
        count_attempt(&r);
        r.more = attempt_left(&r) && r.slot[0].other;
        budget = r.more && pool_budget_peek(dc->pool);
        opts.stop_on_retryable = r.more && budget;
        note_upstream(dc, idx);
        upstream_perform(dc->up, idx, req, &opts, sink, &out->res);
        out->upstream = cfg->upstreams[out->res.upstream].name;
        give_back(&r, &out->res);
        /* A retryable status relayed as it came: the budget was spent. */
        if (r.more && !budget && out->res.head_seen
            && upstream_retryable_status(out->res.outcome.status))
            pool_budget_refuse(dc->pool);
        if (!retryable(&out->res) || !attempt_left(&r))
            goto out;
        /* The next upstream first, then the budget: no leave is spent on
         * a retry that has nowhere to go. */
        next = r.want;
        next.no_wait = 1;
        if (pool_acquire(dc->pool, &next, &r.slot[0], &retry_after) != 0)
            goto out;
        if (!pool_budget_take(dc->pool, &r.slot[0], 0)) {
            pool_give_back(dc->pool, &r.slot[0], POOL_NEUTRAL, 0);
            log_msg(GW_LOG_INFO, "dispatch: no retry, budget spent "
                    "upstream=%s reason=\"%s\"", out->upstream,
                    call_kind_text(out->res.outcome.kind));
            goto out;
        }
        log_msg(GW_LOG_INFO, "dispatch: retry after upstream=%s "
                "reason=\"%s\" status=%d attempt=%d next=%s", out->upstream,
                call_kind_text(out->res.outcome.kind),
                out->res.outcome.status, out->attempts,
                cfg->upstreams[r.slot[0].idx].name);
    }

out:
    judge_held(&r);                 /* no other attempt will tell */
    return stands(&r, out);
}

/* ---- the prompt's prefix ---- */

struct prefix {
    uint64_t h;
    size_t left;
};

static void
prefix_add(struct prefix *px, const char *p, size_t n)
{
    if (n > px->left)
        n = px->left;
    px->h = gw_fnv1a64(px->h, p, n);
    px->left -= n;
}

/* A string as is; anything else (content parts) as its compact JSON. */
static void
prefix_add_json(struct prefix *px, const json_t *v)
{
    char *text;

    if (v == NULL || px->left == 0)
        return;
    if (json_is_string(v)) {
        prefix_add(px, json_string_value(v), json_string_length(v));
        return;
    }
    text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (text != NULL)
        prefix_add(px, text, strlen(text));
    free(text);
}

/* What follows a turn's role: a line break, its content, another. */
static void
prefix_add_content(struct prefix *px, const json_t *content)
{
    prefix_add(px, "\n", 1);
    prefix_add_json(px, content);
    prefix_add(px, "\n", 1);
}

/* Each turn of a chat "messages" array (or a Responses API "input"). */
static void
prefix_add_turns(struct prefix *px, const json_t *turns)
{
    const json_t *m;
    size_t i;

    json_array_foreach(turns, i, m) {
        if (px->left == 0)
            break;
        prefix_add_json(px, json_object_get(m, "role"));
        prefix_add_content(px, json_object_get(m, "content"));
    }
}

uint64_t
dispatch_prefix_hash(const json_t *body, size_t max_bytes)
{
    struct prefix px = { GW_FNV1A64_OFFSET, max_bytes };
    const json_t *msgs = json_object_get(body, "messages");
    const json_t *prompt = json_object_get(body, "prompt");
    const json_t *input = json_object_get(body, "input");
    const json_t *instructions = json_object_get(body, "instructions");

    if (json_is_array(msgs)) {
        prefix_add_turns(&px, msgs);
    } else if (prompt != NULL) {
        prefix_add_json(&px, prompt);
    } else if (input != NULL) {
        /*
         * The Responses API: its instructions are the system turn, its
         * input a user turn or a list of them, so that a conversation
         * hashes as its chat form does when the two agree.
         */
        if (json_is_string(instructions)) {
            prefix_add(&px, "system", 6);
            prefix_add_content(&px, instructions);
        }
        if (json_is_array(input)) {
            prefix_add_turns(&px, input);
        } else {
            prefix_add(&px, "user", 4);
            prefix_add_content(&px, input);
        }
    } else {
        return 0;
    }
    /* FNV-1a spreads poorly in its high bits: the ring wants all 64. */
    return gw_mix64(px.h);
}
