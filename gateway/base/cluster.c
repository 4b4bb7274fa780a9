/* SPDX-License-Identifier: MIT */
/*
 * cluster.c - the cluster object, its round trips, keys, the membership
 * reply, the status view's copy and the /metrics families (cluster.h);
 * the beat thread is cluster_beat.c, sharing cluster_impl.h.
 *
 * Design: the metrics are process-wide, as metrics.c's are, so the
 * counts go on across a reload that replaces the cluster; the up gauge
 * is the cluster's own (the one of the generation that renders it).
 */
#include "base/cluster.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "base/cluster_impl.h"
#include "log.h"
#include "net.h"
#include "prom.h"
#include "util.h"

#define NUM_BUCKETS 12
#define HEARTBEAT_MAX 1024          /* bytes of one member's heartbeat */

/* Upper bounds in microseconds: a loopback round trip is ~100 us, a
 * request's whole budget 20 ms by default. */
static const int64_t bucket_us[NUM_BUCKETS] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 20000, 50000, 100000, 250000,
    1000000,
};

static const char *const op_names[CLUSTER_OP_COUNT] = {
    [CLUSTER_OP_CONNECT] = "connect",
    [CLUSTER_OP_HEARTBEAT] = "heartbeat",
    [CLUSTER_OP_ADMIT] = "admit",
    [CLUSTER_OP_CHARGE] = "charge",
    [CLUSTER_OP_USAGE] = "usage",
    [CLUSTER_OP_LEASE] = "lease",
};

/* Process-wide, relaxed atomics (metrics.h's way). */
static struct {
    _Atomic uint64_t errors[CLUSTER_OP_COUNT];
    _Atomic uint64_t bucket[CLUSTER_OP_COUNT][NUM_BUCKETS];
    _Atomic uint64_t count[CLUSTER_OP_COUNT];
    _Atomic uint64_t sum_us[CLUSTER_OP_COUNT];
} stats;

#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)
#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/*
 * The heartbeat, one atomic step on Redis's clock.  KEYS[1] the members'
 * sorted set, KEYS[2] this gateway's heartbeat key; ARGV: node, the
 * heartbeat, lease (ms), the node keys' prefix, the most members to
 * list.  The set lives as long as its longest-lived member.  Returns
 * (heartbeat, PTTL) pairs of the live members.  It reads the node keys
 * it lists without declaring them: they share the set's hash tag, so
 * they are on its Redis Cluster slot.
 */
