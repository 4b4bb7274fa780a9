/* SPDX-License-Identifier: MIT */
/*
 * proxy.c - the three paths a request upstream takes: direct, leader,
 * follower (proxy.h).
 *
 * Error mapping (DESIGN.md "Responses and errors", reply.h): nothing sent
 * yet -> 502 (unreachable or broken upstream), 504 (a timeout) or 503
 * (the gateway out of memory, or stopping) as an OpenAI error body;
 * already streaming -> an SSE error event and an unclean end of the body,
 * never a fake success.  A flight's failure reaches every one of its
 * clients the same way; what only one client waits for (its own socket,
 * follower_timeout) ends that client alone.
 */
#include "coalesce/proxy.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "fleet/dispatch.h"
#include "coalesce/fanout.h"
#include "coalesce/flight.h"
#include "base/handler.h"
#include "log.h"
#include "base/metrics.h"
#include "net.h"
#include "fleet/pool.h"
#include "wire/reply.h"
#include "base/tenant.h"
#include "upstream/upstream.h"
#include "coalesce/usage.h"

/*
 * How often, at most, a relay's on_tick asks whether its client hung up
 * (reply_client_gone(), which looks at the socket).  The transfer loop
 * calls on_tick after every wake-up (each chunk) and about once a second
 * while the upstream is quiet, and one poll() per call was once the
 * largest share of the gateway's system calls.  The loop also watches
 * the client's socket itself (on_peer), so a hang-up is seen at once;
 * this check is the fallback.
 */
#define PEER_CHECK_MS 100

/* How often the leader looks at its parked followers (fanout_sweep). */
#define SWEEP_MS 1000

/*
 * The upstream request for hr's request (upstream.h says what of the
 * client's request reaches the upstream): NUL-terminated copies of the
 * target and, with forward_client_auth, of the client's credential; and
 * what the pool needs to choose an upstream (dispatch.h).
 */
struct fwd {
    struct upstream_request ur;
    char *path;                 /* owned */
    char *auth;                 /* owned, wiped before free; or NULL */
    size_t client_len;          /* the client's body bytes (ur.body may
                                   be more: usage_ask()) */
    const char *model;          /* the body's; NULL: any upstream */
    struct pool_admission adm;  /* pool_serves()'s for 'model', for the
                                   call's pool_acquire(); or none */
    uint64_t prefix_hash;       /* balance = prefix */
};

/*
 * 'model' (borrowed, or NULL) picks the upstreams; 'json', the body
 * parsed (or NULL: a form), gives the prompt's prefix for balance =
 * prefix.
 */
static int
fwd_init(struct fwd *f, const struct handler_req *hr, const char *model,
         const json_t *json)
{
    const struct gw_config *cfg = hr->ctx->cfg;
    const struct http_request *req = hr->req;
    const struct http_header *h = NULL;

    memset(f, 0, sizeof(*f));
    f->path = gw_strndup(req->target, req->target_len);
    /* An empty value is no credential: the configured key goes. */
    if (hr->ctx->cfg->forward_client_auth)
        h = http_find_header(req, "Authorization");
    if (h != NULL && h->value_len == 0)
        h = NULL;
    if (h != NULL)
        f->auth = gw_strndup(h->value, h->value_len);
    if (f->path == NULL || (h != NULL && f->auth == NULL))
        return GW_ENOMEM;
    /* route.c sends only POSTs of a JSON object (or a form) here */
    f->ur.method = "POST";
    f->ur.path = f->path;
    f->ur.body = buf_ptr(hr->body);
    f->ur.body_len = buf_len(hr->body);
    f->client_len = f->ur.body_len;
    f->ur.request_id = hr->request_id;
    f->ur.client_auth = f->auth;
    f->model = model;
    if (cfg->balance == BALANCE_PREFIX && json != NULL)
        f->prefix_hash = dispatch_prefix_hash(json,
                                              (size_t)cfg->prefix_bytes);
    return 0;
}

