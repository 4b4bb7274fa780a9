/* SPDX-License-Identifier: MIT */
/*
 * coalesce.c - eligibility, key and the map of flights.
 */
#include "coalesce/coalesce.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <mbedtls/sha256.h>
#include <openssl/evp.h>

#include "alloc.h"
#include "base/config.h"
#include "log.h"
#include "util.h"

/*
 * The coalescer's record of a joinable flight.  It exists while the
 * flight is in the map and is freed when it leaves: finishing, or its
 * last reader gone.
 */
struct entry {
    unsigned char key[FLIGHT_KEY_LEN];
    struct entry *next;             /* bucket chain */
    struct flight *f;               /* the map's reference */
    /* A cached entry (the flight finished and was kept): when, until
     * when, what it takes, and its places on the lists by age and by
     * use; none of it is set while the flight runs. */
    int cached;
    uint64_t epoch;                 /* the coalescer's when it was led */
    int64_t stored_ms, expires_ms;
    uint64_t bytes;
    struct entry *age_prev, *age_next;  /* oldest first */
    struct entry *use_prev, *use_next;  /* least recently used first */
    const struct flight_reader *lead;   /* the leader's client's reader */
    unsigned followers;             /* attached now: max_followers */
    unsigned followers_peak;        /* the most at once (status view) */
    int64_t start_ms;               /* when it was led (status view) */
    char model[COALESCE_NAME_MAX];  /* coalesce_about's (status view) */
    char tenant[COALESCE_NAME_MAX];
};

/* A list of cached entries through one pair of links. */
struct list {
    struct entry *head, *tail;
};

struct coalescer {
    struct gw_mutex lock;           /* guards every field below and every
                                       entry */
    uint64_t max_followers;         /* [coalesce]'s, of the config in */
    uint64_t max_flights;           /* force (coalescer_set_limits) */
    int64_t ttl_ms;                 /* [cache]'s, the same way */
    uint64_t max_bytes, max_entry_bytes;
    struct entry **bucket;
    size_t nbuckets;                /* a power of two */
    size_t count;                   /* running flights' entries */
    uint64_t cached, cached_bytes;  /* cached entries, their memory */
    uint64_t epoch;                 /* reloads so far: a flight led
                                       before the last one is not kept */
    struct list by_age, by_use;
};

struct coalescer *
coalescer_new(const struct gw_config *cfg)
{
    struct coalescer *co = gw_calloc(1, sizeof(*co));
    size_t n = 64;

    if (co == NULL)
        return NULL;
    while (n < cfg->max_flights * 2 && n < ((size_t)1 << 24))
        n *= 2;
    co->bucket = gw_calloc(n, sizeof(*co->bucket));
    if (co->bucket == NULL) {
        gw_free(co);
        return NULL;
    }
    co->nbuckets = n;
    gw_mutex_init(&co->lock);
    coalescer_set_limits(co, cfg);
    return co;
}

static void drop_cached_locked(struct coalescer *co, struct entry *e,
                               enum metrics_cache_evict why);

void
coalescer_set_limits(struct coalescer *co, const struct gw_config *cfg)
{
    gw_mutex_lock(&co->lock);
    co->max_followers = cfg->max_followers;
    co->max_flights = cfg->max_flights;
    co->ttl_ms = cfg->cache_ttl_ms;
    co->max_bytes = cfg->cache_max_bytes;
    co->max_entry_bytes = cfg->cache_max_entry_bytes;
    co->epoch++;
    while (co->by_age.head != NULL)
        drop_cached_locked(co, co->by_age.head, METRICS_EVICT_RELOAD);
    gw_mutex_unlock(&co->lock);
}

