/* SPDX-License-Identifier: MIT */
/*
 * check_tenant.c - unit tests for gateway/base/tenant.c: who a request belongs
 * to (keys as digests), the limits and the bill.  The usage that is billed
 * is read by gateway/coalesce/usage.c (check_usage.c).
 */
#include <check.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/sha256.h>

#include "alloc.h"
#include "buf.h"
#include "base/config.h"
#include "http.h"
#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "util.h"
#include "testutil.h"

/* sha256("sk-hashed") */
#define HASHED_HEX \
    "3f0f5a0d4d1d6b2c7b1b8f1f54e0a5c6d0b9b3b3e8f0e0b6b0a7f1c2d3e4f5a6"

/* Keys long enough to load (CONFIG_MIN_KEY_LEN). */
#define KEY_ACME "sk-acme-0123456789"
#define KEY_B2 "sk-b2-0123456789ab"
#define KEY_1 "sk-k1-0123456789ab"
#define KEY_2 "sk-k2-0123456789ab"

static struct gw_config cfg;
static struct http_request req;
static char head[512];

/* Load 'text' into cfg; the test fails with the loader's message. */
static void
load(const char *text)
{
    char err[256];

    config_release(&cfg);
    if (config_load_text("t.conf", text, &cfg, err, sizeof(err)) != 0)
        ck_abort_msg("config: %s", err);
}

/* Parse a request head with 'auth' as its Authorization (NULL: none). */
static const struct http_request *
with_auth(const char *auth)
{
    int n = snprintf(head, sizeof(head), "POST / HTTP/1.1\r\nHost: x\r\n"
                     "%s%s%s\r\n", auth != NULL ? "Authorization: " : "",
                     auth != NULL ? auth : "", auth != NULL ? "\r\n" : "");

    memset(&req, 0, sizeof(req));
    ck_assert_int_gt(http_parse_request(head, (size_t)n, 16384, &req), 0);
    return &req;
}

static void
setup(void)
{
    config_defaults(&cfg);
}

static void
teardown(void)
{
    config_release(&cfg);
}

START_TEST(test_identify_plain_and_hashed_keys)
{
    char conf[512];
    unsigned char d[32];
    char hex[65];

    /* The digest of "sk-hashed", written as the operator would. */
    mbedtls_sha256_ret((const unsigned char *)"sk-hashed", 9, d, 0);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02X", d[i]);
    snprintf(conf, sizeof(conf), "[tenant acme]\napi_key = " KEY_ACME "\n"
             "[tenant beta]\napi_key_sha256 = %s\napi_key = " KEY_B2 "\n",
             hex);
    load(conf);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer " KEY_ACME)),
                      0);
    ck_assert_str_eq(tenant_name(&cfg, 0), "acme");
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer sk-hashed")),
                      1);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("bearer " KEY_B2)), 1);
    /* One character short of acme's key, and one too many. */
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer "
                                                      "sk-acme-012345678")),
                      CONFIG_MAX_TENANTS);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer " KEY_ACME
                                                      "9")),
                      CONFIG_MAX_TENANTS);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer ")),
                      CONFIG_MAX_TENANTS);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Basic " KEY_ACME)),
                      CONFIG_MAX_TENANTS);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth(NULL)),
                      CONFIG_MAX_TENANTS);
    ck_assert_str_eq(tenant_name(&cfg, CONFIG_MAX_TENANTS), "default");
}
END_TEST

/* A plain key and the digest of the same key are one key twice. */
START_TEST(test_key_and_its_digest_collide)
{
    char conf[512], err[256];
    unsigned char d[32];
    char hex[65];
    struct gw_config c;

    mbedtls_sha256_ret((const unsigned char *)KEY_1, strlen(KEY_1), d, 0);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(conf, sizeof(conf), "[tenant a]\napi_key = " KEY_1 "\n"
             "[tenant b]\napi_key_sha256 = %s\n", hex);
    ck_assert_int_eq(config_load_text("t.conf", conf, &c, err, sizeof(err)),
                     GW_EINVAL);
    ck_assert_str_eq(err, "t.conf:4: this api_key is already used by "
                     "tenant 'a'");
}
END_TEST

/* [admin]'s keys are compared as a tenant's are, and are no tenant's. */
START_TEST(test_admin_keys)
{
    char conf[512];
    unsigned char d[32];
    char hex[65];

    load("[tenant a]\napi_key = " KEY_1 "\n");
    ck_assert(!tenant_is_admin(&cfg, with_auth("Bearer " KEY_1)));
    ck_assert(!tenant_is_admin(&cfg, with_auth(NULL)));
    mbedtls_sha256_ret((const unsigned char *)KEY_B2, strlen(KEY_B2), d, 0);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(conf, sizeof(conf), "[tenant a]\napi_key = " KEY_1 "\n"
             "[admin]\napi_key = " KEY_2 "\napi_key_sha256 = %s\n", hex);
    load(conf);
    ck_assert(tenant_is_admin(&cfg, with_auth("Bearer " KEY_2)));
    ck_assert(tenant_is_admin(&cfg, with_auth("bearer " KEY_B2)));
    ck_assert(!tenant_is_admin(&cfg, with_auth("Bearer " KEY_1)));
    ck_assert(!tenant_is_admin(&cfg, with_auth("Bearer " KEY_2 "x")));
    ck_assert(!tenant_is_admin(&cfg, with_auth("Bearer sk-k2-0123456789a")));
    ck_assert(!tenant_is_admin(&cfg, with_auth("Bearer ")));
    ck_assert(!tenant_is_admin(&cfg, with_auth("Basic " KEY_2)));
    ck_assert(!tenant_is_admin(&cfg, with_auth(NULL)));
    /* An admin key is nobody's tenant key, a tenant's still is. */
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer " KEY_2)),
                      CONFIG_MAX_TENANTS);
    ck_assert_uint_eq(tenant_identify(&cfg, with_auth("Bearer " KEY_1)), 0);
}
END_TEST

