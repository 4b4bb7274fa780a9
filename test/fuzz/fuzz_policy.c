/* SPDX-License-Identifier: MIT */
/*
 * fuzz_policy.c - libFuzzer target for the coalescing policy in
 * gateway/coalesce/coalesce.c: who may coalesce (coalesce_eligible) and the key
 * that says two requests are the same (coalesce_key), on two requests
 * with arbitrary bodies.
 *
 * An input is:
 *   OPTIONS '\n' REQUEST [ "\n--\n" REQUEST ]
 * (a final '\n' of the input is dropped, so that text files work).
 * OPTIONS is one byte: bit 0 sets [routing] forward_client_auth, bit 1
 * [coalesce] omitted_temperature = 1 (else 0), bit 2 [coalesce] enabled
 * = off, bit 3 puts the second request under the next configuration
 * generation (a SIGHUP reload: generation.h), the first being generation 1.
 * The tenants are "acme" (key sk-acme-0123456789) and "quiet" (key
 * sk-quiet-0123456789, coalesce = off).  Without a second request, the
 * first is compared with itself.  A REQUEST that starts with '/' has a
 * head: its first line is the target, each further line up to an empty
 * one a field "Name: value"; the rest is the body.  Any other REQUEST is
 * a body alone, for "/v1/chat/completions" with no fields.  The head is turned into what
 * route.c and proxy.c give the policy: the tenant whose key the first
 * Authorization field presents as "Bearer KEY" (else "default"), and the
 * forwarded credential (that field's value, with forward_client_auth on,
 * if not empty).  A body that jsonx_parse_object() refuses (route.c
 * answers 400) never reaches the policy.  Bodies are exact-size heap
 * copies, so ASan catches a read past one.
 *
 * Besides crashes and sanitizer reports, the target aborts when one of
 * these properties fails:
 *   key      The contract (coalesce.h): two keys are equal only if the
 *            requests are the same to the upstream: same configuration
 *            generation, tenant, method, path and forwarded credential,
 *            and bodies byte-equal or canonically equal (json_equal()
 *            over jansson's parse: key order, blanks and escapes do not
 *            count).  The policy hashes the raw body, so, more exactly:
 *            keys are equal if and only if generation, tenant, method,
 *            path, credential and body bytes are.  In particular every
 *            one-field change of a request changes its key: a body one
 *            byte longer, another path, credential (none and empty
 *            differ), tenant or generation, a byte moved across the
 *            border of two fields.  The request id is not in the key;
 *            the same request gives the same key every time, wherever
 *            its bytes sit.
 *   verdict  coalesce_eligible() is deterministic and agrees with the
 *            rule as coalesce.h states it, restated here independently:
 *            off globally, off for the tenant, an opt-out field (any
 *            line of X-Infergw-Coalesce listing "off", of Cache-Control
 *            listing no-cache or no-store), else sampling that is not
 *            reproducible, each with its metrics_bypass reason, in that
 *            order.  Two requests whose bodies are canonically equal,
 *            of one tenant and with the same fields, get one verdict.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fuzz.h"
#include "alloc.h"
#include "coalesce/coalesce.h"
#include "base/config.h"
#include "coalesce/flight.h"
#include "http.h"
#include "jsonx.h"
#include "util.h"

#define FUZZ_DEFAULT_TARGET "/v1/chat/completions"
#define FUZZ_SEP "\n--\n"


/* One request as the policy sees it. */
struct req {
    struct http_request r;      /* views into the input */
    size_t tenant;
    const char *tenant_name;
    uint64_t generation;        /* of the configuration it runs under */
    char *path;                 /* owned C string, as proxy.c's */
    char *auth;                 /* owned; NULL: none forwarded */
    char *body;                 /* owned exact-size copy */
    size_t body_len;
    json_t *json;               /* NULL: refused by route.c */
    int eligible;
    enum metrics_bypass why;
    unsigned char key[FLIGHT_KEY_LEN];
};

/* The configurations, by OPTIONS & 7: loaded once, kept to the end. */
static struct gw_config configs[8];
static int loaded[8];

