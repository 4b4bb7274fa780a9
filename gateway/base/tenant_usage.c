/* SPDX-License-Identifier: MIT */
/*
 * tenant_usage.c - usage across the fleet (tenant.h:
 * tenants_usage_flush()): each tenant's counts go to Redis in batches
 * from the cluster's beat, and the fleet's totals come back with them.
 * A part of module tenant (tenant_impl.h).
 *
 * Design: the request path only counts (tenant_usage_add(), under the
 * tenants' lock it already holds); the beat takes each tenant's batch,
 * what came since the last one Redis took, sends them all in one
 * pipelined round trip, and marks each done by its answer.
 *
 * Exactly once: a round trip can fail after Redis ran it (a timeout, a
 * connection cut on the way back), so a batch without an answer is
 * never merged with newer counts nor dropped: it is sent again, the
 * same, under the same number, until an answer comes; newer counts
 * wait for the next batch.  Redis's script keeps, per tenant and per
 * process (a name drawn at the first flush from the host, the time, the
 * process and chance, so that a restarted gateway, or another with the
 * same node name, starts afresh), the highest number it added, and adds
 * a batch only above it: a resend of a batch it had added is answered
 * "added before", and is done as sent.  The marker lives a day after
 * its last batch (a gateway cut off from Redis longer than that with a
 * batch unanswered may count it twice), and the totals forever.  A
 * Redis restarted empty has lost its totals and the markers alike: the
 * resent batch and the later ones are added to the new totals, none of
 * them twice.
 */
#include "base/tenant.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "alloc.h"
#include "base/cluster.h"
#include "base/tenant_impl.h"
#include "log.h"
#include "redis.h"
#include "util.h"

#define MARKER_TTL_MS "86400000"        /* a day */
#define CHUNK REDIS_PIPELINE_MAX        /* tenants per round trip */

/*
 * KEYS[1] the tenant's usage hash, KEYS[2] this process's marker for
 * it; ARGV[1] the batch's number (0: only read), ARGV[2] the marker's
 * time to live (ms), ARGV[3..6] the counts, in enum tenant_usage_field's
 * order, which is the order of the hash's fields here.
 * Returns { 0 read | 1 added | 2 added before, the hash's HGETALL }.
 * (HGETALL, which no other script of ours calls, so that a test can
 * tell these scripts apart in INFO commandstats.)
 */
static const char usage_src[] =
    "local seq = tonumber(ARGV[1])\n"
    "local state = 0\n"
    "if seq > 0 then\n"
    "  local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0\n"
    "  if seq <= last then\n"
    "    state = 2\n"
    "  else\n"
    "    local f = {'requests', 'prompt_tokens', 'completion_tokens',\n"
    "               'tokens_saved'}\n"
    "    for i = 1, 4 do\n"
    "      if ARGV[i + 2] ~= '0' then\n"
    "        redis.call('HINCRBY', KEYS[1], f[i], ARGV[i + 2])\n"
    "      end\n"
    "    end\n"
    "    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n"
    "    state = 1\n"
    "  end\n"
    "end\n"
    "return {state, redis.call('HGETALL', KEYS[1])}\n";

static struct redis_script usage_script = { usage_src, "" };
static pthread_once_t script_once = PTHREAD_ONCE_INIT;

static void
script_init(void)
{
    redis_script_init(&usage_script, usage_src);
}

static uint64_t
add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void
tenant_usage_add(struct tenant_usage *u, enum tenant_usage_field field,
                 uint64_t n)
{
    u->total[field] = add_sat(u->total[field], n);
}

void
tenant_usage_show(const struct tenant_usage *u, int64_t now_us,
                  struct tenant_status *st)
{
    for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++) {
        st->usage[f] = u->total[f];
        st->unsent[f] = u->total[f] - u->sent[f];
        st->cluster[f] = u->cluster[f];
    }
    st->cluster_age_ms = u->read_us == 0 ? -1
                         : now_us > u->read_us ? (now_us - u->read_us) / 1000
                         : 0;
}

GW_TESTABLE int
tenant_usage_take(struct tenant_usage *u, uint64_t out[TENANT_USAGE_FIELDS],
                  uint64_t *seq)
{
    int any = 0;

    if (!u->pending) {
        for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++) {
            u->batch[f] = u->total[f] - u->sent[f];
            any |= u->batch[f] != 0;
        }
        if (!any) {
            memset(out, 0, TENANT_USAGE_FIELDS * sizeof(out[0]));
            *seq = 0;
            return 0;
        }
        u->seq++;
        u->pending = 1;
    }
    memcpy(out, u->batch, TENANT_USAGE_FIELDS * sizeof(out[0]));
    *seq = u->seq;
    return 1;
}

