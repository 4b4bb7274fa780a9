/* SPDX-License-Identifier: MIT */
/*
 * dispatch.h - one upstream call for a request (a flight's, or a direct
 * one), made on the pool: choose an upstream, take its slot, run the
 * transfer, judge the outcome, and while no byte of a response has
 * reached any client, try again on another upstream.
 *
 * Retries (DESIGN.md "Upstream pools and resilience"): an attempt that
 * fails before the sink has heard of a response head (upstream.h holds it
 * until the first body byte) is made again on an upstream not tried yet:
 * connect errors, a first byte timeout, 429/502/503/504, a connection lost
 * before the first body byte.  At most [routing] retries more attempts,
 * each one taken from the retry budget (pool.h); past either, the last
 * failure is the answer, and a retryable status is then relayed as the
 * upstream sent it.  Once the sink has the head, never: a failure later is
 * the sink's to report (an SSE error event).
 *
 * The bound is on what the upstreams receive: a request reaches them at
 * most 1 + retries times, hedges and resends on a fresh connection
 * (upstream.h on_resend) included, since each is one more request the
 * upstream must read.  So a resend is made only while an attempt is
 * left (it keeps the idle-close race invisible to clients while retries
 * is at least 1), and a hedge too; a resend is charged to the retry
 * budget but never refused by it (pool_note_resend()).
 *
 * The sink sees one response: the one attempt that got as far as a body.
 * For a flight that means every client of it, so a retry is invisible to
 * them except in logs and metrics.
 *
 * Poison: a request that fails with the same 5xx on two upstreams is
 * taken to be the request's fault (a prompt every server chokes on), not
 * theirs, and none of its failures with that status counts toward
 * ejection (pool_judge()).  So a 5xx verdict is held until the call knows:
 * the same status from another attempt (poison), an answer from another
 * (the held failures count), or the end of the call (they count: a
 * request that failed on one upstream only, with no other to try or no
 * retry left, counts as it always did).  Its slot goes back at once; only
 * the verdict waits.  A 503 with Retry-After is judged at once: "not
 * now" is the upstream's word about itself.
 */
#ifndef INFERGW_GATEWAY_FLEET_DISPATCH_H
#define INFERGW_GATEWAY_FLEET_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fleet/pool.h"
#include "upstream/upstream.h"

struct gw_config;
struct tenants;

/* What dispatch_call needs; all borrowed, immutable while it runs. */
struct dispatch_ctx {
    const struct gw_config *cfg;
    struct pool *pool;
    struct upstream *up;
    int stop_fd;                    /* readable once the process stops */
    /*
     * May be NULL: called on the calling thread with the name of the
     * upstream (cfg's) the call is on now, as each attempt but a hedge
     * starts (past the pool's queue), and when a hedge wins.  For the
     * status view (a flight's upstream, flight.h).
     */
    void (*on_upstream)(void *arg, const char *name);
    void *arg;
    /* Where the pool's queue reports what it does with the call, per
     * tenant (pool_want.tenants); NULL: nowhere. */
    struct tenants *tenants;
};

struct dispatch_result {
    struct upstream_result res;     /* of the last attempt; its outcome is
                                       the call's, for the clients (the
                                       pool's refusal when no attempt was
                                       made; CALL_FAULT_REQUEST when the
                                       request was found to be poison) */
    int attempts;                   /* upstream calls made, hedges and
                                       resends too: 1 + retries at most */
    const char *upstream;           /* name of the last one; NULL none */
};

/*
 * Make the call for 'req' (model 'model', NULL: any, with 'adm' what
 * pool_serves() found for it, borrowed, or NULL: pool_want.admission;
 * 'prefix_hash' for balance = prefix; for 'tenant', pool_want.tenant)
 * into 'sink', watching
 * the client's socket 'watch_fd' (-1: none) for a hang-up
 * (sink->on_peer).  With [routing] hedge_after,
 * an attempt without a first body byte by then gets a hedge on another
 * upstream (upstream.h), which costs the retry budget.  OUT *out.
 * Returns call_kind_rc() of out->res.outcome: 0, an upstream_perform()
 * code, GW_ENOTFOUND (CALL_NOT_SERVED), GW_EUNAVAIL (CALL_NO_UPSTREAM or
 * CALL_ALL_FULL: every upstream for the model ejected, held back or full
 * past queue_timeout; the outcome's retry_after_s is for the 503),
 * GW_ESHED (CALL_SHED: every upstream full, the tenant sheddable: 429),
 * GW_EABORTED (CALL_QUEUE_GONE) or GW_ESTOPPING.
 */
int dispatch_call(const struct dispatch_ctx *dc,
                  const struct upstream_request *req, const char *model,
                  const struct pool_admission *adm, uint64_t prefix_hash,
                  size_t tenant,
                  const struct upstream_sink *sink, int watch_fd,
                  struct dispatch_result *out);

/*
 * The prompt's prefix for balance = prefix, hashed: the leading
 * 'max_bytes' of the chat "messages" (role and content of each, in
 * order, so the system prompt first), of "prompt", or of the Responses
 * API's "instructions" and "input" (taken as a system turn and a user
 * turn, or the input's list of turns: a conversation hashes as its chat
 * form; an embedding's or a pooling's "input" too).  0 when the body has
 * none of them (an upload's form: no body to read).
 */
uint64_t dispatch_prefix_hash(const json_t *body, size_t max_bytes);

#endif