static const struct gw_config *
config_for(unsigned opt)
{
    char text[512];
    char err[256];

    opt &= 7;
    if (!loaded[opt]) {
        snprintf(text, sizeof(text),
                 "[routing]\nforward_client_auth = %s\n"
                 "[coalesce]\nomitted_temperature = %s\nenabled = %s\n"
                 "[tenant acme]\napi_key = sk-acme-0123456789\n"
                 "[tenant quiet]\napi_key = sk-quiet-0123456789\n"
                 "coalesce = off\n",
                 opt & 1 ? "on" : "off", opt & 2 ? "1" : "0",
                 opt & 4 ? "off" : "on");
        REQUIRE(config_load_text("policy.conf", text, &configs[opt], err,
                                 sizeof(err)) == 0);
        loaded[opt] = 1;
    }
    return &configs[opt];
}

/* A C string of p[0..n), cut at a NUL as gw_strndup() does. */
static char *
dup_str(const char *p, size_t n)
{
    char *q = gw_strndup(p, n);

    REQUIRE(q != NULL);
    return q;
}

static int
is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static void
trim(const char **p, size_t *n)
{
    while (*n > 0 && is_blank(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n > 0 && is_blank((*p)[*n - 1]))
        (*n)--;
}

/* Read a head's field lines from p[0..n) into r (at most the parser's
 * HTTP_MAX_HEADERS; lines without a ':' are skipped). */
static void
read_fields(struct http_request *r, const char *p, size_t n)
{
    const char *end = p + n, *nl, *colon, *v;
    size_t vn;

    while (p < end && r->num_headers < HTTP_MAX_HEADERS) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            nl = end;
        colon = memchr(p, ':', (size_t)(nl - p));
        if (colon != NULL && colon > p) {
            struct http_header *h = &r->headers[r->num_headers++];

            h->name = p;
            h->name_len = (size_t)(colon - p);
            v = colon + 1;
            vn = (size_t)(nl - v);
            trim(&v, &vn);
            h->value = v;
            h->value_len = vn;
        }
        p = nl + (nl < end);
    }
}

/* The tenant and the forwarded credential, as route.c and proxy.c. */
static void
identify(struct req *q, const struct gw_config *cfg)
{
    const struct http_header *h = http_find_header(&q->r, "Authorization");
    static const char *const keys[] = { "sk-acme-0123456789",
                                        "sk-quiet-0123456789" };

    q->tenant = CONFIG_MAX_TENANTS;
    if (h != NULL && h->value_len >= 7 && gw_strieq(h->value, 7, "Bearer "))
        for (size_t t = 0; t < GW_ARRAY_LEN(keys); t++)
            if (h->value_len - 7 == strlen(keys[t])
                && memcmp(h->value + 7, keys[t], strlen(keys[t])) == 0)
                q->tenant = t;
    q->tenant_name = q->tenant < cfg->num_tenants
                     ? cfg->tenants[q->tenant].name : "default";
    if (cfg->forward_client_auth && h != NULL && h->value_len > 0)
        q->auth = dup_str(h->value, h->value_len);
}

/* Turn p[0..n) into a request (see the top of the file). */
static void
read_req(struct req *q, const struct gw_config *cfg, const char *p,
         size_t n)
{
    const char *end = p + n, *nl, *blank, *fields_end, *body = p, *t;
    const char *query;
    size_t tn;
    char err[160];

    memset(q, 0, sizeof(*q));
    q->r.method = "POST";
    q->r.method_len = 4;
    q->r.minor = 1;
    q->r.body_kind = HTTP_BODY_LENGTH;
    if (n > 0 && p[0] == '/') {
        nl = memchr(p, '\n', n);
        t = p;
        tn = nl != NULL ? (size_t)(nl - p) : n;
        /* The fields end at the first empty line; "\n\n" right after
         * the target line means none. */
        blank = nl != NULL ? memmem(nl, (size_t)(end - nl), "\n\n", 2)
                           : NULL;
        fields_end = blank != NULL ? blank : end;
        if (nl != NULL && fields_end > nl)
            read_fields(&q->r, nl + 1, (size_t)(fields_end - (nl + 1)));
        body = blank != NULL ? blank + 2 : end;
    } else {
        t = FUZZ_DEFAULT_TARGET;
        tn = strlen(t);
    }
    q->r.target = t;
    q->r.target_len = tn;
    q->r.path = t;
    query = memchr(t, '?', tn);
    q->r.path_len = query != NULL ? (size_t)(query - t) : tn;
    q->path = dup_str(t, tn);
    identify(q, cfg);
    q->body_len = (size_t)(end - body);
    q->body = dup_exact(body, q->body_len);
    q->r.content_length = q->body_len;
    if (jsonx_parse_object(q->body, q->body_len, JSONX_MAX_DEPTH, &q->json,
                           err, sizeof(err)) != 0)
        q->json = NULL;
}