GW_TESTABLE void
tenant_usage_done(struct tenant_usage *u, uint64_t seq, int ok,
                  const uint64_t cluster[TENANT_USAGE_FIELDS],
                  int64_t now_us)
{
    if (!ok)
        return;                 /* a pending batch stays, as it is */
    if (seq != 0 && u->pending && seq == u->seq) {
        for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++) {
            u->sent[f] += u->batch[f];
            u->batch[f] = 0;
        }
        u->pending = 0;
    }
    memcpy(u->cluster, cluster, TENANT_USAGE_FIELDS * sizeof(cluster[0]));
    u->read_us = now_us > 0 ? now_us : 1;
}

/* The hash's fields, in enum tenant_usage_field's order (the script's
 * HINCRBYs name them too). */
static const char *const field_names[TENANT_USAGE_FIELDS] = {
    "requests", "prompt_tokens", "completion_tokens", "tokens_saved",
};

const char *
tenant_usage_field_name(enum tenant_usage_field field)
{
    return field_names[field];
}

/* A total: its decimal digits, at most 19 (HINCRBY's int64 range). */
static int
read_count(const redisReply *r, uint64_t *out)
{
    uint64_t v = 0;

    if (r == NULL || r->type != REDIS_REPLY_STRING || r->len == 0
        || r->len > 19)
        return GW_EPARSE;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9')
            return GW_EPARSE;
        v = v * 10 + (uint64_t)(r->str[i] - '0');
    }
    *out = v;
    return 0;
}

/*
 * The hash's (field, value) pairs: a field of ours is read (0 while
 * absent), any other skipped, as a later gateway's new field would be.
 */
GW_TESTABLE int
tenant_usage_read(const redisReply *r, int *applied,
                  uint64_t out[TENANT_USAGE_FIELDS])
{
    uint64_t v[TENANT_USAGE_FIELDS] = { 0 };
    const redisReply *h;

    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2
        || r->element[0] == NULL
        || r->element[0]->type != REDIS_REPLY_INTEGER
        || r->element[0]->integer < 0 || r->element[0]->integer > 2)
        return GW_EPARSE;
    h = r->element[1];
    if (h == NULL || h->type != REDIS_REPLY_ARRAY || h->elements % 2 != 0)
        return GW_EPARSE;
    for (size_t i = 0; i < h->elements; i += 2) {
        const redisReply *k = h->element[i];

        if (k == NULL || k->type != REDIS_REPLY_STRING)
            return GW_EPARSE;
        for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++)
            if (k->len == strlen(field_names[f])
                && memcmp(k->str, field_names[f], k->len) == 0
                && read_count(h->element[i + 1], &v[f]) != 0)
                return GW_EPARSE;
    }
    memcpy(out, v, sizeof(v));
    *applied = (int)r->element[0]->integer;
    return 0;
}

/* One tenant's part of a flush. */
struct item {
    struct tenant_usage *u;     /* its entry's: lives until tenants_free */
    char name[TENANT_NAME_MAX];
    uint64_t seq;
    uint64_t counts[TENANT_USAGE_FIELDS];
    int ok;                     /* Redis answered */
    uint64_t cluster[TENANT_USAGE_FIELDS];
};

/* The text of one command's arguments. */
struct args {
    char key[CLUSTER_KEY_MAX], marker[CLUSTER_KEY_MAX];
    char seq[24], counts[TENANT_USAGE_FIELDS][24];
    const char *argv[2 + 2 + TENANT_USAGE_FIELDS];
};

/* Why a flush failed, for the log: the first reason only. */
static void
fail(char *why, size_t n, const char *reason, const redisReply *r)
{
    size_t k = 0;

    if (why[0] != '\0')
        return;
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        /* Redis's own words, cut, and only printable ASCII of them. */
        for (; k + 1 < n && k < r->len && k < 120; k++)
            why[k] = r->str[k] >= 0x20 && r->str[k] < 0x7f ? r->str[k]
                                                           : '?';
        why[k] = '\0';
        return;
    }
    snprintf(why, n, "%s", reason);
}

/*
 * Send items[0..n) (n <= CHUNK) in one round trip; mark those Redis
 * answered, and say in why[] (if still empty) why one was not.  A
 * tenant whose name cannot be a key is left out (and stays unsent).
 */
