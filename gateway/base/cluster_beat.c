/* SPDX-License-Identifier: MIT */
/*
 * cluster_beat.c - the cluster's beat thread (cluster.h): it alone
 * connects to Redis, writes the heartbeat, reads the live gateways, and
 * says when Redis is lost and when it is back.
 *
 * Design: one loop.  Each turn fills the pool's missing connections (if
 * any), then runs the heartbeat script; the turn's outcome is Redis's
 * state.  A change of state is one log line, and the gauge.  Up, the
 * next turn is a beat later; down, after a backoff that doubles from
 * CLUSTER_BACKOFF_MIN_MS to CLUSTER_BACKOFF_MAX_MS.  A request whose
 * round trip failed nudges the loop to look now (not sooner than
 * CLUSTER_BACKOFF_MIN_MS after the last turn), so a lost Redis is
 * noticed at once under load.
 */
#include "base/cluster_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "log.h"
#include "util.h"

/* The heartbeat's JSON into out[0..n). */
static void
heartbeat_json(const struct cluster *cl, char *out, size_t n)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I}", "node", cl->node,
                          "instance", cluster_instance(),
                          "version", INFERGW_VERSION, "generation",
                          (json_int_t)atomic_load(&cl->generation),
                          "started_unix_ms",
                          (json_int_t)cl->started_unix_ms);
    char *text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;

    snprintf(out, n, "%s", text != NULL ? text : "{}");
    free(text);
    json_decref(o);
}

/* Has cluster_stop() been called? */
static int
stopping(struct cluster *cl)
{
    int stop;

    gw_mutex_lock(&cl->lock);
    stop = cl->stop;
    gw_mutex_unlock(&cl->lock);
    return stop;
}

/*
 * 'prev' (borrowed) is the heartbeat our node's key held before ours
 * replaced it.  Another process's there means another gateway writes
 * under our node name (two configured with one node = ..., or pods whose
 * default names collide): each hides the other from every view, so it
 * is worth a warning.  The heartbeat script reads back our own, never
 * theirs, hence this look at the one before.  A restart finds its
 * previous life's once; only a second sighting warns, then at most
 * once a minute.
 */
static void
check_duplicate(struct cluster *cl, const redisReply *prev)
{
    struct cluster_member m;
    int64_t now = gw_now_ms();

    if (cluster_heartbeat_read(prev, &m) != 0 || m.instance[0] == '\0'
        || strcmp(m.instance, cluster_instance()) == 0)
        return;
    cl->dup_seen++;
    if (cl->dup_seen < 2
        || (cl->dup_logged_ms != 0 && now - cl->dup_logged_ms < 60000))
        return;
    cl->dup_logged_ms = now;
    log_msg(GW_LOG_WARN, "cluster: another gateway (instance %s, started "
            "%lld) writes heartbeats as node=%s too (this one is instance "
            "%s): give each its own node name; seen %llu times",
            m.instance, (long long)m.started_unix_ms, cl->node,
            cluster_instance(), (unsigned long long)cl->dup_seen);
}

/*
 * Fill the pool, then the heartbeat; the members on success.  Returns 0
 * or the failure, its reason in err[0..errlen).
 */
static int
turn(struct cluster *cl, char *err, size_t errlen)
{
    char members[CLUSTER_KEY_MAX], self[CLUSTER_KEY_MAX];
    char node_prefix[CLUSTER_KEY_MAX], ttl[24], max[8], hb[512];
    const char *argv[7], *get[2] = { "GET", self };
    struct redis_cmd cmds[2] = {
        { NULL, 0, 2, get, NULL },              /* check_duplicate() */
        { &cl->heartbeat, 2, 7, argv, NULL },
    };
    struct cluster_member *got = NULL;
    redisReply *rr[2] = { NULL, NULL }, *r;
    size_t n = 0;
    int64_t t0;
    int rc;

    err[0] = '\0';
    if (redis_pool_connected(cl->pool) < cl->connections_max) {
        t0 = gw_now_us();
        rc = redis_pool_fill(cl->pool, gw_now_ms() + cl->beat_io_ms, err,
                             errlen);
        cluster_note_connect(gw_now_us() - t0, rc < 0);
        if (rc < 0)
            return rc;
        /* The connect may have taken a second: a stop meanwhile must
         * not wait for a heartbeat too. */
        if (stopping(cl))
            return GW_ESTOPPING;
    }
    if (cluster_key(cl, CLUSTER_TAG_GATEWAYS, "members", members,
                    sizeof(members)) != 0
        || cluster_key(cl, CLUSTER_TAG_GATEWAYS, "node:", node_prefix,
                       sizeof(node_prefix)) != 0
        || snprintf(self, sizeof(self), "%s%s", node_prefix, cl->node)
           >= (int)sizeof(self)) {
        snprintf(err, errlen, "key_prefix and node make too long a key");
        return GW_ETOOBIG;
    }
    snprintf(ttl, sizeof(ttl), "%lld", (long long)cl->lease_ms);
    snprintf(max, sizeof(max), "%d", CLUSTER_MEMBERS_MAX);
    heartbeat_json(cl, hb, sizeof(hb));
    argv[0] = members;
    argv[1] = self;
    argv[2] = cl->node;
    argv[3] = hb;
    argv[4] = ttl;
    argv[5] = node_prefix;
    argv[6] = max;
    rc = cluster_pipeline(cl, CLUSTER_OP_HEARTBEAT, cmds, 2, rr,
                          cl->beat_io_ms);
    r = rr[1];
    if (rc != 0) {
        snprintf(err, errlen, "heartbeat: %s", rc == GW_EUNAVAIL
                 ? "Redis closed every connection" : gw_strerror(rc));
        return rc;
    }
    got = gw_calloc(CLUSTER_MEMBERS_MAX, sizeof(*got));
    if (got == NULL) {
        rc = GW_ENOMEM;
        snprintf(err, errlen, "out of memory");
    } else if (r->type == REDIS_REPLY_ERROR) {
        rc = GW_EUPSTREAM;
        snprintf(err, errlen, "heartbeat: %.*s",
                 (int)(r->len > 150 ? 150 : r->len), r->str);
    } else {
        rc = cluster_members_read(r, got, CLUSTER_MEMBERS_MAX, &n);
        if (rc != 0)
            snprintf(err, errlen, "heartbeat: an unexpected reply");
    }
    if (rc == 0) {
        check_duplicate(cl, rr[0]);
        gw_mutex_lock(&cl->lock);
        memcpy(cl->members, got, n * sizeof(got[0]));
        cl->num_members = n;
        gw_mutex_unlock(&cl->lock);
        atomic_store(&cl->alive, n > 0 ? n : 1);
    }
    gw_free(got);
    redis_replies_free(rr, 2);
    return rc;
}

