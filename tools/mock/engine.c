/* SPDX-License-Identifier: MIT */
/*
 * engine.c - mock_upstream's vLLM-like engine: the batching scheduler, the
 * prefix cache, the token accounting and vLLM's /metrics text (engine.h).
 *
 * Design: the scheduler thread is the only one that moves sequences from
 * the FIFO to the batch and gives tokens; connection threads only append
 * to the FIFO and take their own sequence out.  A step's length is fixed
 * when it starts, from the batch it starts with: a sequence that leaves
 * during the step does not shorten it, one that arrives waits for the
 * next.  The scheduler sleeps for the step's time with the lock released.
 *
 * The prefix cache is a hash table of block ids chained through one array
 * of nodes, with an LRU list threaded through the same nodes.  Both are
 * sized once, for kv_blocks nodes, so nothing is allocated after
 * engine_new() but the sequences themselves.
 *
 * Locking: e->mu guards everything but the parameters and the fields of a
 * sequence engine_submit() sets before linking it (engine.h).
 */
#include "engine.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "cfg.h"
#include "log.h"
#include "util.h"

#define NONE UINT32_MAX             /* no node */
#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S INT64_C(1000000000)
#define PY_FLOAT_LEN 48             /* "%.16e" of any double, and more */
#define LABELS_LIMIT (64 * 1024)    /* the label text of one series */

enum seq_state {
    SEQ_WAITING,                    /* in e->waiting */
    SEQ_RUNNING,                    /* in e->running */
    SEQ_DONE,                       /* in no list: finished or taken out */
};

struct engine_seq {
    struct engine_seq *prev, *next; /* in its list; e->mu */
    enum seq_state state;           /* e->mu */
    long generated;                 /* tokens given so far; e->mu */

    /* Set by engine_submit() before the sequence is linked, then constant. */
    int efd;                        /* eventfd: tokens to report */
    int stream;                     /* wake at every token, not only the last */
    long prompt_tokens;
    long max_tokens;
    long blocks;                    /* KV blocks reserved while running */
    int lora;                       /* its LoRA adapter's id; 0: none */
    size_t num_ids;                 /* full blocks of the prompt */
    uint64_t *ids;                  /* their hash chain; owned */
};

struct seq_list {
    struct engine_seq *head, *tail;
    size_t n;
};

struct cache_node {
    uint64_t id;                    /* the block's hash chain value */
    uint32_t chain;                 /* next node in its bucket */
    uint32_t newer, older;          /* LRU neighbours */
};

struct prefix_cache {
    struct cache_node *nodes;       /* 'cap' of them; owned */
    uint32_t *buckets;              /* mask + 1 of them; owned */
    uint32_t mask;
    uint32_t cap;
    uint32_t used;                  /* nodes handed out; all once full */
    uint32_t newest, oldest;        /* LRU ends */
};

struct engine {
    struct engine_params p;         /* constant */
    struct gw_mutex mu;
    pthread_cond_t cv;              /* work arrived, or stopping */
    pthread_t thread;               /* the scheduler, once started */
    int started;                    /* only the starting thread's */
    int stopping;                   /* mu */
    struct seq_list waiting;        /* mu: the FIFO */
    struct seq_list running;        /* mu: the batch */
    long reserved;                  /* mu: blocks reserved by 'running' */
    struct prefix_cache cache;      /* mu */
    uint64_t prefix_queries;        /* mu: the counters */
    uint64_t prefix_hits;
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    double created;                 /* mu: when the counters started */
    struct lora lora;               /* mu: the LoRA adapters (lora.h) */
};

void
engine_params_init(struct engine_params *p)
{
    p->max_running = 8;
    p->step_ns = 10 * NS_PER_MS;
    p->step_per_seq_ns = 1 * NS_PER_MS;
    p->prefill_ns_per_token = 50000;        /* 0.05 ms */
    p->kv_blocks = 2048;
    p->block_tokens = 16;
    p->default_max_tokens = 16;
    p->max_loras = 0;
    p->lora_load_ns = LORA_DEFAULT_LOAD_MS * NS_PER_MS;
}

