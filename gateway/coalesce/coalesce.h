/* SPDX-License-Identifier: MIT */
/*
 * coalesce.h - request coalescing ("singleflight"): who may coalesce, the
 * key that says two requests are the same, and the map of flights in
 * flight.
 *
 * The contract: every byte the upstream receives for a coalesced call is
 * either a constant of the gateway's configuration or derived from data
 * that is part of the coalescing key.  So a follower can only ever get
 * the answer to exactly its own request.  It holds by construction:
 * upstream_request.h's struct upstream_request is all of a client's
 * request that reaches the upstream, and coalesce_key() hashes every
 * field of it but the request id, which on a coalesced call is the
 * flight's own (proxy.c); the rest of the upstream request is constant
 * (upstream_request.c).  Its body is the client's, but a stream's asks
 * for the usage (usage.h's usage_ask(), a constant of the
 * configuration): the key is taken over the body as sent.
 * Content-Type and Accept are constants; a forwarded credential is
 * hashed into the key; the tenant is always in it.
 *
 * Design: a map from key to entry under one mutex.  An entry is the
 * coalescer's own record of a flight that takes joiners: the flight, its
 * leader's reader, and how many followers are attached now.  The first
 * eligible request with a key becomes the LEADER: it makes the upstream
 * call and appends to the flight.  Requests with the same key that
 * arrive while the flight is joinable become FOLLOWERS and read it from
 * chunk 0.  Finishing a flight and removing its entry happen in one step
 * under the map lock, so a request that arrives after completion starts
 * a fresh upstream call.
 *
 * The response cache is the flight's afterlife ([cache] ttl > 0): a
 * flight that ended with an answer worth keeping (the caller says so:
 * 200, a clean end, nothing forbade it) and whose log is whole
 * (flight_replayable(), at most max_entry_bytes) stays in the map, in
 * the same step, as a CACHED entry: no copy, its chunk log is the entry.
 * A request with its key within the ttl (and within its own max-age) is
 * a HIT: it attaches to the finished flight and replays it, as a late
 * follower does.  Cached entries are kept on two lists, by age (expired
 * ones go first, from the oldest, on every join) and by use (past
 * max_bytes, the least recently used go).  A reload drops them all
 * (coalescer_set_limits()), and a flight led before it is not kept when
 * it ends after it: the generation in its key means no request under
 * the new configuration could ever hit it.
 * Only running flights count against max_flights or appear in
 * coalescer_status().
 *
 * Lock order: the map lock, then a flight's lock.  Never the reverse.
 */
#ifndef INFERGW_GATEWAY_COALESCE_COALESCE_H
#define INFERGW_GATEWAY_COALESCE_COALESCE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/config.h"
#include "coalesce/flight.h"
#include "http.h"
#include "base/metrics.h"
#include "upstream/upstream.h"

struct gw_config;
struct coalescer;

/* A model or tenant name as the status view keeps it, with its NUL. */
#define COALESCE_NAME_MAX (CONFIG_NAME_MAX + 1)

/*
 * What the status view (status.h) shows of the flight a request leads:
 * the body's model ("" none) and the tenant's name, both borrowed and
 * copied (cut to COALESCE_NAME_MAX - 1 bytes) into the map's entry.
 */
struct coalesce_about {
    const char *model;
    const char *tenant;
};

/* One flight in the map, as coalescer_status() copies it. */
struct coalesce_flight_status {
    char key[13];                   /* coalesce_key_hex(): the log's */
    char model[COALESCE_NAME_MAX];
    char tenant[COALESCE_NAME_MAX];
    char upstream[COALESCE_NAME_MAX];   /* "" before the first attempt */
    int64_t start_ms;               /* gw_now_ms() when it was led */
    enum flight_phase phase;
    unsigned followers;             /* attached now */
    unsigned followers_peak;        /* the most attached at once */
    uint64_t bytes;                 /* body bytes from the upstream */
};

