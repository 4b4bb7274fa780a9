/* SPDX-License-Identifier: MIT */
/*
 * check_lora.c - unit tests for gateway/fleet/lora.c (an upstream's LoRA
 * adapters: vllm:lora_requests_info read, the calls sent since, where an
 * adapter is resident or has room) and for the pool's rule for a call
 * for an adapter (pool_lora.c, pool.h "LoRA adapters").
 *
 * The reading is tested on a table of texts, hostile ones included
 * (names too long, too many, control bytes, a mebibyte label, every
 * allocation failing in turn), each from a copy that ends at a guard
 * page.  The rule is tested through the pool's own API, as the load
 * beat and the health beat feed it: each preference group, the balance
 * within one, a stale scrape, lora_aware = off, a base model on a LoRA
 * fleet, an adapter routed by its parent, and the loads it counts.
 */
#include <check.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "base/config.h"
#include "buf.h"
#include "fleet/engine.h"
#include "fleet/lora.h"
#include "fleet/pool.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so texts may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

#define INFO "vllm:lora_requests_info"
#define NAMES_MAX 8

/* Read text[0..len) from a guarded copy into *r. */
static int
read_guarded(const char *text, size_t len, struct lora_report *r)
{
    char *copy = guarded_copy(text, len);
    int rc = lora_report_read(len > 0 ? copy : NULL, len, r);

    guarded_free(copy, len);
    return rc;
}

struct read_case {
    const char *text;
    size_t len;
    int rc;
    uint64_t max_lora;
    const char *running[NAMES_MAX];     /* NULL-ended */
    const char *waiting[NAMES_MAX];
    size_t dropped;
    const char *note;
};

static const struct read_case read_cases[] = {
    { S("# HELP " INFO " Running stats on lora requests.\n# TYPE " INFO
        " gauge\n" INFO "{max_lora=\"4\",running_lora_adapters=\"sql,chat\","
        "waiting_lora_adapters=\"math\"} 1.7562292345678e+09\n"),
      0, 4, { "sql", "chat" }, { "math" }, 0, "vLLM's gauge" },
    { S(INFO "{max_lora=\"2\",running_lora_adapters=\"old\","
        "waiting_lora_adapters=\"\"} 1.70e+09\n"
        INFO "{max_lora=\"2\",running_lora_adapters=\"\","
        "waiting_lora_adapters=\"\"} 1.71e+09\n"
        INFO "{max_lora=\"2\",running_lora_adapters=\"older\","
        "waiting_lora_adapters=\"w\"} 1.69e+09\n"),
      0, 2, { NULL }, { NULL }, 0, "the latest: nothing runs now" },
    { S("vllm:num_requests_running{engine=\"0\"} 1.0\n"), GW_ENOTFOUND, 0,
      { NULL }, { NULL }, 0, "a server without LoRA" },
    { S(INFO "{max_lora=\"2\",running_lora_adapters=\"a\"} 1\n"), GW_EPARSE,
      0, { NULL }, { NULL }, 0, "a label missing" },
    { S(INFO "{max_lora=\"x\",running_lora_adapters=\"a\","
        "waiting_lora_adapters=\"\"} 1\n"), GW_EPARSE, 0, { NULL }, { NULL },
      0, "max_lora not a number" },
    { S(INFO "{max_lora=\"-1\",running_lora_adapters=\"a\","
        "waiting_lora_adapters=\"\"} 1\n"), GW_EPARSE, 0, { NULL }, { NULL },
      0, "max_lora negative" },
    { S(INFO "{max_lora=\"1000001\",running_lora_adapters=\"\","
        "waiting_lora_adapters=\"\"} 1\n"), GW_EPARSE, 0, { NULL }, { NULL },
      0, "max_lora past LORA_MAX_LORA" },
    { S(INFO "{max_lora=\"1\",running_lora_adapters=\"a\","
        "waiting_lora_adapters=\"\"} 2\n" INFO "{max_lora=\"1\"} NaN\n"),
      GW_EPARSE, 0, { NULL }, { NULL }, 0,
      "a malformed line: it may have been the latest" },
    { S(INFO "{max_lora=\"3\",running_lora_adapters=\",a,,b,\","
        "waiting_lora_adapters=\",\"} 1\n"),
      0, 3, { "a", "b" }, { NULL }, 0, "empty pieces are no names" },
    { S(INFO "{max_lora=\"3\",running_lora_adapters=\"q\\\"x,b\\\\s\","
        "waiting_lora_adapters=\"nl\\nx,ok\"} 1\n"),
      0, 3, { "q\"x", "b\\s" }, { "ok" }, 1,
      "escapes read; a newline in a name drops it" },
    { S(INFO "{max_lora=\"3\",running_lora_adapters=\"a\tb,c\","
        "waiting_lora_adapters=\"d\0e,f\"} 1\n"),
      0, 3, { "c" }, { "f" }, 2, "control bytes and NUL drop a name" },
    { S(INFO "{waiting_lora_adapters=\"w\",max_lora=\"0\","
        "running_lora_adapters=\"r\"} 1\r\n"),
      0, 0, { "r" }, { "w" }, 0, "labels in any order, CRLF" },
};

