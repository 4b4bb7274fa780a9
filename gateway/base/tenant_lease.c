/* SPDX-License-Identifier: MIT */
/*
 * tenant_lease.c - max_inflight across gateways (tenant.h, "Leases"),
 * part of module tenant: this process's book of the leases it holds,
 * the release at a call's end, and the beat's renewal, which is also
 * the reconciliation after Redis came back.
 *
 * Design: a lease is taken in Redis by the admission's script
 * (tenant_shared.c), so taking one costs no round trip of its own.  The
 * book holds every call of this process that may hold a lease, from
 * before its admission's round trip to its release, so that nothing
 * Redis may have is forgotten.  The beat re-adds every open lease (a
 * plain ZADD, not XX): a member is unique to its call, so re-adding is
 * idempotent, and after Redis lost them all (restarted empty) one beat
 * puts back exactly the calls still open.  Re-adding would resurrect a
 * lease released while the beat's round trip is under way, so such a
 * release is left to the beat, which removes it after its ZADD
 * ('renewing', 'released').  A release that fails (Redis gone, its
 * deadline) waits in 'gone' for the beat to retry, until its lease has
 * run out: then Redis drops it anyway, and so does the book.
 */
#include "base/tenant_impl.h"
#include "base/tenant.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/cluster.h"
#include "base/config.h"
#include "util.h"

/* Members in one renewal or release command (REDIS_ARGS_MAX with the
 * key, the lease and the command's name). */
#define LEASE_BATCH (REDIS_ARGS_MAX - 4)
/* The most failed releases kept for the beat: past it the oldest is
 * left to expire in Redis (within 'lease'). */
#define LEASE_GONE_MAX 4096

enum lease_state {
    LEASE_ADMITTING = 0,        /* its admission's round trip is under
                                   way: Redis may or may not add it */
    LEASE_OPEN,                 /* held (or to be re-added by the beat) */
    LEASE_REFUSED,              /* Redis refused it: not in Redis */
};

struct tenant_lease {
    struct tenant_lease *prev, *next;   /* (L) in 'open' or 'gone' */
    const struct cluster *cl;   /* whose beat renews it */
    char tenant[TENANT_NAME_MAX];
    char key[CLUSTER_KEY_MAX];
    char member[CLUSTER_INSTANCE_LEN + 24];
    char max[24], lease_us[24];
    int64_t lease_ms;
    int64_t gone_ms;            /* (L) when its release failed */
    enum lease_state state;     /* (L) */
    int renewing;               /* (L) in a beat's round trip now */
    int released;               /* (L) released meanwhile: the beat's */
};

struct list {
    struct tenant_lease *head;
    size_t n;
};

static struct {
    struct gw_mutex lock;
    struct list open, gone;     /* (L) */
} book;
static pthread_once_t book_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t next_seq;