static void
req_release(struct req *q)
{
    gw_free(q->path);
    gw_free(q->auth);
    free(q->body);
    json_decref(q->json);
}

/* ---- the rule, restated from coalesce.h ---- */

/* Does any line of field 'name' list 'token' (before any "=arg")? */
static int
ref_lists(const struct http_request *r, const char *name, const char *token)
{
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *h = &r->headers[i];
        const char *p = h->value, *end = h->value + h->value_len;

        if (!(strlen(name) == h->name_len
              && gw_strieq(h->name, h->name_len, name)))
            continue;
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *e = comma != NULL ? comma : end;
            const char *eq = memchr(p, '=', (size_t)(e - p));
            const char *elem = p;
            size_t n = (size_t)((eq != NULL ? eq : e) - p);

            trim(&elem, &n);
            if (n == strlen(token) && gw_strieq(elem, n, token))
                return 1;
            if (comma == NULL)
                break;
            p = comma + 1;
        }
    }
    return 0;
}

static int
ref_opted_out(const struct http_request *r)
{
    return ref_lists(r, "X-Infergw-Coalesce", "off")
           || ref_lists(r, "Cache-Control", "no-cache")
           || ref_lists(r, "Cache-Control", "no-store");
}

/* Reproducible sampling: a seed decides alone, then temperature, then
 * the omitted temperature and the other sampling controls. */
static int
ref_reproducible(const struct gw_config *cfg, const json_t *body)
{
    static const struct {
        const char *name;
        double neutral;
        int above;              /* sampling when > neutral, else < */
    } knobs[] = {
        { "top_p", 1, 0 }, { "typical_p", 1, 0 }, { "top_k", 0, 1 },
        { "min_p", 0, 1 }, { "n", 1, 1 }, { "best_of", 1, 1 },
    };
    const json_t *seed = json_object_get(body, "seed");
    const json_t *temp = json_object_get(body, "temperature");

    if (seed != NULL)
        return json_is_integer(seed) && json_integer_value(seed) >= 0;
    if (temp != NULL)
        return json_is_number(temp) && json_number_value(temp) == 0.0;
    if (cfg->omitted_temperature != 0.0)
        return 0;
    for (size_t i = 0; i < GW_ARRAY_LEN(knobs); i++) {
        const json_t *v = json_object_get(body, knobs[i].name);
        double x;

        if (v == NULL)
            continue;
        if (!json_is_number(v))
            return 0;
        x = json_number_value(v);
        if (knobs[i].above ? x > knobs[i].neutral : x < knobs[i].neutral)
            return 0;
    }
    return 1;
}

/* 1, or 0 with OUT *why. */
static int
ref_eligible(const struct gw_config *cfg, const struct req *q,
             enum metrics_bypass *why)
{
    if (!cfg->coalesce)
        *why = METRICS_BYPASS_DISABLED;
    else if (q->tenant < cfg->num_tenants && !cfg->tenants[q->tenant].coalesce)
        *why = METRICS_BYPASS_TENANT;
    else if (ref_opted_out(&q->r))
        *why = METRICS_BYPASS_OPT_OUT;
    else if (!ref_reproducible(cfg, q->json))
        *why = METRICS_BYPASS_SAMPLING;
    else
        return 1;
    return 0;
}

/* ---- the checks ---- */

/* The fields coalesce_key() reads, each of them free to vary. */
struct fields {
    const char *tenant;
    uint64_t generation;
    const char *method;
    const char *path;
    const char *body;
    size_t body_len;
    const char *auth;           /* NULL: none */
};

