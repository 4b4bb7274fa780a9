/* SPDX-License-Identifier: MIT */
/*
 * wait.h - every wait of a request in mock_upstream, each watching the
 * client: a delay, a stall, the engine's tokens, a mock_hold and a
 * mock_gate.
 *
 * Each returns as soon as the client hangs up or resets, with q->gone
 * and q->close set, so that a client that goes away ends the wait at
 * once and is counted in "aborted".  Only wait_hold() and wait_gate()
 * take st.mu, and release it around each socket check and while they
 * sleep.
 */
#ifndef INFERGW_TOOLS_MOCK_WAIT_H
#define INFERGW_TOOLS_MOCK_WAIT_H

#include <stdint.h>

#include <jansson.h>

struct req;

/*
 * Sleep 'ms' milliseconds (-1: no limit) while watching the client, and
 * 'wake_fd' for POLLIN unless it is -1.  Returns 0 when the time is up,
 * 1 when wake_fd is readable, or GW_ECLOSED as soon as the client hangs
 * up or resets (and marks the request gone).  Only POLLRDHUP is asked
 * for, so bytes the client sends meanwhile (a pipelined request) do not
 * end the wait; POLLHUP and POLLERR are always reported.  A client that
 * half-closes after its request counts as gone: libcurl never does that.
 */
int wait_client_or(struct req *q, int64_t ms, int wake_fd);

/* wait_client_or() with nothing else to watch: 0 or an error. */
int wait_client(struct req *q, int64_t ms);

/*
 * Engine mode: wait until the request's sequence has 'n' tokens (at most
 * all of them, q->chunks), watching the client meanwhile.  Returns 0, or
 * wait_client()'s error; the sequence is then taken out of the engine
 * when post_answer() frees it.
 */
int wait_tokens(struct req *q, long n);

/*
 * Wait until content chunk 'i' may be sent: its mock_gate is open that
 * far, then the -d or mock_delay_ms delay, or in engine mode until its
 * token has been generated.  Returns 0 or an error (q->close set).
 */
int wait_chunk(struct req *q, long i);

/* A server that hangs: no answer until the client leaves (or
 * MOCK_STALL_MS), then close. */
void wait_stall(struct req *q);

/*
 * Wait until /release?tag=<q->hold> (or an earlier one), the client goes
 * away, MOCK_HOLD_MS passes or the process stops.
 * Returns 0 (released), GW_ECLOSED (client gone, q->gone set),
 * GW_ETIMEDOUT or GW_EABORTED (stopping).
 * Takes st.mu; releases it around each socket check and while waiting.
 */
int wait_hold(struct req *q);

/*
 * Wait until the request's mock_gate lets content chunk 'i' (from 0) go:
 * until POST /gate has opened it past 'i', the client goes away,
 * MOCK_GATE_MS passes or the process stops.  Returns 0, GW_ECLOSED
 * (client gone), GW_ETIMEDOUT or GW_EABORTED, with q->close set on an
 * error: the body is then cut short, which the client sees as a broken
 * upstream.  Takes st.mu; releases it around each socket check.
 */
int wait_gate(struct req *q, long i);

/* The chunks a request gated on 'tag' may send so far.  st.mu held. */
json_int_t wait_gate_open_locked(const char *tag);

#endif