static struct dispatch_ctx
dispatch_of(const struct handler_ctx *ctx)
{
    struct dispatch_ctx dc = { ctx->cfg, ctx->pool, ctx->up, ctx->stop_fd,
                               NULL, NULL, ctx->tenants };

    return dc;
}

static void
fwd_release(struct fwd *f)
{
    gw_free(f->path);
    gw_wipe_free_str(f->auth);
}

/* Is it time to look for a client that hung up?  '*last' is per relay. */
static int
peer_check_due(int64_t *last)
{
    int64_t now = gw_now_ms();

    if (*last == 0) {
        *last = now;            /* first tick: just start the clock */
        return 0;
    }
    if (now - *last < PEER_CHECK_MS)
        return 0;
    *last = now;
    return 1;
}

/*
 * Bill the usage hr's client received (tenant.h), if it received all of
 * it: a 2xx body that ended cleanly.  'saved': tenants_bill()'s.
 */
static void
bill(struct handler_req *hr, int64_t prompt, int64_t completion, int saved)
{
    const struct reply *r = hr->reply;

    if (r->broken || r->status < 200 || r->status > 299)
        return;
    hr->prompt_tokens = prompt;
    hr->completion_tokens = completion;
    tenants_bill(hr->ctx->tenants, hr->pass, hr->model, (uint64_t)prompt,
                 (uint64_t)completion, saved);
}

/*
 * The bytes the prompt is counted from when the response has no usage
 * (usage_scan_charge()): the client's request's (not what the gateway
 * added to it, usage_ask()), but none of a form's, whose bytes are
 * audio, not text.
 */
static size_t
prompt_bytes(const struct fwd *fw)
{
    return fw->ur.content_type == NULL ? fw->client_len : 0;
}

/*
 * What the call cost its tenant's token limits: usage_scan_charge() of
 * what came; or, for a call that reached the upstream (an attempt was
 * made) and ended before any response head because its clients left
 * or time ran out, its prompt counted: the upstream took the request
 * and may have done the whole prefill, and a client must not be able
 * to spend it for nothing by hanging up before the first token.  A
 * connect timeout sent nothing; an answer that is not 2xx (the
 * upstream refused) costs nothing.  OUT *counted as usage_scan_charge().
 */
static uint64_t
cost_of(const struct usage_scan *u, const struct fwd *fw,
        const struct dispatch_result *out, int *counted)
{
    enum call_kind k = out->res.outcome.kind;

    if (!u->headed && out->attempts > 0
        && (k == CALL_CLIENT_GONE
            || (call_kind_is_timeout(k) && k != CALL_CONNECT_TIMEOUT))) {
        *counted = 1;
        return usage_count_prompt(prompt_bytes(fw));
    }
    return usage_scan_charge(u, prompt_bytes(fw), counted);
}

/*
 * hr's lease back (a leader's when its call is over, a follower's when
 * it follows), by what is left of the request's redis_timeout, which
 * keeps the rest.
 */
static void
give_back_lease(struct handler_req *hr)
{
    int64_t t0;

    if (hr->lease == NULL)
        return;
    t0 = gw_now_ms();
    tenant_lease_release(hr->ctx->cluster, hr->lease, hr->redis_left_ms);
    hr->lease = NULL;
    hr->redis_left_ms -= gw_now_ms() - t0;
}

/*
 * Charge hr's tenant 'tokens' (tenant.h's token limits), once per
 * request, whatever became of its client: the upstream spent them all
 * the same (unlike the bill, which counts what a client received).
 */
static void
charge(struct handler_req *hr, uint64_t tokens, int counted)
{
    int64_t now_us = gw_now_us(), wall_s = gw_wall_s();

    if (tokens == 0)
        return;
    tenants_charge(hr->ctx->tenants, hr->ctx->cfg, hr->tenant, hr->pass,
                   tokens, counted, now_us, wall_s);
    /* With [cluster], the tenant's shared limits too, by what is left of
     * the request's redis_timeout.  The call is over: its lease goes
     * first, so that a charge waiting on a slow Redis does not keep a
     * place of max_inflight from the client's next call meanwhile
     * (test 037). */
    if (hr->pass != NULL
        && tenant_shared_wanted(hr->ctx->cluster, hr->ctx->cfg,
                                hr->tenant)) {
        int64_t t0;

        give_back_lease(hr);
        t0 = gw_now_ms();
        tenant_shared_charge(hr->ctx->cluster, hr->ctx->cfg, hr->tenant,
                             tokens, now_us, wall_s, hr->redis_left_ms);
        hr->redis_left_ms -= gw_now_ms() - t0;
    }
}