int
engine_params_parse(struct engine_params *p, char *list, char *err,
                    size_t errlen)
{
    /* unit: what the value counts; ns: nanoseconds in one (0: a count). */
    const struct {
        const char *key;
        const char *unit;
        long *count;
        int64_t *time;
        double ns, lo, hi;
    } defs[] = {
        { "max_running", "sequences", &p->max_running, NULL, 0, 1, 4096 },
        { "step_ms", "ms", NULL, &p->step_ns, 1e6, 0.001, 60000 },
        { "step_per_seq_ms", "ms", NULL, &p->step_per_seq_ns, 1e6, 0,
          60000 },
        { "prefill_us_per_token", "us", NULL, &p->prefill_ns_per_token, 1e3,
          0, 1000 },
        { "kv_blocks", "blocks", &p->kv_blocks, NULL, 0, 1, 1048576 },
        { "block_tokens", "tokens", &p->block_tokens, NULL, 0, 1, 1024 },
        { "default_max_tokens", "tokens", &p->default_max_tokens, NULL, 0, 1,
          ENGINE_MAX_TOKENS },
    };
    char *item, *next, *eq;
    double v = 0;
    size_t i;

    for (item = list; item != NULL; item = next) {
        next = strchr(item, ',');
        if (next != NULL)
            *next++ = '\0';
        eq = strchr(item, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "-E wants KEY=VALUE[,KEY=VALUE...], not "
                     "\"%s\"", item);
            return GW_EINVAL;
        }
        *eq = '\0';
        for (i = 0; i < GW_ARRAY_LEN(defs); i++)
            if (strcmp(item, defs[i].key) == 0)
                break;
        if (i == GW_ARRAY_LEN(defs)) {
            snprintf(err, errlen, "-E: unknown key \"%s\" (max_running, "
                     "step_ms, step_per_seq_ms, prefill_us_per_token, "
                     "kv_blocks, block_tokens, default_max_tokens)", item);
            return GW_EINVAL;
        }
        if (defs[i].count != NULL
                ? gw_parse_long(eq + 1, (long)defs[i].lo, (long)defs[i].hi,
                                defs[i].count) != 0
                : cfg_parse_decimal(eq + 1, defs[i].lo, defs[i].hi,
                                    &v) != 0) {
            snprintf(err, errlen, "-E %s wants a %s number of %s from %g "
                     "to %g, not \"%s\"", item,
                     defs[i].count != NULL ? "whole" : "decimal",
                     defs[i].unit, defs[i].lo, defs[i].hi, eq + 1);
            return GW_EINVAL;
        }
        if (defs[i].time != NULL)
            *defs[i].time = (int64_t)(v * defs[i].ns + 0.5);   /* v >= 0 */
    }
    return 0;
}