static const char *const bad_digests[] = {
    "abc",
    HASHED_HEX "0",                         /* 65 digits */
    "3f0f5a0d4d1d6b2c7b1b8f1f54e0a5c6d0b9b3b3e8f0e0b6b0a7f1c2d3e4f5ag",
};

START_TEST(test_bad_digest)
{
    char conf[512], err[256];
    struct gw_config c;

    snprintf(conf, sizeof(conf), "[tenant a]\napi_key_sha256 = %s\n",
             bad_digests[_i]);
    ck_assert_int_eq(config_load_text("t.conf", conf, &c, err, sizeof(err)),
                     GW_EINVAL);
    ck_assert_str_eq(err, "t.conf:2: api_key_sha256: expected 64 hex digits "
                     "(the SHA-256 of the key)");
}
END_TEST

START_TEST(test_max_inflight)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p1, *p2, *p3;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nmax_inflight = 2\n"
         "[tenant b]\napi_key = " KEY_2 "\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p1, &wait, NULL),
                     TENANT_ADMITTED);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p2, &wait, NULL),
                     TENANT_ADMITTED);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p3, &wait, NULL),
                     TENANT_MAX_INFLIGHT);
    ck_assert_ptr_null(p3);
    ck_assert_int_eq(wait, 1);
    /* Another tenant is not held back by a's limit. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 0, 0, &p3, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p3);
    tenants_leave(ts, p1);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p1, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p1);
    tenants_leave(ts, p2);
    tenants_free(ts);
}
END_TEST

#define S_US INT64_C(1000000)

START_TEST(test_requests_per_minute)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nrequests_per_minute = 3\n");
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0,
                                       &p, &wait, NULL),
                         TENANT_ADMITTED);
        tenants_leave(ts, p);
    }
    /* Empty: one token per 20 s at 3 a minute, in whole seconds rounded
     * up (due in 19.999999 s is "20"). */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(wait, 20);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US + 1, 0,
                                   &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(wait, 20);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 11 * S_US, 0, &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(wait, 10);
    /* A microsecond before the token: still refused, and honest. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 21 * S_US - 1, 0,
                                   &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(wait, 1);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 21 * S_US, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    /* A full minute refills no more than the minute's worth. */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 10000 * S_US, 0, &p,
                                       &wait, NULL), TENANT_ADMITTED);
        tenants_leave(ts, p);
    }
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 10000 * S_US, 0,
                                   &p, &wait, NULL),
                     TENANT_RATE);
    tenants_free(ts);
}
END_TEST

/*
 * 'senders' clients of tenant 0 sending 'each' requests 'period_us'
 * apart, client j 'stagger_us' x j after client 0, from 'start_us', in
 * time order on the fake clock (as keep-alive connections whose requests
 * interleave).  Returns how many were admitted; every refusal must give
 * a Retry-After of 1..'max_wait' s.
 */
static int
send_interleaved(struct tenants *ts, int64_t start_us, int senders,
                 int each, int64_t period_us, int64_t stagger_us,
                 int max_wait)
{
    struct tenant_entry *p;
    int admitted = 0, wait;

    ck_assert_int_lt((int64_t)(senders - 1) * stagger_us, period_us + 1);
    for (int k = 0; k < each; k++) {
        for (int j = 0; j < senders; j++) {
            int64_t now = start_us + k * period_us + j * stagger_us;

            if (tenants_enter(ts, &cfg, 0, now, 0, &p, &wait, NULL)
                == TENANT_ADMITTED) {
                admitted++;
                tenants_leave(ts, p);
            } else {
                ck_assert_ptr_null(p);
                ck_assert_int_ge(wait, 1);
                ck_assert_int_le(wait, max_wait);
            }
        }
    }
    return admitted;
}

/*
 * Issue 16 item 10, the first case: rpm = 60 and 120 requests over 10 s
 * from 8 interleaved senders (one every 83.3 ms).  The bucket starts
 * full, so 60 pass at once and one more per second: the last request,
 * at 9.92 s, finds 60 + 9.92 tokens made, so 69 pass.  The old bucket,
 * whose Retry-After rounded to 0 counted as "admitted", passed 73.
 */
