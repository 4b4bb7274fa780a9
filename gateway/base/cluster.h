/* SPDX-License-Identifier: MIT */
/*
 * cluster.h - the [cluster] section at work: a pool of Redis connections
 * shared by every thread (common/redis.h), a beat thread that keeps it
 * connected and writes this gateway's heartbeat, the live gateways it
 * reads back, the keys, and the round trip the request path makes.
 *
 * What is shared: membership (here), the tenants' rates and token
 * budgets (tenant.h, "Shared limits": tenant_shared.c runs its script
 * through cluster_pipeline()), and the tenants' usage totals, which the
 * beat sends in batches after each heartbeat through cluster_self's
 * after_beat (tenant.h: tenants_usage_flush()), and the tenants'
 * leases, max_inflight across gateways (tenant.h, "Leases"), renewed by
 * the same after_beat (tenants_after_beat()).
 *
 * Keys: every key starts with key_prefix.  A tenant's carry its name as
 * a hash tag, "<prefix>{<tenant>}:<what>", so each tenant's keys share
 * one Redis Cluster slot (one script may touch them all).  The
 * gateways' own use the tag "{@gateways}", which no tenant name can be
 * (a tenant name has no '@').  No key, nor a value, holds an API key or
 * a hash of one: tenants are named by their configured names.
 *
 * Membership: the beat writes "<prefix>{@gateways}:node:<node>" (this
 * gateway: node, instance id, version, configuration generation, start
 * time) with a time to live of 'lease', and its node into the sorted set
 * "<prefix>{@gateways}:members" scored by that expiry on Redis's clock,
 * in one script; the same script drops expired members and returns the
 * live ones.  A gateway that stops beating is gone from every view
 * within 'lease'; one that stops cleanly is too (it deletes nothing, so
 * a reload that keeps the node name never blinks).  Two gateways given
 * one node name would hide each other; the beat reads the heartbeat it
 * replaces and warns when another process's instance id wrote it.
 *
 * Failure: no round trip waits longer than its deadline (redis_timeout
 * on the request path).  The beat runs every lease / 3 (at most 5 s, at
 * least 100 ms); when Redis fails it logs one line, sets
 * infergw_cluster_up to 0, closes the idle connections (so the request
 * path fails at once rather than each request waiting its deadline), and
 * tries again after a doubling backoff (100 ms to 5 s); when Redis is
 * back it logs one line and sets the gauge to 1.  Only the beat thread
 * connects: the accept loop, requests and the health and load beats
 * never wait on a connect.
 *
 * Lifetime: a generation (generation.h) holds a cluster.  A reload whose
 * [cluster] settings are unchanged keeps the one in force (same
 * connections, same beat: cluster_ref(), cluster_set_generation()); a
 * changed one starts a new cluster and stops the old one's beat
 * (cluster_stop()), whose pool stays usable by the old generation's
 * requests until its last reference goes.
 *
 * Threads and locking: one beat thread per cluster, started by
 * cluster_start(), detached.  The last cluster_unref() only asks it to
 * stop and returns at once: a turn under way may take its connect and
 * its heartbeat, redis_timeout within 250 ms .. 1 s each (and as much
 * again for each 64 tenants of the usage flush after it), and a host
 * name's resolution, which nothing bounds.  The beat holds the cluster
 * too, and whichever of it and the last reference lets go last frees
 * it.  The process waits for the beats at exit (cluster_wait_beats()).
 * The cluster's mutex guards the beat's stop flag and the state the status view
 * copies (members, last error); it is never held across I/O.  The
 * metrics are process-wide atomics.  Every function here may be called
 * from any thread.
 */
#ifndef INFERGW_GATEWAY_BASE_CLUSTER_H
#define INFERGW_GATEWAY_BASE_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "redis.h"
#include "base/config.h"