static const char heartbeat_src[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local ttl = tonumber(ARGV[3])\n"
    "redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)\n"
    "redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])\n"
    "if redis.call('PTTL', KEYS[1]) < ttl then\n"
    "  redis.call('PEXPIRE', KEYS[1], ttl)\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local out = {}\n"
    "for _, n in ipairs(redis.call('ZRANGE', KEYS[1], 0,\n"
    "                              tonumber(ARGV[5]) - 1)) do\n"
    "  local k = ARGV[4] .. n\n"
    "  local v = redis.call('GET', k)\n"
    "  if v then\n"
    "    out[#out + 1] = v\n"
    "    out[#out + 1] = redis.call('PTTL', k)\n"
    "  end\n"
    "end\n"
    "return out\n";

/* ---- keys ---- */

/* A tag or a key's last part: printable, no blanks, quotes or braces. */
static int
valid_part(const char *s)
{
    if (s[0] == '\0')
        return 0;
    for (; *s != '\0'; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f
            || strchr("\"\\{}", *s) != NULL)
            return 0;
    return 1;
}

int
cluster_key(const struct cluster *cl, const char *tag, const char *what,
            char *out, size_t n)
{
    int len;

    if (!valid_part(tag) || !valid_part(what))
        return GW_EINVAL;
    len = snprintf(out, n, "%s{%s}:%s", cl->prefix, tag, what);
    if (len < 0 || (size_t)len >= n) {
        if (n > 0)
            out[0] = '\0';
        return GW_ETOOBIG;
    }
    return 0;
}

/* ---- the round trip ---- */

static void
observe(enum cluster_op op, int64_t us, int failed)
{
    size_t b = 0;

    while (b < NUM_BUCKETS && us > bucket_us[b])
        b++;
    if (b < NUM_BUCKETS)
        ADD(stats.bucket[op][b], 1);
    ADD(stats.sum_us[op], (uint64_t)(us > 0 ? us : 0));
    ADD(stats.count[op], 1);
    if (failed)
        ADD(stats.errors[op], 1);
}

int
cluster_pipeline(struct cluster *cl, enum cluster_op op,
                 const struct redis_cmd *cmds, size_t n,
                 redisReply **replies, int64_t timeout_ms)
{
    int64_t t0 = gw_now_us();
    int64_t deadline = gw_now_ms() + (timeout_ms > 0 ? timeout_ms
                                      : cl->timeout_ms);
    int rc = redis_pool_pipeline(cl->pool, cmds, n, replies, deadline);

    observe(op, gw_now_us() - t0, rc != 0);
    /* The beat's own round trips need no nudge: it is the beat.
     * GW_EBUSY: our callers hold every connection; Redis may be fine.
     * GW_EUNAVAIL: no connection left.  Down, the beat knows (and its
     * backoff rules); up, the pool may have emptied without a failed
     * round trip (a killed Redis's idle connections are closed when
     * they are taken: not quiet), and only a nudge tells the beat
     * before its next turn, up to a third of the lease away. */
    if (rc != 0 && rc != GW_EBUSY
        && (rc != GW_EUNAVAIL || atomic_load(&cl->up))
        && op != CLUSTER_OP_HEARTBEAT && op != CLUSTER_OP_USAGE) {
        gw_mutex_lock(&cl->lock);
        cl->nudge = 1;
        pthread_cond_signal(&cl->cv);
        gw_mutex_unlock(&cl->lock);
    }
    return rc;
}

void
cluster_note_connect(int64_t us, int failed)
{
    observe(CLUSTER_OP_CONNECT, us, failed);
}

/* ---- membership ---- */

/* A JSON string member 'key' of 'o' into out[0..n): printable, fits. */
static int
json_text(json_t *o, const char *key, char *out, size_t n)
{
    json_t *v = json_object_get(o, key);
    const char *s;
    size_t len;

    if (!json_is_string(v))
        return GW_EPARSE;
    s = json_string_value(v);
    len = json_string_length(v);
    if (len == 0 || len >= n || strlen(s) != len)
        return GW_EPARSE;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f)
            return GW_EPARSE;
    memcpy(out, s, len + 1);
    return 0;
}

int
cluster_heartbeat_read(const redisReply *v, struct cluster_member *m)
{
    json_t *o = NULL, *gen, *started;
    int rc = GW_EPARSE;

    if (v == NULL || v->type != REDIS_REPLY_STRING
        || v->len > HEARTBEAT_MAX)
        goto out;
    o = json_loadb(v->str, v->len, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(o))
        goto out;
    gen = json_object_get(o, "generation");
    started = json_object_get(o, "started_unix_ms");
    if (json_text(o, "node", m->node, sizeof(m->node)) != 0
        || !valid_part(m->node)
        || json_text(o, "version", m->version, sizeof(m->version)) != 0
        || !json_is_integer(gen) || json_integer_value(gen) < 0
        || !json_is_integer(started) || json_integer_value(started) < 0)
        goto out;
    /* An older version's heartbeat has no instance: "" then. */
    m->instance[0] = '\0';
    if (json_object_get(o, "instance") != NULL
        && json_text(o, "instance", m->instance, sizeof(m->instance)) != 0)
        goto out;
    m->generation = (uint64_t)json_integer_value(gen);
    m->started_unix_ms = json_integer_value(started);
    m->ttl_ms = 0;
    rc = 0;

out:
    json_decref(o);
    return rc;
}

/* One heartbeat (its JSON and PTTL replies) into *m. */
static int
read_member(const redisReply *v, const redisReply *ttl,
            struct cluster_member *m)
{
    if (ttl == NULL || ttl->type != REDIS_REPLY_INTEGER || ttl->integer < 0
        || cluster_heartbeat_read(v, m) != 0)
        return GW_EPARSE;
    m->ttl_ms = ttl->integer;
    return 0;
}

