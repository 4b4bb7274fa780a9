/* SPDX-License-Identifier: MIT */
/*
 * control.c - mock_upstream's control endpoints (control.h): the query
 * parameters they read, what POST /control changes in 'st', and the
 * counters they show or reset.
 */
#include "control.h"

#include <pthread.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "engine.h"
#include "http.h"
#include "mock.h"
#include "record.h"
#include "send.h"
#include "util.h"
#include "wait.h"

#define MOCK_METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* What GET /metrics answers (POST /control?metrics=...). */
enum metrics_mode {
    METRICS_ON = 0,             /* vLLM's current names */
    METRICS_OLD,                /* older vLLM's gpu_* names */
    METRICS_OFF,                /* 404: a server without the series */
};

static const char *const metrics_modes[] = { "on", "old", "off" };

static int
hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Find 'name' in the query of 'r' and percent-decode its value
 * (form-style: '+' is a space) into out[0..size).
 * Returns 0, GW_EINVAL (absent), GW_EPARSE (bad escape) or GW_ETOOBIG.
 */
static int
query_param(const struct http_request *r, const char *name, char *out,
            size_t size)
{
    const char *p = r->target + r->path_len;
    const char *end = r->target + r->target_len;
    const char *amp;
    size_t nl = strlen(name), k;
    int hi, lo;

    if (p == end || *p != '?')
        return GW_EINVAL;
    for (p++; p < end; p = amp + 1) {
        amp = memchr(p, '&', (size_t)(end - p));
        if (amp == NULL)
            amp = end;
        if ((size_t)(amp - p) <= nl || memcmp(p, name, nl) != 0
            || p[nl] != '=')
            continue;
        for (p += nl + 1, k = 0; p < amp; p++, k++) {
            if (k + 1 >= size)
                return GW_ETOOBIG;
            if (*p == '%') {
                if (amp - p < 3 || (hi = hex_val(p[1])) < 0
                    || (lo = hex_val(p[2])) < 0)
                    return GW_EPARSE;
                out[k] = (char)(hi * 16 + lo);
                p += 2;
            } else {
                out[k] = *p == '+' ? ' ' : *p;
            }
        }
        out[k] = '\0';
        return 0;
    }
    return GW_EINVAL;
}

/* One query parameter as a long in [lo, hi]; absent leaves *out. */
static int
control_param(struct req *q, const char *name, long lo, long hi, long *out)
{
    char v[32];
    long n;

    if (query_param(q->r, name, v, sizeof(v)) != 0 || v[0] == '\0')
        return 0;
    if (gw_parse_long(v, lo, hi, &n) != 0)
        return GW_EINVAL;
    *out = n;
    return 0;
}

void
control_set(struct req *q)
{
    long status, retry_after, health, every, ms, poison_status;
    long metrics_delay;
    char name[32], poison[MOCK_MAX_TAG + 1], mode_name[8];
    enum fault fault;
    size_t i;
    int bad = 0, rc, mode;

    mock_lock();
    status = st.force_status;
    retry_after = st.force_retry_after;
    health = st.health_status;
    every = st.slow_every;
    ms = st.slow_ms;
    fault = (enum fault)st.force_fault;
    memcpy(poison, st.poison, sizeof(poison));
    poison_status = st.poison_status;
    mode = st.metrics_mode;
    metrics_delay = st.metrics_delay_ms;
    mock_unlock();
    rc = query_param(q->r, "metrics", mode_name, sizeof(mode_name));
    bad |= rc != 0 && rc != GW_EINVAL;
    if (rc == 0) {
        for (i = 0; i < GW_ARRAY_LEN(metrics_modes)
                    && strcmp(mode_name, metrics_modes[i]) != 0; i++)
            ;
        bad |= i == GW_ARRAY_LEN(metrics_modes);
        mode = (int)i;
    }
    if (query_param(q->r, "fault", name, sizeof(name)) == 0) {
        fault = mock_fault_parse(name);
        bad |= fault == FAULT_NONE && strcmp(name, "none") != 0;
    }
    /* An empty marker turns it off.  Printable ASCII only: it is
     * matched with memmem() and echoed in the JSON answer. */
    rc = query_param(q->r, "poison", poison, sizeof(poison));
    bad |= rc != 0 && rc != GW_EINVAL;
    for (i = 0; rc == 0 && poison[i] != '\0'; i++)
        bad |= poison[i] < 0x20 || poison[i] > 0x7e;
    bad |= control_param(q, "status", 0, 599, &status);
    bad |= control_param(q, "retry_after", 0, 3600, &retry_after);
    bad |= control_param(q, "health", 0, 599, &health);
    bad |= control_param(q, "slow_every", 0, 1000000, &every);
    bad |= control_param(q, "slow_ms", 0, MOCK_MAX_MS, &ms);
    bad |= control_param(q, "poison_status", 400, 599, &poison_status);
    bad |= control_param(q, "metrics_delay_ms", 0, MOCK_MAX_MS,
                         &metrics_delay);
    if (bad || (status != 0 && status < 200)
        || (health != 0 && health < 200)) {
        send_error(q, 400, "use POST /control?status=S&retry_after=N&"
                   "health=S&slow_every=N&slow_ms=MS&fault=F&poison=M&"
                   "poison_status=P&metrics=on|old|off&metrics_delay_ms=MS "
                   "(S 0 or 200..599, F a mock_fault or none, M at most 256 "
                   "printable ASCII bytes, P 400..599)", NULL,
                   "invalid_control");
        return;
    }
    mock_lock();
    st.force_status = status;
    st.force_retry_after = retry_after;
    st.health_status = health;
    st.slow_every = every;
    st.slow_ms = ms;
    st.force_fault = (int)fault;
    memcpy(st.poison, poison, sizeof(poison));
    st.poison_status = poison_status;
    st.metrics_mode = mode;
    st.metrics_delay_ms = metrics_delay;
    mock_unlock();
    send_json(q, 200, json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:s, "
                                "s:i}",
                                "status", (int)status, "retry_after",
                                (int)retry_after, "health", (int)health,
                                "slow_every", (int)every, "slow_ms", (int)ms,
                                "poison", poison, "poison_status",
                                (int)poison_status, "metrics",
                                metrics_modes[mode], "metrics_delay_ms",
                                (int)metrics_delay), 0);
}