#define CLUSTER_MEMBERS_MAX 64      /* gateways listed */
#define CLUSTER_KEY_MAX 256         /* bytes of a key, with its NUL */
#define CLUSTER_TAG_GATEWAYS "@gateways"
#define CLUSTER_INSTANCE_LEN 16     /* hex digits of a process's id */
/* The backoff between tries while Redis is gone. */
#define CLUSTER_BACKOFF_MIN_MS 100
#define CLUSTER_BACKOFF_MAX_MS 5000

struct cluster;

/*
 * What a round trip was for: the label of infergw_cluster_errors_total
 * and infergw_cluster_latency_seconds.  A new use (a limit, a lease) is a
 * new value and a name in cluster.c.
 */
enum cluster_op {
    CLUSTER_OP_CONNECT = 0,         /* a connection's hello (the beat's) */
    CLUSTER_OP_HEARTBEAT,           /* the heartbeat and membership */
    CLUSTER_OP_ADMIT,               /* a request's admission by the
                                       tenant's shared limits */
    CLUSTER_OP_CHARGE,              /* a call's tokens, at its end */
    CLUSTER_OP_USAGE,               /* the tenants' usage, in a batch
                                       after each heartbeat (tenant.h) */
    CLUSTER_OP_LEASE,               /* a lease's release at a call's end,
                                       the beat's renewal (tenant.h) */
    CLUSTER_OP_COUNT
};

/* What this process's heartbeat says besides its node and version. */
struct cluster_self {
    uint64_t generation;            /* the configuration's, at start */
    int64_t started_unix_ms;        /* when the process started */
    /*
     * Run by the beat thread after each heartbeat that succeeded, with
     * 'after_beat_arg', the cluster and the bound of the beat's own
     * round trips (ms); NULL: nothing.  The tenants' usage flush
     * (tenant.h: tenants_usage_flush()), so that the counts go to Redis
     * in batches from the beat, never from a request.
     */
    void (*after_beat)(void *arg, struct cluster *cl, int64_t timeout_ms);
    void *after_beat_arg;
};

/*
 * Start the cluster of 'cfg' (borrowed; cfg->cluster set): its pool and
 * its beat thread, which connects at once.  Nothing waits on Redis here.
 * Returns a cluster with one reference, or NULL (logged: out of memory,
 * a thread that cannot start).
 */
struct cluster *cluster_start(const struct gw_config *cfg,
                              const struct cluster_self *self);

/* One more reference to 'cl' (a generation that shares it). */
struct cluster *cluster_ref(struct cluster *cl);

/*
 * Drop a reference; the last one stops the beat (cluster_stop()) and
 * returns at once; the cluster is freed when the beat has ended too (the
 * caller's round trips are over).  NULL-safe.
 */
void cluster_unref(struct cluster *cl);

/*
 * Ask the beat to end (a reload replaced this cluster): returns at once.
 * A turn under way ends first, so one more heartbeat may be written
 * after it (one already sent, or a connect under way then no more); the
 * next turn never starts.  The pool stays usable.
 */
void cluster_stop(struct cluster *cl);

/*
 * Wait until every beat thread of the process has ended, or until
 * 'deadline_ms' (gw_now_ms() clock): 0 or GW_ETIMEDOUT.  For the exit,
 * after the last cluster_unref(): no beat then touches freed memory.
 */
int cluster_wait_beats(int64_t deadline_ms);

/* Are the [cluster] settings of 'a' and 'b' the same (both borrowed)? */
int cluster_same_config(const struct gw_config *a, const struct gw_config *b);

/*
 * The gateways the last heartbeat found alive, this one included (>= 1;
 * 1 before the first): a limit's local share while Redis is gone is
 * the limit divided by it (tenant.h).
 */
size_t cluster_alive(const struct cluster *cl);

/* The configuration generation the next heartbeat names. */
void cluster_set_generation(struct cluster *cl, uint64_t generation);

