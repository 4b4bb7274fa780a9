/* SPDX-License-Identifier: MIT */
/*
 * window.c - counts over the last minute, lock-free (window.h).
 */
#include "window.h"

#define COUNT_MASK 0xffffffffu

/* The second of 'ms' as a bucket's words stamp it: its low 32 bits. */
static uint32_t
second_of(int64_t ms)
{
    return (uint32_t)(uint64_t)(ms / 1000);
}

void
window_start(struct window *w, int64_t now_ms)
{
    atomic_store_explicit(&w->start_ms, now_ms, memory_order_relaxed);
}

void
window_add(struct window *w, int64_t now_ms, size_t cls)
{
    uint32_t s = second_of(now_ms);
    _Atomic uint64_t *word;
    uint64_t v, next;

    if (cls >= WINDOW_CLASSES || now_ms < 0)
        return;
    word = &w->slot[s % WINDOW_SECONDS][cls];
    v = atomic_load_explicit(word, memory_order_relaxed);
    do {
        uint32_t held = (uint32_t)(v >> 32);

        if (held == s)
            next = v + 1;
        else if ((int32_t)(held - s) > 0)
            return;             /* a newer second has it: window.h */
        else
            next = (uint64_t)s << 32 | 1;
    } while (!atomic_compare_exchange_weak_explicit(word, &v, next,
                                                    memory_order_relaxed,
                                                    memory_order_relaxed));
}

int64_t
window_read(struct window *w, int64_t now_ms, uint64_t out[WINDOW_CLASSES])
{
    uint32_t s = second_of(now_ms);
    int64_t span = (WINDOW_SECONDS - 1) * 1000 + now_ms % 1000;
    int64_t since = now_ms - atomic_load_explicit(&w->start_ms,
                                                  memory_order_relaxed);

    for (size_t c = 0; c < WINDOW_CLASSES; c++)
        out[c] = 0;
    for (size_t i = 0; i < WINDOW_SECONDS; i++)
        for (size_t c = 0; c < WINDOW_CLASSES; c++) {
            uint64_t v = atomic_load_explicit(&w->slot[i][c],
                                              memory_order_relaxed);

            /* An empty word (0) is second 0 with no count: adds 0. */
            if ((uint32_t)(s - (uint32_t)(v >> 32)) < WINDOW_SECONDS)
                out[c] += v & COUNT_MASK;
        }
    if (since < span)
        span = since;
    return span < 1000 ? 1000 : span;
}
