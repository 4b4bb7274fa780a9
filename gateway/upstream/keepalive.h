/* SPDX-License-Identifier: MIT */
/*
 * keepalive.h - the upstream connections kept alive between calls.
 *
 * Per upstream, a LIFO of idle sessions, each holding one warm
 * connection to that upstream.  A session is opaque here (upstream.c's
 * libcurl multi handle with its easy handles); this module only knows
 * the descriptor of its connection, to watch it, and how to drop it.
 *
 * Design (DESIGN.md "Key and eligibility", last point): an answer may
 * only ever reach the request it answers, so a connection that has
 * anything to read while it idles (a stray response, a 408 before the
 * upstream's idle close, the close itself) is never used again.  A
 * session is checked with a zero-timeout poll() when it is taken, and
 * the reaper thread checks every idle one each KEEPALIVE_CHECK_MS, so a
 * connection the upstream closed is closed here too within that time
 * (no socket left in CLOSE_WAIT).  Besides:
 *   - at most 'max_idle' ([routing] keepalive) idle sessions per
 *     upstream; putting one more drops the oldest;
 *   - one idle longer than 'idle_timeout_ms' ([routing]
 *     keepalive_timeout) is dropped, so the gateway closes first, before
 *     the upstream's own idle timer (uvicorn: 5 s) can race a request;
 *   - a session without a connection is never kept: with libcurl 7.88
 *     each multi handle costs two descriptors of its own (its wake-up
 *     pipe), which an idle session pays only for the connection it keeps.
 *
 * Threads: every function is thread-safe.  One mutex guards the stacks;
 * it is held only to push or pop, never across poll(), a drop or a log
 * line.  The reaper is a beat thread: keepalive_new() starts it and
 * keepalive_free() stops it (joins) before dropping what is left.
 */
#ifndef INFERGW_GATEWAY_UPSTREAM_KEEPALIVE_H
#define INFERGW_GATEWAY_UPSTREAM_KEEPALIVE_H

#include <stddef.h>
#include <stdint.h>

struct keepalive;

/* How often the reaper looks at the idle connections. */
#define KEEPALIVE_CHECK_MS 1000

/*
 * Drops an idle session: frees it, closing its connection.  Called
 * without the lock, by the thread that found it stale.
 */
typedef void keepalive_drop_fn(void *session);

/*
 * A cache for 'num_upstreams' upstreams, 'max_idle' sessions each (0:
 * none is ever kept), dropped after 'idle_timeout_ms' idle.  Starts the
 * reaper.  NULL on failure (logged).
 */
struct keepalive *keepalive_new(size_t num_upstreams, uint64_t max_idle,
                                int64_t idle_timeout_ms,
                                keepalive_drop_fn *drop);

/* Stop the reaper, drop every idle session, free.  NULL-safe. */
void keepalive_free(struct keepalive *k);

/*
 * The most recently used idle session of upstream 'idx' whose
 * connection is quiet and not too old: returned owned (NULL: none).
 * Every stale one met on the way is dropped.
 */
void *keepalive_take(struct keepalive *k, size_t idx);

/*
 * Keep 'session' (stolen) as an idle one of upstream 'idx', its
 * connection on descriptor 'fd'.  Drops the oldest one when the stack is
 * full (or this one, with max_idle 0).
 */
void keepalive_put(struct keepalive *k, size_t idx, void *session, int fd);

#endif