static void
fields_of(const struct req *q, struct fields *f)
{
    f->tenant = q->tenant_name;
    f->generation = q->generation;
    f->method = "POST";
    f->path = q->path;
    f->body = q->body;
    f->body_len = q->body_len;
    f->auth = q->auth;
}

static void
key_fields(const struct fields *f, const char *id,
           unsigned char key[FLIGHT_KEY_LEN])
{
    struct upstream_request ur;

    memset(&ur, 0, sizeof(ur));
    ur.method = f->method;
    ur.path = f->path;
    ur.body = f->body;
    ur.body_len = f->body_len;
    ur.request_id = id;
    ur.client_auth = f->auth;
    coalesce_key(f->tenant, f->generation, &ur, key);
}

/* A new string: a[0..na) then b[0..nb), NUL-terminated (owned). */
static char *
join(const char *a, size_t na, const char *b, size_t nb)
{
    char *s = malloc(na + nb + 1);

    REQUIRE(s != NULL);
    memcpy(s, a, na);
    memcpy(s + na, b, nb);
    s[na + nb] = '\0';
    return s;
}

/* The key of 'v', a variant of 'q' in one field, is not q's. */
static void
differs(const struct req *q, const struct fields *v)
{
    unsigned char k[FLIGHT_KEY_LEN];

    key_fields(v, "req-v", k);
    REQUIRE(memcmp(k, q->key, FLIGHT_KEY_LEN) != 0);
}

/*
 * Every one-field change of a request changes its key: the body one
 * byte longer, another path, credential, tenant or generation, and a
 * byte moved across the border of two adjacent fields (what the length
 * prefixes are for).  A random pair of requests rarely differs in one
 * field only, so the variants are made here.  Keys are computed for the
 * fields alone, JSON or not: the key must tell any two tuples apart.
 */
static void
check_variants(const struct req *q)
{
    struct fields f, v;
    size_t n;
    char *s, *t;

    fields_of(q, &f);
    v = f;
    s = join(f.body, f.body_len, " ", 1);
    v.body = s;
    v.body_len = f.body_len + 1;
    differs(q, &v);
    free(s);

    v = f;
    v.path = s = join(f.path, strlen(f.path), "x", 1);
    differs(q, &v);
    free(s);

    v = f;
    v.auth = f.auth != NULL ? NULL : "";    /* none and empty differ */
    differs(q, &v);
    if (f.auth != NULL) {
        v.auth = s = join(f.auth, strlen(f.auth), "x", 1);
        differs(q, &v);
        free(s);
    }

    v = f;
    v.tenant = s = join(f.tenant, strlen(f.tenant), "x", 1);
    differs(q, &v);
    free(s);

    v = f;
    v.generation = f.generation + 1;
    differs(q, &v);

    /* Borders: tenant|method, method|path, path|body, body|auth. */
    v = f;
    n = strlen(f.tenant);
    v.tenant = s = join(f.tenant, n - 1, "", 0);
    v.method = t = join(f.tenant + n - 1, 1, f.method, strlen(f.method));
    differs(q, &v);
    free(s);
    free(t);

    v = f;
    n = strlen(f.method);
    v.method = s = join(f.method, n - 1, "", 0);
    v.path = t = join(f.method + n - 1, 1, f.path, strlen(f.path));
    differs(q, &v);
    free(s);
    free(t);

    v = f;
    n = strlen(f.path);
    if (n > 0) {
        v.path = s = join(f.path, n - 1, "", 0);
        v.body = t = join(f.path + n - 1, 1, f.body, f.body_len);
        v.body_len = f.body_len + 1;
        differs(q, &v);
        free(s);
        free(t);
    }

    v = f;
    if (f.auth != NULL && f.body_len > 0 && f.body[f.body_len - 1] != '\0') {
        v.body_len = f.body_len - 1;
        v.auth = s = join(f.body + f.body_len - 1, 1, f.auth,
                          strlen(f.auth));
        differs(q, &v);
        free(s);
    }
}