/* What x-ratelimit-* say (route.c): the bucket after each verdict. */
START_TEST(test_rate_as_the_headers_tell_it)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p, *p1, *p2, *q;
    struct tenant_rate r;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nrequests_per_minute = 3\n"
         "max_inflight = 2\n[tenant b]\napi_key = " KEY_2 "\n");
    r.limit = 9;
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 0, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.limit, 0);              /* b has no rate */
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    ck_assert_uint_eq(r.limit, 3);
    ck_assert_uint_eq(r.remaining, 2);
    ck_assert_int_eq(r.reset_us, 20 * S_US);    /* one token: 20 s */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p1, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.remaining, 1);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p2, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.remaining, 0);
    /* Refused for max_inflight (2 under way): the bucket is told as it
     * is, refilled, nothing taken. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 11 * S_US, 0, &q, &wait, &r),
                     TENANT_MAX_INFLIGHT);
    ck_assert_uint_eq(r.remaining, 0);
    ck_assert_int_eq(r.reset_us, 50 * S_US);    /* half a token back */
    tenants_leave(ts, p1);
    tenants_leave(ts, p2);
    /* Refused for the rate: 0 left, and a token is due at 21 s. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 21 * S_US - 1, 0, &q, &wait,
                                   &r), TENANT_RATE);
    ck_assert_uint_eq(r.remaining, 0);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 21 * S_US, 0, &q, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.remaining, 0);
    tenants_leave(ts, q);
    tenants_free(ts);
}
END_TEST

START_TEST(test_rate_starts_full_and_refills_continuously)
{
    struct tenants *ts = tenants_new();

    load("[tenant a]\napi_key = " KEY_1 "\nrequests_per_minute = 60\n");
    ck_assert_int_eq(send_interleaved(ts, 0, 8, 15, 666667, 83333, 1), 69);
    tenants_free(ts);
}
END_TEST

/*
 * The second case: rpm = 700, a bucket emptied by a burst, then 8
 * senders each sending every millisecond (one request every 125 us) for
 * 5 s.  700 / 60 x 5 = 58.3 tokens are made in those 5 s: 58 pass.  The
 * old bucket kept time in milliseconds and admitted every request that
 * came while the next token was due in under 0.5 ms, without taking
 * it: 258 passed.
 */
START_TEST(test_rate_bursts_within_a_millisecond)
{
    struct tenants *ts = tenants_new();

    load("[tenant a]\napi_key = " KEY_1 "\nrequests_per_minute = 700\n");
    ck_assert_int_eq(send_interleaved(ts, 0, 1, 700, 0, 0, 1), 700);
    ck_assert_int_eq(send_interleaved(ts, 0, 8, 1, 1, 0, 1), 0);
    ck_assert_int_eq(send_interleaved(ts, 1, 8, 5000, 1000, 125, 1), 58);
    tenants_free(ts);
}
END_TEST

/*
 * Requests with the next token due in under half a millisecond: each is
 * refused (the old bucket read the rounded Retry-After of 0 as "admit"
 * and took nothing); the token, once due, admits one.
 */
START_TEST(test_rate_refusal_never_admits)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nrequests_per_minute = 700\n");
    ck_assert_int_eq(send_interleaved(ts, 0, 1, 700, 0, 0, 1), 700);
    /* 700 a minute: a token every 85714.3 us, so the first is whole at
     * 85715 us. */
    for (int64_t t = 85215; t < 85715; t++) {
        ck_assert_int_eq(tenants_enter(ts, &cfg, 0, t, 0, &p, &wait, NULL),
                         TENANT_RATE);
        ck_assert_int_eq(wait, 1);
    }
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 85715, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 85715, 0, &p, &wait, NULL),
                     TENANT_RATE);
    /* A clock read before the last one (another thread's, late for the
     * lock) neither refills nor rewinds the bucket. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1, 0, &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 171428, 0, &p, &wait, NULL),
                     TENANT_RATE);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 171429, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    tenants_free(ts);
}
END_TEST

START_TEST(test_bill_and_render)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    struct buf b;
    int wait;
    char model[16];

    load("[tenant a]\napi_key = " KEY_1 "\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_bill(ts, p, "m1", 10, 5, 0);
    tenants_bill(ts, p, "m1", 10, 5, 1);
    tenants_bill(ts, p, "we\\ird", 1, 2, 0);
    /* Past 32 models the rest is billed in one row. */
    for (int i = 0; i < 40; i++) {
        snprintf(model, sizeof(model), "x%d", i);
        tenants_bill(ts, p, model, 1, 1, 0);
    }
    buf_init(&b, 1 << 20);
    ck_assert_int_eq(tenants_render_metrics(ts, &cfg, 0, &b), 0);
    ck_assert_int_eq(buf_append(&b, "", 1), 0);
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tokens_total{tenant="
                                 "\"a\",model=\"m1\",kind=\"prompt\"} 20\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tokens_total{tenant="
                                 "\"a\",model=\"m1\",kind=\"completion\"} "
                                 "10\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "model=\"we\\\\ird\""));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tokens_total{tenant="
                                 "\"a\",model=\"(other models)\","
                                 "kind=\"prompt\"} 10\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b),
                                 "infergw_coalesce_tokens_saved_total"
                                 "{tenant=\"a\"} 15\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b),
                                 "infergw_tenant_requests_inflight"
                                 "{tenant=\"a\"} 1\n"));
    tenants_leave(ts, p);
    buf_release(&b);
    tenants_free(ts);
}
END_TEST

/* The text of tenants_render_metrics(ts, &cfg), 0, NUL-terminated, in 'b'. */
static const char *
rendered(struct tenants *ts, struct buf *b)
{
    buf_reset(b);
    ck_assert_int_eq(tenants_render_metrics(ts, &cfg, 0, b), 0);
    ck_assert_int_eq(buf_append(b, "", 1), 0);
    return buf_ptr(b);
}

