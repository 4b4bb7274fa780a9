/*
 * route.h - the HTTP routes: health, readiness, metrics and the OpenAI
 * endpoints that go upstream.
 */
#ifndef INFERGW_GATEWAY_ROUTE_H
#define INFERGW_GATEWAY_ROUTE_H

struct conn;

/*
 * Answer the request whose head is in c->req: pick the route (404, or 405
 * with Allow), read and check the body, and respond or forward upstream.
 * Always leaves a response sent (or the connection marked broken).
 */
void route_request(struct conn *c);

#endif
