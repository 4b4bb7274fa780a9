/* SPDX-License-Identifier: MIT */
/*
 * window.h - counts over the last minute, a second at a time, with no
 * lock: what "requests per second over the last minute" is read from.
 *
 * A window is WINDOW_SECONDS buckets, one per second of the clock the
 * caller passes (gw_now_ms()), each holding WINDOW_CLASSES counts (what
 * a class is, the caller says: the status view's are 1xx .. 5xx).
 * Each count is one 64-bit atomic word: the second it belongs to (its
 * low 32 bits) in the high half, the count in the low half.  Adding is
 * one compare-and-swap that either bumps the count of this second or
 * starts it over at 1 for a new second (the bucket last held the second
 * a minute ago), so no add is ever lost to another starting the bucket
 * over, and no writer waits for another.  A reader sums the words
 * whose second is in the last WINDOW_SECONDS.
 *
 * What was given up: a count past 2^32 in one second would wrap (four
 * billion requests a second), and an add whose clock reading is older
 * than the second its bucket already holds (a thread that read the
 * clock, then slept a whole minute) is dropped, not counted a minute
 * late.
 *
 * Storage is the caller's (a static struct is ready once window_start()
 * has set its start); common/ keeps no window of its own.
 */
#ifndef INFERGW_COMMON_WINDOW_H
#define INFERGW_COMMON_WINDOW_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define WINDOW_SECONDS 60
#define WINDOW_CLASSES 5

struct window {
    _Atomic uint64_t slot[WINDOW_SECONDS][WINDOW_CLASSES];
    _Atomic int64_t start_ms;       /* window_start(); 0: long ago */
};

/* The window starts counting at 'now_ms' (it covers less than a minute
 * until a minute has passed).  Once, before any window_add(). */
void window_start(struct window *w, int64_t now_ms);

/* One more event of class 'cls' (< WINDOW_CLASSES; others are not
 * counted) at 'now_ms'.  Lock-free, any thread. */
void window_add(struct window *w, int64_t now_ms, size_t cls);

/*
 * The counts of the last WINDOW_SECONDS seconds at 'now_ms': the
 * current second so far and the WINDOW_SECONDS - 1 before it.  OUT
 * out[WINDOW_CLASSES]: each class's count.  Returns the time they
 * cover in ms, for a rate: WINDOW_SECONDS - 1 whole seconds and the
 * part of this one, or the time since window_start() when that is
 * shorter; never below 1000, so that the first requests are not a
 * burst of thousands a second.  Lock-free, any thread.
 */
int64_t window_read(struct window *w, int64_t now_ms,
                    uint64_t out[WINDOW_CLASSES]);

#endif