START_TEST(test_requests_by_status)
{
    struct tenants *ts = tenants_new();
    struct buf b;
    int i;

    load("[tenant a]\napi_key = " KEY_1 "\n");
    buf_init(&b, 1 << 20);
    /* Before any request the family is there, with no sample. */
    ck_assert_ptr_nonnull(strstr(rendered(ts, &b),
                                 "# TYPE infergw_tenant_requests_total "
                                 "counter\n"));
    ck_assert_ptr_null(strstr(buf_ptr(&b), "infergw_tenant_requests_total{"));
    tenants_count_request(ts, &cfg, 0, 200);
    tenants_count_request(ts, &cfg, 0, 200);
    tenants_count_request(ts, &cfg, 0, 429);
    tenants_count_request(ts, &cfg, CONFIG_MAX_TENANTS, 401);
    rendered(ts, &b);
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"a\",status=\"200\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"a\",status=\"429\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"default\",status=\"401\"} "
                                 "1\n"));
    /* Past TENANT_MAX_STATUSES statuses the rest share one series, and
     * a status outside 100..599 goes there too. */
    for (i = 0; i < TENANT_MAX_STATUSES + 5; i++)
        tenants_count_request(ts, &cfg, 0, 500 + i);
    tenants_count_request(ts, &cfg, 0, 0);
    tenants_count_request(ts, &cfg, 0, 200);
    rendered(ts, &b);
    /* 200 and 429 took two rows: 500..521 got theirs, the 7 others and
     * the status 0 went to "other". */
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"a\",status=\"521\"} 1\n"));
    ck_assert_ptr_null(strstr(buf_ptr(&b), "status=\"522\""));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"a\",status=\"other\"} 8\n"));
    ck_assert_ptr_nonnull(strstr(buf_ptr(&b), "infergw_tenant_requests_total"
                                 "{tenant=\"a\",status=\"200\"} 3\n"));
    buf_release(&b);
    tenants_free(ts);
}
END_TEST

/*
 * The status view's copy: in flight, admitted in the last minute (the
 * seconds before it no longer count), 429s by limit, tokens and the
 * tokens saved.
 */
START_TEST(test_status)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p1, *p2, *p3;
    struct tenant_status *v;
    size_t n;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nmax_inflight = 2\n");
    ck_assert_int_eq(tenants_status(ts, &cfg, 0, 0, &v, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p1, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_bill(ts, p1, "m", 10, 5, 1);
    tenants_leave(ts, p1);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 50 * S_US, 0, &p1, &wait,
                                   NULL), TENANT_ADMITTED);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 50 * S_US, 0, &p2, &wait,
                                   NULL), TENANT_ADMITTED);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 50 * S_US, 0, &p3, &wait,
                                   NULL), TENANT_MAX_INFLIGHT);
    tenants_bill(ts, p1, "n", 1, 2, 0);

    ck_assert_int_eq(tenants_status(ts, &cfg, 60 * S_US, 0, &v, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(v[0].name, "a");
    ck_assert_uint_eq(v[0].inflight, 2);
    ck_assert_uint_eq(v[0].last_minute, 3);
    ck_assert_uint_eq(v[0].rejected[0], 1);
    ck_assert_uint_eq(v[0].rejected[1], 0);
    ck_assert_uint_eq(v[0].prompt_tokens, 11);
    ck_assert_uint_eq(v[0].completion_tokens, 7);
    ck_assert_uint_eq(v[0].saved, 15);
    gw_free(v);
    /* Second 1 is past the minute at 61 s; second 50 is not. */
    ck_assert_int_eq(tenants_status(ts, &cfg, 61 * S_US, 0, &v, &n), 0);
    ck_assert_uint_eq(v[0].last_minute, 2);
    gw_free(v);
    ck_assert_int_eq(tenants_status(ts, &cfg, 110 * S_US, 0, &v, &n), 0);
    ck_assert_uint_eq(v[0].last_minute, 0);
    gw_free(v);
    tenants_leave(ts, p1);
    tenants_leave(ts, p2);
    tenants_free(ts);
}
END_TEST

/*
 * Every number about a tenant is this module's to show: its limits, its
 * followers and what the admission queue did with its calls, reported
 * by the pool (tenants_note_queue()), each row of cfg's tenants (and the
 * default one) there from the start, labelled with its priority where
 * the queue's order is, and kept by name: a reload that reorders the
 * tenants moves no count to another name.
 */
/* How many lines of 'text' start with 'series' (a sample's name and
 * labels). */
static int
count_lines(const char *text, const char *series)
{
    int n = 0;
    size_t len = strlen(series);

    for (const char *p = text; p != NULL && *p != '\0';) {
        if (strncmp(p, series, len) == 0)
            n++;
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return n;
}

/*
 * A configured [tenant default] is the one series of that name: the
 * default tenant's implicit row would repeat its labels (an invalid
 * exposition, counted twice by a sum()).
 */
START_TEST(test_a_tenant_named_default_is_one_series)
{
    struct tenants *ts = tenants_new();
    const char *t;
    struct buf b;

    load("[tenant default]\napi_key = " KEY_1 "\n");
    buf_init(&b, 1 << 20);
    t = rendered(ts, &b);
    ck_assert_int_eq(count_lines(t, "infergw_coalesce_followers_by_tenant_"
                                 "total{tenant=\"default\"} "), 1);
    ck_assert_int_eq(count_lines(t, "infergw_tenant_queued{tenant="
                                 "\"default\",priority=\"0\"} "), 1);
    ck_assert_int_eq(count_lines(t, "infergw_tenant_queue_waits_total"
                                 "{tenant=\"default\",priority=\"0\"} "),
                     1);
    buf_release(&b);
    tenants_free(ts);
}
END_TEST

START_TEST(test_queue_followers_and_limits_by_name)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *pa;
    const char *t;
    struct buf b;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\nmax_inflight = 3\n"
         "requests_per_minute = 120\npriority = 2\n"
         "[tenant b]\napi_key = " KEY_2 "\npriority = -1\n");
    buf_init(&b, 1 << 20);
    t = rendered(ts, &b);
    ck_assert_double_eq(sample(t, "infergw_tenant_max_inflight"
                               "{tenant=\"a\"} "), 3);
    ck_assert_double_eq(sample(t, "infergw_tenant_max_inflight"
                               "{tenant=\"b\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_requests_per_minute_limit"
                               "{tenant=\"a\"} "), 120);
    ck_assert_ptr_null(strstr(t, "infergw_tenant_max_inflight"
                              "{tenant=\"default\"}"));
    ck_assert_double_eq(sample(t, "infergw_tenant_queued{tenant=\"a\","
                               "priority=\"2\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_shed_total{tenant=\"b\","
                               "priority=\"-1\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_queue_waits_total"
                               "{tenant=\"default\",priority=\"0\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_coalesce_followers_by_tenant_total"
                               "{tenant=\"default\"} "), 0);

    tenants_note_queue(ts, &cfg, 0, TENANT_QUEUE_ENTERED, 0);
    tenants_note_queue(ts, &cfg, 0, TENANT_QUEUE_ENTERED, 0);
    t = rendered(ts, &b);
    ck_assert_double_eq(sample(t, "infergw_tenant_queued{tenant=\"a\","
                               "priority=\"2\"} "), 2);
    tenants_note_queue(ts, &cfg, 0, TENANT_QUEUE_LEFT, 1500);
    tenants_note_queue(ts, &cfg, 0, TENANT_QUEUE_LEFT, 250);
    tenants_note_queue(ts, &cfg, 0, TENANT_QUEUE_TIMED_OUT, 0);
    tenants_note_queue(ts, &cfg, 1, TENANT_QUEUE_SHED, 0);
    tenants_note_queue(NULL, &cfg, 1, TENANT_QUEUE_SHED, 0);  /* nowhere */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &pa, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_note_follower(ts, pa);
    tenants_note_follower(ts, NULL);
    t = rendered(ts, &b);
    ck_assert_double_eq(sample(t, "infergw_tenant_queued{tenant=\"a\","
                               "priority=\"2\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_queue_waits_total"
                               "{tenant=\"a\",priority=\"2\"} "), 2);
    ck_assert_double_eq(sample(t, "infergw_tenant_queue_wait_seconds_total"
                               "{tenant=\"a\",priority=\"2\"} "), 1.75);
    ck_assert_double_eq(sample(t, "infergw_tenant_queue_timeouts_total"
                               "{tenant=\"a\",priority=\"2\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_tenant_shed_total{tenant=\"b\","
                               "priority=\"-1\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_coalesce_followers_by_tenant_total"
                               "{tenant=\"a\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_coalesce_followers_by_tenant_total"
                               "{tenant=\"b\"} "), 0);

    /* A reload puts b first, a second, with a new priority: the counts
     * stay a's, the label says a's priority now. */
    tenants_leave(ts, pa);
    load("[tenant b]\napi_key = " KEY_2 "\n"
         "[tenant a]\napi_key = " KEY_1 "\npriority = 1\n");
    t = rendered(ts, &b);
    ck_assert_double_eq(sample(t, "infergw_tenant_queue_waits_total"
                               "{tenant=\"a\",priority=\"1\"} "), 2);
    ck_assert_double_eq(sample(t, "infergw_tenant_shed_total{tenant=\"b\","
                               "priority=\"0\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_coalesce_followers_by_tenant_total"
                               "{tenant=\"a\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_tenant_max_inflight"
                               "{tenant=\"a\"} "), 0);
    buf_release(&b);
    tenants_free(ts);
}
END_TEST

