/* SPDX-License-Identifier: MIT */
/*
 * route.h - the HTTP routes: health, readiness, metrics, and the OpenAI
 * endpoints that go upstream; and the checks a request passes before it
 * is forwarded (method, API key, body size and framing, a JSON object).
 */
#ifndef INFERGW_GATEWAY_CLIENT_ROUTE_H
#define INFERGW_GATEWAY_CLIENT_ROUTE_H

struct handler_req;

/*
 * Answer 'hr': pick the route (404, or 405 with Allow; on the admin
 * listener only /metrics, /healthz, /readyz, /status.json and /status,
 * the last two there alone), check the key (401: a tenant's, or for
 * /metrics and /status.json an [admin] one), read the body (413, 408,
 * 400; Expect: 100-continue answered), and respond or forward upstream.
 * Always leaves a response sent or the reply broken.  A request of a
 * tenant's route (one that goes upstream, and /v1/models) is counted
 * with its status under its tenant (tenants_count_request()).
 */
void route_request(struct handler_req *hr);

#ifdef INFERGW_UNIT_TEST
#include <stddef.h>
#include <stdint.h>

/* Test builds only (GW_TESTABLE): 'us' as an x-ratelimit-reset-*
 * value, Go's duration, into out[0..n). */
void format_reset(char *out, size_t n, int64_t us);
#endif

#endif