void
coalescer_free(struct coalescer *co)
{
    if (co == NULL)
        return;
    gw_mutex_lock(&co->lock);
    while (co->by_age.head != NULL)
        drop_cached_locked(co, co->by_age.head, METRICS_EVICT_RELOAD);
    gw_mutex_unlock(&co->lock);
    assert(co->count == 0);
    gw_mutex_destroy(&co->lock);
    gw_free(co->bucket);
    gw_free(co);
}

/* ---- policy ---- */

/* Does the response cache apply to the tenant's requests? */
static int
cache_on(const struct gw_config *cfg, size_t tenant)
{
    return cfg->cache_ttl_ms > 0
           && (tenant >= cfg->num_tenants || cfg->tenants[tenant].cache);
}

/*
 * Every field line of both names counts, as one list (RFC 9110 5.3).
 * Where the cache applies, no-cache asks only for an answer made for
 * this request (coalesce_cache_ask()), which it may lead.
 */
static int
opted_out(const struct http_request *r, int cache)
{
    return http_lists_token(r, "X-Infergw-Coalesce", "off")
           || (!cache && http_lists_token(r, "Cache-Control", "no-cache"))
           || http_lists_token(r, "Cache-Control", "no-store");
}

void
coalesce_cache_ask(const struct gw_config *cfg, size_t tenant,
                   const struct http_request *r,
                   struct coalesce_cache_ask *ask)
{
    int64_t s;

    ask->use = 0;
    ask->fresh = 0;
    ask->max_age_ms = -1;
    /* Without the cache nothing here matters: no header is read. */
    if (!cache_on(cfg, tenant)
        || http_lists_token(r, "Cache-Control", "no-store"))
        return;
    ask->use = 1;
    ask->fresh = http_lists_token(r, "Cache-Control", "no-cache");
    if (http_lists_seconds(r, "Cache-Control", "max-age", &s))
        ask->max_age_ms = s * 1000;
}

/*
 * Sampling controls other than temperature, with the value that leaves
 * greedy decoding alone: vLLM's defaults (protocol.py
 * _DEFAULT_SAMPLING_PARAMS: top_p 1, top_k 0 or -1, min_p 0), the OpenAI
 * API's n, best_of (several candidates: sampling), and typical_p, which
 * OpenAI-compatible servers such as llama.cpp's and TGI's accept.  A value
 * past 'neutral' in the direction of 'above' asks for sampling.
 */
static const struct {
    const char *name;
    double neutral;
    int above;                  /* 1: sampling when > neutral; 0: < */
} sampling_knobs[] = {
    { "top_p", 1, 0 },
    { "typical_p", 1, 0 },
    { "top_k", 0, 1 },
    { "min_p", 0, 1 },
    { "n", 1, 1 },
    { "best_of", 1, 1 },
};

/*
 * Does a body without temperature and without a seed ask for sampling
 * through another control?  A control that is present but not a number
 * (a string, a boolean, null) counts as asking: it can never make a
 * request eligible.
 */
static int
other_knobs_sample(const json_t *body)
{
    for (size_t i = 0; i < GW_ARRAY_LEN(sampling_knobs); i++) {
        const json_t *v = json_object_get(body, sampling_knobs[i].name);
        double x;

        if (v == NULL)
            continue;
        if (!json_is_number(v))
            return 1;
        x = json_number_value(v);
        if (sampling_knobs[i].above ? x > sampling_knobs[i].neutral
                                    : x < sampling_knobs[i].neutral)
            return 1;
    }
    return 0;
}

/*
 * The tutorial's rule: equal requests may share one answer only if the
 * answer is reproducible.  Greedy decoding (temperature 0) is; a fixed
 * non-negative integer seed makes any sampling so.  Numbers compare as
 * numbers (jansson parses 1e-400 and -0.0 to 0); anything that is not a
 * number where a number belongs bypasses, for the upstream to judge.
 */