int
cluster_members_read(const redisReply *r, struct cluster_member *out,
                     size_t max, size_t *n)
{
    *n = 0;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0)
        return GW_EPARSE;
    for (size_t i = 0; i + 1 < r->elements && *n < max; i += 2)
        if (read_member(r->element[i], r->element[i + 1], &out[*n]) == 0)
            (*n)++;
    return 0;
}

/* ---- lifecycle ---- */

static pthread_once_t instance_once = PTHREAD_ONCE_INIT;
static char instance[CLUSTER_INSTANCE_LEN + 1];

/* This process's instance id: random, so that two processes never share
 * it, even two started in the same microsecond on two hosts. */
static void
instance_init(void)
{
    unsigned char r[CLUSTER_INSTANCE_LEN / 2];

    if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        gw_random_hex(instance, CLUSTER_INSTANCE_LEN);
        return;
    }
    gw_hex(r, sizeof(r), instance);
}

const char *
cluster_instance(void)
{
    pthread_once(&instance_once, instance_init);
    return instance;
}

GW_TESTABLE void
cluster_node_name(const char *host, int port, char *out, size_t n)
{
    char suffix[32];
    size_t hn = strlen(host), room;

    if (port != 0)
        snprintf(suffix, sizeof(suffix), ":%d", port);
    else
        snprintf(suffix, sizeof(suffix), ":pid%ld", (long)getpid());
    if (n == 0)
        return;
    room = n - 1 > strlen(suffix) ? n - 1 - strlen(suffix) : 0;
    /* A pod's name ends in its unique part ("api-7d9f8b6c5-x2kq4"): keep
     * the end of a long host name, not its start, or every replica of a
     * Deployment would be the same node. */
    if (hn > room)
        host += hn - room;
    snprintf(out, n, "%s%s", host, suffix);
}

/*
 * The default node name: the host name and the listen port, or the
 * process id when the port is 0 (chosen by the kernel, as in tests), so
 * that two gateways of one host never share a name.
 */
static void
default_node(const struct gw_config *cfg, char *out, size_t n)
{
    /* Linux allows HOST_NAME_MAX (64) bytes, and gethostname() fails
     * with ENAMETOOLONG on a buffer with no room for the NUL. */
    char host[HOST_NAME_MAX + 2] = "";
    const char *addr = cfg->listen[0] != '\0' ? cfg->listen
                       : cfg->tls_listen;
    const char *h;
    size_t hn;
    int port = 0;

    if (gethostname(host, sizeof(host) - 1) != 0 || !valid_part(host))
        snprintf(host, sizeof(host), "localhost");
    if (net_parse_hostport(addr, &h, &hn, &port) != 0)
        port = 0;
    cluster_node_name(host, port, out, n);
}

int
cluster_same_config(const struct gw_config *a, const struct gw_config *b)
{
    return a->cluster == b->cluster
           && (!a->cluster
               || (strcmp(a->redis, b->redis) == 0
                   && strcmp(a->redis_password, b->redis_password) == 0
                   && a->redis_timeout_ms == b->redis_timeout_ms
                   && a->redis_connections == b->redis_connections
                   && strcmp(a->key_prefix, b->key_prefix) == 0
                   && strcmp(a->node, b->node) == 0
                   && a->lease_ms == b->lease_ms
                   && a->on_error == b->on_error));
}

/* Free what cluster_start() made; the thread is not running. */
static void
cluster_free(struct cluster *cl)
{
    redis_pool_free(cl->pool);
    pthread_cond_destroy(&cl->cv);
    gw_mutex_destroy(&cl->lock);
    gw_free(cl);
}

/*
 * Beat threads not yet ended, process-wide, so that the process's exit
 * waits for them (cluster_wait_beats()): they are detached, and nobody
 * else joins them.
 */
static struct {
    pthread_once_t once;
    struct gw_mutex lock;
    pthread_cond_t cv;          /* signalled as 'running' drops */
    int running;                /* (lock) */
} beats = { PTHREAD_ONCE_INIT };