/* What the beat thread knows of Redis between turns. */
struct seen {
    int tried;                  /* a turn ended once */
    int up;                     /* the last turn's outcome */
    int64_t down_ms;            /* gw_now_ms() when it went down */
    uint64_t failures;          /* turns that failed since */
};

/*
 * The outcome of a turn: a change of state is one log line, the gauge,
 * and the status view's 'since'; a failure's reason is kept for it.
 */
static void
note(struct cluster *cl, struct seen *s, int up, const char *err)
{
    int64_t now = gw_now_ms();

    gw_mutex_lock(&cl->lock);
    if (!up)
        snprintf(cl->last_error, sizeof(cl->last_error), "%s", err);
    gw_mutex_unlock(&cl->lock);
    if (!up)
        s->failures++;
    if (s->tried && up == s->up)
        return;
    if (up && !s->tried)
        log_msg(GW_LOG_INFO, "cluster: redis up at %s node=%s "
                "connections=%zu", cl->redis, cl->node,
                redis_pool_connected(cl->pool));
    else if (up)
        log_msg(GW_LOG_WARN, "cluster: redis back at %s node=%s "
                "down_ms=%lld failures=%llu", cl->redis, cl->node,
                (long long)(now - s->down_ms),
                (unsigned long long)s->failures);
    else
        log_msg(GW_LOG_WARN, "cluster: redis lost at %s node=%s: %s; "
                "requests go on without it, retrying with backoff",
                cl->redis, cl->node, err);
    if (!up) {
        s->down_ms = now;
        s->failures = 1;
    }
    s->tried = 1;
    s->up = up;
    atomic_store(&cl->up, up);
    gw_mutex_lock(&cl->lock);
    cl->since_unix_ms = gw_wall_ms();
    gw_mutex_unlock(&cl->lock);
}

void *
cluster_thread(void *arg)
{
    struct cluster *cl = arg;
    int64_t backoff = CLUSTER_BACKOFF_MIN_MS, started, next;
    struct seen seen = { 0, 0, 0, 0 };
    char err[200];
    int rc;

    gw_mutex_lock(&cl->lock);
    while (!cl->stop) {
        gw_mutex_unlock(&cl->lock);
        started = gw_now_ms();
        rc = turn(cl, err, sizeof(err));
        if (rc == GW_ESTOPPING) {
            gw_mutex_lock(&cl->lock);
            continue;               /* stop is set: the loop ends */
        }
        if (rc == GW_EBUSY) {
            /* Requests hold every connection: Redis answers them, so it
             * is not lost; this heartbeat waits for the next beat (a
             * lease spans three). */
            next = started + cl->beat_ms;
        } else if (rc == 0) {
            note(cl, &seen, 1, "");
            /* Redis answered: the batch goes now, in a round trip of
             * its own; a failed one waits for the next beat. */
            if (cl->after_beat != NULL)
                cl->after_beat(cl->after_beat_arg, cl, cl->beat_io_ms);
            backoff = CLUSTER_BACKOFF_MIN_MS;
            next = started + cl->beat_ms;
        } else {
            /* Requests fail at once from now on, not at their
             * deadlines, until the beat connects again. */
            redis_pool_drop_idle(cl->pool);
            note(cl, &seen, 0, err);
            next = gw_now_ms() + backoff;
            backoff = backoff * 2 > CLUSTER_BACKOFF_MAX_MS
                      ? CLUSTER_BACKOFF_MAX_MS : backoff * 2;
        }
        gw_mutex_lock(&cl->lock);
        while (!cl->stop) {
            /* A request's round trip failed: look now (while up; down,
             * the backoff rules), not sooner than the least backoff. */
            if (cl->nudge && seen.up
                && next > started + CLUSTER_BACKOFF_MIN_MS)
                next = started + CLUSTER_BACKOFF_MIN_MS;
            cl->nudge = 0;
            if (gw_cond_timedwait(&cl->cv, &cl->lock, next) != 0)
                break;
        }
    }
    gw_mutex_unlock(&cl->lock);
    cluster_beat_exit(cl);
    return NULL;
}