static int64_t
now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* Unix time, for the counters' _created series. */
static double
wall_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
list_append(struct seq_list *l, struct engine_seq *s)
{
    s->prev = l->tail;
    s->next = NULL;
    if (l->tail != NULL)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

static void
list_remove(struct seq_list *l, struct engine_seq *s)
{
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        l->head = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    else
        l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

/* ceil(tokens / block_tokens): the blocks 'tokens' tokens occupy. */
static long
blocks_of(const struct engine *e, long tokens)
{
    return tokens / e->p.block_tokens + (tokens % e->p.block_tokens != 0);
}

static uint32_t *
bucket_of(struct prefix_cache *c, uint64_t id)
{
    return &c->buckets[gw_mix64(id) & c->mask];
}

/* The node holding block 'id', or NONE. */
static uint32_t
cache_find(struct prefix_cache *c, uint64_t id)
{
    uint32_t i;

    for (i = *bucket_of(c, id); i != NONE; i = c->nodes[i].chain)
        if (c->nodes[i].id == id)
            return i;
    return NONE;
}

static void
lru_unlink(struct prefix_cache *c, uint32_t i)
{
    struct cache_node *n = &c->nodes[i];

    if (n->newer != NONE)
        c->nodes[n->newer].older = n->older;
    else
        c->newest = n->older;
    if (n->older != NONE)
        c->nodes[n->older].newer = n->newer;
    else
        c->oldest = n->newer;
}

static void
lru_push_newest(struct prefix_cache *c, uint32_t i)
{
    struct cache_node *n = &c->nodes[i];

    n->newer = NONE;
    n->older = c->newest;
    if (c->newest != NONE)
        c->nodes[c->newest].newer = i;
    else
        c->oldest = i;
    c->newest = i;
}

/*
 * Make block 'id' the newest: move it to the front of the LRU list, or
 * insert it, taking a fresh node while there are some and the oldest
 * block's once the cache is full.
 */
static void
cache_use(struct prefix_cache *c, uint64_t id)
{
    uint32_t i = cache_find(c, id), *pp;

    if (i != NONE) {
        lru_unlink(c, i);
        lru_push_newest(c, i);
        return;
    }
    if (c->used < c->cap) {
        i = c->used++;
    } else {
        i = c->oldest;
        lru_unlink(c, i);
        for (pp = bucket_of(c, c->nodes[i].id); *pp != i;
             pp = &c->nodes[*pp].chain)
            ;
        *pp = c->nodes[i].chain;
    }
    c->nodes[i].id = id;
    pp = bucket_of(c, id);
    c->nodes[i].chain = *pp;
    *pp = i;
    lru_push_newest(c, i);
}

static void
cache_clear(struct prefix_cache *c)
{
    memset(c->buckets, 0xff, ((size_t)c->mask + 1) * sizeof(*c->buckets));
    c->used = 0;
    c->newest = c->oldest = NONE;
}

/*
 * Look the admitted sequence's prompt up in the prefix cache, and enter
 * it.  The hits are the leading blocks found, at most
 * (prompt_tokens - 1) / block_tokens of them: vLLM always computes a
 * prompt's last token, for its logits, so a prompt cached whole still
 * misses its last block.  Then every full block is touched or inserted,
 * the last first, so that the first is the newest: eviction takes a
 * prompt's tail before its head, as vLLM frees a request's blocks in
 * reverse order.  Returns the hit tokens.
 */
static long
cache_admit_locked(struct engine *e, const struct engine_seq *s)
{
    size_t max_hit = (size_t)((s->prompt_tokens - 1) / e->p.block_tokens);
    size_t hit = 0, i;

    assert(gw_mutex_held(&e->mu));
    while (hit < s->num_ids && hit < max_hit
           && cache_find(&e->cache, s->ids[hit]) != NONE)
        hit++;
    for (i = s->num_ids; i-- > 0;)
        cache_use(&e->cache, s->ids[i]);
    return (long)hit * e->p.block_tokens;
}

/*
 * Admit sequences in FIFO order while the batch has a slot and the KV
 * cache the blocks the next one needs (first come, first served: one
 * that does not fit holds back those behind it).  One whose LoRA adapter
 * may not join the batch (lora.h: it has max_loras others) is skipped
 * and keeps its place, as vLLM skips it.  Returns the time the admitted
 * ones add to this step: their prefill, and the adapters loaded for
 * them.
 */
static int64_t
admit_locked(struct engine *e)
{
    struct engine_seq *s, *next;
    int64_t prefill = 0;
    long hit;

    assert(gw_mutex_held(&e->mu));
    for (s = e->waiting.head; s != NULL; s = next) {
        next = s->next;
        if (e->running.n >= (size_t)e->p.max_running)
            break;
        if (s->lora != 0 && !lora_may_run(&e->lora, s->lora))
            continue;
        if (e->reserved + s->blocks > e->p.kv_blocks)
            break;
        list_remove(&e->waiting, s);
        list_append(&e->running, s);
        s->state = SEQ_RUNNING;
        e->reserved += s->blocks;
        hit = cache_admit_locked(e, s);
        e->prefix_queries += (uint64_t)s->prompt_tokens;
        e->prefix_hits += (uint64_t)hit;
        e->prompt_tokens += (uint64_t)s->prompt_tokens;
        prefill += (int64_t)(s->prompt_tokens - hit)
                   * e->p.prefill_ns_per_token;
        if (s->lora != 0)
            prefill += lora_start(&e->lora, s->lora);
    }
    return prefill;
}

/* Make the sequence's descriptor readable.  Under the lock: see engine.h. */
static void
wake_locked(struct engine *e, struct engine_seq *s)
{
    uint64_t one = 1;
    ssize_t n;

    assert(gw_mutex_held(&e->mu));
    /* An eventfd write of 8 bytes fails only when the count would pass
     * 2^64 - 2: never. */
    n = write(s->efd, &one, sizeof(one));
    assert(n == (ssize_t)sizeof(one));
    (void)n;
}

/* The end of a step: a token for each running sequence. */
static void
step_locked(struct engine *e)
{
    struct engine_seq *s, *next;

    assert(gw_mutex_held(&e->mu));
    for (s = e->running.head; s != NULL; s = next) {
        next = s->next;
        s->generated++;
        e->generation_tokens++;
        if (s->generated == s->max_tokens) {
            list_remove(&e->running, s);
            e->reserved -= s->blocks;
            s->state = SEQ_DONE;
            if (s->lora != 0)
                lora_stop(&e->lora, s->lora);
        }
        if (s->stream || s->state == SEQ_DONE)
            wake_locked(e, s);
    }
}

/*
 * Wait until 'end' (now_ns()'s clock) or stopping, with the lock released
 * meanwhile.  gw_cond_timedwait() takes a millisecond deadline, so it
 * waits until a millisecond or two before 'end' and clock_nanosleep()
 * does the rest: a stop arriving then waits for it.
 */
static void
sleep_until_locked(struct engine *e, int64_t end)
{
    struct timespec ts;

    assert(gw_mutex_held(&e->mu));
    while (!e->stopping && end - now_ns() > 0) {
        /* More than 2 ms left: end's millisecond less one is still
         * ahead, so the wait cannot spin on a deadline already past. */
        if (end - now_ns() > 2 * NS_PER_MS) {
            gw_cond_timedwait(&e->cv, &e->mu, end / NS_PER_MS - 1);
            continue;
        }
        ts.tv_sec = (time_t)(end / NS_PER_S);
        ts.tv_nsec = (long)(end % NS_PER_S);
        gw_mutex_unlock(&e->mu);
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        gw_mutex_lock(&e->mu);
    }
}

/* The scheduler thread: admit, sleep the step, give tokens; until stop. */
static void *
engine_main(void *arg)
{
    struct engine *e = arg;
    int64_t prefill, end;

    gw_mutex_lock(&e->mu);
    while (!e->stopping) {
        if (e->waiting.n == 0 && e->running.n == 0) {
            gw_cond_wait(&e->cv, &e->mu);
            continue;
        }
        prefill = admit_locked(e);
        /* An empty batch always takes the FIFO's head: engine_submit()
         * refused any sequence bigger than the whole cache. */
        assert(e->running.n > 0);
        end = now_ns() + e->p.step_ns
              + e->p.step_per_seq_ns * (int64_t)e->running.n + prefill;
        sleep_until_locked(e, end);
        if (!e->stopping)
            step_locked(e);
    }
    gw_mutex_unlock(&e->mu);
    return NULL;
}

struct engine *
engine_new(const struct engine_params *p)
{
    struct engine *e = gw_calloc(1, sizeof(*e));
    size_t buckets = 2;

    if (e == NULL)
        return NULL;
    e->p = *p;
    assert(p->kv_blocks >= 1 && p->kv_blocks <= (1L << 20));
    while (buckets < 2 * (size_t)p->kv_blocks)
        buckets *= 2;           /* load factor at most 1/2 */
    e->cache.cap = (uint32_t)p->kv_blocks;
    e->cache.mask = (uint32_t)(buckets - 1);
    e->cache.nodes = gw_calloc(e->cache.cap, sizeof(*e->cache.nodes));
    e->cache.buckets = gw_calloc(buckets, sizeof(*e->cache.buckets));
    if (e->cache.nodes == NULL || e->cache.buckets == NULL) {
        gw_free(e->cache.nodes);
        gw_free(e->cache.buckets);
        gw_free(e);
        return NULL;
    }
    cache_clear(&e->cache);
    lora_init(&e->lora, p->max_loras, p->lora_load_ns);
    gw_mutex_init(&e->mu);
    gw_cond_init(&e->cv);
    e->created = wall_now();
    return e;
}

int
engine_start(struct engine *e)
{
    int err = pthread_create(&e->thread, NULL, engine_main, e);

    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock engine: pthread_create");
        return GW_EIO;
    }
    e->started = 1;
    return 0;
}

void
engine_stop(struct engine *e)
{
    if (e == NULL || !e->started)
        return;
    gw_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    gw_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = 0;
}

/* Free a sequence that is in no list (or never was).  NULL-safe. */
static void
seq_destroy(struct engine_seq *s)
{
    if (s == NULL)
        return;
    if (s->efd != -1)
        close(s->efd);
    gw_free(s->ids);
    gw_free(s);
}

int
engine_submit(struct engine *e, const char *p, size_t n, long max_tokens,
              int stream, const char *model, struct engine_seq **out)
{
    const size_t block_bytes = (size_t)e->p.block_tokens
                               * ENGINE_BYTES_PER_TOKEN;
    struct engine_seq *s = NULL;
    size_t tokens, i, off;
    uint64_t h = GW_FNV1A64_OFFSET;
    int err, rc = GW_ENOMEM;

    *out = NULL;
    assert(max_tokens >= 1 && max_tokens <= ENGINE_MAX_TOKENS);
    tokens = n / ENGINE_BYTES_PER_TOKEN + (n % ENGINE_BYTES_PER_TOKEN != 0);
    if (tokens == 0)
        tokens = 1;             /* vLLM counts at least BOS */
    /* At most 2^30 tokens fit (kv_blocks x block_tokens): no overflow. */
    if (tokens + (size_t)max_tokens
        > (size_t)e->p.kv_blocks * (size_t)e->p.block_tokens) {
        rc = GW_ETOOBIG;
        goto out;
    }
    s = gw_calloc(1, sizeof(*s));
    if (s == NULL)
        goto out;
    s->efd = -1;
    s->num_ids = tokens / (size_t)e->p.block_tokens;
    if (s->num_ids > 0) {
        s->ids = gw_calloc(s->num_ids, sizeof(*s->ids));
        if (s->ids == NULL)
            goto out;
    }
    /* vLLM's hash chain: block i's id covers blocks 0..i.  A full block
     * of tokens starts before the prompt's end, so off < n (or n is 0
     * with 1-token blocks: an empty block). */
    for (i = 0; i < s->num_ids; i++) {
        off = i * block_bytes;
        h = gw_fnv1a64(i == 0 ? h : gw_mix64(h), p + off,
                       n - off < block_bytes ? n - off : block_bytes);
        s->ids[i] = h;
    }
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->efd == -1) {
        err = errno;
        log_errno(GW_LOG_ERROR, err, "mock engine: eventfd");
        rc = GW_EIO;
        goto out;
    }
    s->stream = stream;
    s->prompt_tokens = (long)tokens;
    s->max_tokens = max_tokens;
    s->blocks = blocks_of(e, (long)tokens + max_tokens);

    gw_mutex_lock(&e->mu);
    if (e->stopping) {
        gw_mutex_unlock(&e->mu);
        rc = GW_ESTOPPING;
        goto out;
    }
    s->state = SEQ_WAITING;
    s->lora = model != NULL ? lora_find(&e->lora, model) : 0;
    list_append(&e->waiting, s);
    pthread_cond_signal(&e->cv);
    gw_mutex_unlock(&e->mu);
    *out = s;                   /* the caller's now */
    s = NULL;
    rc = 0;

out:
    seq_destroy(s);
    return rc;
}