/* ---- direct: the client's own socket is the sink ---- */

struct direct {
    struct handler_req *hr;
    int64_t peer_check_ms;
    struct usage_scan usage;
};

static int
direct_head(void *arg, const struct http_head *h)
{
    struct direct *d = arg;

    usage_scan_head(&d->usage, h->status, h->content_type);
    return reply_begin_head(d->hr->reply, h) != 0 ? GW_ENOMEM : 0;
}

static int
direct_data(void *arg, const char *p, size_t n)
{
    struct direct *d = arg;

    if (reply_body(d->hr->reply, p, n) == 0) {
        usage_scan_feed(&d->usage, p, n);
        return 0;
    }
    return handler_stopping(d->hr->ctx) ? GW_ESTOPPING : GW_EABORTED;
}

static int
direct_tick(void *arg)
{
    struct direct *d = arg;

    if (handler_stopping(d->hr->ctx))
        return GW_ESTOPPING;
    if (peer_check_due(&d->peer_check_ms)
        && reply_client_gone(d->hr->reply))
        return GW_EABORTED;
    return 0;
}

/*
 * The client's socket is readable: gone, or its next request.  Once its
 * whole body is sent it is no longer watched (a hang-up then is a
 * client that is done).
 */
static int
direct_peer(void *arg)
{
    struct direct *d = arg;
    struct reply *r = d->hr->reply;

    if (reply_body_complete(r))
        return 1;
    return reply_client_gone(r) ? GW_EABORTED : 0;
}

/* This client alone, with its own request id. */
static void
forward_direct(struct handler_req *hr, const struct fwd *fw)
{
    struct direct d = { hr, 0, { 0 } };
    struct upstream_sink sink = { &d, direct_head, direct_data,
                                  direct_tick, direct_peer };
    struct dispatch_ctx dc = dispatch_of(hr->ctx);
    struct dispatch_result out;
    const struct call_outcome *o = &out.res.outcome;
    struct reply *r = hr->reply;
    int64_t prompt, completion;
    uint64_t tokens;
    int billed, counted;

    usage_scan_init(&d.usage, usage_limit(hr->ctx->cfg->max_request_body));
    dispatch_call(&dc, &fw->ur, fw->model, &fw->adm, fw->prefix_hash,
                  hr->tenant, &sink, net_stream_fd(r->stream), &out);
    hr->upstream = out.upstream;
    hr->attempts = out.attempts;
    r->upstream_status = o->status;
    billed = o->kind == CALL_OK
             && usage_scan_end(&d.usage, &prompt, &completion);
    /* Charged before the body ends, so that the client's next request
     * is judged with it. */
    tokens = cost_of(&d.usage, fw, &out, &counted);
    charge(hr, tokens, counted);
    if (o->kind == CALL_OK) {
        reply_end(r);
        if (billed)
            bill(hr, prompt, completion, 0);
    } else if (call_kind_rc(o->kind) == GW_EABORTED || r->broken)
        reply_gone(r);          /* the client went away: nothing to say */
    else
        reply_failure(r, o);
    usage_scan_release(&d.usage);
}

/* The flight's id for the access log: a copy, the flight goes first. */
static void
note_flight(struct handler_req *hr, const struct flight *f)
{
    _Static_assert(sizeof(hr->flight_id) > FLIGHT_ID_LEN, "flight id");
    memcpy(hr->flight_id, f->id, FLIGHT_ID_LEN + 1);
}

/* ---- leader: one upstream call for the flight ---- */

