/* SPDX-License-Identifier: MIT */
/*
 * check_coalesce.c - the coalescer: eligibility, key and the map of
 * flights, without any sockets.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <mbedtls/sha256.h>

#include "alloc.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "coalesce/flight.h"
#include "base/tenant.h"
#include "testutil.h"
#include "util.h"

/* How the calls behind the flights here end (outcome.h). */
static const struct call_outcome complete = { CALL_OK, 200, 0,
                                              CALL_FAULT_NONE };
static const struct call_outcome nobody = { CALL_CLIENT_GONE, 0, 0,
                                            CALL_FAULT_CLIENT };

static struct gw_config cfg;

/* Every flight here is model "m" of tenant "t" (the status view's). */
static enum coalesce_role
join(struct coalescer *co, const unsigned char *k, struct flight_reader *r,
     struct flight **f, enum metrics_bypass *why)
{
    static const struct coalesce_about about = { "m", "t" };
    static const struct coalesce_cache_ask no_cache = { 0, 0, -1 };
    int64_t age;

    return coalescer_join(co, k, &about, &no_cache, r, f, &age, why);
}

static void
setup(void)
{
    ck_assert_int_eq(config_defaults(&cfg), 0);
}

static void
teardown(void)
{
    config_release(&cfg);
}

/* An upstream request as proxy.c builds it; 'auth' may be NULL. */
static struct upstream_request
ureq(const char *method, const char *path, const char *body,
     const char *auth)
{
    struct upstream_request ur;

    memset(&ur, 0, sizeof(ur));
    ur.method = method;
    ur.path = path;
    ur.body = body;
    ur.body_len = strlen(body);
    ur.request_id = "client-id";
    ur.client_auth = auth;
    return ur;
}

static void
key_of(const char *body, unsigned char key[FLIGHT_KEY_LEN])
{
    struct upstream_request ur = ureq("POST", "/v1/chat/completions", body,
                                      NULL);

    coalesce_key("default", 1, &ur, key);
}

/* ---- the map ---- */