enum coalesce_role {
    COALESCE_LEADER,
    COALESCE_FOLLOWER,
    COALESCE_BYPASS,
    COALESCE_HIT,                   /* a cached flight, replayed */
};

/*
 * What one request may take from the cache (coalesce_cache_ask()):
 * 'use' the cache applies ([cache] ttl > 0, its tenant's cache on, no
 * "no-store"); 'fresh' ("no-cache") no entry, nor a running flight,
 * which began before it: it leads, or goes alone; 'max_age_ms'
 * ("max-age=N") no entry older than that; -1 any within the ttl.
 */
struct coalesce_cache_ask {
    int use;
    int fresh;
    int64_t max_age_ms;
};

/* What the cache holds now, for the status view and /metrics. */
struct coalesce_cache_status {
    uint64_t entries;
    uint64_t bytes;                 /* their memory, overhead included */
    uint64_t max_bytes;             /* [cache] max_bytes */
    int64_t ttl_ms;                 /* [cache] ttl; 0: off */
};

/* NULL on ENOMEM.  Takes its limits from 'cfg' (not kept). */
struct coalescer *coalescer_new(const struct gw_config *cfg);

/* A reloaded configuration's max_followers, max_flights and [cache],
 * from now on (the flights under way keep their followers); every
 * cached entry is dropped (coalesce_evict "reload"). */
void coalescer_set_limits(struct coalescer *co, const struct gw_config *cfg);

/* Frees the map and the cache; every flight must have finished.
 * NULL-safe. */
void coalescer_free(struct coalescer *co);

/*
 * May this request coalesce?  Returns 1, or 0 with OUT *why set.
 * Refused: coalescing off (globally or for the tenant), opt-out headers
 * (X-Infergw-Coalesce: off, Cache-Control: no-cache or no-store, in any
 * of their field lines; but where the cache applies to the tenant,
 * no-cache only keeps it from entries and running flights:
 * coalesce_cache_ask()), and sampling that is not reproducible:
 *  - a "seed" that is not an integer >= 0 (present: it decides alone);
 *  - without a seed, a "temperature" that is not the number 0;
 *  - without either, omitted_temperature > 0, or another control set to
 *    sample: top_p < 1, typical_p < 1, top_k > 0, min_p > 0, n > 1,
 *    best_of > 1 (or set to something that is not a number).
 * Borrows everything.
 */
int coalesce_eligible(const struct gw_config *cfg, size_t tenant,
                      const struct http_request *r, const json_t *body,
                      enum metrics_bypass *why);

/*
 * The cache's part in an eligible request of 'tenant' (its index in
 * 'cfg', or past num_tenants: the default one): OUT *ask from [cache],
 * the tenant's cache switch and the request's Cache-Control (every
 * field line; a max-age that does not parse is ignored).  Borrows all.
 */
void coalesce_cache_ask(const struct gw_config *cfg, size_t tenant,
                        const struct http_request *r,
                        struct coalesce_cache_ask *ask);

/*
 * The key: SHA-256 over the configuration's generation (generation.h), the
 * tenant name and every client-derived field
 * of 'ur' that reaches the upstream (upstream.h):
 * method, path (with its query), the body as sent, its content type (or its
 * absence: application/json) and the forwarded credential (client_auth,
 * or its absence), each length-prefixed so that
 * no two different field tuples hash the same bytes.  ur->request_id is
 * not hashed: a coalesced call carries its flight's id instead.  Only the
 * hash is kept, so a credential never sits in the map in clear.  The
 * upstream is not in it: which upstreams may answer follows from the
 * body's model, and the one that does is a constant of the
 * configuration as far as the contract goes (one balancing decision per
 * flight, dispatch.h).  The generation makes that true across a reload:
 * a request under a new configuration never joins a flight made under
 * an old one.  OUT key.
 */
void coalesce_key(const char *tenant, uint64_t generation,
                  const struct upstream_request *ur,
                  unsigned char key[FLIGHT_KEY_LEN]);

/* The first 6 key bytes in hex, for log lines ("a4f1c2..."). */
void coalesce_key_hex(const unsigned char key[FLIGHT_KEY_LEN],
                      char out[13]);