static void
send_chunk(struct cluster *cl, const char *boot, struct item *items,
           size_t n, int64_t timeout_ms, char *why, size_t whylen)
{
    struct args *a = gw_calloc(n, sizeof(*a));
    struct redis_cmd *cmds = gw_calloc(n, sizeof(*cmds));
    redisReply **replies = gw_calloc(n, sizeof(*replies));
    size_t *of = gw_calloc(n, sizeof(*of));
    size_t m = 0;
    char what[sizeof("usage-seen:") + sizeof(((struct tenants *)0)->boot)];
    int applied, rc;

    if (a == NULL || cmds == NULL || replies == NULL || of == NULL) {
        fail(why, whylen, "out of memory", NULL);
        goto out;
    }
    snprintf(what, sizeof(what), "usage-seen:%s", boot);
    for (size_t i = 0; i < n; i++) {
        struct args *x = &a[m];

        if (cluster_key(cl, items[i].name, "usage", x->key,
                        sizeof(x->key)) != 0
            || cluster_key(cl, items[i].name, what, x->marker,
                           sizeof(x->marker)) != 0) {
            fail(why, whylen, "key_prefix and a tenant name make too long "
                 "a key", NULL);
            continue;
        }
        snprintf(x->seq, sizeof(x->seq), "%" PRIu64, items[i].seq);
        x->argv[0] = x->key;
        x->argv[1] = x->marker;
        x->argv[2] = x->seq;
        x->argv[3] = MARKER_TTL_MS;
        for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++) {
            snprintf(x->counts[f], sizeof(x->counts[f]), "%" PRIu64,
                     items[i].counts[f]);
            x->argv[4 + f] = x->counts[f];
        }
        cmds[m] = (struct redis_cmd){ &usage_script, 2,
                                      4 + TENANT_USAGE_FIELDS, x->argv,
                                      NULL };
        of[m++] = i;
    }
    if (m == 0)
        goto out;
    rc = cluster_pipeline(cl, CLUSTER_OP_USAGE, cmds, m, replies, timeout_ms);
    if (rc != 0) {
        fail(why, whylen, gw_strerror(rc), NULL);
        goto out;
    }
    for (size_t k = 0; k < m; k++) {
        items[of[k]].ok = tenant_usage_read(replies[k], &applied,
                                            items[of[k]].cluster) == 0;
        if (!items[of[k]].ok)
            fail(why, whylen, "an unexpected reply", replies[k]);
    }
    redis_replies_free(replies, m);

out:
    gw_free(of);
    gw_free(replies);
    gw_free(cmds);
    gw_free(a);
}

/*
 * This process's name in its batches' numbers: gw_random_hex() alone is
 * seeded from a clock two processes may share; the host, the wall
 * clock and the process id make two gateways' names differ.
 */
static void
boot_name(char *out, size_t n)
{
    char host[256] = "", rnd[9];
    uint64_t h;

    if (gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    h = gw_fnv1a64(UINT64_C(0xcbf29ce484222325), host, strlen(host));
    h = gw_mix64(h ^ (uint64_t)gw_wall_ms() ^ ((uint64_t)getpid() << 40));
    gw_random_hex(rnd, sizeof(rnd) - 1);
    snprintf(out, n, "%016" PRIx64 "%s", h, rnd);
}

void
tenants_usage_flush(void *arg, struct cluster *cl, int64_t timeout_ms)
{
    struct tenants *ts = arg;
    struct item *items = NULL;
    char why[160] = "";
    size_t n = 0, unsent = 0;
    int64_t now_us;
    int was;

    pthread_once(&script_once, script_init);
    gw_mutex_lock(&ts->lock);
    if (ts->flushing || ts->n == 0) {
        gw_mutex_unlock(&ts->lock);
        return;
    }
    /* An allocation, no I/O, under the lock: tenants_status()'s way. */
    items = gw_calloc(ts->n, sizeof(*items));
    if (items == NULL) {
        gw_mutex_unlock(&ts->lock);
        return;                 /* the counts wait for the next beat */
    }
    ts->flushing = 1;
    if (ts->boot[0] == '\0')
        boot_name(ts->boot, sizeof(ts->boot));
    n = ts->n;
    for (size_t i = 0; i < n; i++) {
        const char *name;

        items[i].u = tenant_entry_usage(ts->v[i], &name);
        snprintf(items[i].name, sizeof(items[i].name), "%s", name);
        tenant_usage_take(items[i].u, items[i].counts, &items[i].seq);
    }
    gw_mutex_unlock(&ts->lock);

    for (size_t i = 0; i < n; i += CHUNK)
        send_chunk(cl, ts->boot, items + i, n - i < CHUNK ? n - i : CHUNK,
                   timeout_ms, why, sizeof(why));

    now_us = gw_now_us();
    gw_mutex_lock(&ts->lock);
    for (size_t i = 0; i < n; i++) {
        tenant_usage_done(items[i].u, items[i].seq, items[i].ok,
                            items[i].cluster, now_us);
        unsent += !items[i].ok;
    }
    was = ts->usage_failing;
    ts->usage_failing = unsent > 0;
    ts->flushing = 0;
    gw_mutex_unlock(&ts->lock);
    gw_free(items);
    /* Once when it starts failing, once when it is over (STYLE.md 7);
     * the counts wait meanwhile. */
    if (unsent > 0 && !was)
        log_msg(GW_LOG_WARN, "usage: %zu of %zu tenants' counts not added "
                "in Redis: %s; kept for the next beat", unsent, n, why);
    else if (unsent == 0 && was)
        log_msg(GW_LOG_INFO, "usage: every tenant's counts added in Redis "
                "again");
}