void
control_metrics(struct req *q)
{
    struct buf *b = &q->c->out;
    struct engine_stats s;
    long delay;
    int mode;

    memset(&s, 0, sizeof(s));
    mock_lock();
    mode = st.metrics_mode;
    delay = st.metrics_delay_ms;
    s.running = st.completing;
    mock_unlock();
    if (delay > 0 && wait_client(q, delay) != 0)
        return;
    if (mode == METRICS_OFF) {
        send_not_found(q);
        return;
    }
    if (engine != NULL)
        engine_snapshot(engine, &s);
    else
        s.created = start_time;
    buf_reset(b);
    if (engine_metrics(b, &s, opt.num_models > 0 ? opt.models[0]
                                                 : MOCK_MODEL,
                       mode == METRICS_OLD ? ENGINE_NAMES_OLD
                                           : ENGINE_NAMES_CURRENT) != 0
        || (engine != NULL && engine_lora_metrics(engine, b) != 0)) {
        send_error(q, 500, "mock: cannot build the response", NULL,
                   "internal_error");
        return;
    }
    send_simple(q, 200, MOCK_METRICS_TYPE, buf_ptr(b), buf_len(b));
}

/*
 * The adapters in a GPU slot now, least recently used first, and the
 * loads since the start or the last reset: for GET /stats.
 */
static json_t *
lora_resident_new(uint64_t *loads)
{
    struct engine_lora_card *cards, t;
    struct engine_stats s;
    json_t *a = json_array();
    size_t n, i, j;

    *loads = 0;
    if (engine == NULL)
        return a;
    engine_snapshot(engine, &s);
    *loads = s.lora_loads;
    cards = gw_calloc(LORA_MAX, sizeof(*cards));
    n = cards != NULL ? engine_lora_cards(engine, cards, LORA_MAX) : 0;
    for (i = 1; i < n; i++) {           /* by 'used', a few hundred */
        t = cards[i];
        for (j = i; j > 0 && cards[j - 1].used > t.used; j--)
            cards[j] = cards[j - 1];
        cards[j] = t;
    }
    for (i = 0; a != NULL && i < n; i++)
        if (cards[i].resident)
            json_array_append_new(a, json_string(cards[i].name));
    gw_free(cards);
    return a;
}

void
control_stats(struct req *q)
{
    uint64_t v[11], loads;
    json_t *hdrs, *body, *resident = lora_resident_new(&loads);

    mock_lock();
    v[0] = st.requests;
    v[1] = st.completions;
    v[2] = st.connections_open;
    v[3] = st.connections_total;
    v[4] = st.aborted;
    v[5] = st.in_progress;
    v[6] = st.held;
    v[7] = st.probes;
    v[8] = st.prefix_hits;
    v[9] = st.prefix_misses;
    v[10] = st.gated;
    hdrs = json_deep_copy(st.last_headers);
    body = st.last_body != NULL ? json_deep_copy(st.last_body) : json_null();
    mock_unlock();
    send_json(q, 200, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                                "s:I, s:I, s:I, s:o, s:o, s:I, s:o}",
                                "probes", (json_int_t)v[7],
                                "prefix_hits", (json_int_t)v[8],
                                "prefix_misses", (json_int_t)v[9],
                                "requests", (json_int_t)v[0],
                                "completions", (json_int_t)v[1],
                                "connections_open", (json_int_t)v[2],
                                "connections_total", (json_int_t)v[3],
                                "aborted", (json_int_t)v[4],
                                "in_progress", (json_int_t)v[5],
                                "held", (json_int_t)v[6],
                                "gated", (json_int_t)v[10],
                                "last_headers", hdrs,
                                "last_body", body,
                                "lora_loads", (json_int_t)loads,
                                "lora_resident", resident), 0);
}