static void
beats_init(void)
{
    gw_mutex_init(&beats.lock);
    gw_cond_init(&beats.cv);
}

static void
beats_add(int n)
{
    pthread_once(&beats.once, beats_init);
    gw_mutex_lock(&beats.lock);
    beats.running += n;
    pthread_cond_broadcast(&beats.cv);
    gw_mutex_unlock(&beats.lock);
}

/* Drop one hold on 'cl'; the last frees it. */
static void
release(struct cluster *cl)
{
    if (atomic_fetch_sub(&cl->holders, 1) == 1)
        cluster_free(cl);
}

void
cluster_beat_exit(struct cluster *cl)
{
    release(cl);                /* 'cl' may be gone from here on */
    beats_add(-1);
}

int
cluster_wait_beats(int64_t deadline_ms)
{
    int rc = 0;

    pthread_once(&beats.once, beats_init);
    gw_mutex_lock(&beats.lock);
    while (beats.running > 0 && rc == 0)
        rc = gw_cond_timedwait(&beats.cv, &beats.lock, deadline_ms);
    rc = beats.running > 0 ? GW_ETIMEDOUT : 0;
    gw_mutex_unlock(&beats.lock);
    return rc;
}

struct cluster *
cluster_start(const struct gw_config *cfg, const struct cluster_self *self)
{
    struct cluster *cl = gw_calloc(1, sizeof(*cl));
    struct redis_url url;
    struct redis_pool_opts o = { &url, cfg->redis_password,
                                 (size_t)cfg->redis_connections };
    int err;

    if (cl == NULL)
        return NULL;
    gw_mutex_init(&cl->lock);
    gw_cond_init(&cl->cv);
    if (redis_url_parse(cfg->redis, &url) != 0) {
        /* config.c checked it: only a bug gets here. */
        log_msg(GW_LOG_ERROR, "cluster: the redis URL does not parse");
        cluster_free(cl);
        return NULL;
    }
    redis_url_show(&url, cl->redis, sizeof(cl->redis));
    cl->pool = redis_pool_new(&o);
    redis_url_wipe(&url);
    if (cl->pool == NULL) {
        log_msg(GW_LOG_ERROR, "cluster: out of memory for the pool");
        cluster_free(cl);
        return NULL;
    }
    snprintf(cl->prefix, sizeof(cl->prefix), "%s", cfg->key_prefix);
    if (cfg->node[0] != '\0')
        snprintf(cl->node, sizeof(cl->node), "%s", cfg->node);
    else
        default_node(cfg, cl->node, sizeof(cl->node));
    cl->timeout_ms = cfg->redis_timeout_ms;
    cl->lease_ms = cfg->lease_ms;
    cl->beat_ms = cfg->lease_ms / 3;
    if (cl->beat_ms < 100)
        cl->beat_ms = 100;
    if (cl->beat_ms > 5000)
        cl->beat_ms = 5000;
    /* The beat's own round trips are not a request's: a Redis a little
     * slow is not lost for that.  At most a second each (its connect,
     * then its heartbeat; a name's resolution has no bound at all): the
     * reason nobody on the accept loop ever joins the beat. */
    cl->beat_io_ms = cfg->redis_timeout_ms < 250 ? 250
                     : cfg->redis_timeout_ms > 1000 ? 1000
                     : cfg->redis_timeout_ms;
    cl->connections_max = (size_t)cfg->redis_connections;
    cl->on_error = cfg->on_error;
    cl->started_unix_ms = self->started_unix_ms;
    cl->after_beat = self->after_beat;
    cl->after_beat_arg = self->after_beat_arg;
    redis_script_init(&cl->heartbeat, heartbeat_src);
    atomic_store(&cl->generation, self->generation);
    atomic_store(&cl->alive, 1);
    atomic_store(&cl->refs, 1);
    atomic_store(&cl->holders, 2);
    beats_add(1);
    err = pthread_create(&cl->thread, NULL, cluster_thread, cl);
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "cluster: pthread_create");
        beats_add(-1);
        cluster_free(cl);
        return NULL;
    }
    pthread_detach(cl->thread);
    return cl;
}