long
engine_seq_prompt_tokens(const struct engine_seq *s)
{
    return s->prompt_tokens;
}

int
engine_seq_fd(const struct engine_seq *s)
{
    return s->efd;
}

long
engine_seq_tokens(struct engine *e, struct engine_seq *s)
{
    uint64_t count;
    ssize_t n;
    long tokens;

    /* Clear before reading the count, so that a token given after the
     * read makes the descriptor readable again.  Non-blocking: EAGAIN
     * when there was nothing to clear. */
    n = read(s->efd, &count, sizeof(count));
    (void)n;
    gw_mutex_lock(&e->mu);
    tokens = s->generated;
    gw_mutex_unlock(&e->mu);
    return tokens;
}

void
engine_seq_free(struct engine *e, struct engine_seq *s)
{
    if (s == NULL)
        return;
    gw_mutex_lock(&e->mu);
    if (s->state == SEQ_WAITING) {
        list_remove(&e->waiting, s);
    } else if (s->state == SEQ_RUNNING) {
        list_remove(&e->running, s);
        e->reserved -= s->blocks;
        if (s->lora != 0)
            lora_stop(&e->lora, s->lora);
    }
    s->state = SEQ_DONE;
    gw_mutex_unlock(&e->mu);
    seq_destroy(s);
}

