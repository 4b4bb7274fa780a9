/* SPDX-License-Identifier: MIT */
/*
 * cluster_impl.h - the cluster's state, private to the cluster module:
 * cluster.c (the object, the round trip, keys, membership replies, the
 * status and metrics) and cluster_beat.c (the beat thread).  Nothing
 * else includes it.
 *
 * Locking: 'lock' guards the fields marked (L); the others are
 * immutable after cluster_start() or atomics.
 */
#ifndef INFERGW_GATEWAY_BASE_CLUSTER_IMPL_H
#define INFERGW_GATEWAY_BASE_CLUSTER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/cluster.h"
#include "util.h"

struct cluster {
    struct redis_pool *pool;
    char redis[300];                /* the URL without its password */
    char prefix[65];
    char node[CONFIG_NAME_MAX + 1];
    int64_t timeout_ms;             /* redis_timeout */
    int64_t lease_ms;
    int64_t beat_ms;                /* lease / 3, 100 ms .. 5 s */
    int64_t beat_io_ms;             /* the beat's own round trips' bound:
                                       redis_timeout, 250 ms .. 1 s */
    size_t connections_max;
    int on_error;
    int64_t started_unix_ms;
    struct redis_script heartbeat;
    void (*after_beat)(void *arg, struct cluster *cl, int64_t timeout_ms);
    void *after_beat_arg;           /* cluster_self's */
    _Atomic uint64_t generation;
    _Atomic int up;                 /* the beat's last finding */
    _Atomic size_t alive;           /* gateways last seen, >= 1 */
    _Atomic long refs;              /* the generations' (cluster_ref()) */
    _Atomic int holders;            /* the generations together, and the
                                       beat: the last of them frees */

    pthread_t thread;               /* detached: joined by nobody */
    struct gw_mutex lock;
    pthread_cond_t cv;              /* wakes the beat: stop, nudge */
    int stop;                       /* (L) */
    int nudge;                      /* (L) a round trip failed: look now */
    int64_t since_unix_ms;          /* (L) up or down since */
    char last_error[200];           /* (L) */
    struct cluster_member members[CLUSTER_MEMBERS_MAX];     /* (L) */
    size_t num_members;             /* (L) */
    uint64_t dup_seen;              /* the beat thread's: heartbeats of */
    int64_t dup_logged_ms;          /* another instance under our node */
};

/* The beat thread (cluster_beat.c), started by cluster_start(); it
 * ends with cluster_beat_exit(). */
void *cluster_thread(void *arg);

/* The beat thread's last act: drop its hold on 'cl' (which may free it)
 * and count it gone for cluster_wait_beats(). */
void cluster_beat_exit(struct cluster *cl);

/* The beat filled the pool: 'us' it took, and whether it failed
 * (infergw_cluster_*{op="connect"}, cluster.c). */
void cluster_note_connect(int64_t us, int failed);

#endif
