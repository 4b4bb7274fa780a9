/* SPDX-License-Identifier: MIT */
/*
 * lora.h - an upstream's LoRA adapters as its engine reports them, what
 * the gateway sent there since, and what that says of a call for an
 * adapter (DESIGN.md "Fleet-aware scheduling"; docs/UPSTREAMS.md "LoRA
 * adapters").
 *
 * vLLM with --enable-lora --max-loras N serves adapters as models: a
 * request names one as its "model".  A batch holds at most N adapters,
 * and an adapter not loaded on the server is loaded there first
 * (hundreds of ms to seconds, the whole batch waiting) in the place of
 * another.  Its GET /metrics says which adapters its running and waiting
 * requests use, in one gauge:
 *
 *   vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",
 *                           waiting_lora_adapters="c"} 1.7562292345e+09
 *
 * whose value is the time it was set, and whose every label set ever
 * seen stays on the page: the state now is the sample with the highest
 * value (prom_read_latest()).  scrape.c reads it with the engine's load
 * (engine.h), so it is as fresh as that load, and no fresher.
 *
 * Between two scrapes the gateway adds what it did itself, as engine.h
 * does for the load: an adapter it sent a call for to an upstream since
 * the scrape went out counts as running there (vLLM runs or queues it
 * at once), until a scrape sent after that call says what became of it.
 * So a burst for an adapter that runs nowhere goes where its first call
 * went, not one call per upstream.
 *
 * The gauge names the adapters of running and waiting requests only,
 * not those loaded and idle; but vLLM keeps max_lora of them in its GPU
 * slots, the least recently used one out when another comes.  So the
 * gateway keeps the same list for each upstream, from what it sees:
 * every adapter a scrape shows running or waiting, and every one it
 * sends there, goes to the front of a list of max_lora (at most
 * LORA_SLOTS_MAX), the last one off its end.  An adapter on that list
 * is still in a slot, as far as anything the gateway can see says (a
 * client that goes around the gateway may have pushed it out).  Without
 * that, an adapter idle for a moment would go wherever there is room,
 * and load again, though it still sits where it last ran.
 *
 * What a call for adapter A makes of an upstream with a fresh report:
 *   resident  A is running or waiting there, was sent there since, or
 *             is on its list of slots;
 *   free      it is not, fewer than max_lora adapters run there (those
 *             sent since counted as running), and its list of slots has
 *             fewer than max_lora: A would load in a slot nobody used;
 *   room      the same but for the list, which is full: A would load in
 *             the place of an idle adapter, pushing out none that runs;
 *   neither.
 * Without a fresh report (none, a failed scrape, or one older than
 * load_stale) an upstream is neither, and a call lands on it by load
 * alone.  A call that goes where its adapter is not resident is counted
 * as an adapter load the gateway caused (infergw_upstream_lora_loads_
 * total); one to an upstream without a fresh report is not counted:
 * nothing says what it had.
 *
 * Bounds: of each list, the first LORA_MAX_ADAPTERS names are kept, each
 * at most POOL_MODEL_ID_MAX bytes (a longer one, or one holding a NUL or
 * a byte under 0x20, is dropped, and counted); however long the label
 * value, it is read once, and nothing but the kept names is copied.
 *
 * Values only: no state of its own, no locks.  A struct lora_load lives
 * in the pool's member and is read and changed under the pool's lock; a
 * struct lora_report is built without it (scrape.c) and handed over.
 */
#ifndef INFERGW_GATEWAY_FLEET_LORA_H
#define INFERGW_GATEWAY_FLEET_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "fleet/engine.h"

#define LORA_MAX_ADAPTERS 64        /* names kept of each list */
#define LORA_SENT_MAX 64            /* calls since the scrape remembered */
#define LORA_MAX_LORA 1000000       /* the largest max_lora read */
#define LORA_NAME_MAX 256           /* POOL_MODEL_ID_MAX: a longer name is
                                       no model the pool routes */
