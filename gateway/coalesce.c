/*
 * coalesce.c - eligibility, key and the map of flights.
 */
#include "coalesce.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include <mbedtls/sha256.h>

#include "alloc.h"
#include "config.h"
#include "log.h"

struct coalescer {
    const struct gw_config *cfg;    /* borrowed, immutable */
    struct gw_mutex lock;           /* guards every field below */
    struct flight **bucket;         /* chains through flight->next */
    size_t nbuckets;                /* a power of two */
    size_t count;                   /* linked flights */
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
    co->cfg = cfg;
    gw_mutex_init(&co->lock);
    return co;
}

void
coalescer_free(struct coalescer *co)
{
    if (co == NULL)
        return;
    assert(co->count == 0);
    gw_mutex_destroy(&co->lock);
    gw_free(co->bucket);
    gw_free(co);
}

/* ---- tenant and policy ---- */

/* Constant-time equality, so a key's prefix cannot be probed by timing. */
static int
secret_eq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned char d = alen != blen;

    for (size_t i = 0; i < alen; i++)
        d |= (unsigned char)(a[i] ^ b[i < blen ? i : 0]);
    return d == 0 && blen > 0;
}

size_t
coalesce_tenant(const struct gw_config *cfg, const struct http_request *r)
{
    const struct http_header *h = http_find_header(r, "Authorization");
    const char *key;
    size_t len;

    if (h == NULL || h->value_len < 7 || !gw_strieq(h->value, 7, "Bearer "))
        return CONFIG_MAX_TENANTS;
    key = h->value + 7;
    len = h->value_len - 7;
    for (size_t t = 0; t < cfg->num_tenants; t++)
        for (size_t k = 0; k < cfg->tenants[t].num_keys; k++)
            if (secret_eq(key, len, cfg->tenants[t].api_keys[k]))
                return t;
    return CONFIG_MAX_TENANTS;
}

const char *
coalesce_tenant_name(const struct gw_config *cfg, size_t tenant)
{
    return tenant < cfg->num_tenants ? cfg->tenants[tenant].name
                                     : "default";
}

/* Every field line of both names counts, as one list (RFC 9110 5.3). */
static int
opted_out(const struct http_request *r)
{
    return http_lists_token(r, "X-Infergw-Coalesce", "off")
           || http_lists_token(r, "Cache-Control", "no-cache")
           || http_lists_token(r, "Cache-Control", "no-store");
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
        *why = BYPASS_DISABLED;
        return 0;
    }
    if (tenant < cfg->num_tenants && !cfg->tenants[tenant].coalesce) {
        *why = BYPASS_TENANT;
        return 0;
    }
    if (opted_out(r)) {
        *why = BYPASS_OPT_OUT;
        return 0;
    }
    if (!reproducible(cfg, body)) {
        *why = BYPASS_SAMPLING;
        return 0;
    }
    return 1;
}

/* ---- key ---- */

static void
hash_field(mbedtls_sha256_context *h, const void *p, size_t n)
{
    unsigned char len[8];

    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    mbedtls_sha256_update_ret(h, len, sizeof(len));
    mbedtls_sha256_update_ret(h, p, n);
}

void
coalesce_key(const char *tenant, const char *upstream,
             const struct upstream_request *ur,
             unsigned char key[FLIGHT_KEY_LEN])
{
    mbedtls_sha256_context h;
    const char *auth = ur->client_auth;

    mbedtls_sha256_init(&h);
    mbedtls_sha256_starts_ret(&h, 0);
    hash_field(&h, "infergw-coalesce-v2", 19);
    hash_field(&h, tenant, strlen(tenant));
    hash_field(&h, upstream, strlen(upstream));
    hash_field(&h, ur->method, strlen(ur->method));
    hash_field(&h, ur->path, strlen(ur->path));
    hash_field(&h, ur->body, ur->body_len);
    /* "none" and an empty credential must differ: a presence byte. */
    hash_field(&h, auth != NULL ? "1" : "0", 1);
    hash_field(&h, auth != NULL ? auth : "", auth != NULL ? strlen(auth)
                                                          : 0);
    mbedtls_sha256_finish_ret(&h, key);
    mbedtls_sha256_free(&h);
}

void
coalesce_key_hex(const unsigned char key[FLIGHT_KEY_LEN], char out[13])
{
    for (int i = 0; i < 6; i++)
        snprintf(out + 2 * i, 3, "%02x", key[i]);
}

/* ---- the map ---- */