struct cluster *
cluster_ref(struct cluster *cl)
{
    atomic_fetch_add(&cl->refs, 1);
    return cl;
}

void
cluster_stop(struct cluster *cl)
{
    gw_mutex_lock(&cl->lock);
    cl->stop = 1;
    pthread_cond_broadcast(&cl->cv);
    gw_mutex_unlock(&cl->lock);
}

void
cluster_unref(struct cluster *cl)
{
    if (cl == NULL || atomic_fetch_sub(&cl->refs, 1) != 1)
        return;
    /* The beat may be in a connect or a round trip for seconds: it ends
     * on its own and frees the cluster if it is the last to let go. */
    cluster_stop(cl);
    release(cl);
}

size_t
cluster_alive(const struct cluster *cl)
{
    size_t n = atomic_load(&cl->alive);

    return n > 0 ? n : 1;
}

void
cluster_set_generation(struct cluster *cl, uint64_t generation)
{
    atomic_store(&cl->generation, generation);
}

/* ---- the status view and /metrics ---- */

void
cluster_status(struct cluster *cl, struct cluster_status *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->node, sizeof(out->node), "%s", cl->node);
    snprintf(out->redis, sizeof(out->redis), "%s", cl->redis);
    out->up = atomic_load(&cl->up);
    out->on_error = cl->on_error;
    out->lease_ms = cl->lease_ms;
    out->connections = redis_pool_connected(cl->pool);
    out->connections_max = cl->connections_max;
    gw_mutex_lock(&cl->lock);
    out->since_unix_ms = cl->since_unix_ms;
    memcpy(out->last_error, cl->last_error, sizeof(out->last_error));
    memcpy(out->members, cl->members,
           cl->num_members * sizeof(out->members[0]));
    out->num_members = cl->num_members;
    gw_mutex_unlock(&cl->lock);
}

int
cluster_render_metrics(struct cluster *cl, struct buf *out)
{
    struct prom w;

    prom_init(&w, out);
    prom_family(&w, "infergw_cluster_up", PROM_GAUGE,
                "1 while Redis ([cluster]) answers this gateway's beat, "
                "else 0.");
    prom_int(&w, NULL, 0, atomic_load(&cl->up));
    prom_family(&w, "infergw_cluster_members", PROM_GAUGE,
                "Gateways the last heartbeat found alive, this one "
                "included.");
    prom_uint(&w, NULL, 0, atomic_load(&cl->alive));
    prom_family(&w, "infergw_cluster_errors_total", PROM_COUNTER,
                "Redis round trips that failed (timed out, refused, "
                "closed, no connection), by what they were for.");
    for (size_t op = 0; op < CLUSTER_OP_COUNT; op++) {
        const struct prom_label l = { "op", op_names[op] };

        prom_uint(&w, &l, 1, LOAD(stats.errors[op]));
    }
    prom_family(&w, "infergw_cluster_latency_seconds", PROM_HISTOGRAM,
                "Redis round trips, failed ones included, by what they "
                "were for.");
    for (size_t op = 0; op < CLUSTER_OP_COUNT; op++) {
        const struct prom_label l = { "op", op_names[op] };
        double le[NUM_BUCKETS];
        uint64_t counts[NUM_BUCKETS], in_buckets = 0;
        struct prom_histogram h = { le, counts, NUM_BUCKETS, 0, 0 };

        for (size_t b = 0; b < NUM_BUCKETS; b++) {
            le[b] = (double)bucket_us[b] / 1e6;
            counts[b] = LOAD(stats.bucket[op][b]);
            in_buckets += counts[b];
        }
        /* As metrics.c's snapshot(): never a count below the buckets. */
        h.count = LOAD(stats.count[op]);
        if (h.count < in_buckets)
            h.count = in_buckets;
        h.sum = (double)LOAD(stats.sum_us[op]) / 1e6;
        prom_histogram(&w, &l, 1, &h);
    }
    return w.rc;
}