/*
 * One round trip for 'op': cmds[0..n) pipelined (redis.h, scripts by
 * EVALSHA with EVAL on NOSCRIPT), by a deadline 'timeout_ms' from now
 * (0: redis_timeout, as the request path must use).  Fails fast: with
 * Redis gone (no connection) GW_EUNAVAIL at once, with every connection
 * busy GW_EBUSY at the deadline (not a sign that Redis is lost: the beat
 * skips its heartbeat then, it does not drop the connections).  Counts the outcome and its time
 * into the metrics; a failure other than GW_EUNAVAIL wakes the beat to
 * look at Redis.  Returns and fills 'replies' as redis_pool_pipeline().
 */
int cluster_pipeline(struct cluster *cl, enum cluster_op op,
                     const struct redis_cmd *cmds, size_t n,
                     redisReply **replies, int64_t timeout_ms);

/*
 * The key "<prefix>{<tag>}:<what>" into out[0..n).  'tag' is a tenant's
 * name (or CLUSTER_TAG_GATEWAYS); 'tag' and 'what' must be printable,
 * without blanks or braces (a brace would move the hash tag).  Returns 0,
 * GW_EINVAL or GW_ETOOBIG.  Borrows everything.
 */
int cluster_key(const struct cluster *cl, const char *tag, const char *what,
                char *out, size_t n);

/* One gateway of the membership, as its heartbeat says. */
struct cluster_member {
    char node[CONFIG_NAME_MAX + 1];
    char instance[CLUSTER_INSTANCE_LEN + 1];    /* "" from an older one */
    char version[32];
    uint64_t generation;
    int64_t started_unix_ms;
    int64_t ttl_ms;                 /* its heartbeat's time left */
};

/*
 * Read the heartbeat script's reply 'r' (borrowed): an array of
 * (heartbeat JSON, its PTTL) pairs.  Fills out[0..max), OUT *n.  An entry
 * that is not a valid heartbeat (another version's, damaged) is skipped;
 * entries past 'max' are left out.  Returns 0, or GW_EPARSE when 'r' is
 * not such an array at all.  Any bytes: it is fuzzed
 * (test/fuzz/fuzz_cluster.c).
 */
int cluster_members_read(const redisReply *r, struct cluster_member *out,
                         size_t max, size_t *n);

/*
 * One heartbeat's JSON 'v' (borrowed) into *m, its ttl_ms 0.  Returns 0,
 * or GW_EPARSE when 'v' is not a heartbeat.  Any bytes (fuzzed).
 */
int cluster_heartbeat_read(const redisReply *v, struct cluster_member *m);

/*
 * This process's instance id, CLUSTER_INSTANCE_LEN random hex digits,
 * the same for every cluster it starts: its heartbeat carries it, so
 * that two gateways given one node name see each other (cluster_beat.c).
 */
const char *cluster_instance(void);

#ifdef INFERGW_UNIT_TEST
/*
 * Test builds only: the default node name for host name 'host' and
 * listen port 'port' (0: ":pid<pid>" instead) into out[0..n): the END
 * of a host name too long to fit, so that pods keep their unique part.
 */
void cluster_node_name(const char *host, int port, char *out, size_t n);
#endif

/* What the status view shows of a cluster: a copy. */
struct cluster_status {
    char node[CONFIG_NAME_MAX + 1];
    char redis[300];                /* the URL without its password */
    int up;
    int on_error;
    int64_t lease_ms;
    size_t connections;             /* connected now */
    size_t connections_max;
    int64_t since_unix_ms;          /* up or down since; 0: not tried */
    char last_error[200];           /* the last failure's reason, or "" */
    struct cluster_member members[CLUSTER_MEMBERS_MAX];
    size_t num_members;
};

/* Copy it into *out (a big struct: the caller's heap). */
void cluster_status(struct cluster *cl, struct cluster_status *out);

/*
 * Append the cluster's /metrics families: infergw_cluster_up (of 'cl'),
 * infergw_cluster_members, infergw_cluster_errors_total{op} and
 * infergw_cluster_latency_seconds{op} (process-wide).  Returns 0 or a
 * buf error.
 */
int cluster_render_metrics(struct cluster *cl, struct buf *out);

#endif