/* ---- token limits ---- */

/* Some instants, UTC (seconds since the epoch). */
#define T_2024_02_28_2359 INT64_C(1709164740)
#define T_2024_02_29 INT64_C(1709164800)
#define T_2024_02_29_1200 INT64_C(1709208000)
#define T_2024_03_01 INT64_C(1709251200)
#define T_2023_12_31_2300 INT64_C(1704063600)
#define T_2024_01_01 INT64_C(1704067200)
#define T_2023_02_10 INT64_C(1675987200)
#define T_2023_03_01 INT64_C(1677628800)
#define DAY INT64_C(86400)

/* The period ends of the calendar, a table: (instant, day's end,
 * month's end, note). */
static const struct {
    int64_t at, day_end, month_end;
    const char *note;
} period_ends[] = {
    { T_2024_02_28_2359, T_2024_02_29, T_2024_03_01, "leap year: 29 Feb" },
    { T_2024_02_29, T_2024_02_29 + DAY, T_2024_03_01, "the leap day" },
    { T_2023_02_10, T_2023_02_10 + DAY, T_2023_03_01, "not leap: 28 days" },
    { T_2023_12_31_2300, T_2024_01_01, T_2024_01_01, "December to January" },
    { T_2024_01_01, T_2024_01_01 + DAY, T_2024_01_01 + 31 * DAY,
      "the first second of a month" },
    { T_2024_01_01 - 1, T_2024_01_01, T_2024_01_01, "its last second" },
    { INT64_C(4107456000), INT64_C(4107542400), INT64_C(4107542400),
      "2100-02-28: 2100 is not a leap year" },
    { INT64_C(951696000), INT64_C(951782400), INT64_C(951868800),
      "2000-02-28: 2000 is" },
    { -1, 0, 0, "1969-12-31 23:59:59: before the epoch" },
    { INT64_C(-2203977600), INT64_C(-2203891200), INT64_C(-2203891200),
      "1900-02-28: 1900 is not" },
};

