/* SPDX-License-Identifier: MIT */
/*
 * beat.h - a thread per upstream that runs a function every interval
 * until stopped: health.c's probes and scrape.c's load scrapes.
 *
 * One thread per upstream, not one for all: a slow or hung upstream then
 * delays only its own beat, never another's (a serial beat once held one
 * upstream's models back 5 s behind a hung one).  A beat that runs past
 * its interval makes the next start at once.
 *
 * Threads: 'fn' runs on the upstream's thread, never twice at once for
 * one upstream, in parallel across upstreams.  beat_free() sets the
 * 'stopping' flag fn is given, wakes every thread, and joins them.
 */
#ifndef INFERGW_GATEWAY_FLEET_BEAT_H
#define INFERGW_GATEWAY_FLEET_BEAT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct beat;

/*
 * Run for upstream 'idx' on its thread; 'arg' is beat_start()'s.
 * 'stopping' turns nonzero once beat_free() began: a probe under way
 * watches it to end early.
 */
typedef void (*beat_fn)(void *arg, size_t idx, const _Atomic int *stopping);

/*
 * Start 'n' threads, 'name' for log lines; each runs fn(arg, idx) at
 * once and then every 'every_ms'.  NULL on failure (logged; nothing left
 * running).
 */
struct beat *beat_start(const char *name, size_t n, int64_t every_ms,
                        beat_fn fn, void *arg);

/* Stop and join every thread, then free.  NULL-safe. */
void beat_free(struct beat *b);

#endif