struct leader {
    struct handler_req *hr;
    struct fanout_reader *self;     /* the leader's own client */
    struct flight *f;
    const unsigned char *key;
    struct fanout_opts opts;
    size_t max_bytes;               /* [coalesce] max_flight_bytes */
    size_t max_lag;                 /* [coalesce] max_reader_lag */
    int attached;                   /* its client is still a reader */
    int cut;                        /* its client was cut: no longer a
                                       reader, it still has its error to
                                       get (fanout_cut_begin()) */
    int64_t peer_check_ms;          /* its client, see PEER_CHECK_MS */
    int64_t self_moved_ms;          /* its client last took bytes */
    int64_t sweep_ms;               /* last fanout_sweep() */
    struct usage_scan usage;        /* what the call cost */
    int cache;                      /* its answer may be cached */
    int asks_usage;                 /* the body sent asks for the usage
                                       event (usage_ask()) */
    int split;                      /* ... and it is a stream that comes
                                       as it is read: it is cut */
    struct usage_split events;      /* the cut, usage event alone */
};

static struct fanout_opts
opts_of(const struct handler_ctx *ctx)
{
    struct fanout_opts o = { fanout_policy_of(ctx->cfg->leader_writes),
                             ctx->ncpu, ctx->stopping };

    return o;
}

/*
 * The leader's own client stops being a reader ('why': "gone", ...).
 * Said as what follows: the call goes on for the followers still
 * attached, or, with none, it stops (lead_nobody(); none can join once
 * the last reader left, coalesce.h).
 */
static void
leader_detach_client(struct leader *l, const char *why)
{
    unsigned left;

    if (l->cut) {
        l->cut = 0;             /* not a reader already: nothing to say */
        reply_gone(l->hr->reply);
        return;
    }
    if (!l->attached)
        return;
    l->attached = 0;
    reply_gone(l->hr->reply);
    left = coalescer_detach(l->hr->ctx->co, l->key, l->f, &l->self->fr);
    if (left == 0)
        log_msg(GW_LOG_INFO, "coalesce: leader client %s, no follower: "
                "the upstream call stops flight=%s", why, l->f->id);
    else
        log_msg(GW_LOG_INFO, "coalesce: leader client %s, the upstream "
                "call goes on for %u follower%s flight=%s", why, left,
                left == 1 ? "" : "s", l->f->id);
}

/*
 * The leader's own client was cut, too far behind: it stops being a
 * reader, so the flight frees what only it held, and the transfer goes
 * on for the followers (or is aborted if there are none, lead_nobody()).
 * Its error is queued after its pending bytes, written as its socket
 * takes them (lead_push_self()), and ended after the transfer.
 */
static void
leader_cut_client(struct leader *l)
{
    l->attached = 0;
    l->cut = 1;
    fanout_cut_begin(l->f, l->self);
    coalescer_detach(l->hr->ctx->co, l->key, l->f, &l->self->fr);
}

/*
 * Push to the leader's own client, never waiting (once it was cut, only
 * what it has pending).  A client that takes nothing for send_timeout is
 * dropped, as a follower's own thread or a direct relay would drop it:
 * else it would keep the flight's memory (its position holds every
 * chunk from there on) and the upstream call alive for nobody.
 */
static void
lead_push_self(struct leader *l)
{
    struct buf *pending = &l->self->pending;
    size_t before = buf_len(pending);
    int64_t now;
    int rc;

    rc = l->attached ? fanout_push(l->f, l->self) : fanout_flush(l->self);
    if (rc == GW_ETOOBIG) {
        leader_cut_client(l);
        return;
    }
    if (rc != 0) {
        leader_detach_client(l, "gone");
        return;
    }
    now = gw_now_ms();
    if (buf_len(pending) == 0 || buf_len(pending) < before)
        l->self_moved_ms = now;
    else if (now - l->self_moved_ms >= l->hr->reply->send_timeout_ms)
        leader_detach_client(l, "stuck for send_timeout");
}