START_TEST(test_period_ends)
{
    int64_t at = period_ends[_i].at;

    ck_assert_msg(tenant_period_end_s(TENANT_DAY, at)
                  == period_ends[_i].day_end, "%s: day ends %" PRId64,
                  period_ends[_i].note, tenant_period_end_s(TENANT_DAY, at));
    ck_assert_msg(tenant_period_end_s(TENANT_MONTH, at)
                  == period_ends[_i].month_end, "%s: month ends %" PRId64,
                  period_ends[_i].note,
                  tenant_period_end_s(TENANT_MONTH, at));
    /* The last second of a period and the first of the next differ. */
    ck_assert_int_ne(tenant_period_key(TENANT_DAY,
                                       period_ends[_i].day_end - 1),
                     tenant_period_key(TENANT_DAY, period_ends[_i].day_end));
    ck_assert_int_eq(tenant_period_key(TENANT_MONTH, at),
                     tenant_period_key(TENANT_MONTH,
                                       period_ends[_i].month_end - 1));
    ck_assert_int_ne(tenant_period_key(TENANT_MONTH, at),
                     tenant_period_key(TENANT_MONTH,
                                       period_ends[_i].month_end));
}
END_TEST

/*
 * tokens_per_minute = 600 (10 a second): admitted while a whole token
 * is there, charged the whole usage after, into debt; Retry-After and
 * the headers' numbers until it is paid back.
 */
START_TEST(test_tokens_per_minute_debt)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p, *q;
    struct tenant_rate r;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 600\n"
         "requests_per_minute = 100\n[tenant b]\napi_key = " KEY_2 "\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.tokens_limit, 600);
    ck_assert_uint_eq(r.tokens_remaining, 600);     /* starts full */
    ck_assert_int_eq(r.tokens_reset_us, 0);
    ck_assert_uint_eq(r.remaining, 99);
    /* Another call of a's under way: admitted, the usage is not known
     * before a call ends. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &q, &wait, &r),
                     TENANT_ADMITTED);
    /* The first costs 1000 tokens: 400 in debt. */
    tenants_charge(ts, &cfg, 0, p, 1000, 0, 1 * S_US, 0);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, &r),
                     TENANT_TOKENS);
    /* 401 tokens at 10 a second: 40.1 s, rounded up. */
    ck_assert_int_eq(wait, 41);
    ck_assert_uint_eq(r.tokens_remaining, 0);
    ck_assert_int_eq(r.tokens_reset_us, 100 * S_US);   /* 1000 tokens */
    ck_assert_uint_eq(r.remaining, 98);     /* the refusal took none */
    /* The one still under way finishes: charged too (the overshoot). */
    tenants_charge(ts, &cfg, 0, q, 200, 1, 2 * S_US, 0);
    tenants_leave(ts, q);
    /* Now 590 in debt at 2 s: a whole token at 2 + 59.1 s. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 2 * S_US + 59100000 - 1, 0,
                                   &p, &wait, NULL), TENANT_TOKENS);
    ck_assert_int_eq(wait, 1);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 2 * S_US + 59100000, 0, &p,
                                   &wait, &r), TENANT_ADMITTED);
    ck_assert_uint_eq(r.tokens_remaining, 1);
    tenants_leave(ts, p);
    /* Another tenant without the limit: no bucket, no headers. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 2 * S_US, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    ck_assert_uint_eq(r.tokens_limit, 0);
    tenants_charge(ts, &cfg, 1, p, 1000000, 0, 2 * S_US, 0);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 2 * S_US, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    tenants_charge(ts, &cfg, 0, NULL, 5, 0, 0, 0);     /* NULL-safe */
    tenants_free(ts);
}
END_TEST

/*
 * The bucket never holds more than a minute's worth, however long it
 * idles; a huge charge cannot overflow it, nor shut the tenant out for
 * more than a day; a reload keeps its state by name and clamps it to a
 * lower limit.
 */
START_TEST(test_tokens_bucket_bounds_and_reload)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    struct tenant_rate r;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 1000\n"
         "[tenant b]\napi_key = " KEY_2 "\ntokens_per_minute = 60\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 100, 0, 0, 0);
    tenants_leave(ts, p);
    /* An hour idle: full, not 60 minutes' worth. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 3600 * S_US, 0, &p, &wait,
                                   &r), TENANT_ADMITTED);
    ck_assert_uint_eq(r.tokens_remaining, 1000);
    /* The most one call can be charged, at 1 a second: in debt for
     * ages, Retry-After bounded, no overflow. */
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 0, 0, &p, &wait, &r),
                     TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 1, p, UINT64_MAX, 0, 0, 0);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 0, 0, &p, &wait, &r),
                     TENANT_TOKENS);
    /* The debt stops at a day's refill: a whole token a second later. */
    ck_assert_int_eq(wait, 86401);
    ck_assert_int_eq(r.tokens_reset_us, (86400 + 60) * S_US);
    /* b's debt survives a reload that renames nothing but moves it
     * first; a's full bucket is clamped to its new, lower limit. */
    load("[tenant b]\napi_key = " KEY_2 "\ntokens_per_minute = 60\n"
         "[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 10\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, &r),
                     TENANT_TOKENS);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 3601 * S_US, 0, &p, &wait,
                                   &r), TENANT_ADMITTED);
    ck_assert_uint_eq(r.tokens_remaining, 10);
    tenants_leave(ts, p);
    /* One usage object at get_count()'s bound (2^32 + 2^32) at 1000 a
     * minute: a day, not 16 years; at the largest limit, less. */
    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 1000\n"
         "[tenant b]\napi_key = " KEY_2
         "\ntokens_per_minute = 1000000000\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, UINT64_C(1) << 33, 0, 0, 0);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 0, &p, &wait, NULL),
                     TENANT_TOKENS);
    ck_assert_int_eq(wait, 86401);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 4000 * S_US, 0, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    for (int i = 0; i < 8; i++)
        tenants_charge(ts, &cfg, 1, p, TENANT_MAX_CHARGE, 0, 4000 * S_US, 0);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 4000 * S_US, 0, &p, &wait,
                                   NULL), TENANT_TOKENS);
    ck_assert_int_le(wait, 86400);
    tenants_free(ts);
}
END_TEST