static int
reproducible(const struct gw_config *cfg, const json_t *body)
{
    const json_t *t = json_object_get(body, "temperature");
    const json_t *seed = json_object_get(body, "seed");
    double temp;

    if (seed != NULL)
        /* llama.cpp's server takes a negative seed as "random". */
        return json_is_integer(seed) && json_integer_value(seed) >= 0;
    if (t != NULL) {
        if (!json_is_number(t))
            return 0;
        temp = json_number_value(t);
        return temp == 0.0;     /* greedy: the other controls are moot */
    }
    /* Omitted: the upstream's default, as configured. */
    return cfg->omitted_temperature == 0.0 && !other_knobs_sample(body);
}

int
coalesce_eligible(const struct gw_config *cfg, size_t tenant,
                  const struct http_request *r, const json_t *body,
                  enum metrics_bypass *why)
{
    if (!cfg->coalesce) {
        *why = METRICS_BYPASS_DISABLED;
        return 0;
    }
    if (tenant < cfg->num_tenants && !cfg->tenants[tenant].coalesce) {
        *why = METRICS_BYPASS_TENANT;
        return 0;
    }
    if (opted_out(r, cache_on(cfg, tenant))) {
        *why = METRICS_BYPASS_OPT_OUT;
        return 0;
    }
    if (!reproducible(cfg, body)) {
        *why = METRICS_BYPASS_SAMPLING;
        return 0;
    }
    return 1;
}

/* ---- key ---- */

/*
 * The key's digest is SHA-256 over the fields below, each with its length
 * (so that no two field lists make the same bytes).  OpenSSL computes it
 * (its SHA-256 uses the CPU's SHA instructions where there are some:
 * about a tenth of mbedTLS's portable code, which is a third of what a
 * cache hit costs otherwise); mbedTLS, the same digest, where OpenSSL
 * fails (out of memory), so that a key is never wrong or missing.
 */
typedef void key_update_fn(void *ctx, const void *p, size_t n);

static void
hash_field(key_update_fn *update, void *ctx, const void *p, size_t n)
{
    unsigned char len[8];

    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    update(ctx, len, sizeof(len));
    update(ctx, p, n);
}

/* Every field of the key, in order, to 'update'. */
static void
key_fields(key_update_fn *update, void *ctx, const char *tenant,
           uint64_t generation, const struct upstream_request *ur)
{
    const char *auth = ur->client_auth;
    unsigned char gen[8];

    for (int i = 0; i < 8; i++)
        gen[i] = (unsigned char)(generation >> (8 * i));
    hash_field(update, ctx, "infergw-coalesce-v5", 19);
    hash_field(update, ctx, gen, sizeof(gen));
    hash_field(update, ctx, tenant, strlen(tenant));
    hash_field(update, ctx, ur->method, strlen(ur->method));
    hash_field(update, ctx, ur->path, strlen(ur->path));
    hash_field(update, ctx, ur->body, ur->body_len);
    /* Never set on a coalescable route today; hashed all the same. */
    hash_field(update, ctx, ur->content_type != NULL ? "1" : "0", 1);
    hash_field(update, ctx,
               ur->content_type != NULL ? ur->content_type : "",
               ur->content_type != NULL ? strlen(ur->content_type) : 0);
    /* "none" and an empty credential must differ: a presence byte. */
    hash_field(update, ctx, auth != NULL ? "1" : "0", 1);
    hash_field(update, ctx, auth != NULL ? auth : "",
               auth != NULL ? strlen(auth) : 0);
}

/* OpenSSL's SHA-256, fetched once (NULL: not there; mbedTLS's then). */
static EVP_MD *evp_sha256;
static pthread_once_t evp_sha256_once = PTHREAD_ONCE_INIT;

static void
evp_sha256_fetch(void)
{
    evp_sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
}

struct evp_key {
    EVP_MD_CTX *ctx;
    int ok;
};

static void
evp_update(void *arg, const void *p, size_t n)
{
    struct evp_key *k = arg;

    if (k->ok && EVP_DigestUpdate(k->ctx, p, n) != 1)
        k->ok = 0;
}