/* dispatch_ctx.on_upstream: the flight's upstream, for the status view. */
static void
lead_upstream(void *arg, const char *name)
{
    struct leader *l = arg;

    flight_set_upstream(l->f, name);
}

/* GW_EABORTED once no client at all is listening, else 0. */
static int
lead_nobody(struct leader *l)
{
    return !l->attached && flight_readers(l->f) == 0 ? GW_EABORTED : 0;
}

static int
lead_head(void *arg, const struct http_head *h)
{
    struct leader *l = arg;
    struct reply *r = l->hr->reply;

    flight_set_head(l->f, h);
    usage_scan_head(&l->usage, h->status, h->content_type);
    /* A stream of a known length would lose its framing for the clients
     * that skip the usage event: it is not cut (vLLM's is chunked). */
    l->split = l->asks_usage && l->usage.mode == USAGE_SSE
               && h->content_length < 0;
    /* From the flight's head, as every follower's: the same bytes. */
    r->upstream_status = h->status;
    if (l->attached && reply_begin_head(r, &l->f->head) != 0)
        leader_detach_client(l, "out of memory");
    return 0;
}

/*
 * usage_piece_fn: append p[0..n) to the flight ('usage': the usage event
 * alone, for the clients that asked), write it to the leader's own
 * client and then to the parked followers, each as far as its socket
 * takes without waiting (fanout.h).  Out of memory here fails the whole
 * flight, honestly, for every client.
 */
static int
lead_piece(void *arg, const char *p, size_t n, int usage)
{
    struct leader *l = arg;
    int rc;

    rc = usage ? flight_append_usage(l->f, p, n, l->max_bytes, l->max_lag)
               : flight_append(l->f, p, n, l->max_bytes, l->max_lag);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "coalesce: out of memory appending a chunk "
                "flight=%s bytes=%zu", l->f->id, n);
        return GW_ENOMEM;
    }
    if (l->attached || l->cut)
        lead_push_self(l);
    fanout_after_append(l->f, &l->opts);
    return 0;
}

/*
 * Each upstream piece goes to the flight as it came; or, when the usage
 * event is cut out, as the split gives it: whole events, with only the
 * start of one that has not ended held back.
 */
static int
lead_data(void *arg, const char *p, size_t n)
{
    struct leader *l = arg;
    int rc;

    usage_scan_feed(&l->usage, p, n);
    rc = l->split ? usage_split_feed(&l->events, p, n, lead_piece, l)
                  : lead_piece(l, p, n, 0);
    return rc != 0 ? rc : lead_nobody(l);
}

/*
 * About once a second, and after every read: the stop; the leader's own
 * client (hung up? bytes its socket did not take?); and, at most once a
 * SWEEP_MS, the parked followers (fanout_sweep: hung up, or past their
 * deadline), since their threads sleep and cannot notice.
 */
static int
lead_tick(void *arg)
{
    struct leader *l = arg;
    int64_t now;

    if (handler_stopping(l->hr->ctx))
        return GW_ESTOPPING;
    if (l->attached && peer_check_due(&l->peer_check_ms)
        && reply_client_gone(l->hr->reply))
        leader_detach_client(l, "gone");
    now = gw_now_ms();
    if (now - l->sweep_ms >= SWEEP_MS) {
        l->sweep_ms = now;
        fanout_sweep(l->f, now);
    }
    if ((l->attached || l->cut) && buf_len(&l->self->pending) > 0)
        lead_push_self(l);
    return lead_nobody(l);
}

/*
 * Its client's socket is readable: gone (the flight goes on), or not.
 * Not watched once that client is no reader, or has its whole body.
 */
static int
lead_peer(void *arg)
{
    struct leader *l = arg;
    struct reply *r = l->hr->reply;
    int rc;

    if (!l->attached || reply_body_complete(r))
        return 1;
    if (!reply_client_gone(r))
        return 0;
    leader_detach_client(l, "gone");
    rc = lead_nobody(l);
    return rc != 0 ? rc : 1;
}