void
engine_snapshot(struct engine *e, struct engine_stats *st)
{
    const struct engine_seq *s;
    long used = 0;

    gw_mutex_lock(&e->mu);
    st->running = e->running.n;
    st->waiting = e->waiting.n;
    for (s = e->running.head; s != NULL; s = s->next)
        used += blocks_of(e, s->prompt_tokens + s->generated);
    st->kv_usage = (double)used / (double)e->p.kv_blocks;
    st->prefix_queries = e->prefix_queries;
    st->prefix_hits = e->prefix_hits;
    st->prompt_tokens = e->prompt_tokens;
    st->generation_tokens = e->generation_tokens;
    st->lora_loads = e->lora.loads;
    st->created = e->created;
    gw_mutex_unlock(&e->mu);
}

void
engine_reset(struct engine *e)
{
    gw_mutex_lock(&e->mu);
    cache_clear(&e->cache);
    e->prefix_queries = 0;
    e->prefix_hits = 0;
    e->prompt_tokens = 0;
    e->generation_tokens = 0;
    e->lora.loads = 0;
    e->created = wall_now();
    gw_mutex_unlock(&e->mu);
}

/*
 * 'v' (finite, not negative) as prometheus_client writes a sample value
 * (its floatToGoString()): Python's repr(), the fewest digits that read
 * back as 'v' ("2.0", "0.0546875", "1e-05"), except that seven or more
 * digits before the point become Go's exponent form ("1.7e+09", the
 * _created times).  In the C locale, which the mock never changes.
 */