/*
 * Join the flight for 'key' or start it, attaching 'r' to it.  'about'
 * (borrowed) describes it for the status view, if 'r' leads; 'ask'
 * (borrowed) says what the request may take from the cache.  A cached
 * entry past the ttl is dropped ("expired"), one too old for 'ask' is
 * replaced by the new flight ("replaced").
 *  HIT:    OUT *f is a finished flight from the cache, 'r' attached at
 *          chunk 0, OUT *age_ms its age (since it finished); the caller
 *          holds one reference.  Only with ask->use.
 *  LEADER: OUT *f is a new flight in the map with 'r' attached; the
 *          caller holds two references (one as the driver of the
 *          upstream call, one as a reader).
 *  FOLLOWER: OUT *f is the running flight, 'r' attached at chunk 0; the
 *          caller holds one reference.
 *  BYPASS: a bound was reached (max_followers attached now, max_flights,
 *          the flight's bytes past max_flight_bytes) or memory ran out;
 *          OUT *why says which; *f is NULL.  The caller goes upstream
 *          alone, at once.
 */
enum coalesce_role coalescer_join(struct coalescer *co,
                                  const unsigned char key[FLIGHT_KEY_LEN],
                                  const struct coalesce_about *about,
                                  const struct coalesce_cache_ask *ask,
                                  struct flight_reader *r, struct flight **f,
                                  int64_t *age_ms, enum metrics_bypass *why);

/*
 * Leader: the upstream call ended with outcome 'o' (borrowed; outcome.h;
 * CALL_OK = complete), which the flight keeps.  Removes the entry
 * for 'key' if it is still this flight's (a stale flight never removes
 * its successor) and sets the final state, in one step under the map
 * lock.  Drops the map's reference, not the caller's.  The caller then
 * wakes the parked readers (flight_wake_all()).  With 'keep' (the
 * caller's verdict: a 200 that ended cleanly, cacheable for its leader's
 * request and by its upstream) and the cache on, a replayable flight of
 * at most max_entry_bytes stays in the map as a cached entry instead,
 * the least recently used going past max_bytes.  Returns 1 when kept.
 */
int coalescer_finish(struct coalescer *co,
                     const unsigned char key[FLIGHT_KEY_LEN],
                     struct flight *f, const struct call_outcome *o,
                     int keep);

/*
 * The cache now, its expired entries dropped first (the status view
 * and /metrics call it, so an idle cache shows what it holds).  OUT *st.
 */
void coalescer_cache_status(struct coalescer *co,
                            struct coalesce_cache_status *st);

/*
 * A reader leaves (its client is done or gone): detaches 'r' and drops
 * its reference (a cached entry stays).  When the last reader leaves a
 * running flight, the
 * entry goes, so the next identical request starts afresh while the
 * leader aborts the now useless upstream call.  Returns the readers
 * still attached: with 0 none can join any more.
 */
unsigned coalescer_detach(struct coalescer *co,
                          const unsigned char key[FLIGHT_KEY_LEN],
                          struct flight *f, struct flight_reader *r);

/*
 * For the status view: copy up to 'max' of the flights in the map into
 * out[] (the first ones the map holds, in no order), and return how many
 * the map holds.  The map lock is held for the copy alone, and no
 * flight's lock is taken: a flight's phase, upstream and bytes are its
 * atomics (flight.h).
 */
size_t coalescer_status(struct coalescer *co,
                        struct coalesce_flight_status *out, size_t max);

/* The stop: hand every parked reader of every flight in the map back to
 * its thread (flight_wake_all()), so that it sees the stop. */
void coalescer_wake_all(struct coalescer *co);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* Flights in the map now. */
size_t coalescer_count(struct coalescer *co);

/*
 * Call fn(f) for every flight in the map, under the map lock (fn may take
 * the flight's lock, not the map's).
 */
void coalescer_each(struct coalescer *co, void (*fn)(struct flight *f));
#endif

#endif