static void
mbedtls_update(void *arg, const void *p, size_t n)
{
    mbedtls_sha256_update_ret(arg, p, n);
}

void
coalesce_key(const char *tenant, uint64_t generation,
             const struct upstream_request *ur,
             unsigned char key[FLIGHT_KEY_LEN])
{
    struct evp_key k = { NULL, 0 };
    mbedtls_sha256_context h;
    unsigned int len = 0;

    pthread_once(&evp_sha256_once, evp_sha256_fetch);
    if (evp_sha256 != NULL && (k.ctx = EVP_MD_CTX_new()) != NULL)
        k.ok = EVP_DigestInit_ex2(k.ctx, evp_sha256, NULL) == 1;
    if (k.ok) {
        key_fields(evp_update, &k, tenant, generation, ur);
        k.ok = k.ok && EVP_DigestFinal_ex(k.ctx, key, &len) == 1
               && len == FLIGHT_KEY_LEN;
    }
    EVP_MD_CTX_free(k.ctx);             /* NULL-safe */
    if (k.ok)
        return;
    mbedtls_sha256_init(&h);
    mbedtls_sha256_starts_ret(&h, 0);
    key_fields(mbedtls_update, &h, tenant, generation, ur);
    mbedtls_sha256_finish_ret(&h, key);
    mbedtls_sha256_free(&h);
}

void
coalesce_key_hex(const unsigned char key[FLIGHT_KEY_LEN], char out[13])
{
    gw_hex(key, 6, out);
}

/* ---- the map ---- */

static size_t
bucket_of(const struct coalescer *co, const unsigned char *key)
{
    uint64_t h = 0;

    memcpy(&h, key, sizeof(h));     /* SHA-256 bytes are already uniform */
    return (size_t)(h & (co->nbuckets - 1));
}

/* The slot that points at the entry for 'key', or at the chain's end. */
static struct entry **
find_locked(struct coalescer *co, const unsigned char *key)
{
    struct entry **pp;

    assert(gw_mutex_held(&co->lock));
    for (pp = &co->bucket[bucket_of(co, key)]; *pp != NULL;
         pp = &(*pp)->next)
        if (memcmp((*pp)->key, key, FLIGHT_KEY_LEN) == 0)
            break;
    return pp;
}

/* Remove the entry at *pp and drop the map's reference to its flight. */
static void
remove_locked(struct coalescer *co, struct entry **pp)
{
    struct entry *e = *pp;

    assert(gw_mutex_held(&co->lock));
    *pp = e->next;
    co->count--;
    metrics_flights_add(-1);
    /* Others hold theirs: this is never the last reference. */
    assert(atomic_load(&e->f->refs) > 1);
    flight_unref(e->f);
    gw_free(e);
}

/* ---- the cache: cached entries on two lists ---- */

/* Put a new cached entry at the young end of both lists. */
static void
lists_add_locked(struct coalescer *co, struct entry *e)
{
    e->age_prev = co->by_age.tail;
    e->age_next = NULL;
    if (co->by_age.tail != NULL)
        co->by_age.tail->age_next = e;
    else
        co->by_age.head = e;
    co->by_age.tail = e;
    e->use_prev = co->by_use.tail;
    e->use_next = NULL;
    if (co->by_use.tail != NULL)
        co->by_use.tail->use_next = e;
    else
        co->by_use.head = e;
    co->by_use.tail = e;
}

/* Take e off both lists. */
static void
lists_remove_locked(struct coalescer *co, struct entry *e)
{
    if (e->age_prev != NULL)
        e->age_prev->age_next = e->age_next;
    else
        co->by_age.head = e->age_next;
    if (e->age_next != NULL)
        e->age_next->age_prev = e->age_prev;
    else
        co->by_age.tail = e->age_prev;
    if (e->use_prev != NULL)
        e->use_prev->use_next = e->use_next;
    else
        co->by_use.head = e->use_next;
    if (e->use_next != NULL)
        e->use_next->use_prev = e->use_prev;
    else
        co->by_use.tail = e->use_prev;
}