static void
py_float(double v, char s[PY_FLOAT_LEN])
{
    char e[PY_FLOAT_LEN], m[PY_FLOAT_LEN];
    int digits, exp, before;
    size_t k;

    for (digits = 1;; digits++) {
        snprintf(e, sizeof(e), "%.*e", digits - 1, v);
        if (digits == 17 || strtod(e, NULL) == v)
            break;
    }
    exp = atoi(strchr(e, 'e') + 1);
    if (exp < -4 || exp >= 16) {            /* repr() switches to e too */
        memcpy(s, e, sizeof(e));
        return;
    }
    snprintf(s, PY_FLOAT_LEN, "%.*f", digits - 1 - exp > 0
                                      ? digits - 1 - exp : 0, v);
    if (strchr(s, '.') == NULL)
        strcat(s, ".0");                    /* at most 17 digits so far */
    before = (int)(strchr(s, '.') - s);
    if (v > 0 && before > 6) {
        k = (size_t)snprintf(m, sizeof(m), "%c.%.*s%s", s[0], before - 1,
                             s + 1, s + before + 1);
        while (k > 0 && (m[k - 1] == '0' || m[k - 1] == '.'))
            m[--k] = '\0';
        /* 7..16 digits before the point (repr() keeps no more): fits. */
        k = (size_t)snprintf(s, PY_FLOAT_LEN, "%se+0%d", m, before - 1);
        assert(k < PY_FLOAT_LEN);
    }
}