void
control_reset(struct req *q)
{
    json_t *fresh = json_object(), *old, *old_body;
    struct rec_entry *ring = gw_calloc(MOCK_REC_MAX, sizeof(*ring));
    struct rec_entry *old_ring;
    size_t old_head, old_count;

    if (fresh == NULL || ring == NULL) {
        json_decref(fresh);
        gw_free(ring);
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
        return;
    }
    mock_lock();
    st.requests = 0;
    st.completions = 0;
    st.connections_total = 0;
    st.aborted = 0;
    st.probes = 0;
    st.prefix_hits = 0;
    st.prefix_misses = 0;
    st.completion_seq = 0;
    memset(st.prefixes, 0, MOCK_PREFIX_SLOTS * sizeof(*st.prefixes));
    st.num_prefixes = 0;
    st.stored_next = st.stored_count = 0;
    json_object_clear(st.released);
    json_object_clear(st.gates);
    old = st.last_headers;
    st.last_headers = fresh;
    old_body = st.last_body;
    st.last_body = NULL;
    old_ring = st.rec;
    old_head = st.rec_head;
    old_count = st.rec_count;
    st.rec = ring;
    st.rec_head = 0;
    st.rec_count = 0;
    st.rec_bytes = 0;
    st.rec_dropped = 0;
    mock_unlock();
    if (engine != NULL)
        engine_reset(engine);   /* its own lock, never under st.mu */
    json_decref(old);
    json_decref(old_body);
    record_free(old_ring, old_head, old_count);
    send_json(q, 200, json_pack("{s:b}", "reset", 1), 0);
}

void
control_release(struct req *q)
{
    char tag[MOCK_MAX_TAG + 1];
    struct holder *h;
    json_int_t n = 0;
    int rc;

    rc = query_param(q->r, "tag", tag, sizeof(tag));
    if (rc != 0 || tag[0] == '\0' || strlen(tag) > MOCK_MAX_TAG) {
        send_error(q, 400, "use POST /release?tag=T with a tag of 1 to 256 "
                   "bytes", "tag", "invalid_tag");
        return;
    }
    mock_lock();
    /* Keys must be UTF-8: a tag that is not cannot match a JSON string. */
    rc = json_object_set_new(st.released, tag, json_true());
    for (h = st.holders; rc == 0 && h != NULL; h = h->next) {
        if (!h->released && strcmp(h->tag, tag) == 0) {
            h->released = 1;
            n++;
        }
    }
    pthread_cond_broadcast(&st.cv);
    mock_unlock();
    if (rc != 0) {
        send_error(q, 400, "tag must be UTF-8", "tag", "invalid_tag");
        return;
    }
    send_json(q, 200, json_pack("{s:I}", "released", n), 0);
}

void
control_gate(struct req *q)
{
    char tag[MOCK_MAX_TAG + 1], num[24];
    json_int_t open = 0, gated = 0;
    long chunks;
    int rc;

    rc = query_param(q->r, "tag", tag, sizeof(tag));
    if (rc != 0 || tag[0] == '\0' || strlen(tag) > MOCK_MAX_TAG) {
        send_error(q, 400, "use POST /gate?tag=T&chunks=N with a tag of 1 "
                   "to 256 bytes", "tag", "invalid_tag");
        return;
    }
    if (query_param(q->r, "chunks", num, sizeof(num)) != 0
        || gw_parse_long(num, 0, MOCK_MAX_CHUNKS, &chunks) != 0) {
        send_error(q, 400, "use POST /gate?tag=T&chunks=N with N from 0 to "
                   "100000", "chunks", "invalid_chunks");
        return;
    }
    mock_lock();
    open = wait_gate_open_locked(tag);
    rc = 0;
    if (chunks > open) {
        /* Keys must be UTF-8, as /release's. */
        rc = json_object_set_new(st.gates, tag, json_integer(chunks));
        if (rc == 0)
            open = chunks;
    }
    gated = (json_int_t)st.gated;
    pthread_cond_broadcast(&st.cv);
    mock_unlock();
    if (rc != 0) {
        send_error(q, 400, "tag must be UTF-8", "tag", "invalid_tag");
        return;
    }
    send_json(q, 200, json_pack("{s:I, s:I}", "gate", open, "gated", gated),
              0);
}