/* 'r''s names [from, from + n) are want[0..) (NULL-ended). */
static void
assert_names(const struct lora_report *r, size_t from, size_t n,
             const char *const *want, const char *note)
{
    size_t k = 0;

    while (k < NAMES_MAX && want[k] != NULL)
        k++;
    ck_assert_msg(n == k, "%s: %zu names, want %zu", note, n, k);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(strcmp(lora_report_name(r, from + i), want[i]) == 0,
                      "%s: name %zu is \"%s\"", note, i,
                      lora_report_name(r, from + i));
        ck_assert(r->hash[from + i] == lora_hash(want[i]));
    }
}

START_TEST(test_read_table)
{
    const struct read_case *c = &read_cases[_i];
    struct lora_report r;
    int rc = read_guarded(c->text, c->len, &r);

    ck_assert_msg(rc == c->rc, "%s: rc %d", c->note, rc);
    if (rc != 0) {
        ck_assert(r.names == NULL && r.num_running == 0
                  && r.num_waiting == 0);
        return;
    }
    ck_assert_msg(r.max_lora == c->max_lora, "%s: max_lora %llu", c->note,
                  (unsigned long long)r.max_lora);
    assert_names(&r, 0, r.num_running, c->running, c->note);
    assert_names(&r, r.num_running, r.num_waiting, c->waiting, c->note);
    ck_assert_msg(r.dropped == c->dropped, "%s: dropped %zu", c->note,
                  r.dropped);
    lora_report_release(&r);
}
END_TEST

/* A line of the gauge whose running list is 'running'. */
static void
gauge_line(struct buf *b, const char *running)
{
    ck_assert_int_eq(buf_printf(b, INFO "{max_lora=\"8\","
                                "running_lora_adapters=\"%s\","
                                "waiting_lora_adapters=\"\"} 1\n", running),
                     0);
}

/* Bounds: a name of LORA_NAME_MAX bytes is kept, one more is not; past
 * LORA_MAX_ADAPTERS names the rest are counted, not kept. */
START_TEST(test_read_bounds)
{
    char name[LORA_NAME_MAX + 2], list[200 * 8];
    struct lora_report r;
    struct buf b;
    size_t len = 0;

    buf_init(&b, 1 << 20);
    memset(name, 'n', sizeof(name));
    name[LORA_NAME_MAX] = '\0';
    gauge_line(&b, name);
    ck_assert_int_eq(read_guarded(buf_ptr(&b), buf_len(&b), &r), 0);
    ck_assert(r.num_running == 1 && r.dropped == 0);
    ck_assert_uint_eq(strlen(lora_report_name(&r, 0)), LORA_NAME_MAX);
    lora_report_release(&r);

    buf_reset(&b);
    name[LORA_NAME_MAX] = 'n';
    name[LORA_NAME_MAX + 1] = '\0';
    gauge_line(&b, name);
    ck_assert_int_eq(read_guarded(buf_ptr(&b), buf_len(&b), &r), 0);
    ck_assert(r.num_running == 0 && r.dropped == 1);
    lora_report_release(&r);

    for (int i = 0; i < 100; i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%sa%d",
                                i > 0 ? "," : "", i);
    buf_reset(&b);
    gauge_line(&b, list);
    ck_assert_int_eq(read_guarded(buf_ptr(&b), buf_len(&b), &r), 0);
    ck_assert_uint_eq(r.num_running, LORA_MAX_ADAPTERS);
    ck_assert_uint_eq(r.dropped, 100 - LORA_MAX_ADAPTERS);
    ck_assert_str_eq(lora_report_name(&r, LORA_MAX_ADAPTERS - 1), "a63");
    lora_report_release(&r);
    buf_release(&b);
}
END_TEST

