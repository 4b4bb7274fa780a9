/* SPDX-License-Identifier: MIT */
/*
 * proxy.h - forward one client request upstream and relay the answer,
 * by one of three paths (each makes its upstream call through
 * dispatch.h, which picks the upstream, retries and hedges):
 *
 *  - direct: this client alone (not coalescable, bypassed, or a bound
 *    reached).  Each upstream piece is written to the client as it
 *    arrives (blocking, bounded by send_timeout), so a slow client slows
 *    only its own upstream transfer.
 *  - leader: the first of identical requests makes the upstream call,
 *    appends every chunk to the flight and writes it, without waiting,
 *    to its own client and the parked followers (fanout.h).
 *  - follower: an identical request that arrives while the flight takes
 *    joiners relays the flight from chunk 0 at its client's pace.
 */
#ifndef INFERGW_GATEWAY_COALESCE_PROXY_H
#define INFERGW_GATEWAY_COALESCE_PROXY_H

#include <jansson.h>

struct handler_req;

/*
 * Forward hr's POST (head, body) and answer the client.  'json' is the
 * parsed body, a JSON object (borrowed): its "model" picks the upstreams
 * (404 model_not_found when none serves it), and the call is made on the
 * pool (dispatch.h).  'coalescable' says the route may coalesce (the
 * policy decides).  A request that gets past the model's check has
 * reached proxying (metrics_proxied()), here and in the form's path.
 */
void proxy_forward(struct handler_req *hr, const json_t *json,
                   int coalescable);

/*
 * Forward hr's POST of a form (an audio upload) by the direct path,
 * never coalesced: 'model' (borrowed, not NULL) picks the upstreams (404
 * model_not_found when none serves it), and the body goes with
 * "Content-Type: 'content_type'" (borrowed) instead of JSON's.
 */
void proxy_forward_form(struct handler_req *hr, const char *model,
                        const char *content_type);

#endif