/*
 * tokens_per_day = 100: refused once the day's charges reach it, with
 * Retry-After until midnight UTC, and admitted again on the next day,
 * across a leap day.
 */
START_TEST(test_day_budget_across_midnight)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_day = 100\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_28_2359, &p,
                                   &wait, NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 99, 0, 0, T_2024_02_28_2359);
    tenants_leave(ts, p);
    /* 99 of 100: room for one more call, which overshoots. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_28_2359, &p,
                                   &wait, NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 30, 0, 0, T_2024_02_28_2359);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_28_2359, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    ck_assert_int_eq(wait, 60);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29 - 1, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    ck_assert_int_eq(wait, 1);
    /* Midnight: the leap day is a new day. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    /* A call that ends at noon is charged to the day it ends in. */
    tenants_charge(ts, &cfg, 0, p, 100, 0, 0, T_2024_02_29_1200);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29_1200, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    ck_assert_int_eq(wait, 12 * 3600);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_03_01, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_leave(ts, p);
    tenants_free(ts);
}
END_TEST

/*
 * tokens_per_month = 1000: the month adds up its days; refused until
 * the first of the next month (December to January; a February of 28
 * days); with the day spent too, Retry-After waits for both.
 */
START_TEST(test_month_budget_across_month_ends)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_month = 1000\n"
         "tokens_per_day = 700\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_02_10, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 600, 0, 0, T_2023_02_10);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_02_10 + DAY, &p,
                                   &wait, NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 400, 0, 0, T_2023_02_10 + DAY);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_02_10 + DAY, &p,
                                   &wait, NULL), TENANT_QUOTA_MONTH);
    ck_assert_int_eq(wait, T_2023_03_01 - T_2023_02_10 - DAY);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_03_01, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_leave(ts, p);

    /* Both spent on 10 February: no room until 1 March, which the
     * month's verdict says, not the day's midnight. */
    load("[tenant b]\napi_key = " KEY_2 "\ntokens_per_month = 1000\n"
         "tokens_per_day = 700\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_02_10, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 1000, 0, 0, T_2023_02_10);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_02_10, &p, &wait,
                                   NULL), TENANT_QUOTA_MONTH);
    ck_assert_int_eq(wait, T_2023_03_01 - T_2023_02_10);
    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_month = 1000\n"
         "tokens_per_day = 700\n");

    /* The last hour of the year, both spent, both end at midnight: the
     * day is named. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_12_31_2300, &p,
                                   &wait, NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 1000, 0, 0, T_2023_12_31_2300);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2023_12_31_2300, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    ck_assert_int_eq(wait, 3600);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_01_01, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_leave(ts, p);
    tenants_free(ts);
}
END_TEST

/*
 * Periods only move forward: a charge whose clock was read just before
 * midnight, made after another was charged in the new day, counts in
 * the new day; a wall clock stepped back across midnight finds the
 * new day's use, not a fresh budget.
 */
START_TEST(test_periods_never_move_back)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p, *q;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_day = 100\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29 - 1, &p,
                                   &wait, NULL), TENANT_ADMITTED);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29 - 1, &q,
                                   &wait, NULL), TENANT_ADMITTED);
    /* q's thread read the clock after midnight and took the lock
     * first; p's read it at 23:59:59 and took it second. */
    tenants_charge(ts, &cfg, 0, q, 500, 0, 0, T_2024_02_29);
    tenants_charge(ts, &cfg, 0, p, 1, 0, 0, T_2024_02_29 - 1);
    tenants_leave(ts, p);
    tenants_leave(ts, q);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29 + 10, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    /* NTP steps the clock back a minute: 23:59:30 the day before. */
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_29 - 30, &p,
                                   &wait, NULL), TENANT_QUOTA_DAY);
    /* The month, likewise, across the end of February. */
    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_month = 501\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_03_01, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 501, 0, 0, T_2024_03_01);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_03_01 - 1, &p,
                                   &wait, NULL), TENANT_QUOTA_MONTH);
    /* A first period before the epoch is one too (no key 0 to start). */
    load("[tenant b]\napi_key = " KEY_2 "\ntokens_per_day = 100\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, -10, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 100, 0, 0, -10);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, 10, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_leave(ts, p);
    tenants_free(ts);
}
END_TEST

/*
 * A reload lowers tokens_per_minute while a call admitted under the old
 * config runs: its charge, made with the old config, takes its tokens
 * and refills nothing, so the debt run up under the new limit stays.
 */
START_TEST(test_charge_under_old_config_keeps_debt)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p, *old;
    struct gw_config oldcfg;
    char err[256];
    int wait;

    ck_assert_int_eq(config_load_text("o.conf", "[tenant a]\napi_key = "
                                      KEY_1 "\ntokens_per_minute = 600000\n",
                                      &oldcfg, err, sizeof(err)), 0);
    ck_assert_int_eq(tenants_enter(ts, &oldcfg, 0, 0, 0, &old, &wait, NULL),
                     TENANT_ADMITTED);
    /* The reload: 60 a minute; a new call runs 600 into debt. */
    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 60\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 1 * S_US, 0, &p, &wait, NULL),
                     TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 660, 0, 1 * S_US, 0);
    tenants_leave(ts, p);
    /* The old call ends 2 s later, a token: 10000 a second then. */
    tenants_charge(ts, &oldcfg, 0, old, 1, 0, 3 * S_US, 0);
    tenants_leave(ts, old);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 3 * S_US, 0, &p, &wait, NULL),
                     TENANT_TOKENS);
    /* 601 tokens of debt at 1 a second, 2 s of them paid. */
    ck_assert_int_eq(wait, 600);
    config_release(&oldcfg);
    tenants_free(ts);
}
END_TEST