#define LORA_SLOTS_MAX 64           /* slots mirrored per upstream, at
                                       most (of max_lora) */

/* What one scrape's vllm:lora_requests_info said. */
struct lora_report {
    uint64_t max_lora;
    size_t num_running;             /* names kept, running ones ... */
    size_t num_waiting;             /* ... then waiting ones */
    uint64_t hash[2 * LORA_MAX_ADAPTERS];  /* lora_hash() of each */
    char *names;                    /* owned: each name NUL-ended, in
                                       that order; NULL when none */
    size_t dropped;                 /* names not kept (bounds, above) */
};

/*
 * Read the latest vllm:lora_requests_info sample of text[0..len) (a GET
 * /metrics body; borrowed) into *out (whose old contents are not
 * freed).  Returns 0; GW_ENOTFOUND when the text has no such sample (a
 * server without LoRA); GW_EPARSE when a line of it is malformed, or its
 * latest sample lacks a label or has a max_lora that is not a whole
 * number up to LORA_MAX_LORA (then nothing is known of its adapters); or
 * GW_ENOMEM.  On any error *out is empty (lora_report_release()-safe).
 */
int lora_report_read(const char *text, size_t len, struct lora_report *out);

/* Free what a report owns; it is empty afterwards.  NULL-safe. */
void lora_report_release(struct lora_report *r);

/* The i-th name kept of 'r' (running ones first); i < running+waiting. */
const char *lora_report_name(const struct lora_report *r, size_t i);

/* The hash an adapter's name is known by (its bytes, no NUL). */
uint64_t lora_hash(const char *name);

/* A call for an adapter the gateway sent to an upstream. */
struct lora_sent {
    uint64_t hash;                  /* the adapter's (lora_hash()) */
    uint64_t call;                  /* the call's number: engine_load's
                                       'started' once it was counted */
};

/* An upstream's adapters: in the pool's member, under its lock. */
struct lora_load {
    struct lora_report last;        /* the last scrape's, when 'known' */
    int known;                      /* the last scrape had the gauge */
    struct lora_sent sent[LORA_SENT_MAX];   /* a ring, oldest overwritten */
    size_t num_sent, next_sent;
    uint64_t slots[LORA_SLOTS_MAX]; /* the adapters in its GPU slots, as
                                       far as the gateway saw: hashes,
                                       the most recently used first */
    size_t num_slots;
    uint64_t loads;                 /* calls sent where their adapter
                                       was not resident */
};

/*
 * The scrape sent at 'sent' came back with 'r' (stolen, emptied; NULL:
 * it had no gauge, or failed).  The calls sent since 'sent' stay noted;
 * the ones before are in the report (or gone).  OUT *old: the report
 * replaced, to release once the lock is dropped.
 */
void lora_set(struct lora_load *l, struct lora_report *r,
              const struct engine_mark *sent, struct lora_report *old);

/* What a call for the adapter hashed 'h' makes of an upstream. */
enum lora_fit {
    LORA_UNKNOWN = 0,               /* no fresh report */
    LORA_RESIDENT,
    LORA_FREE,
    LORA_ROOM,
    LORA_NEITHER,
};

/*
 * 'fresh': the upstream's engine load (which the report came with) is
 * fresh (engine_fresh()).
 */
enum lora_fit lora_fit(const struct lora_load *l, int fresh, uint64_t h);

/*
 * Is the adapter hashed 'h' running or waiting there, by the report
 * alone (the status view; 'known' or not)?
 */
int lora_reported(const struct lora_load *l, uint64_t h);

/*
 * A call for the adapter hashed 'h' was sent there as call number
 * 'call' (engine_load's 'started' after it).  Counted as a load when the
 * report was fresh and it was not resident.
 */
void lora_note_call(struct lora_load *l, int fresh, uint64_t h,
                    uint64_t call);

#endif
