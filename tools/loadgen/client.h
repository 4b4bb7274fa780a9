/* SPDX-License-Identifier: MIT */
/*
 * client.h - loadgen's clients: one connection each, driven through
 * connect, request and response by one epoll loop over 'run'.
 *
 * Every function here works on 'run' (lg.h) and must be called from the
 * one thread; none blocks but client_event_loop(), which waits in
 * epoll_wait() until its condition holds or its deadline passes.
 */
#ifndef INFERGW_TOOLS_LOADGEN_CLIENT_H
#define INFERGW_TOOLS_LOADGEN_CLIENT_H

#include <stdint.h>

#include "lg.h"

/* Keep LG_CONNECT_BURST connects outstanding until every client has one. */
void client_feed_connects(int64_t now);

/*
 * Write what is left of the request on 'c' (a connected client); the
 * socket is non-blocking, so the epoll loop writes the rest.  The first
 * byte stamps the request's send time.
 */
void client_send(struct client *c, int64_t now);

/*
 * Store one request's outcome 'err' (LE_NONE: a complete response) at
 * 'now' in run.recs; the run goes on without it on ENOMEM (run.oom).
 */
void client_record(struct client *c, enum lg_error err, int64_t now);

/* Close the client's socket, if any, and free its head buffer. */
void client_close(struct client *c);

/* Close the client for good: CS_DONE, out of run.active. */
void client_finish(struct client *c);

/*
 * Run the event loop until 'until' returns true or 'deadline' passes.
 * 'rbuf' is the one read buffer of LG_READ_SIZE, shared by all clients.
 */
void client_event_loop(int (*until)(void), int64_t deadline, char *rbuf);

/* client_event_loop() conditions: every connect ended; every client done. */
int client_all_connected(void);
int client_all_done(void);

#endif