/* A hit: e becomes the most recently used. */
static void
touch_locked(struct coalescer *co, struct entry *e)
{
    if (co->by_use.tail == e)
        return;
    if (e->use_prev != NULL)
        e->use_prev->use_next = e->use_next;
    else
        co->by_use.head = e->use_next;
    e->use_next->use_prev = e->use_prev;    /* not the tail: has one */
    e->use_prev = co->by_use.tail;
    e->use_next = NULL;
    co->by_use.tail->use_next = e;
    co->by_use.tail = e;
}

static void
cache_size_locked(struct coalescer *co)
{
    metrics_cache_size(co->cached, co->cached_bytes);
}

/*
 * Drop the cached entry 'e' for 'why': off the lists and out of the map,
 * the map's reference dropped (a hit still reading it keeps its own).
 */
static void
drop_cached_locked(struct coalescer *co, struct entry *e,
                   enum metrics_cache_evict why)
{
    struct entry **pp;

    assert(gw_mutex_held(&co->lock) && e->cached);
    lists_remove_locked(co, e);
    for (pp = &co->bucket[bucket_of(co, e->key)]; *pp != e;
         pp = &(*pp)->next)
        ;
    *pp = e->next;
    co->cached--;
    co->cached_bytes -= e->bytes;
    metrics_cache_evicted(why, 1);
    cache_size_locked(co);
    flight_unref(e->f);
    gw_free(e);
}

/* Drop the entries past their ttl at 'now', oldest first. */
static void
expire_locked(struct coalescer *co, int64_t now)
{
    while (co->by_age.head != NULL && co->by_age.head->expires_ms <= now)
        drop_cached_locked(co, co->by_age.head, METRICS_EVICT_EXPIRED);
}

/*
 * Keep the finished flight of running entry 'e' as a cached entry of
 * 'bytes', making room past max_bytes from the least recently used.
 */
static void
keep_locked(struct coalescer *co, struct entry *e, uint64_t bytes,
            int64_t now)
{
    while (co->by_use.head != NULL
           && co->cached_bytes + bytes > co->max_bytes)
        drop_cached_locked(co, co->by_use.head, METRICS_EVICT_SIZE);
    e->cached = 1;
    e->stored_ms = now;
    e->expires_ms = now + co->ttl_ms;
    e->bytes = bytes;
    e->lead = NULL;
    lists_add_locked(co, e);
    co->cached++;
    co->cached_bytes += bytes;
    cache_size_locked(co);
}

/*
 * Is the cached entry 'e' an answer for 'ask' at 'now' (within the ttl,
 * expire_locked() saw to that, and the request's max-age)?
 */
static int
fits_locked(const struct entry *e, const struct coalesce_cache_ask *ask,
            int64_t now)
{
    return ask->use && !ask->fresh
           && (ask->max_age_ms < 0 || now - e->stored_ms <= ask->max_age_ms);
}

/* Join the flight of entry 'e' as a follower.  Map lock held. */
static enum coalesce_role
follow_locked(struct coalescer *co, struct entry *e, struct flight_reader *r,
              struct flight **out, enum metrics_bypass *why)
{
    if (e->followers >= co->max_followers) {
        *why = METRICS_BYPASS_MAX_FOLLOWERS;
        return COALESCE_BYPASS;
    }
    if (flight_attach(e->f, r) != 0) {
        *why = METRICS_BYPASS_MAX_FLIGHT_BYTES;     /* too big to replay */
        return COALESCE_BYPASS;
    }
    flight_ref(e->f);
    e->followers++;
    if (e->followers > e->followers_peak)
        e->followers_peak = e->followers;
    *out = e->f;
    return COALESCE_FOLLOWER;
}