/* A mebibyte-long label value is read once and copies nothing big: its
 * one name is too long, dropped; the short one after it is kept. */
START_TEST(test_read_huge_label)
{
    const size_t big = 1 << 20;
    struct lora_report r;
    struct buf b;

    buf_init(&b, 2 * big);
    ck_assert_int_eq(buf_append_str(&b, INFO "{max_lora=\"4\","
                                    "running_lora_adapters=\""), 0);
    for (size_t i = 0; i < big / 16; i++)
        ck_assert_int_eq(buf_append(&b, "xxxxxxxxxxxxxxxx", 16), 0);
    ck_assert_int_eq(buf_append_str(&b, ",short\",waiting_lora_adapters="
                                    "\"\"} 1\n"), 0);
    ck_assert_int_eq(read_guarded(buf_ptr(&b), buf_len(&b), &r), 0);
    ck_assert(r.num_running == 1 && r.dropped == 1);
    ck_assert_str_eq(lora_report_name(&r, 0), "short");
    lora_report_release(&r);
    buf_release(&b);
}
END_TEST

/* Every allocation failing in turn: GW_ENOMEM and an empty report. */
START_TEST(test_read_out_of_memory)
{
    static const char text[] =
        INFO "{max_lora=\"4\",running_lora_adapters=\"a,b,c\","
        "waiting_lora_adapters=\"d\"} 1\n";
    struct lora_report r;
    int rc;

    for (long n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = lora_report_read(text, sizeof(text) - 1, &r);
        alloc_fail_after(0, 0);
        if (rc == 0) {
            ck_assert(r.num_running == 3 && r.num_waiting == 1);
            lora_report_release(&r);
            break;
        }
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert(r.names == NULL && r.num_running == 0);
        ck_assert(n < 100);
    }
}
END_TEST

/* ---- one upstream's adapters (lora_fit) ---- */

/* A report of 'running' and 'waiting' (comma lists) under max_lora. */
static struct lora_report
report_of(uint64_t max_lora, const char *running, const char *waiting)
{
    struct lora_report r;
    struct buf b;

    buf_init(&b, 4096);
    ck_assert_int_eq(buf_printf(&b, INFO "{max_lora=\"%llu\","
                                "running_lora_adapters=\"%s\","
                                "waiting_lora_adapters=\"%s\"} 1\n",
                                (unsigned long long)max_lora, running,
                                waiting), 0);
    ck_assert_int_eq(lora_report_read(buf_ptr(&b), buf_len(&b), &r), 0);
    buf_release(&b);
    return r;
}

/* Set 'l' to the report, as a scrape sent at call number 'mark'. */
static void
set(struct lora_load *l, uint64_t max_lora, const char *running,
    const char *waiting, uint64_t mark)
{
    struct lora_report r = report_of(max_lora, running, waiting), old;
    struct engine_mark sent = { mark, 0 };

    lora_set(l, &r, &sent, &old);
    lora_report_release(&old);
}

START_TEST(test_fit)
{
    struct lora_load l;
    struct lora_report old;

    memset(&l, 0, sizeof(l));
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_UNKNOWN);
    set(&l, 2, "a", "b", 0);
    ck_assert_int_eq(lora_fit(&l, 0, lora_hash("a")), LORA_UNKNOWN);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_RESIDENT);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("b")), LORA_RESIDENT);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_ROOM);
    set(&l, 2, "a,b", "", 0);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_NEITHER);
    /* A failed scrape: nothing known. */
    lora_set(&l, NULL, NULL, &old);
    lora_report_release(&old);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_UNKNOWN);
    lora_report_release(&l.last);
}
END_TEST

/*
 * Calls sent since the scrape count as running there until a scrape
 * sent after them; a load is counted where the adapter was not
 * resident and the report fresh, and only there.
 */