/*
 * The leader.  The request id it sends upstream is the flight's, not its
 * client's: vLLM builds the completion's "id" from it, and every client
 * of the flight gets those same bytes.  'asks_usage': fw's body asks
 * for the usage event, so a stream's is cut out for the clients that
 * did not ask (coalesce()).
 */
/*
 * May the cache keep the flight the leader 'l' has just ended with 'o'
 * (coalescer_finish()'s 'keep')?  For a request the cache applies to,
 * a 200 whose body ended cleanly and had no error (usage_scan_clean()),
 * that its upstream did not mark no-store or private.
 */
static int
cacheable(const struct leader *l, const struct call_outcome *o)
{
    return l->cache && o->kind == CALL_OK && l->f->head.status == 200
           && !l->f->head.no_store && usage_scan_clean(&l->usage);
}

static void
lead(struct handler_req *hr, struct flight *f, struct fanout_reader *self,
     const struct fwd *fw, int asks_usage, const unsigned char *key,
     const char *keyhex, int cache)
{
    const struct handler_ctx *ctx = hr->ctx;
    struct leader l;
    struct upstream_sink sink = { &l, lead_head, lead_data, lead_tick,
                                  lead_peer };
    struct upstream_request ur = fw->ur;
    struct dispatch_ctx dc = dispatch_of(ctx);
    struct dispatch_result out;
    const struct call_outcome *o = &out.res.outcome;
    int64_t prompt, completion;
    uint64_t tokens;
    int counted;

    memset(&l, 0, sizeof(l));
    usage_scan_init(&l.usage, usage_limit(hr->ctx->cfg->max_request_body));
    usage_split_init(&l.events);
    l.asks_usage = asks_usage;
    l.hr = hr;
    l.self = self;
    l.f = f;
    l.key = key;
    l.opts = opts_of(ctx);
    l.max_bytes = (size_t)ctx->cfg->max_flight_bytes;
    l.max_lag = (size_t)ctx->cfg->max_reader_lag;
    l.attached = 1;
    l.cache = cache;
    l.sweep_ms = l.self_moved_ms = gw_now_ms();
    hr->reply->role = "leader";
    note_flight(hr, f);
    metrics_coalesce_leader();
    log_msg(GW_LOG_INFO, "coalesce: leader key=%s flight=%s", keyhex, f->id);

    ur.request_id = f->id;
    dc.on_upstream = lead_upstream;
    dc.arg = &l;
    /* A flight is one tenant's (its key says whose): the leader's. */
    dispatch_call(&dc, &ur, fw->model, &fw->adm, fw->prefix_hash, hr->tenant,
                  &sink, net_stream_fd(hr->reply->stream), &out);
    hr->upstream = out.upstream;
    hr->attempts = out.attempts;
    /* The end of a stream that did not end with its event's blank line
     * (or was cut short) goes on as it came. */
    if (l.split)
        usage_split_end(&l.events, lead_piece, &l);
    usage_split_release(&l.events);
    if (o->kind == CALL_OK && usage_scan_end(&l.usage, &prompt, &completion))
        flight_set_usage(f, prompt, completion);
    /* The leader's tenant now, attached or not; each follower's from the
     * flight, the same count (its key holds the same request). */
    tokens = cost_of(&l.usage, fw, &out, &counted);
    flight_set_charge(f, tokens, counted);
    charge(hr, tokens, counted);
    coalescer_finish(ctx->co, key, f, o, cacheable(&l, o));
    usage_scan_release(&l.usage);
    flight_wake_all(f);
    if (o->kind != CALL_OK && call_kind_rc(o->kind) != GW_EABORTED)
        log_msg(GW_LOG_INFO, "coalesce: flight failed key=%s flight=%s "
                "reason=\"%s\"", keyhex, f->id, call_kind_text(o->kind));

    if (l.attached) {
        /* The transfer is over: now the client may take its time. */
        fanout_relay(f, self, &l.opts);
        coalescer_detach(ctx->co, key, f, &self->fr);
        if (flight_usage(f, &prompt, &completion))
            bill(hr, prompt, completion, 0);
    } else if (l.cut) {
        fanout_cut_end(self);
    }
    flight_unref(f);            /* the driver's reference */
}