int
engine_label_value(struct buf *out, const char *s)
{
    size_t n;
    int rc = 0;

    /* prometheus_client escapes \ " and LF. */
    while (rc == 0 && *s != '\0') {
        n = strcspn(s, "\\\"\n");
        rc = buf_append(out, s, n);
        s += n;
        if (rc == 0 && *s != '\0') {
            rc = buf_append(out, *s == '\n' ? "\\n"
                                 : *s == '"' ? "\\\"" : "\\\\", 2);
            s++;
        }
    }
    return rc;
}

/* One family of one series: HELP, TYPE, the sample. */
static int
put_family(struct buf *out, const char *name, const char *suffix,
           const char *type, const char *help, const char *labels,
           double v)
{
    char num[PY_FLOAT_LEN];

    py_float(v, num);
    return buf_printf(out, "# HELP %s%s %s\n# TYPE %s%s %s\n%s%s{%s} %s\n",
                      name, suffix, help, name, suffix, type, name, suffix,
                      labels, num);
}

int
engine_metrics(struct buf *out, const struct engine_stats *s,
               const char *model, enum engine_names names)
{
    const int old = names == ENGINE_NAMES_OLD;
    const struct {
        const char *name;           /* a counter's without _total */
        const char *help;
        int counter;
        double value;
    } fams[] = {
        { "vllm:num_requests_running",
          "Number of requests in model execution batches.", 0,
          (double)s->running },
        { "vllm:num_requests_waiting",
          "Number of requests waiting to be processed.", 0,
          (double)s->waiting },
        { old ? "vllm:gpu_cache_usage_perc" : "vllm:kv_cache_usage_perc",
          old ? "GPU KV-cache usage. 1 means 100 percent usage."
              : "KV-cache usage. 1 means 100 percent usage.", 0,
          s->kv_usage },
        { old ? "vllm:gpu_prefix_cache_queries" : "vllm:prefix_cache_queries",
          old ? "GPU prefix cache queries, in terms of number of queried "
                "tokens."
              : "Prefix cache queries, in terms of number of queried "
                "tokens.", 1, (double)s->prefix_queries },
        { old ? "vllm:gpu_prefix_cache_hits" : "vllm:prefix_cache_hits",
          old ? "GPU prefix cache hits, in terms of number of cached tokens."
              : "Prefix cache hits, in terms of number of cached tokens.", 1,
          (double)s->prefix_hits },
        { "vllm:prompt_tokens", "Number of prefill tokens processed.", 1,
          (double)s->prompt_tokens },
        { "vllm:generation_tokens", "Number of generation tokens processed.",
          1, (double)s->generation_tokens },
    };
    struct buf labels;
    size_t i;
    int rc;

    /* prometheus_client sorts the label names. */
    buf_init(&labels, LABELS_LIMIT);
    rc = buf_append_str(&labels, "engine=\"0\",model_name=\"");
    if (rc == 0)
        rc = engine_label_value(&labels, model);
    if (rc == 0)
        rc = buf_append_str(&labels, "\"");
    for (i = 0; rc == 0 && i < GW_ARRAY_LEN(fams); i++) {
        if (!fams[i].counter) {
            rc = put_family(out, fams[i].name, "", "gauge", fams[i].help,
                            buf_ptr(&labels), fams[i].value);
            continue;
        }
        rc = put_family(out, fams[i].name, "_total", "counter",
                        fams[i].help, buf_ptr(&labels), fams[i].value);
        if (rc == 0)
            rc = put_family(out, fams[i].name, "_created", "gauge",
                            fams[i].help, buf_ptr(&labels), s->created);
    }
    buf_release(&labels);
    return rc;
}