START_TEST(test_sent_since)
{
    struct lora_load l;

    memset(&l, 0, sizeof(l));
    set(&l, 2, "a", "", 0);
    lora_note_call(&l, 1, lora_hash("b"), 1);       /* room: loads b */
    ck_assert_uint_eq(l.loads, 1);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("b")), LORA_RESIDENT);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_NEITHER);
    lora_note_call(&l, 1, lora_hash("b"), 2);       /* resident now */
    lora_note_call(&l, 1, lora_hash("a"), 3);
    ck_assert_uint_eq(l.loads, 1);
    lora_note_call(&l, 1, lora_hash("c"), 4);       /* neither: loads c */
    lora_note_call(&l, 0, lora_hash("d"), 5);       /* not fresh: unknown */
    ck_assert_uint_eq(l.loads, 2);
    /* A scrape sent after calls 1..3 went out: c and d stay noted, and
     * count as running (two of max_lora three, then of two); a slot of
     * the three is free. */
    set(&l, 3, "", "", 3);
    ck_assert_uint_eq(l.num_sent, 2);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("e")), LORA_FREE);
    set(&l, 2, "", "", 3);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("e")), LORA_NEITHER);
    set(&l, 2, "c", "", 5);
    ck_assert_uint_eq(l.num_sent, 0);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("e")), LORA_ROOM);
    /* The ring keeps the newest LORA_SENT_MAX, in order: the x's go
     * with the scrape sent after them, the y's count as running. */
    for (uint64_t i = 0; i < 3 * LORA_SENT_MAX; i++)
        lora_note_call(&l, 1, i < 2 * LORA_SENT_MAX ? lora_hash("x")
                                                    : lora_hash("y"),
                       6 + i);
    ck_assert_uint_eq(l.num_sent, LORA_SENT_MAX);
    set(&l, 2, "", "", 6 + 2 * LORA_SENT_MAX);
    ck_assert_uint_eq(l.num_sent, LORA_SENT_MAX - 1);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("z")), LORA_ROOM);
    set(&l, 2, "w", "", 6 + 2 * LORA_SENT_MAX);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("z")), LORA_NEITHER);
    lora_report_release(&l.last);
}
END_TEST

/*
 * The slots: an adapter seen running, waiting or sent stays resident
 * while idle, until max_lora others came after it (vLLM's LRU).
 */
START_TEST(test_slots)
{
    struct lora_load l;
    struct lora_report old;

    memset(&l, 0, sizeof(l));
    set(&l, 2, "a", "", 0);
    set(&l, 2, "", "", 0);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_RESIDENT);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("b")), LORA_FREE);
    set(&l, 2, "b", "", 0);
    set(&l, 2, "", "c", 0);                 /* c waits: it will run */
    set(&l, 2, "", "", 0);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_ROOM);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("b")), LORA_RESIDENT);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_RESIDENT);
    lora_note_call(&l, 1, lora_hash("a"), 1);   /* a loads: b goes */
    ck_assert_uint_eq(l.loads, 1);
    set(&l, 2, "", "", 1);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("b")), LORA_ROOM);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_RESIDENT);
    set(&l, 1, "", "", 1);                  /* one slot now: a's */
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("c")), LORA_ROOM);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_RESIDENT);
    /* A failed scrape knows nothing; the next good one finds them. */
    lora_set(&l, NULL, NULL, &old);
    lora_report_release(&old);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_UNKNOWN);
    set(&l, 1, "", "", 1);
    ck_assert_int_eq(lora_fit(&l, 1, lora_hash("a")), LORA_RESIDENT);
    lora_report_release(&l.last);
}
END_TEST

/* ---- the pool's rule ---- */

static struct gw_config cfg;
static struct pool *pool;

/*
 * Three upstreams u0..u2 serving "base"; 'routing' added to [routing],
 * 'per' to each [upstream].
 */
static void
make_pool_with(const char *routing, const char *per)
{
    char text[2048], err[256];
    int len;

    len = snprintf(text, sizeof(text), "[routing]\nhealth_interval = 0\n"
                   "max_waiting = 1000\n%s", routing);
    for (int i = 0; i < 3; i++)
        len += snprintf(text + len, sizeof(text) - (size_t)len,
                        "[upstream u%d]\nurl = http://127.0.0.1:%d\n"
                        "models = base\n%s", i, 9000 + i, per);
    ck_assert_msg(config_load_text("t.conf", text, &cfg, err,
                                   sizeof(err)) == 0, "%s", err);
    pool = pool_new(&cfg);
    ck_assert_ptr_nonnull(pool);
}

static void
make_pool(const char *routing)
{
    make_pool_with(routing, "");
}

static void
teardown(void)
{
    pool_free(pool);
    pool = NULL;
    config_release(&cfg);
}

/* Upstream idx's GET /v1/models: "base", and each adapter (a
 * comma list) with "base" as its parent. */