/* ---- follower: someone else's upstream call ---- */

static void
follow(struct handler_req *hr, struct flight *f, struct fanout_reader *r,
       const unsigned char *key, const char *keyhex)
{
    const struct handler_ctx *ctx = hr->ctx;
    struct fanout_opts o = opts_of(ctx);
    int64_t prompt, completion;
    uint64_t tokens;
    int billed, charged, counted;

    hr->reply->role = "follower";
    note_flight(hr, f);
    metrics_coalesce_follower();
    tenants_note_follower(ctx->tenants, hr->pass);
    /* The flight's leader holds a lease for the call: a follower's own
     * goes back now, so followers do not count against max_inflight. */
    give_back_lease(hr);
    log_msg(GW_LOG_INFO, "coalesce: follower key=%s flight=%s tenant=%s",
            keyhex, f->id, tenant_name(ctx->cfg, hr->tenant));
    fanout_relay(f, r, &o);
    /* Before the detach: it may drop the last reference. */
    billed = flight_usage(f, &prompt, &completion);
    charged = flight_charge(f, &tokens, &counted);
    coalescer_detach(ctx->co, key, f, &r->fr);
    if (billed)
        bill(hr, prompt, completion, TENANT_SAVED_COALESCE);
    if (charged)
        charge(hr, tokens, counted);
}

/* ---- hit: a finished flight from the cache ---- */

/*
 * Replay the cached flight 'f' to hr's client, 'age_ms' after it ended:
 * billed as a follower is (its tenant's tokens, saved by the cache), but
 * charged nothing: no upstream spent anything for it.
 */
static void
hit(struct handler_req *hr, struct flight *f, struct fanout_reader *r,
    const unsigned char *key, int64_t age_ms)
{
    const struct handler_ctx *ctx = hr->ctx;
    struct fanout_opts o = opts_of(ctx);
    int64_t prompt, completion;
    int billed;

    hr->reply->age_s = age_ms / 1000;
    note_flight(hr, f);
    give_back_lease(hr);        /* it holds no upstream call */
    fanout_relay(f, r, &o);
    billed = flight_usage(f, &prompt, &completion);
    coalescer_detach(ctx->co, key, f, &r->fr);
    if (billed)
        bill(hr, prompt, completion, TENANT_SAVED_CACHE);
}

static void
bypass(struct handler_req *hr, const struct fwd *fw, enum metrics_bypass why,
       const char *keyhex)
{
    hr->reply->role = "bypass";
    metrics_coalesce_bypass(why);
    log_msg(GW_LOG_INFO, "coalesce: bypass key=%s reason=%s", keyhex,
            metrics_bypass_name(why));
    forward_direct(hr, fw);
}

/*
 * With [cache] on, what the cache did for hr's request: counted, told
 * in X-Infergw-Cache and the access log.  Once per request.
 */
static void
say_cache(struct handler_req *hr, enum metrics_cache_result res)
{
    if (hr->ctx->cfg->cache_ttl_ms <= 0)
        return;
    hr->reply->cache = metrics_cache_result_name(res);
    metrics_cache_result(res);
}

/*
 * Eligible: lead, follow, take a cached answer, or (a bound reached) go
 * alone.  A coalesced stream always asks the upstream for its usage
 * (usage_ask(): a constant of the configuration), so that each follower
 * and hit is billed what it saved, and the key is taken over the body
 * as sent, so the contract holds by construction: a client that asked
 * in exactly the words of the rewrite shares the flight of those that
 * did not.  A bypass goes alone, with the client's own body.
 */