static const char renew_src[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local lease = tonumber(ARGV[1])\n"
    "for i = 2, #ARGV do\n"
    "  redis.call('ZADD', KEYS[1], now + lease, ARGV[i])\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local want = math.ceil(lease / 1000) + 1000\n"
    "if redis.call('PTTL', KEYS[1]) < want then\n"
    "  redis.call('PEXPIRE', KEYS[1], want)\n"
    "end\n"
    "return #ARGV - 1\n";
static struct redis_script renew_script;

static void
book_init(void)
{
    gw_mutex_init(&book.lock);
    redis_script_init(&renew_script, renew_src);
}

static void
link_locked(struct list *li, struct tenant_lease *l)
{
    assert(gw_mutex_held(&book.lock));
    l->prev = NULL;
    l->next = li->head;
    if (li->head != NULL)
        li->head->prev = l;
    li->head = l;
    li->n++;
}

static void
unlink_locked(struct list *li, struct tenant_lease *l)
{
    assert(gw_mutex_held(&book.lock));
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        li->head = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
    li->n--;
}

int
tenant_lease_wanted(const struct cluster *cl, const struct gw_config *cfg,
                    size_t tenant)
{
    return cl != NULL && tenant < cfg->num_tenants
           && cfg->tenants[tenant].max_inflight > 0;
}

struct tenant_lease *
tenant_lease_new(struct cluster *cl, const struct gw_config *cfg,
                 size_t tenant)
{
    const struct config_tenant *ct;
    struct tenant_lease *l;

    if (!tenant_lease_wanted(cl, cfg, tenant))
        return NULL;
    ct = &cfg->tenants[tenant];
    l = gw_calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    if (cluster_key(cl, ct->name, "leases", l->key, sizeof(l->key)) != 0) {
        gw_free(l);
        return NULL;
    }
    pthread_once(&book_once, book_init);
    l->cl = cl;
    snprintf(l->tenant, sizeof(l->tenant), "%s", ct->name);
    snprintf(l->member, sizeof(l->member), "%s:%" PRIu64,
             cluster_instance(), atomic_fetch_add(&next_seq, 1) + 1);
    snprintf(l->max, sizeof(l->max), "%" PRIu64, ct->max_inflight);
    l->lease_ms = cfg->lease_ms;
    snprintf(l->lease_us, sizeof(l->lease_us), "%" PRId64,
             cfg->lease_ms * 1000);
    gw_mutex_lock(&book.lock);
    link_locked(&book.open, l);
    gw_mutex_unlock(&book.lock);
    return l;
}

void
tenant_lease_argv(const struct tenant_lease *l, const char *argv[4])
{
    argv[0] = l->key;
    argv[1] = l->member;
    argv[2] = l->max;
    argv[3] = l->lease_us;
}

size_t
tenant_lease_settle(struct tenant_lease *l, int answered, int admitted)
{
    size_t n = 0;

    gw_mutex_lock(&book.lock);
    l->state = answered && !admitted ? LEASE_REFUSED : LEASE_OPEN;
    /* Counted only for the local verdict: a walk of every open call,
     * which Redis's answer spares the request path. */
    for (struct tenant_lease *o = book.open.head; o != NULL && !answered;
         o = o->next)
        if (o->cl == l->cl && o->state != LEASE_REFUSED
            && strcmp(o->tenant, l->tenant) == 0)
            n++;
    gw_mutex_unlock(&book.lock);
    return n;
}

/* Keep 'l' (unlinked) for the beat to remove from Redis. */
static void
keep_gone_locked(struct tenant_lease *l)
{
    l->gone_ms = gw_now_ms();
    link_locked(&book.gone, l);
}

/*
 * Commands for up to LEASE_BATCH of v[from..n) that share a key: a
 * renewal (the script) or a release (ZREM) into *cmd, its arguments
 * into argv[] (LEASE_BATCH + 3).  Returns how many it took.
 */
static size_t
batch(struct tenant_lease **v, size_t from, size_t n, int renew,
      struct redis_cmd *cmd, const char **argv)
{
    size_t k = 0, a = 0;

    if (renew) {
        argv[a++] = v[from]->key;
        argv[a++] = v[from]->lease_us;
    } else {
        argv[a++] = "ZREM";
        argv[a++] = v[from]->key;
    }
    while (from + k < n && k < LEASE_BATCH
           && strcmp(v[from + k]->key, v[from]->key) == 0)
        argv[a++] = v[from + k++]->member;
    cmd->script = renew ? &renew_script : NULL;
    cmd->nkeys = renew ? 1 : 0;
    cmd->argc = (int)a;
    cmd->argv = argv;
    cmd->argvlen = NULL;
    return k;
}

static int
by_key(const void *a, const void *b)
{
    const struct tenant_lease *x = *(struct tenant_lease *const *)a;
    const struct tenant_lease *y = *(struct tenant_lease *const *)b;

    return strcmp(x->key, y->key);
}

/*
 * Renew (or release) v[0..n) in Redis, grouped by key, in round trips
 * of REDIS_PIPELINE_MAX commands by 'timeout_ms' each.  Returns how
 * many of v[] (in order) had their round trip answered.
 */
static size_t
send_all(struct cluster *cl, struct tenant_lease **v, size_t n, int renew,
         int64_t timeout_ms)
{
    struct redis_cmd cmds[REDIS_PIPELINE_MAX];
    redisReply *replies[REDIS_PIPELINE_MAX];
    static const size_t per = LEASE_BATCH + 3;
    const char **argv = NULL;
    size_t done = 0, at, k, c;

    argv = gw_calloc(REDIS_PIPELINE_MAX * per, sizeof(*argv));
    if (argv == NULL)
        goto out;
    qsort(v, n, sizeof(v[0]), by_key);
    while (done < n) {
        for (c = 0, at = done; c < REDIS_PIPELINE_MAX && at < n; c++)
            at += batch(v, at, n, renew, &cmds[c], argv + c * per);
        memset(replies, 0, sizeof(replies));
        if (cluster_pipeline(cl, CLUSTER_OP_LEASE, cmds, c, replies,
                             timeout_ms) != 0)
            goto out;
        for (k = 0; k < c; k++)
            if (replies[k]->type == REDIS_REPLY_ERROR)
                at = done;      /* not applied: tried again later */
        redis_replies_free(replies, c);
        if (at == done)
            goto out;
        done = at;
    }

out:
    gw_free(argv);
    return done;
}

void
tenant_lease_release(struct cluster *cl, struct tenant_lease *l,
                     int64_t left_ms)
{
    struct tenant_lease *v[1] = { l };
    int refused;

    if (l == NULL)
        return;
    gw_mutex_lock(&book.lock);
    if (l->renewing) {
        /* The beat re-adds it now: removing it first would not hold. */
        l->released = 1;
        gw_mutex_unlock(&book.lock);
        return;
    }
    unlink_locked(&book.open, l);
    refused = l->state == LEASE_REFUSED;
    gw_mutex_unlock(&book.lock);
    if (refused || (left_ms > 0 && send_all(cl, v, 1, 0, left_ms) == 1)) {
        gw_free(l);
        return;
    }
    gw_mutex_lock(&book.lock);
    keep_gone_locked(l);
    gw_mutex_unlock(&book.lock);
}

/* Take the failed releases of 'cl' still worth sending into *out. */
static size_t
take_gone(struct cluster *cl, struct tenant_lease ***out)
{
    struct tenant_lease *l, *next, **v = NULL;
    int64_t now = gw_now_ms();
    size_t n = 0;

    gw_mutex_lock(&book.lock);
    if (book.gone.n > 0)
        v = gw_calloc(book.gone.n, sizeof(*v));
    for (l = book.gone.head; l != NULL; l = next) {
        next = l->next;
        if (l->cl != cl)
            continue;
        unlink_locked(&book.gone, l);
        /* Past its lease Redis has dropped it; out of memory, so do. */
        if (now - l->gone_ms > l->lease_ms || v == NULL)
            gw_free(l);
        else
            v[n++] = l;
    }
    gw_mutex_unlock(&book.lock);
    *out = v;
    return n;
}

/* The releases the beat sends: those that failed, and those released
 * while it renewed them. */
static void
release_gone(struct cluster *cl, int64_t timeout_ms)
{
    struct tenant_lease **v = NULL;
    size_t n = take_gone(cl, &v), done;

    if (n == 0)
        goto out;
    done = send_all(cl, v, n, 0, timeout_ms);
    gw_mutex_lock(&book.lock);
    for (size_t i = 0; i < n; i++)
        if (i < done)
            gw_free(v[i]);
        else
            link_locked(&book.gone, v[i]);
    /* Bounded: the oldest go first (they expire soonest in Redis). */
    while (book.gone.n > LEASE_GONE_MAX) {
        struct tenant_lease *old = book.gone.head;

        while (old->next != NULL)
            old = old->next;
        unlink_locked(&book.gone, old);
        gw_free(old);
    }
    gw_mutex_unlock(&book.lock);

out:
    gw_free(v);
}

GW_TESTABLE void tenant_leases_renew(struct cluster *cl,
                                     int64_t timeout_ms);

/* The beat's part: tenant_impl.h. */
GW_TESTABLE void
tenant_leases_renew(struct cluster *cl, int64_t timeout_ms)
{
    struct tenant_lease *l, **v = NULL;
    size_t n = 0;

    pthread_once(&book_once, book_init);
    gw_mutex_lock(&book.lock);
    if (book.open.n > 0)
        v = gw_calloc(book.open.n, sizeof(*v));
    for (l = book.open.head; l != NULL && v != NULL; l = l->next)
        if (l->cl == cl && l->state == LEASE_OPEN) {
            l->renewing = 1;
            v[n++] = l;
        }
    gw_mutex_unlock(&book.lock);
    if (n > 0)
        (void)send_all(cl, v, n, 1, timeout_ms);
    gw_mutex_lock(&book.lock);
    for (size_t i = 0; i < n; i++) {
        l = v[i];
        l->renewing = 0;
        if (l->released) {
            unlink_locked(&book.open, l);
            keep_gone_locked(l);
        }
    }
    gw_mutex_unlock(&book.lock);
    gw_free(v);
    release_gone(cl, timeout_ms);
}

void
tenants_after_beat(void *ts, struct cluster *cl, int64_t timeout_ms)
{
    /* The leases first: a lease left unrenewed expires, a count waits. */
    tenant_leases_renew(cl, timeout_ms);
    tenants_usage_flush(ts, cl, timeout_ms);
}

#ifdef INFERGW_UNIT_TEST
size_t
tenant_leases_held(size_t *gone, size_t *renewing)
{
    size_t n;

    pthread_once(&book_once, book_init);
    gw_mutex_lock(&book.lock);
    n = book.open.n;
    *gone = book.gone.n;
    *renewing = 0;
    for (struct tenant_lease *l = book.open.head; l != NULL; l = l->next)
        *renewing += l->renewing ? 1 : 0;
    gw_mutex_unlock(&book.lock);
    return n;
}
#endif