static void
models(size_t idx, const char *adapters)
{
    char **ids = gw_calloc(16, sizeof(*ids));
    char **parents = gw_calloc(16, sizeof(*parents));
    char **texts = gw_calloc(16, sizeof(*texts));
    char list[256], *tok, *save = NULL;
    size_t n = 0;

    ck_assert(ids != NULL && parents != NULL && texts != NULL);
    ids[n] = gw_strdup("base");
    texts[n++] = gw_strdup("{\"id\":\"base\"}");
    snprintf(list, sizeof(list), "%s", adapters);
    for (tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        ids[n] = gw_strdup(tok);
        parents[n] = gw_strdup("base");
        texts[n++] = gw_strdup("{}");
    }
    pool_set_models(pool, idx, ids, parents, texts, n);
}

/* Upstream idx's scrape: its adapters, and 'load' waiting requests. */
static void
scrape(size_t idx, uint64_t max_lora, const char *running,
       const char *waiting, double load)
{
    struct lora_report r = report_of(max_lora, running, waiting);
    const struct engine_report e = { load, 0, 0.1 };
    const struct engine_mark sent = pool_load_mark(pool, idx);

    pool_set_lora(pool, idx, &r, &sent);
    pool_set_load(pool, idx, &e, &sent);
}

/* 'n' calls for 'model', each given back at once; how many went to
 * each upstream. */
static void
calls(const char *model, int n, int got[3])
{
    struct pool_want w = { .model = model, .tenant = CONFIG_MAX_TENANTS };
    struct pool_slot s;
    int ra;

    got[0] = got[1] = got[2] = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
        got[s.idx]++;
        pool_give_back(pool, &s, POOL_OK, 0);
    }
}

/* The loads the gateway caused on upstream idx (the status view's). */
static uint64_t
loads(size_t idx)
{
    struct pool_upstream_status st[3];

    ck_assert_uint_eq(pool_status(pool, st, 3), 3);
    return st[idx].lora_loads;
}

/* One upstream's scrape in a rule case. */
struct up_case {
    uint64_t max_lora;
    const char *running, *waiting;
    double load;                /* waiting requests: least_load's score */
    const char *earlier;        /* ran before that scrape (NULL: none) */
};

struct rule_case {
    const char *note;
    const char *adapters;       /* every upstream's /v1/models lists them */
    struct up_case up[3];
    const char *model;          /* the calls' */
    int calls;                  /* made one after the other */
    int want[3];                /* calls each upstream gets; -1: any */
    uint64_t loads;             /* counted in all */
};

static const struct rule_case rule_cases[] = {
    { "resident first: a1 runs on u1 alone, the most loaded: all there, "
      "and no load", "a1,a2,a3",
      { { 4, "", "", 0, NULL }, { 4, "a2", "a1", 5, NULL },
        { 4, "", "", 0, NULL } },
      "a1", 20, { 0, 20, 0 }, 0 },
    { "room next: u0 and u2 run max_lora others, u1 has room though the "
      "most loaded: all there, one load, then it is resident", "a1,a2,a3,a4",
      { { 2, "a1,a2", "", 0, NULL }, { 2, "a1", "", 6, NULL },
        { 2, "a2,a4", "", 1, NULL } },
      "a3", 10, { 0, 10, 0 }, 1 },
    { "at max_lora everywhere, by load: two choices among three, so the "
      "lighter of a pair, never the heaviest", "a1,a2,a3,a4,a5",
      { { 1, "a1", "", 9, NULL }, { 1, "a2", "", 0, NULL },
        { 1, "a4", "", 3, NULL } },
      "a5", 1, { 0, -1, -1 }, 1 },
    { "load within a group: resident on u0 and u1, the lighter of the "
      "two, never u2", "a1",
      { { 4, "a1", "", 7, NULL }, { 4, "", "a1", 2, NULL },
        { 4, "", "", 0, NULL } },
      "a1", 10, { 0, 10, 0 }, 0 },
    { "a free slot before room: u0's two slots hold idle adapters, u1 "
      "the most loaded has one free, u2 none", "a1,a2,a3,a4,a5",
      { { 2, "", "", 0, "a1,a2" }, { 2, "a3", "", 5, NULL },
        { 1, "a4", "", 0, NULL } },
      "a5", 5, { 0, 5, 0 }, 1 },
    { "idle but in a slot is resident: a1 ran on u2 and is idle there; "
      "u0 and u1 have free slots", "a1,a2",
      { { 4, "", "", 0, NULL }, { 4, "a2", "", 0, NULL },
        { 4, "", "", 3, "a1" } },
      "a1", 5, { 0, 0, 5 }, 0 },
};