/* The status view's and /metrics' numbers of the token limits. */
START_TEST(test_tokens_status_and_render)
{
    struct tenants *ts = tenants_new();
    struct tenant_entry *p;
    struct tenant_status *v;
    struct buf b;
    const char *t;
    size_t n;
    int wait;

    load("[tenant a]\napi_key = " KEY_1 "\ntokens_per_minute = 60\n"
         "tokens_per_day = 500\ntokens_per_month = 9000\n"
         "[tenant b]\napi_key = " KEY_2 "\n");
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_28_2359, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_charge(ts, &cfg, 0, p, 100, 0, 0, T_2024_02_28_2359);
    tenants_charge(ts, &cfg, 0, p, 7, 1, 0, T_2024_02_28_2359);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 0, 0, T_2024_02_28_2359, &p, &wait,
                                   NULL), TENANT_TOKENS);
    ck_assert_int_eq(tenants_enter(ts, &cfg, 1, 0, T_2024_02_28_2359, &p, &wait,
                                   NULL), TENANT_ADMITTED);
    tenants_leave(ts, p);
    ck_assert_int_eq(tenants_status(ts, &cfg, 1 * S_US, T_2024_02_28_2359, &v,
                                    &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(v[0].name, "a");
    ck_assert(v[0].tokens_bucket);
    ck_assert_int_eq(v[0].tokens_credit, -46);  /* 60 - 107 + 1 */
    ck_assert_uint_eq(v[0].tokens_day, 107);
    ck_assert_uint_eq(v[0].tokens_month, 107);
    ck_assert_uint_eq(v[0].rejected[TENANT_TOKENS - 1], 1);
    ck_assert(!v[1].tokens_bucket);
    gw_free(v);
    /* The next day: the day's count is back to 0, the month's is not. */
    ck_assert_int_eq(tenants_status(ts, &cfg, 1 * S_US, T_2024_02_29,
                                    &v, &n), 0);
    ck_assert_uint_eq(v[0].tokens_day, 0);
    ck_assert_uint_eq(v[0].tokens_month, 107);
    gw_free(v);

    buf_init(&b, 1 << 20);
    ck_assert_int_eq(tenants_render_metrics(ts, &cfg, T_2024_02_28_2359,
                                            &b), 0);
    ck_assert_int_eq(buf_append(&b, "", 1), 0);
    t = buf_ptr(&b);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_per_minute_limit"
                               "{tenant=\"a\"} "), 60);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_per_day_limit"
                               "{tenant=\"a\"} "), 500);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_per_month_limit"
                               "{tenant=\"a\"} "), 9000);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_per_month_limit"
                               "{tenant=\"b\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_rejected_total{tenant="
                               "\"a\",limit=\"tokens_per_minute\"} "), 1);
    ck_assert_double_eq(sample(t, "infergw_tenant_rejected_total{tenant="
                               "\"a\",limit=\"tokens_per_day\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_rejected_total{tenant="
                               "\"b\",limit=\"tokens_per_month\"} "), 0);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_charged_total{"
                               "tenant=\"a\",source=\"usage\"} "), 100);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_charged_total{"
                               "tenant=\"a\",source=\"counted\"} "), 7);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_used{tenant=\"a\","
                               "period=\"day\"} "), 107);
    ck_assert_double_eq(sample(t, "infergw_tenant_tokens_used{tenant=\"a\","
                               "period=\"month\"} "), 107);
    buf_release(&b);
    tenants_free(ts);
}
END_TEST

static Suite *
tenant_suite(void)
{
    Suite *s = suite_create("tenant");
    TCase *tc = tcase("identify");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_identify_plain_and_hashed_keys);
    tcase_add_test(tc, test_key_and_its_digest_collide);
    tcase_add_test(tc, test_admin_keys);
    tcase_add_loop_test(tc, test_bad_digest, 0,
                        (int)GW_ARRAY_LEN(bad_digests));
    suite_add_tcase(s, tc);

    tc = tcase("limits");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_max_inflight);
    tcase_add_test(tc, test_status);
    tcase_add_test(tc, test_requests_per_minute);
    tcase_add_test(tc, test_rate_as_the_headers_tell_it);
    tcase_add_test(tc, test_rate_starts_full_and_refills_continuously);
    tcase_add_test(tc, test_rate_bursts_within_a_millisecond);
    tcase_add_test(tc, test_rate_refusal_never_admits);
    tcase_add_test(tc, test_bill_and_render);
    tcase_add_test(tc, test_requests_by_status);
    tcase_add_test(tc, test_queue_followers_and_limits_by_name);
    tcase_add_test(tc, test_a_tenant_named_default_is_one_series);
    suite_add_tcase(s, tc);

    tc = tcase("tokens");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_period_ends, 0,
                        (int)GW_ARRAY_LEN(period_ends));
    tcase_add_test(tc, test_tokens_per_minute_debt);
    tcase_add_test(tc, test_tokens_bucket_bounds_and_reload);
    tcase_add_test(tc, test_day_budget_across_midnight);
    tcase_add_test(tc, test_month_budget_across_month_ends);
    tcase_add_test(tc, test_periods_never_move_back);
    tcase_add_test(tc, test_charge_under_old_config_keeps_debt);
    tcase_add_test(tc, test_tokens_status_and_render);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(tenant_suite()));
}