/* Start a flight for 'key' led by 'r', at the slot *pp.  Map lock held. */
static enum coalesce_role
lead_locked(struct coalescer *co, struct entry **pp, const unsigned char *key,
            const struct coalesce_about *about, struct flight_reader *r,
            struct flight **out, enum metrics_bypass *why)
{
    struct entry *e;
    struct flight *f;

    if (co->count >= co->max_flights) {
        *why = METRICS_BYPASS_MAX_FLIGHTS;
        return COALESCE_BYPASS;
    }
    e = gw_malloc(sizeof(*e));
    f = flight_new();
    if (e == NULL || f == NULL || flight_attach(f, r) != 0) {
        gw_free(e);
        flight_unref(f);
        *why = METRICS_BYPASS_NOMEM;
        return COALESCE_BYPASS;
    }
    flight_ref(f);                  /* the driver's */
    flight_ref(f);                  /* the reader's; flight_new's: map */
    memcpy(e->key, key, FLIGHT_KEY_LEN);
    e->f = f;
    e->lead = r;
    e->followers = 0;
    e->followers_peak = 0;
    e->cached = 0;
    e->epoch = co->epoch;
    e->start_ms = gw_now_ms();
    snprintf(e->model, sizeof(e->model), "%s", about->model);
    snprintf(e->tenant, sizeof(e->tenant), "%s", about->tenant);
    e->next = NULL;
    *pp = e;                        /* the end of its chain */
    co->count++;
    metrics_flights_add(1);
    *out = f;
    return COALESCE_LEADER;
}

enum coalesce_role
coalescer_join(struct coalescer *co, const unsigned char key[FLIGHT_KEY_LEN],
               const struct coalesce_about *about,
               const struct coalesce_cache_ask *ask, struct flight_reader *r,
               struct flight **out, int64_t *age_ms,
               enum metrics_bypass *why)
{
    int64_t now = gw_now_ms();
    enum coalesce_role role;
    struct entry **pp, *e;

    *out = NULL;
    *age_ms = 0;
    gw_mutex_lock(&co->lock);
    expire_locked(co, now);
    pp = find_locked(co, key);
    e = *pp;
    if (e != NULL && e->cached) {
        if (fits_locked(e, ask, now) && flight_attach(e->f, r) == 0) {
            flight_ref(e->f);
            touch_locked(co, e);
            *age_ms = now - e->stored_ms;
            *out = e->f;
            gw_mutex_unlock(&co->lock);
            return COALESCE_HIT;
        }
        /* Too old for this request (no-cache, max-age): its answer, made
         * now, takes the entry's place. */
        drop_cached_locked(co, e, METRICS_EVICT_REPLACED);
        pp = find_locked(co, key);
        e = NULL;
    }
    if (e == NULL) {
        role = lead_locked(co, pp, key, about, r, out, why);
    } else if (ask->use && ask->fresh) {
        *why = METRICS_BYPASS_OPT_OUT;  /* began before it: not fresh */
        role = COALESCE_BYPASS;
    } else {
        role = follow_locked(co, e, r, out, why);
    }
    gw_mutex_unlock(&co->lock);
    return role;
}

int
coalescer_finish(struct coalescer *co, const unsigned char key[FLIGHT_KEY_LEN],
                 struct flight *f, const struct call_outcome *o, int keep)
{
    int64_t now = gw_now_ms();
    struct entry **pp;
    uint64_t bytes;
    int kept = 0;

    gw_mutex_lock(&co->lock);
    flight_finish(f, o);
    pp = find_locked(co, key);
    if (*pp != NULL && (*pp)->f == f) {  /* identity: never a successor */
        if (keep && co->ttl_ms > 0 && (*pp)->epoch == co->epoch
            && flight_replayable(f, &bytes)
            && bytes <= co->max_entry_bytes) {
            co->count--;
            metrics_flights_add(-1);
            keep_locked(co, *pp, bytes, now);
            kept = 1;
        } else {
            remove_locked(co, pp);
        }
    }
    gw_mutex_unlock(&co->lock);
    return kept;
}