/* Each upstream scraped as up[0..3) (what ran earlier first). */
static void
scrape_all(const struct up_case *up)
{
    for (size_t i = 0; i < 3; i++) {
        if (up[i].earlier != NULL)
            scrape(i, up[i].max_lora, up[i].earlier, "", 0);
        scrape(i, up[i].max_lora, up[i].running, up[i].waiting, up[i].load);
    }
}

/* The pool with 'routing', each upstream listing 'adapters', scraped. */
static void
fleet_of(const char *routing, const char *adapters, const struct up_case *up)
{
    make_pool(routing);
    for (size_t i = 0; i < 3; i++)
        models(i, adapters);
    scrape_all(up);
}

START_TEST(test_rule_table)
{
    const struct rule_case *c = &rule_cases[_i];
    int got[3];

    fleet_of("", c->adapters, c->up);
    calls(c->model, c->calls, got);
    for (size_t i = 0; i < 3; i++)
        ck_assert_msg(c->want[i] < 0 || got[i] == c->want[i],
                      "%s: got %d %d %d", c->note, got[0], got[1], got[2]);
    ck_assert_msg(loads(0) + loads(1) + loads(2) == c->loads,
                  "%s: %llu loads", c->note,
                  (unsigned long long)(loads(0) + loads(1) + loads(2)));
    teardown();
}
END_TEST

/*
 * Six calls held at once, balanced by load alone (open calls, power of
 * two choices): none gets more than three, whatever is resident where.
 */
static void
assert_spread(const int got[3])
{
    ck_assert_msg(got[0] <= 3 && got[1] <= 3 && got[2] <= 3,
                  "not by load alone: %d %d %d", got[0], got[1], got[2]);
}

/* Held calls (not given back) for 'model': how many each upstream got. */
static void
held_calls(const char *model, int n, int got[3], struct pool_slot *s)
{
    struct pool_want w = { .model = model, .tenant = CONFIG_MAX_TENANTS };
    int ra;

    got[0] = got[1] = got[2] = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(pool_acquire(pool, &w, &s[i], &ra), 0);
        got[s[i].idx]++;
    }
}

static void
give_back_all(struct pool_slot *s, int n)
{
    for (int i = 0; i < n; i++)
        pool_give_back(pool, &s[i], POOL_OK, 0);
}

/* Fresh, the calls go where a1 is; past load_stale the scrape says
 * nothing: by load alone (the open calls, as least_inflight), so held
 * calls spread over the three. */
/* a1 runs on u0; the three equally loaded. */
static const struct up_case on_u0[3] = {
    { 4, "a1", "", 0, NULL }, { 4, "", "", 0, NULL }, { 4, "", "", 0, NULL },
};

START_TEST(test_stale_is_load_alone)
{
    struct pool_slot s[6];
    int got[3];

    fleet_of("load_stale = 200ms\n", "a1", on_u0);
    held_calls("a1", 6, got, s);
    ck_assert_int_eq(got[0], 6);            /* fresh: where it is */
    give_back_all(s, 6);
    usleep(300000);
    held_calls("a1", 6, got, s);
    assert_spread(got);
    give_back_all(s, 6);
    teardown();
}
END_TEST

/* lora_aware = off: by load alone too, but the loads are still counted. */
START_TEST(test_off)
{
    struct pool_slot s[6];
    int got[3];

    fleet_of("lora_aware = off\n", "a1", on_u0);
    held_calls("a1", 6, got, s);
    assert_spread(got);
    ck_assert_uint_eq(loads(0), 0);
    /* The first call to each of u1 and u2 loads it; then it was sent. */
    ck_assert_uint_eq(loads(1) + loads(2), (got[1] > 0) + (got[2] > 0));
    give_back_all(s, 6);
    teardown();
}
END_TEST

/* A base model on a LoRA fleet is no adapter: by load, and no loads. */
START_TEST(test_base_model)
{
    static const struct up_case up[3] = {
        { 1, "a1", "", 0, NULL }, { 1, "a1", "", 0, NULL },
        { 1, "", "", 0, NULL },
    };
    struct pool_slot s[6];
    int got[3];

    fleet_of("", "a1", up);
    held_calls("base", 6, got, s);
    assert_spread(got);
    ck_assert(loads(0) + loads(1) + loads(2) == 0);
    give_back_all(s, 6);
    teardown();
}
END_TEST

