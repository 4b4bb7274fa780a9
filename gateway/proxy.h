/*
 * proxy.h - forward one client request upstream and relay the answer.
 *
 * Non-coalesced requests are relayed directly: each upstream piece is
 * written to the client as it arrives (blocking, bounded by send_timeout),
 * so a slow client slows only its own upstream transfer.
 */
#ifndef INFERGW_GATEWAY_PROXY_H
#define INFERGW_GATEWAY_PROXY_H

#include <jansson.h>

struct conn;

/*
 * Forward c's request (head in c->req, body in c->body) and answer the
 * client.  'json' is the parsed body (borrowed; NULL for GET).
 * 'coalescable' says the route may coalesce (the policy decides).
 */
void proxy_forward(struct conn *c, const json_t *json, int coalescable);

#endif