static size_t
bucket_of(const struct coalescer *co, const unsigned char *key)
{
    uint64_t h = 0;

    memcpy(&h, key, sizeof(h));     /* SHA-256 bytes are already uniform */
    return (size_t)(h & (co->nbuckets - 1));
}

static struct flight *
find_locked(struct coalescer *co, const unsigned char *key)
{
    struct flight *f;

    assert(gw_mutex_held(&co->lock));
    for (f = co->bucket[bucket_of(co, key)]; f != NULL; f = f->next)
        if (memcmp(f->key, key, FLIGHT_KEY_LEN) == 0)
            return f;
    return NULL;
}

/*
 * Remove 'f' from the map if it is there; the map's reference is then the
 * caller's to drop.  Returns 1 if it was unlinked.  Map lock held.
 */
static int
unlink_locked(struct coalescer *co, struct flight *f)
{
    struct flight **pp;

    assert(gw_mutex_held(&co->lock));
    if (!f->linked)
        return 0;
    for (pp = &co->bucket[bucket_of(co, f->key)]; *pp != NULL;
         pp = &(*pp)->next) {
        if (*pp == f) {         /* identity, not key: never a successor */
            *pp = f->next;
            f->next = NULL;
            f->linked = 0;
            /* The map's reference; others still hold theirs. */
            atomic_fetch_sub(&f->refs, 1);
            assert(atomic_load(&f->refs) > 0);
            co->count--;
            metrics_flights_add(-1);
            return 1;
        }
    }
    assert(!"linked flight missing from its bucket");
    return 0;
}

enum coalesce_role
coalescer_join(struct coalescer *co, const unsigned char key[FLIGHT_KEY_LEN],
               struct flight **out, enum metrics_bypass *why)
{
    enum coalesce_role role = COALESCE_BYPASS;
    struct flight *f;
    size_t b;

    *out = NULL;
    gw_mutex_lock(&co->lock);
    f = find_locked(co, key);
    if (f != NULL) {
        /* Membership is the map lock's: no flight lock to wait for. */
        if (!atomic_load(&f->joinable)) {
            *why = BYPASS_MAX_FLIGHT_BYTES;
        } else if (f->followers >= co->cfg->max_followers) {
            *why = BYPASS_MAX_FOLLOWERS;
        } else {
            flight_ref(f);
            atomic_fetch_add(&f->readers, 1);
            f->followers++;
            *out = f;
            role = COALESCE_FOLLOWER;
        }
        goto out;
    }
    if (co->count >= co->cfg->max_flights) {
        *why = BYPASS_MAX_FLIGHTS;
        goto out;
    }
    f = flight_new(key);
    if (f == NULL) {
        *why = BYPASS_NOMEM;
        goto out;
    }
    /* Not yet visible to anyone: the fields need no lock here. */
    atomic_store(&f->refs, 3);      /* map, driver, reader */
    atomic_store(&f->readers, 1);
    f->linked = 1;
    atomic_store(&f->joinable, 1);
    b = bucket_of(co, key);
    f->next = co->bucket[b];
    co->bucket[b] = f;
    co->count++;
    metrics_flights_add(1);
    *out = f;
    role = COALESCE_LEADER;

out:
    gw_mutex_unlock(&co->lock);
    return role;
}

void
coalescer_finish(struct coalescer *co, struct flight *f, int rc,
                 const char *reason)
{
    gw_mutex_lock(&co->lock);
    gw_mutex_lock(&f->lock);
    unlink_locked(co, f);
    flight_finish_locked(f, rc, reason);
    assert(atomic_load(&f->refs) > 0);  /* the caller still holds its own */
    gw_mutex_unlock(&f->lock);
    gw_mutex_unlock(&co->lock);
    /* Outside the map lock: waking thousands of readers takes a while. */
    flight_wake_all(f);
}

void
coalescer_detach(struct coalescer *co, struct flight *f)
{
    gw_mutex_lock(&co->lock);
    assert(atomic_load(&f->readers) > 0);
    /* Still linked means still running: finishing unlinks. */
    if (atomic_fetch_sub(&f->readers, 1) == 1 && f->linked) {
        atomic_store(&f->joinable, 0);
        unlink_locked(co, f);
    }
    gw_mutex_unlock(&co->lock);
    flight_unref(f);
}

unsigned
coalescer_readers(struct flight *f)
{
    return atomic_load(&f->readers);
}

size_t
coalescer_count(struct coalescer *co)
{
    size_t n;

    gw_mutex_lock(&co->lock);
    n = co->count;
    gw_mutex_unlock(&co->lock);
    return n;
}