/* An upstream whose config lists "base" serves an adapter of base that
 * its GET /v1/models names, from that answer on, and only it. */
START_TEST(test_routed_by_parent)
{
    struct pool_admission adm;
    struct buf b;
    int got[3];

    make_pool("");
    for (size_t i = 0; i < 3; i++)
        models(i, "");
    ck_assert(!pool_serves(pool, "late", &adm));
    models(2, "late");
    ck_assert(pool_serves(pool, "late", &adm));
    ck_assert_uint_eq(adm.set, 4);
    calls("late", 3, got);
    ck_assert_int_eq(got[2], 3);
    /* And the gateway's /v1/models lists it, as u2 did. */
    buf_init(&b, 1 << 16);
    ck_assert_int_eq(pool_models_json(pool, &b), 0);
    ck_assert_str_eq(buf_ptr(&b), "{\"object\":\"list\",\"data\":["
                     "{\"id\":\"base\"},{}]}");
    buf_release(&b);
    teardown();
}
END_TEST

/* A call for 'model' on its own thread: its slot, once it has one. */
struct waiting_call {
    const char *model;
    pthread_t thread;
    struct pool_slot slot;
    int rc;
};

static void *
call_thread(void *arg)
{
    struct waiting_call *c = arg;
    struct pool_want w = { .model = c->model, .tenant = CONFIG_MAX_TENANTS };
    int ra;

    c->rc = pool_acquire(pool, &w, &c->slot, &ra);
    return NULL;
}

/* Calls waiting in the gateway's queue that upstream 'idx' could take. */
static uint64_t
queued_for(size_t idx)
{
    struct pool_upstream_status st[3];

    ck_assert_uint_eq(pool_status(pool, st, 3), 3);
    return st[idx].queued;
}

/* Start a call for 'model' that waits: the queue then holds 'n'. */
static void
start_call(struct waiting_call *c, const char *model, uint64_t n)
{
    int64_t deadline = gw_now_ms() + 5000;

    c->model = model;
    ck_assert_int_eq(pthread_create(&c->thread, NULL, call_thread, c), 0);
    while (queued_for(0) < n && gw_now_ms() < deadline)
        usleep(1000);
    ck_assert_msg(queued_for(0) == n, "the call did not wait");
}

/*
 * a1 is resident on u0 alone, which is full (max_inflight = 1): a call
 * for it waits for u0, though u1 and u2 have room, and gets u0's place
 * when it frees (no load); a place elsewhere goes to it only once it has
 * waited POOL_LORA_SPILL_MS (then it loads there).  A base model's call
 * goes to u1 or u2 at once, as does one with queue_timeout = 0.
 */
START_TEST(test_waits_where_it_is)
{
    struct waiting_call c1, c2;
    struct pool_slot held, s;
    struct pool_want w = { .model = "a1", .tenant = CONFIG_MAX_TENANTS };
    int ra;

    make_pool_with("queue_timeout = 5s\n", "max_inflight = 1\n");
    for (size_t i = 0; i < 3; i++)
        models(i, "a1");
    scrape(0, 4, "a1", "", 0);
    scrape(1, 4, "", "", 0);
    scrape(2, 4, "", "", 0);
    ck_assert_int_eq(pool_acquire(pool, &w, &held, &ra), 0);
    ck_assert_int_eq(held.idx, 0);
    start_call(&c1, "a1", 1);
    pool_give_back(pool, &held, POOL_OK, 0);
    pthread_join(c1.thread, NULL);
    ck_assert_int_eq(c1.rc, 0);
    ck_assert_int_eq(c1.slot.idx, 0);
    ck_assert(c1.slot.queued);
    ck_assert_uint_eq(loads(1) + loads(2), 0);

    /* u0 stays full (c1's): the place u1 offers waits, then is taken. */
    start_call(&c2, "a1", 1);
    scrape(1, 4, "", "", 0);            /* u1 may take a call: not yet */
    ck_assert_uint_eq(queued_for(0), 1);
    usleep((POOL_LORA_SPILL_MS + 100) * 1000);
    scrape(1, 4, "", "", 0);
    pthread_join(c2.thread, NULL);
    ck_assert_int_eq(c2.rc, 0);
    ck_assert_int_eq(c2.slot.idx, 1);
    ck_assert_uint_eq(loads(1), 1);

    /* A base model is no adapter: at once, elsewhere. */
    w.model = "base";
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert(s.idx == 2 && !s.queued);
    pool_give_back(pool, &s, POOL_OK, 0);
    pool_give_back(pool, &c1.slot, POOL_OK, 0);
    pool_give_back(pool, &c2.slot, POOL_OK, 0);
    teardown();

    /* queue_timeout = 0: no call waits, so a1's goes on elsewhere. */
    make_pool_with("queue_timeout = 0\n", "max_inflight = 1\n");
    for (size_t i = 0; i < 3; i++)
        models(i, "a1");
    scrape(0, 4, "a1", "", 0);
    scrape(1, 4, "", "", 0);
    scrape(2, 4, "", "", 0);
    w.model = "a1";
    ck_assert_int_eq(pool_acquire(pool, &w, &held, &ra), 0);
    ck_assert_int_eq(pool_acquire(pool, &w, &s, &ra), 0);
    ck_assert(held.idx == 0 && s.idx != 0);
    pool_give_back(pool, &held, POOL_OK, 0);
    pool_give_back(pool, &s, POOL_OK, 0);
    teardown();
}
END_TEST