START_TEST(test_leader_then_follower)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb;
    struct flight *a, *b;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(join(co, k, &ra, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(join(co, k, &rb, &b, &why),
                     COALESCE_FOLLOWER);
    ck_assert_ptr_eq(a, b);
    ck_assert_uint_eq(flight_readers(a), 2);
    ck_assert_uint_eq(coalescer_count(co), 1);

    coalescer_finish(co, k, a, &complete, 0);
    ck_assert_uint_eq(coalescer_count(co), 0);      /* checkpoint 4 */
    coalescer_detach(co, k, b, &rb);                /* follower */
    coalescer_detach(co, k, a, &ra);                /* leader's client */
    flight_unref(a);                                /* leader's driver */
    coalescer_free(co);
}
END_TEST

/*
 * The status view's copy of the map: what the leader said of the flight,
 * its followers now and at most, and how far its call is.
 */
START_TEST(test_status_copies_the_map)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN], k2[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb, rc, rd;
    struct flight *a, *b, *c, *d;
    struct coalesce_flight_status st[2];
    enum metrics_bypass why;
    char hex[13];

    key_of("{\"x\":1}", k);
    coalesce_key_hex(k, hex);
    ck_assert_int_eq(join(co, k, &ra, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(join(co, k, &rb, &b, &why), COALESCE_FOLLOWER);
    ck_assert_int_eq(join(co, k, &rc, &c, &why), COALESCE_FOLLOWER);
    coalescer_detach(co, k, c, &rc);
    ck_assert_uint_eq(coalescer_status(co, st, 2), 1);
    ck_assert_str_eq(st[0].key, hex);
    ck_assert_str_eq(st[0].model, "m");
    ck_assert_str_eq(st[0].tenant, "t");
    ck_assert_str_eq(st[0].upstream, "");
    ck_assert_int_eq(st[0].phase, FLIGHT_PHASE_QUEUED);
    ck_assert_uint_eq(st[0].followers, 1);
    ck_assert_uint_eq(st[0].followers_peak, 2);
    ck_assert_uint_eq(st[0].bytes, 0);
    ck_assert_int_le(st[0].start_ms, gw_now_ms());

    flight_set_upstream(a, "u1");
    coalescer_status(co, st, 2);
    ck_assert_int_eq(st[0].phase, FLIGHT_PHASE_WAITING);
    ck_assert_str_eq(st[0].upstream, "u1");
    flight_set_head(a, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    ck_assert_int_eq(flight_append(a, "hello", 5, 1 << 20, 1 << 20), 0);
    coalescer_status(co, st, 2);
    ck_assert_int_eq(st[0].phase, FLIGHT_PHASE_STREAMING);
    ck_assert_uint_eq(st[0].bytes, 5);

    /* A cap: the count says how many there are, the copy stops. */
    key_of("{\"x\":2}", k2);
    ck_assert_int_eq(join(co, k2, &rd, &d, &why), COALESCE_LEADER);
    ck_assert_uint_eq(coalescer_status(co, st, 1), 2);
    ck_assert_uint_eq(coalescer_status(co, NULL, 0), 2);

    coalescer_finish(co, k2, d, &complete, 0);
    coalescer_detach(co, k2, d, &rd);
    flight_unref(d);
    coalescer_finish(co, k, a, &complete, 0);
    ck_assert_uint_eq(coalescer_status(co, st, 2), 0);
    coalescer_detach(co, k, b, &rb);
    coalescer_detach(co, k, a, &ra);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

START_TEST(test_after_finish_is_fresh_call)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb;
    struct flight *a, *b;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(join(co, k, &ra, &a, &why), COALESCE_LEADER);
    coalescer_finish(co, k, a, &complete, 0);
    /* Not a cache: the same key now leads a new flight. */
    ck_assert_int_eq(join(co, k, &rb, &b, &why), COALESCE_LEADER);
    ck_assert_ptr_ne(a, b);
    ck_assert_str_ne(a->id, b->id);
    coalescer_finish(co, k, b, &complete, 0);
    coalescer_detach(co, k, a, &ra);
    flight_unref(a);
    coalescer_detach(co, k, b, &rb);
    flight_unref(b);
    coalescer_free(co);
}
END_TEST

START_TEST(test_stale_flight_keeps_successor)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb, rc;
    struct flight *a, *b, *c;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    ck_assert_int_eq(join(co, k, &ra, &a, &why), COALESCE_LEADER);
    /* A's only client leaves: A is unlinked while its leader still runs. */
    coalescer_detach(co, k, a, &ra);
    ck_assert_uint_eq(coalescer_count(co), 0);
    ck_assert_int_eq(join(co, k, &rb, &b, &why), COALESCE_LEADER);
    ck_assert_ptr_ne(a, b);
    /* A's leader finishes late: B must stay in the map. */
    coalescer_finish(co, k, a, &nobody, 0);
    flight_unref(a);
    ck_assert_uint_eq(coalescer_count(co), 1);
    ck_assert_int_eq(join(co, k, &rc, &c, &why),
                     COALESCE_FOLLOWER);
    ck_assert_ptr_eq(c, b);
    coalescer_finish(co, k, b, &complete, 0);
    coalescer_detach(co, k, c, &rc);
    coalescer_detach(co, k, b, &rb);
    flight_unref(b);
    coalescer_free(co);
}
END_TEST

START_TEST(test_bounds_bypass)
{
    struct coalescer *co;
    unsigned char k1[FLIGHT_KEY_LEN], k2[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb, rx;
    struct flight *a, *b, *x;
    enum metrics_bypass why;

    cfg.max_followers = 1;
    cfg.max_flights = 1;
    cfg.max_flight_bytes = 10;
    co = coalescer_new(&cfg);
    key_of("{\"x\":1}", k1);
    key_of("{\"x\":2}", k2);
    ck_assert_int_eq(join(co, k1, &ra, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(join(co, k2, &rx, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, METRICS_BYPASS_MAX_FLIGHTS);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(join(co, k1, &rb, &b, &why),
                     COALESCE_FOLLOWER);
    ck_assert_int_eq(join(co, k1, &rx, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, METRICS_BYPASS_MAX_FOLLOWERS);
    /* max_followers counts the followers attached now: one leaves, the
     * next one joins. */
    coalescer_detach(co, k1, b, &rb);
    ck_assert_int_eq(join(co, k1, &rb, &b, &why),
                     COALESCE_FOLLOWER);
    ck_assert_int_eq(join(co, k1, &rx, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, METRICS_BYPASS_MAX_FOLLOWERS);
    /* The leader's client leaving frees no follower slot. */
    coalescer_detach(co, k1, a, &ra);
    ck_assert_int_eq(join(co, k1, &rx, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, METRICS_BYPASS_MAX_FOLLOWERS);
    coalescer_finish(co, k1, a, &complete, 0);
    coalescer_detach(co, k1, b, &rb);
    flight_unref(a);

    /* Past max_flight_bytes the flight stops taking joiners. */
    ck_assert_int_eq(join(co, k1, &ra, &a, &why), COALESCE_LEADER);
    flight_set_head(a, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    ck_assert_int_eq(flight_append(a, "0123456789ab", 12, 10, 1 << 30), 0);
    ck_assert_int_eq(join(co, k1, &rx, &x, &why), COALESCE_BYPASS);
    ck_assert_int_eq(why, METRICS_BYPASS_MAX_FLIGHT_BYTES);
    coalescer_finish(co, k1, a, &complete, 0);
    coalescer_detach(co, k1, a, &ra);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/*
 * Joining the map is two allocations (the entry, the flight); either
 * failing makes a clean bypass, with nothing left behind (ASan's leak
 * check runs at the end of each forked test), and the map still works.
 */
START_TEST(test_join_enomem_bypasses)
{
    struct coalescer *co = coalescer_new(&cfg);
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader ra, rb;
    struct flight *a, *b;
    enum metrics_bypass why;

    key_of("{\"x\":1}", k);
    for (long n = 1; n <= 2; n++) {
        alloc_fail_after(n, 0);
        ck_assert_int_eq(join(co, k, &ra, &a, &why),
                         COALESCE_BYPASS);
        ck_assert_int_eq(why, METRICS_BYPASS_NOMEM);
        ck_assert_ptr_null(a);
        ck_assert_int_eq(alloc_failures(), 1);
        alloc_fail_after(0, 0);
        ck_assert_uint_eq(coalescer_count(co), 0);
    }
    ck_assert_int_eq(join(co, k, &ra, &a, &why), COALESCE_LEADER);
    ck_assert_int_eq(join(co, k, &rb, &b, &why),
                     COALESCE_FOLLOWER);
    coalescer_finish(co, k, a, &complete, 0);
    coalescer_detach(co, k, b, &rb);
    coalescer_detach(co, k, a, &ra);
    flight_unref(a);
    coalescer_free(co);
}
END_TEST

/* ---- key and eligibility ---- */

/* Key of tenant 't' and the request fields. */
static void
key4(const char *t, const char *method, const char *path,
     const char *body, const char *auth, unsigned char key[FLIGHT_KEY_LEN])
{
    struct upstream_request ur = ureq(method, path, body, auth);

    coalesce_key(t, 1, &ur, key);
}

/* 'n' bytes at 'p' after their length, 8 bytes little-endian. */
static void
spec_field(mbedtls_sha256_context *h, const void *p, size_t n)
{
    unsigned char len[8];

    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    mbedtls_sha256_update_ret(h, len, sizeof(len));
    mbedtls_sha256_update_ret(h, p, n);
}

/*
 * The key is the digest coalesce.h describes, whichever library computes
 * it (OpenSSL, or mbedTLS when OpenSSL fails): computed here from the
 * description with mbedTLS, it is the same bytes.
 */
START_TEST(test_key_is_the_described_digest)
{
    unsigned char got[FLIGHT_KEY_LEN], want[FLIGHT_KEY_LEN];
    unsigned char gen[8] = { 7, 0, 0, 0, 0, 0, 0, 0 };
    struct upstream_request ur = ureq("POST", "/v1/completions",
                                      "{\"prompt\":\"x\"}", "Bearer k");
    mbedtls_sha256_context h;

    coalesce_key("acme", 7, &ur, got);
    mbedtls_sha256_init(&h);
    mbedtls_sha256_starts_ret(&h, 0);
    spec_field(&h, "infergw-coalesce-v5", 19);
    spec_field(&h, gen, 8);
    spec_field(&h, "acme", 4);
    spec_field(&h, "POST", 4);
    spec_field(&h, "/v1/completions", 15);
    spec_field(&h, "{\"prompt\":\"x\"}", 14);
    spec_field(&h, "0", 1);                 /* no Content-Type */
    spec_field(&h, "", 0);
    spec_field(&h, "1", 1);                 /* a credential */
    spec_field(&h, "Bearer k", 8);
    mbedtls_sha256_finish_ret(&h, want);
    mbedtls_sha256_free(&h);
    ck_assert_int_eq(memcmp(got, want, FLIGHT_KEY_LEN), 0);
}
END_TEST

START_TEST(test_key_separates_fields)
{
    unsigned char a[FLIGHT_KEY_LEN], b[FLIGHT_KEY_LEN];
    struct upstream_request ur;

    key4("t1", "POST", "/v1/completions", "{}", NULL, a);
    key4("t2", "POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* tenant */
    key4("t1", "POST", "/v1/chat/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* path */
    key4("t1", "POST", "/v1/completions?x=1", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* query */
    /* Not the upstream: one balancing decision per flight (dispatch.h). */
    key4("t1", "POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_eq(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key4("t1", "POST", "/v1/completions", "{ }", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* body bytes */
    key4("t1", "GET", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* method */
    /* A forwarded credential is part of the key; none differs from "". */
    key4("t1", "POST", "/v1/completions", "{}", "Bearer k1", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key4("t1", "POST", "/v1/completions", "{}", "", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key4("t1", "POST", "/v1/completions", "{}", "Bearer k1", a);
    key4("t1", "POST", "/v1/completions", "{}", "Bearer k2", b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    key4("t1", "POST", "/v1/completions", "{}", "Bearer k1", b);
    ck_assert_int_eq(memcmp(a, b, FLIGHT_KEY_LEN), 0);     /* stable */
    /* Length prefixes: moving a byte between fields changes the key. */
    key4("t1", "POST", "/v1/completions", "{}", NULL, a);
    key4("t", "1POST", "/v1/completions", "{}", NULL, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    /* A body's content type (NULL: application/json) is in the key. */
    ur = ureq("POST", "/v1/completions", "{}", NULL);
    ur.content_type = "multipart/form-data; boundary=a";
    coalesce_key("t1", 1, &ur, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    ur.content_type = "";
    coalesce_key("t1", 1, &ur, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    /* The client's request id is not hashed: the flight sends its own. */
    ur = ureq("POST", "/v1/completions", "{}", NULL);
    ur.request_id = "another-client";
    coalesce_key("t1", 1, &ur, b);
    ck_assert_int_eq(memcmp(a, b, FLIGHT_KEY_LEN), 0);
    /* A reloaded configuration starts its own flights (generation.h). */
    coalesce_key("t1", 2, &ur, b);
    ck_assert_int_ne(memcmp(a, b, FLIGHT_KEY_LEN), 0);
}
END_TEST

static const struct {
    const char *body;
    double omitted;
    int eligible;
    const char *note;
} sampling[] = {
    { "{}", 0, 1, "omitted temperature, default config: the seed's demo" },
    { "{}", 1.0, 0, "omitted temperature, strict config (vLLM's 1.0)" },
    { "{}", 0.5, 0, "omitted counts as 0.5" },
    { "{\"temperature\":0}", 1.0, 1, "greedy" },
    { "{\"temperature\":0.0}", 1.0, 1, "greedy, real zero" },
    { "{\"temperature\":-0.0}", 1.0, 1, "negative zero is zero" },
    { "{\"temperature\":1e-400}", 1.0, 1, "underflows to zero: zero" },
    { "{\"temperature\":0e7}", 1.0, 1, "zero with an exponent" },
    { "{\"temperature\":1e-300}", 0, 0, "tiny but not zero" },
    { "{\"temperature\":0.7}", 0, 0, "random sampling, no seed" },
    { "{\"temperature\":-1}", 0, 0, "negative temperature: upstream's call" },
    { "{\"temperature\":0,\"top_p\":0.5}", 0, 1, "greedy: top_p is moot" },
    { "{\"temperature\":0.7,\"seed\":42}", 0, 1, "seed makes it repeatable" },
    { "{\"temperature\":1.5,\"seed\":0}", 0, 1, "seed 0 is a seed" },
    { "{\"temperature\":1.5,\"seed\":-0}", 0, 1, "seed -0 is 0" },
    { "{\"seed\":7}", 1.0, 1, "seed with omitted temperature" },
    { "{\"seed\":7,\"top_p\":0.1}", 0, 1, "seed makes top_p repeatable" },
    { "{\"temperature\":0.7,\"seed\":-1}", 0, 0, "negative seed: random" },
    { "{\"temperature\":0,\"seed\":-1}", 0, 0, "negative seed, greedy" },
    { "{\"seed\":-42}", 0, 0, "negative seed, omitted temperature" },
    { "{\"temperature\":0.7,\"seed\":4.2}", 0, 0, "non-integer seed" },
    { "{\"temperature\":0.7,\"seed\":42.0}", 0, 0, "real seed" },
    { "{\"temperature\":0.7,\"seed\":\"42\"}", 0, 0, "string seed" },
    { "{\"seed\":null}", 0, 0, "null seed is no seed" },
    { "{\"seed\":true}", 0, 0, "boolean seed" },
    { "{\"temperature\":\"0\"}", 0, 0, "string temperature" },
    { "{\"temperature\":null}", 0, 0, "null temperature" },
    { "{\"temperature\":false}", 0, 0, "boolean temperature" },
    { "{\"temperature\":[0]}", 0, 0, "array temperature" },
    /* Omitted temperature: every other control must leave greedy alone. */
    { "{\"top_p\":1}", 0, 1, "top_p 1 is neutral" },
    { "{\"top_p\":1.0,\"top_k\":0,\"min_p\":0,\"n\":1}", 0, 1,
      "all neutral" },
    { "{\"top_k\":-1}", 0, 1, "top_k -1 is vLLM's off" },
    { "{\"min_p\":1e-400}", 0, 1, "min_p underflows to 0" },
    { "{\"top_p\":0.9}", 0, 0, "nucleus sampling" },
    { "{\"top_p\":0.9999}", 0, 0, "nucleus sampling, barely" },
    { "{\"typical_p\":0.5}", 0, 0, "typical sampling" },
    { "{\"top_k\":40}", 0, 0, "top-k sampling" },
    { "{\"top_k\":1}", 0, 0, "top_k 1: counted as sampling" },
    { "{\"min_p\":0.05}", 0, 0, "min-p sampling" },
    { "{\"n\":3}", 0, 0, "several choices" },
    { "{\"best_of\":2}", 0, 0, "best of several candidates" },
    { "{\"top_p\":\"0.9\"}", 0, 0, "string top_p" },
    { "{\"top_k\":null}", 0, 0, "null top_k" },
    { "{\"min_p\":true}", 0, 0, "boolean min_p" },
    { "{\"top_p\":0.9}", 1.0, 0, "strict config too" },
};

START_TEST(test_sampling_rule)
{
    struct http_request r;
    enum metrics_bypass why = METRICS_BYPASS_COUNT;
    json_t *j;

    memset(&r, 0, sizeof(r));
    cfg.omitted_temperature = sampling[_i].omitted;
    j = json_loads(sampling[_i].body, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_msg(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j, &why)
                  == sampling[_i].eligible, "%s: %s", sampling[_i].body,
                  sampling[_i].note);
    if (!sampling[_i].eligible)
        ck_assert_int_eq(why, METRICS_BYPASS_SAMPLING);
    json_decref(j);
}
END_TEST

static int
parse(const char *raw, struct http_request *r)
{
    return http_parse_request(raw, strlen(raw), 16384, r);
}

static const struct {
    const char *fields;         /* header field lines, CRLF-terminated */
    int opted_out;
    const char *note;
} opt_outs[] = {
    { "X-Infergw-Coalesce: off\r\n", 1, "the gateway's own switch" },
    { "Cache-Control: no-cache\r\n", 1, "no-cache" },
    { "Cache-Control: max-age=0, no-store\r\n", 1, "no-store in a list" },
    { "Cache-Control: max-age=0\r\nCache-Control: no-cache\r\n", 1,
      "RFC 9110 5.3: a second line continues the list" },
    { "Cache-Control: max-age=0\r\ncache-control: No-Store\r\n", 1,
      "names and directives are case-insensitive" },
    { "X-Infergw-Coalesce: on\r\nX-Infergw-Coalesce: OFF\r\n", 1,
      "off on a second line" },
    { "Cache-Control: no-cache=\"x\"\r\n", 1, "no-cache with an argument" },
    { "", 0, "no opt-out header" },
    { "Cache-Control: max-age=0\r\n", 0, "another directive" },
    { "Cache-Control: no-cachex, x-no-cache\r\n", 0, "substrings only" },
    { "X-Infergw-Coalesce: offline\r\n", 0, "not the token off" },
    { "X-Infergw-Coalesce: on\r\n", 0, "explicitly on" },
};

START_TEST(test_opt_out_headers)
{
    struct http_request r;
    enum metrics_bypass why = METRICS_BYPASS_COUNT;
    json_t *j = json_loads("{\"temperature\":0}", 0, NULL);
    char raw[512];

    snprintf(raw, sizeof(raw), "POST / HTTP/1.1\r\nHost: x\r\n%s\r\n",
             opt_outs[_i].fields);
    ck_assert_int_gt(parse(raw, &r), 0);
    ck_assert_msg(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j, &why)
                  == !opt_outs[_i].opted_out, "%s", opt_outs[_i].note);
    if (opt_outs[_i].opted_out)
        ck_assert_int_eq(why, METRICS_BYPASS_OPT_OUT);
    json_decref(j);
}
END_TEST

START_TEST(test_global_switch)
{
    struct http_request r;
    enum metrics_bypass why;
    json_t *j = json_loads("{\"temperature\":0}", 0, NULL);

    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
    ck_assert_int_eq(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j,
                                       &why), 1);
    cfg.coalesce = 0;
    ck_assert_int_eq(coalesce_eligible(&cfg, CONFIG_MAX_TENANTS, &r, j,
                                       &why), 0);
    ck_assert_int_eq(why, METRICS_BYPASS_DISABLED);
    json_decref(j);
}
END_TEST

START_TEST(test_tenants)
{
    struct gw_config c;
    struct http_request r;
    enum metrics_bypass why;
    char err[256];
    json_t *j = json_loads("{}", 0, NULL);
    static const char conf[] =
        "[tenant acme]\napi_key = sk-acme-0123456789\n"
        "[tenant globex]\napi_key = sk-globex-0123456789\n"
        "api_key = sk-g2-0123456789ab\ncoalesce = off\n";

    config_release(&cfg);
    ck_assert_int_eq(config_load_text("t.conf", conf, &c, err, sizeof(err)),
                     0);
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-acme-0123456789\r\n"
                           "\r\n", &r), 0);
    ck_assert_uint_eq(tenant_identify(&c, &r), 0);
    ck_assert_str_eq(tenant_name(&c, 0), "acme");
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-g2-0123456789ab\r\n"
                           "\r\n", &r), 0);
    ck_assert_uint_eq(tenant_identify(&c, &r), 1);
    ck_assert_int_eq(coalesce_eligible(&c, 1, &r, j, &why), 0);
    ck_assert_int_eq(why, METRICS_BYPASS_TENANT);
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n"
                           "Authorization: Bearer sk-acme-012345678\r\n"
                           "\r\n", &r), 0);
    ck_assert_uint_eq(tenant_identify(&c, &r), CONFIG_MAX_TENANTS);
    ck_assert_str_eq(tenant_name(&c, CONFIG_MAX_TENANTS),
                     "default");
    ck_assert_int_gt(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
    ck_assert_uint_eq(tenant_identify(&c, &r), CONFIG_MAX_TENANTS);
    json_decref(j);
    config_release(&c);
    config_defaults(&cfg);          /* for teardown */
}
END_TEST

/* ---- the response cache ---- */

static const struct coalesce_cache_ask use_cache = { 1, 0, -1 };

static enum coalesce_role
join_cache(struct coalescer *co, const unsigned char *k,
           const struct coalesce_cache_ask *ask, struct flight_reader *r,
           struct flight **f, int64_t *age)
{
    static const struct coalesce_about about = { "m", "t" };
    enum metrics_bypass why;

    return coalescer_join(co, k, &about, ask, r, f, age, &why);
}

/*
 * Lead the flight for 'body' to its end with an answer of 'n' bytes
 * and 'status', offered to the cache with 'keep'; its client leaves.
 * Returns coalescer_finish()'s verdict.
 */
static int
answer(struct coalescer *co, const char *body, size_t n, int status,
       int keep)
{
    static char bytes[512 * 1024];
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader r;
    struct flight *f;
    int64_t age;
    int kept;

    key_of(body, k);
    ck_assert_int_eq(join_cache(co, k, &use_cache, &r, &f, &age),
                     COALESCE_LEADER);
    flight_set_head(f, &(struct http_head){ status, -1, "text/event-stream",
                                           0, 0 });
    ck_assert_uint_le(n, sizeof(bytes));
    ck_assert_int_eq(flight_append(f, bytes, n, 1 << 30, 1 << 30), 0);
    kept = coalescer_finish(co, k, f, &complete, keep);
    coalescer_detach(co, k, f, &r);
    flight_unref(f);
    return kept;
}

/* Is 'body' a hit now for 'ask'?  (Its reader leaves at once.) */
static int
is_hit(struct coalescer *co, const char *body,
       const struct coalesce_cache_ask *ask)
{
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader r;
    struct flight *f;
    int64_t age;
    enum coalesce_role role;

    key_of(body, k);
    role = join_cache(co, k, ask, &r, &f, &age);
    if (role == COALESCE_LEADER)
        coalescer_finish(co, k, f, &nobody, 0);
    if (role != COALESCE_BYPASS) {
        coalescer_detach(co, k, f, &r);
        if (role == COALESCE_LEADER)
            flight_unref(f);
    }
    return role == COALESCE_HIT;
}

static void
cache_cfg(int64_t ttl_ms, uint64_t max_bytes, uint64_t max_entry)
{
    cfg.cache_ttl_ms = ttl_ms;
    cfg.cache_max_bytes = max_bytes;
    cfg.cache_max_entry_bytes = max_entry;
}

START_TEST(test_cache_keeps_a_finished_flight)
{
    struct coalescer *co;
    struct coalesce_cache_status st;

    cache_cfg(60000, 1 << 20, 1 << 18);
    co = coalescer_new(&cfg);
    coalescer_set_limits(co, &cfg);
    ck_assert_int_eq(answer(co, "{\"a\":1}", 1000, 200, 1), 1);
    ck_assert_uint_eq(coalescer_count(co), 0);  /* no flight runs */
    coalescer_cache_status(co, &st);
    ck_assert_uint_eq(st.entries, 1);
    ck_assert_uint_gt(st.bytes, 1000);
    ck_assert(is_hit(co, "{\"a\":1}", &use_cache));
    ck_assert(is_hit(co, "{\"a\":1}", &use_cache));
    /* Not offered (the caller's verdict), a failure, too big: not kept. */
    ck_assert_int_eq(answer(co, "{\"b\":1}", 1000, 200, 0), 0);
    ck_assert_int_eq(answer(co, "{\"c\":1}", (1 << 18) + 1, 200, 1), 0);
    ck_assert(!is_hit(co, "{\"b\":1}", &use_cache));
    ck_assert(!is_hit(co, "{\"c\":1}", &use_cache));
    /* A request the cache does not apply to never hits. */
    ck_assert(!is_hit(co, "{\"a\":1}",
                      &(struct coalesce_cache_ask){ 0, 0, -1 }));
    coalescer_free(co);
}
END_TEST

/* no-cache and max-age replace the entry; the next plain one hits. */
START_TEST(test_cache_fresh_and_max_age_replace)
{
    struct coalescer *co;
    struct coalesce_cache_status st;
    int64_t t0;

    cache_cfg(60000, 1 << 20, 1 << 18);
    co = coalescer_new(&cfg);
    coalescer_set_limits(co, &cfg);
    ck_assert_int_eq(answer(co, "{\"a\":1}", 100, 200, 1), 1);
    ck_assert(!is_hit(co, "{\"a\":1}",
                      &(struct coalesce_cache_ask){ 1, 1, -1 }));
    coalescer_cache_status(co, &st);
    ck_assert_uint_eq(st.entries, 0);       /* replaced, then not kept */
    ck_assert_int_eq(answer(co, "{\"a\":1}", 100, 200, 1), 1);
    t0 = gw_now_ms();
    while (gw_now_ms() < t0 + 2)
        ;                                   /* the entry is 2 ms old */
    ck_assert(is_hit(co, "{\"a\":1}",
                     &(struct coalesce_cache_ask){ 1, 0, 60000 }));
    ck_assert(!is_hit(co, "{\"a\":1}",
                      &(struct coalesce_cache_ask){ 1, 0, 1 }));
    coalescer_free(co);
}
END_TEST

/* Past max_bytes the least recently used go; past the ttl, all. */
START_TEST(test_cache_lru_and_ttl)
{
    struct coalescer *co;
    struct coalesce_cache_status st;
    int64_t t0;

    cache_cfg(60000, 64 * 1024, 32 * 1024);
    co = coalescer_new(&cfg);
    coalescer_set_limits(co, &cfg);
    ck_assert_int_eq(answer(co, "{\"a\":1}", 25000, 200, 1), 1);
    ck_assert_int_eq(answer(co, "{\"b\":1}", 25000, 200, 1), 1);
    ck_assert(is_hit(co, "{\"a\":1}", &use_cache));     /* a: recent */
    ck_assert_int_eq(answer(co, "{\"c\":1}", 25000, 200, 1), 1);
    coalescer_cache_status(co, &st);
    ck_assert_uint_le(st.bytes, 64 * 1024);
    ck_assert_uint_eq(st.entries, 2);
    ck_assert(!is_hit(co, "{\"b\":1}", &use_cache));    /* b went */
    ck_assert(is_hit(co, "{\"a\":1}", &use_cache));
    ck_assert(is_hit(co, "{\"c\":1}", &use_cache));
    /* A reload drops everything; then a 1 ms ttl expires on its own. */
    cache_cfg(1, 64 * 1024, 32 * 1024);
    coalescer_set_limits(co, &cfg);
    coalescer_cache_status(co, &st);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_int_eq(answer(co, "{\"a\":1}", 100, 200, 1), 1);
    t0 = gw_now_ms();
    while (gw_now_ms() < t0 + 2)
        ;
    coalescer_cache_status(co, &st);
    ck_assert_uint_eq(st.entries, 0);
    coalescer_free(co);
}
END_TEST

/* A flight led before a reload and ended after it is not kept: its
 * key holds the old generation, so nothing could ever hit it. */
START_TEST(test_cache_never_keeps_a_flight_led_before_a_reload)
{
    struct coalescer *co;
    struct coalesce_cache_status st;
    unsigned char k[FLIGHT_KEY_LEN];
    struct flight_reader r;
    struct flight *f;
    int64_t age;

    cache_cfg(60000, 1 << 20, 1 << 18);
    co = coalescer_new(&cfg);
    coalescer_set_limits(co, &cfg);
    key_of("{\"a\":1}", k);
    ck_assert_int_eq(join_cache(co, k, &use_cache, &r, &f, &age),
                     COALESCE_LEADER);
    flight_set_head(f, &(struct http_head){ 200, -1, "text/event-stream",
                                           0, 0 });
    ck_assert_int_eq(flight_append(f, "x", 1, 1 << 30, 1 << 30), 0);
    coalescer_set_limits(co, &cfg);             /* the reload */
    ck_assert_int_eq(coalescer_finish(co, k, f, &complete, 1), 0);
    coalescer_detach(co, k, f, &r);
    flight_unref(f);
    coalescer_cache_status(co, &st);
    ck_assert_uint_eq(st.entries, 0);
    /* The next one, led after it, is. */
    ck_assert_int_eq(answer(co, "{\"a\":1}", 1, 200, 1), 1);
    coalescer_free(co);
}
END_TEST

static Suite *
coalesce_suite(void)
{
    Suite *s = suite_create("coalesce");
    TCase *tc;

    tc = tcase_create("map");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_leader_then_follower);
    tcase_add_test(tc, test_status_copies_the_map);
    tcase_add_test(tc, test_after_finish_is_fresh_call);
    tcase_add_test(tc, test_stale_flight_keeps_successor);
    tcase_add_test(tc, test_bounds_bypass);
    tcase_add_test(tc, test_join_enomem_bypasses);
    tcase_add_test(tc, test_cache_keeps_a_finished_flight);
    tcase_add_test(tc, test_cache_fresh_and_max_age_replace);
    tcase_add_test(tc, test_cache_lru_and_ttl);
    tcase_add_test(tc, test_cache_never_keeps_a_flight_led_before_a_reload);
    suite_add_tcase(s, tc);

    tc = tcase_create("policy");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_key_separates_fields);
    tcase_add_test(tc, test_key_is_the_described_digest);
    tcase_add_loop_test(tc, test_sampling_rule, 0,
                        (int)(sizeof(sampling) / sizeof(sampling[0])));
    tcase_add_loop_test(tc, test_opt_out_headers, 0,
                        (int)(sizeof(opt_outs) / sizeof(opt_outs[0])));
    tcase_add_test(tc, test_global_switch);
    tcase_add_test(tc, test_tenants);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(coalesce_suite()));
}