/* ---- LoRA adapters (lora.h) ---- */

int
engine_lora_add(struct engine *e, const char *name, const char *path)
{
    int rc = GW_EINVAL;

    gw_mutex_lock(&e->mu);
    if (e->lora.max_loras > 0)
        rc = lora_add(&e->lora, name, path);
    gw_mutex_unlock(&e->mu);
    return rc;
}

int
engine_lora_remove(struct engine *e, const char *name)
{
    int rc;

    gw_mutex_lock(&e->mu);
    rc = lora_remove(&e->lora, name);
    gw_mutex_unlock(&e->mu);
    return rc;
}

size_t
engine_lora_cards(struct engine *e, struct engine_lora_card *out, size_t max)
{
    size_t i;

    gw_mutex_lock(&e->mu);
    for (i = 0; i < e->lora.n && i < max; i++) {
        const struct lora_adapter *a = &e->lora.a[i];

        memcpy(out[i].name, a->name, sizeof(out[i].name));
        memcpy(out[i].path, a->path, sizeof(out[i].path));
        out[i].served = a->served;
        out[i].resident = a->resident;
        out[i].used = a->used;
    }
    gw_mutex_unlock(&e->mu);
    return i;
}

/*
 * The adapters of the sequences in 'l', in the order of their first
 * sequence, each once, into ids[0..LORA_MAX).  Returns how many.
 */
static size_t
adapters_of(const struct seq_list *l, int *ids)
{
    const struct engine_seq *s;
    size_t n = 0, k;

    for (s = l->head; s != NULL; s = s->next) {
        if (s->lora == 0)
            continue;
        for (k = 0; k < n && ids[k] != s->lora; k++)
            ;
        if (k == n)
            ids[n++] = s->lora;     /* at most LORA_MAX ids exist */
    }
    return n;
}

int
engine_lora_metrics(struct engine *e, struct buf *out)
{
    int running[LORA_MAX], waiting[LORA_MAX];
    char num[PY_FLOAT_LEN];
    size_t nr, nw, i;
    int rc;

    gw_mutex_lock(&e->mu);
    if (e->lora.max_loras == 0) {
        gw_mutex_unlock(&e->mu);
        return 0;
    }
    nr = adapters_of(&e->running, running);
    nw = adapters_of(&e->waiting, waiting);
    rc = lora_show(&e->lora, running, nr, waiting, nw, wall_now());
    if (rc == 0)
        rc = buf_append_str(out, "# HELP vllm:lora_requests_info Running "
                            "stats on lora requests.\n# TYPE "
                            "vllm:lora_requests_info gauge\n");
    for (i = 0; rc == 0 && i < e->lora.num_shown; i++) {
        py_float(e->lora.shown[i].at, num);
        rc = buf_printf(out, "vllm:lora_requests_info{%s} %s\n",
                        e->lora.shown[i].labels, num);
    }
    gw_mutex_unlock(&e->mu);
    return rc;
}