/*
 * Every upstream full, each running another adapter: a place u0 frees
 * goes to the call for a1 (there) before an older one for a2 (on u1),
 * which gets u1's: neither loads anything.
 */
START_TEST(test_grant_prefers_resident)
{
    static const struct up_case up[3] = {
        { 4, "a1", "", 0, NULL }, { 4, "a2", "", 0, NULL },
        { 4, "a3", "", 0, NULL },
    };
    static const char *const held_for[3] = { "a1", "a2", "a3" };
    struct waiting_call x, y;
    struct pool_slot held[3];
    int ra;

    make_pool_with("queue_timeout = 5s\n", "max_inflight = 1\n");
    for (size_t i = 0; i < 3; i++)
        models(i, "a1,a2,a3");
    scrape_all(up);
    for (size_t i = 0; i < 3; i++) {
        struct pool_want w = { .model = held_for[i],
                               .tenant = CONFIG_MAX_TENANTS };

        ck_assert_int_eq(pool_acquire(pool, &w, &held[i], &ra), 0);
        ck_assert_int_eq(held[i].idx, (int)i);
    }
    start_call(&x, "a2", 1);
    start_call(&y, "a1", 2);
    pool_give_back(pool, &held[0], POOL_OK, 0);
    pthread_join(y.thread, NULL);
    ck_assert_int_eq(y.slot.idx, 0);
    ck_assert_uint_eq(queued_for(1), 1);    /* x waits on */
    pool_give_back(pool, &held[1], POOL_OK, 0);
    pthread_join(x.thread, NULL);
    ck_assert_int_eq(x.slot.idx, 1);
    ck_assert_uint_eq(loads(0) + loads(1) + loads(2), 0);
    pool_give_back(pool, &held[2], POOL_OK, 0);
    pool_give_back(pool, &x.slot, POOL_OK, 0);
    pool_give_back(pool, &y.slot, POOL_OK, 0);
    teardown();
}
END_TEST

static Suite *
lora_suite(void)
{
    Suite *s = suite_create("lora");
    TCase *tc;

    tc = tcase("read");
    tcase_add_loop_test(tc, test_read_table, 0,
                        (int)GW_ARRAY_LEN(read_cases));
    tcase_add_test(tc, test_read_bounds);
    tcase_add_test(tc, test_read_huge_label);
    tcase_add_test(tc, test_read_out_of_memory);
    suite_add_tcase(s, tc);

    tc = tcase("fit");
    tcase_add_test(tc, test_fit);
    tcase_add_test(tc, test_sent_since);
    tcase_add_test(tc, test_slots);
    suite_add_tcase(s, tc);

    tc = tcase("rule");
    tcase_add_loop_test(tc, test_rule_table, 0,
                        (int)GW_ARRAY_LEN(rule_cases));
    tcase_add_test(tc, test_stale_is_load_alone);
    tcase_add_test(tc, test_off);
    tcase_add_test(tc, test_base_model);
    tcase_add_test(tc, test_routed_by_parent);
    tcase_add_test(tc, test_waits_where_it_is);
    tcase_add_test(tc, test_grant_prefers_resident);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(lora_suite()));
}