void
coalescer_cache_status(struct coalescer *co, struct coalesce_cache_status *st)
{
    gw_mutex_lock(&co->lock);
    expire_locked(co, gw_now_ms());
    st->entries = co->cached;
    st->bytes = co->cached_bytes;
    st->max_bytes = co->max_bytes;
    st->ttl_ms = co->ttl_ms;
    gw_mutex_unlock(&co->lock);
}

unsigned
coalescer_detach(struct coalescer *co, const unsigned char key[FLIGHT_KEY_LEN],
                 struct flight *f, struct flight_reader *r)
{
    struct entry **pp;
    unsigned left;

    gw_mutex_lock(&co->lock);
    left = flight_detach(f, r);
    pp = find_locked(co, key);
    if (*pp != NULL && (*pp)->f == f && !(*pp)->cached) {
        if (r != (*pp)->lead) {
            assert((*pp)->followers > 0);
            (*pp)->followers--;
        }
        /* Still in the map and not cached means still running:
         * finishing removes it or keeps it. */
        if (left == 0)
            remove_locked(co, pp);
    }
    gw_mutex_unlock(&co->lock);
    flight_unref(f);
    return left;
}

#ifdef INFERGW_UNIT_TEST
size_t
coalescer_count(struct coalescer *co)
{
    size_t n;

    gw_mutex_lock(&co->lock);
    n = co->count;
    gw_mutex_unlock(&co->lock);
    return n;
}
#endif

/* Copy what the status view shows of entry 'e'.  Map lock held. */
static void
status_of_locked(struct coalescer *co, const struct entry *e,
                 struct coalesce_flight_status *st)
{
    const char *up;

    assert(gw_mutex_held(&co->lock));
    coalesce_key_hex(e->key, st->key);
    memcpy(st->model, e->model, sizeof(st->model));
    memcpy(st->tenant, e->tenant, sizeof(st->tenant));
    /* The name lives while its leader holds its generation, which it
     * does while the flight is in the map (flight.h). */
    up = atomic_load_explicit(&e->f->upstream, memory_order_relaxed);
    snprintf(st->upstream, sizeof(st->upstream), "%s", up != NULL ? up : "");
    st->start_ms = e->start_ms;
    st->phase = (enum flight_phase)atomic_load_explicit(
        &e->f->phase, memory_order_relaxed);
    st->followers = e->followers;
    st->followers_peak = e->followers_peak;
    st->bytes = atomic_load_explicit(&e->f->body_bytes,
                                     memory_order_relaxed);
}

size_t
coalescer_status(struct coalescer *co, struct coalesce_flight_status *out,
                 size_t max)
{
    size_t n = 0, total;

    gw_mutex_lock(&co->lock);
    total = co->count;
    for (size_t b = 0; b < co->nbuckets && n < max; b++)
        for (struct entry *e = co->bucket[b]; e != NULL && n < max;
             e = e->next)
            if (!e->cached)     /* its upstream name may be gone */
                status_of_locked(co, e, &out[n++]);
    gw_mutex_unlock(&co->lock);
    return total;
}

/*
 * Call fn(f) for every flight in the map, under the map lock (fn may take
 * the flight's lock, not the map's).
 */
GW_TESTABLE void
coalescer_each(struct coalescer *co, void (*fn)(struct flight *f))
{
    gw_mutex_lock(&co->lock);
    for (size_t b = 0; b < co->nbuckets; b++)
        for (struct entry *e = co->bucket[b]; e != NULL; e = e->next)
            fn(e->f);
    gw_mutex_unlock(&co->lock);
}

void
coalescer_wake_all(struct coalescer *co)
{
    coalescer_each(co, flight_wake_all);
}