static void
coalesce(struct handler_req *hr, const struct fwd *fw, const json_t *json)
{
    const struct handler_ctx *ctx = hr->ctx;
    unsigned char key[FLIGHT_KEY_LEN];
    struct coalesce_about about = { hr->model,
                                    tenant_name(ctx->cfg, hr->tenant) };
    struct coalesce_cache_ask ask;
    struct fwd sent = *fw;          /* borrows fw's strings: no release */
    struct fanout_reader r;
    enum metrics_bypass why;
    struct buf body;
    struct flight *f;
    int64_t age_ms;
    char keyhex[13];
    int asked, own = usage_asked(json);     /* the client asked itself */

    buf_init(&body, fw->ur.body_len + sizeof(USAGE_ASK));
    asked = usage_ask(fw->ur.body, fw->ur.body_len, json, &body);
    if (asked < 0) {
        reply_out_of_memory(hr->reply, "out of memory");
        goto out;
    }
    if (asked) {
        sent.ur.body = buf_ptr(&body);
        sent.ur.body_len = buf_len(&body);
    }
    coalesce_key(tenant_name(ctx->cfg, hr->tenant), ctx->generation,
                 &sent.ur, key);
    coalesce_key_hex(key, keyhex);
    coalesce_cache_ask(ctx->cfg, hr->tenant, hr->req, &ask);
    fanout_reader_init(&r, hr->reply, ctx->cfg->follower_timeout_ms,
                       keyhex, own);
    switch (coalescer_join(ctx->co, key, &about, &ask, &r.fr, &f, &age_ms,
                           &why)) {
    case COALESCE_LEADER:
        say_cache(hr, ask.use ? METRICS_CACHE_MISS : METRICS_CACHE_BYPASS);
        lead(hr, f, &r, &sent, asked || own, key, keyhex,
             ask.use);
        break;
    case COALESCE_FOLLOWER:
        say_cache(hr, ask.use ? METRICS_CACHE_MISS : METRICS_CACHE_BYPASS);
        follow(hr, f, &r, key, keyhex);
        break;
    case COALESCE_HIT:
        say_cache(hr, METRICS_CACHE_HIT);
        hit(hr, f, &r, key, age_ms);
        break;
    case COALESCE_BYPASS:
        say_cache(hr, METRICS_CACHE_BYPASS);
        bypass(hr, fw, why, keyhex);
        break;
    }
    fanout_reader_release(&r);
out:
    buf_release(&body);
}

/* 404 in OpenAI's shape for a model no upstream serves. */
static void
reply_no_model(struct handler_req *hr)
{
    char msg[128];

    snprintf(msg, sizeof(msg), "The model '%s' does not exist or is not "
             "served by any upstream", hr->model);
    reply_error_full(hr->reply, 404, "invalid_request_error", "model",
                     "model_not_found", msg, 0);
}

void
proxy_forward(struct handler_req *hr, const json_t *json, int coalescable)
{
    enum metrics_bypass why;
    struct fwd fw;

    if (fwd_init(&fw, hr, json_string_value(json_object_get(json, "model")),
                 json) != 0) {
        reply_out_of_memory(hr->reply, "out of memory");
    } else if (fw.model != NULL
               && !pool_serves(hr->ctx->pool, fw.model, &fw.adm)) {
        reply_no_model(hr);
    } else {
        metrics_proxied();
        if (!coalescable) {
            say_cache(hr, METRICS_CACHE_BYPASS);
            forward_direct(hr, &fw);
        } else if (!coalesce_eligible(hr->ctx->cfg, hr->tenant, hr->req,
                                      json, &why)) {
            say_cache(hr, METRICS_CACHE_BYPASS);
            bypass(hr, &fw, why, "-");
        } else {
            coalesce(hr, &fw, json);
        }
    }
    fwd_release(&fw);
}

void
proxy_forward_form(struct handler_req *hr, const char *model,
                   const char *content_type)
{
    struct fwd fw;

    if (fwd_init(&fw, hr, model, NULL) != 0) {
        reply_out_of_memory(hr->reply, "out of memory");
    } else if (!pool_serves(hr->ctx->pool, model, &fw.adm)) {
        reply_no_model(hr);
    } else {
        metrics_proxied();
        fw.ur.content_type = content_type;
        say_cache(hr, METRICS_CACHE_BYPASS);
        forward_direct(hr, &fw);
    }
    fwd_release(&fw);
}