/* One request alone: verdict and key, each checked. */
static void
judge(struct req *q, const struct gw_config *cfg)
{
    unsigned char again[FLIGHT_KEY_LEN];
    enum metrics_bypass why2 = METRICS_BYPASS_COUNT, ref_why = METRICS_BYPASS_COUNT;
    struct fields f;
    char *copy;

    q->why = METRICS_BYPASS_COUNT;
    q->eligible = coalesce_eligible(cfg, q->tenant, &q->r, q->json, &q->why);
    REQUIRE(q->eligible == 0 || q->eligible == 1);
    REQUIRE(q->eligible == coalesce_eligible(cfg, q->tenant, &q->r, q->json,
                                             &why2));
    REQUIRE(q->eligible == ref_eligible(cfg, q, &ref_why));
    if (!q->eligible)
        REQUIRE(q->why == ref_why && why2 == ref_why);

    fields_of(q, &f);
    key_fields(&f, "req-1", q->key);
    f.body = copy = dup_exact(q->body, q->body_len);    /* same text */
    key_fields(&f, "req-2", again);
    free(copy);
    REQUIRE(memcmp(q->key, again, FLIGHT_KEY_LEN) == 0);
    check_variants(q);
}

static int
str_eq(const char *a, const char *b)
{
    return a == NULL || b == NULL ? a == b : strcmp(a, b) == 0;
}

/* The same field lines, byte for byte, in the same order. */
static int
same_fields(const struct http_request *a, const struct http_request *b)
{
    if (a->num_headers != b->num_headers)
        return 0;
    for (size_t i = 0; i < a->num_headers; i++) {
        const struct http_header *x = &a->headers[i], *y = &b->headers[i];

        if (x->name_len != y->name_len || x->value_len != y->value_len
            || memcmp(x->name, y->name, x->name_len) != 0
            || memcmp(x->value, y->value, x->value_len) != 0)
            return 0;
    }
    return 1;
}

static void
compare(const struct req *a, const struct req *b)
{
    int same_target = a->generation == b->generation
                      && strcmp(a->tenant_name, b->tenant_name) == 0
                      && strcmp(a->path, b->path) == 0
                      && str_eq(a->auth, b->auth);
    int same_bytes = a->body_len == b->body_len
                     && memcmp(a->body, b->body, a->body_len) == 0;
    int canonical = json_equal(a->json, b->json);
    int same_key = memcmp(a->key, b->key, FLIGHT_KEY_LEN) == 0;

    /* The contract, as any policy must keep it. */
    REQUIRE(!same_key || (same_target && (same_bytes || canonical)));
    /* This policy: the raw body, nothing normalised. */
    REQUIRE(same_key == (same_target && same_bytes));
    /* The verdict depends on the tenant, the fields and the JSON value. */
    if (canonical && a->tenant == b->tenant && same_fields(&a->r, &b->r))
        REQUIRE(a->eligible == b->eligible && a->why == b->why);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct req a, b;             /* 2 KiB each: keep off the stack */
    static int seeded;
    const char *p = (const char *)data, *end = p + size, *nl, *sep;
    const struct gw_config *cfg;

    if (!seeded) {
        json_object_seed(1);            /* the same order on every run */
        seeded = 1;
    }
    if (size == 0)
        return 0;
    cfg = config_for(data[0]);
    nl = memchr(p, '\n', size);
    p = nl != NULL ? nl + 1 : end;
    if (p < end && end[-1] == '\n')
        end--;
    sep = memmem(p, (size_t)(end - p), FUZZ_SEP, strlen(FUZZ_SEP));
    read_req(&a, cfg, p, (size_t)((sep != NULL ? sep : end) - p));
    if (sep != NULL)
        read_req(&b, cfg, sep + strlen(FUZZ_SEP),
                 (size_t)(end - sep - strlen(FUZZ_SEP)));
    else
        read_req(&b, cfg, p, (size_t)(end - p));
    a.generation = 1;
    b.generation = data[0] & 8 ? 2 : 1;
    if (a.json != NULL)
        judge(&a, cfg);
    if (b.json != NULL)
        judge(&b, cfg);
    if (a.json != NULL && b.json != NULL)
        compare(&a, &b);
    req_release(&a);
    req_release(&b);
    return 0;
}
