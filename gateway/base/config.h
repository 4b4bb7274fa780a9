/* SPDX-License-Identifier: MIT */
/*
 * config.h - the gateway's settings: schema, defaults and loading.
 *
 * Every setting is documented, with its default, in etc/gateway.conf; the
 * table in config_schema.c is the single source of truth for names and
 * defaults.
 * A loaded struct gw_config is immutable and shared by every thread.
 */
#ifndef INFERGW_GATEWAY_BASE_CONFIG_H
#define INFERGW_GATEWAY_BASE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"
/* The gateway's version: -V, the start-up line, /status.json. */
#define INFERGW_VERSION "0.1.0"

#define CONFIG_MAX_TENANTS 64
#define CONFIG_MAX_TENANT_KEYS 16
#define CONFIG_MAX_UPSTREAMS 64     /* a set of them fits a uint64_t */
#define CONFIG_MAX_MODELS 64        /* per upstream */
#define CONFIG_NAME_MAX 64          /* tenant, upstream and model names */
#define CONFIG_KEY_DIGEST_LEN 32    /* SHA-256 of a tenant's API key */
#define CONFIG_MAX_KEEPALIVE 1024   /* idle connections per upstream */
#define CONFIG_MIN_KEY_LEN 16       /* a client's api_key: shorter is weak */
#define CONFIG_MAX_SETTINGS 128    /* rows in config_schema.c's table */
#define CONFIG_MAX_TRUSTED_PROXIES 64   /* networks in trusted_proxies */
/* eject_time's bound, and the most a doubled one grows to (pool.h). */
#define CONFIG_MAX_EJECT_MS (5 * 60 * 1000)
/* A [tenant]'s requests_per_minute: tenant.c's bucket counts in units
 * that stay below 2^64 up to this. */
#define CONFIG_MAX_REQUESTS_PER_MINUTE 1000000000
/* A [tenant]'s tokens_per_minute (tenant_impl.h's units), and its
 * tokens_per_day and tokens_per_month. */
#define CONFIG_MAX_TOKENS_PER_MINUTE 1000000000
#define CONFIG_MAX_TOKEN_BUDGET UINT64_C(1000000000000000)

/* [cluster] on_error: what a limited tenant gets while Redis is gone. */
enum config_on_error {
    ON_ERROR_LOCAL = 0,         /* each gateway's share of the limits */
    ON_ERROR_DENY,              /* 503 with Retry-After */
};

enum config_balance {
    BALANCE_LEAST_LOAD = 0,     /* power of two choices on the engines'
                                   own load (pool.h), else open calls */
    BALANCE_LEAST_INFLIGHT,     /* power of two choices on open calls */
    BALANCE_ROUND_ROBIN,        /* smooth weighted round robin */
    BALANCE_PREFIX,             /* consistent hash of the prompt's prefix,
                                   bounded loads */
};

/*
 * One [upstream NAME] section (the plain [upstream] is "default").  The
 * timeouts are resolved at load: an unset one takes [routing]'s.
 */
struct config_upstream {
    char *name;
    char *url;                  /* no trailing '/' */
    char *api_key;              /* "" = none; sent as Bearer; wiped */
    char *ca_file;              /* "" = the system's CAs (https://) */
    char *client_cert;          /* "" = none; PEM, for https:// */
    char *client_key;           /* "" = none */
    int tls_verify;             /* on: the peer and its name checked */
    char *models[CONFIG_MAX_MODELS];    /* empty: ask GET /v1/models */
    size_t num_models;
    uint64_t weight;            /* 1: relative share of new requests */
    uint64_t max_inflight;      /* 0 = no limit on open calls */
    int64_t connect_timeout_ms;
    int64_t first_byte_timeout_ms;      /* request sent to first body byte */
    int64_t idle_timeout_ms;            /* between body bytes */
    int64_t total_timeout_ms;
    int line;                   /* its section header; 0 = built in */
};

/*
 * A tenant's keys are kept only as SHA-256 digests: an api_key line is
 * hashed at load (its text is wiped with the file's), an api_key_sha256
 * line gives the digest itself.  A client's key is hashed and compared
 * in constant time (tenant.h).
 */
struct config_tenant {
    char *name;
    unsigned char key_sha256[CONFIG_MAX_TENANT_KEYS][CONFIG_KEY_DIGEST_LEN];
    size_t num_keys;            /* digests wiped on release */
    int coalesce;               /* per-tenant switch, default on */
    int cache;                  /* on: its answers may be cached, when
                                   [cache] ttl > 0 */
    uint64_t max_inflight;      /* 0 = no limit on requests under way */
    uint64_t requests_per_minute;   /* 0 = no limit; a token bucket */
    uint64_t tokens_per_minute;     /* 0 = no limit; prompt + completion,
                                       a bucket that usage may put in
                                       debt (tenant.h) */
    uint64_t tokens_per_day;        /* 0 = no limit; a budget per UTC day */
    uint64_t tokens_per_month;      /* 0 = no limit; per UTC month */
    uint64_t weight;            /* 1: its share of upstream calls while
                                   calls wait in the gateway (pool.h) */
    int64_t priority;           /* 0: higher goes first; < 0 sheddable */
};

struct gw_config {
    char *path;

    /* [server] */
    char *listen;               /* "127.0.0.1:8080"; "" = plain HTTP off */
    char *tls_listen;           /* "" = no TLS listener */
    char *tls_cert;             /* PEM chain, leaf first */
    char *tls_key;              /* PEM */
    int tls_min_version;        /* 12 (TLS 1.2) or 13 */
    int64_t tls_handshake_timeout_ms;   /* 10s */
    int64_t tls_session_timeout_ms;     /* 1h, whole seconds; 0 = no
                                           session resumption */
    uint64_t max_connections;   /* 1024 */
    uint64_t thread_stack_size; /* 256k */
    uint64_t max_header_size;   /* 16k */
    uint64_t max_request_body;  /* 16m */
    int64_t header_timeout_ms;  /* 10s: whole head, from its first byte */
    int64_t body_timeout_ms;    /* 60s: whole body */
    int64_t idle_timeout_ms;    /* 60s: keep-alive wait for a next request */
    int64_t send_timeout_ms;    /* 60s: a client that stops reading */
    int64_t drain_timeout_ms;   /* 30s */
    int log_level;              /* GW_LOG_INFO */
    int log_format;             /* GW_LOG_FORMAT_KV (log.h) */
    int access_log;             /* on */
    int64_t log_repeat_interval_ms; /* 10s: a background failure's
                                       summary lines (log.h) */
    /* Peers whose X-Forwarded-For names the client (conn.c); none by
     * default: every client is its socket's peer. */
    struct net_cidr trusted_proxies[CONFIG_MAX_TRUSTED_PROXIES];
    size_t num_trusted_proxies;

    /* [upstream NAME]: at least one (a built-in "default" when none) */
    struct config_upstream upstreams[CONFIG_MAX_UPSTREAMS];
    size_t num_upstreams;

    /* [routing] (forward_client_auth also in the plain [upstream]) */
    int forward_client_auth;    /* off: the client's Authorization stays */
    int balance;                /* enum config_balance */
    int64_t health_interval_ms; /* 5s; 0 = no GET /health probes */
    uint64_t eject_after;       /* 3 failures in a row */
    int64_t eject_time_ms;      /* 10s, doubling per repeat, at most 5m */
    double max_ejected;         /* 0.5: of a model's upstreams ejected at
                                   once (at least one may be) */
    double panic_below;         /* 0.5: fewer of a model's upstreams usable:
                                   calls go to all of them */
    uint64_t retries;           /* 2 further attempts */
    double retry_budget;        /* 0.2: retries+hedges per recent request */
    uint64_t retry_budget_min;  /* 3 per budget window, always allowed */
    int64_t hedge_after_ms;     /* 0 = off */
    int64_t queue_timeout_ms;   /* 2s: wait for a max_inflight slot */
    double prefix_epsilon;      /* 0.25: load bound (1 + e) x mean */
    uint64_t prefix_bytes;      /* 1k: how much of the prompt is hashed */
    int lora_aware;             /* on: a call for a LoRA adapter prefers
                                   the upstreams where it is (pool.h) */
    int64_t connect_timeout_ms; /* 5s: each upstream's default ... */
    int64_t first_byte_timeout_ms;  /* 60s */
    int64_t upstream_idle_timeout_ms;   /* 30s */
    int64_t total_timeout_ms;   /* 10m */
    uint64_t keepalive;         /* 32 idle connections per upstream */
    int64_t load_interval_ms;   /* 100ms: GET /metrics beat; 0 = off */
    int64_t load_timeout_ms;    /* 200ms: one scrape's bound */
    int64_t load_stale_ms;      /* 1s: an older scrape is not used */
    double kv_high;             /* 0.9: KV cache usage that saturates */
    uint64_t max_waiting;       /* 4: engine queue length that saturates */
    double headroom;            /* 0.1: of the fleet's batch places, the
                                   least a tenant ahead of its share
                                   keeps, held or free, for the tenants
                                   before it while tenants compete
                                   (pool_share.c); 0: no reserve */
    int64_t keepalive_timeout_ms;   /* 4s: then an idle one is closed */

    /* [coalesce] */
    int coalesce;               /* on */
    double omitted_temperature; /* 0: what a request without one means */
    uint64_t max_followers;     /* 4096 per flight */
    uint64_t max_flight_bytes;  /* 8m */
    uint64_t max_reader_lag;    /* 32m: a client further behind is cut */
    uint64_t max_flights;       /* 1024 */
    int64_t follower_timeout_ms;    /* 10m: a follower's longest wait */
    int leader_writes;          /* on: the leader writes to caught-up readers */

    /* [cache]: finished flights kept for their ttl (coalesce.h) */
    int64_t cache_ttl_ms;       /* 0: off */
    uint64_t cache_max_bytes;   /* 256m: every entry, overhead included */
    uint64_t cache_max_entry_bytes;     /* 4m: a larger answer is not kept */

    /* [tenant NAME] */
    struct config_tenant tenants[CONFIG_MAX_TENANTS];
    size_t num_tenants;

    /*
     * [admin]: who may read /metrics, and where else it is served.  Its
     * keys are kept and compared like a tenant's (tenant.h), and a key
     * is either a tenant's or an admin's, never both.
     */
    char *admin_listen;         /* "" = no admin listener */
    uint64_t status_flights;    /* 100: flights /status.json lists */
    unsigned char admin_key_sha256[CONFIG_MAX_TENANT_KEYS]
                                  [CONFIG_KEY_DIGEST_LEN];
    size_t num_admin_keys;      /* digests wiped on release */

    /*
     * [cluster]: state shared across gateways in Redis (cluster.h).  Off
     * without the section: nothing connects.  The URL and the password
     * are secrets: wiped on release, never in a message.
     */
    int cluster;                /* the section is there (then redis is) */
    char *redis;                /* "redis://..." or "unix:/path" */
    char *redis_password_file;  /* "" = none */
    char *redis_password;       /* read from it at load; "" = none (the
                                   URL's, if it has one) */
    int64_t redis_timeout_ms;   /* 20ms: the longest a request waits */
    uint64_t redis_connections; /* 8: the pool, shared by every thread */
    char *key_prefix;           /* "infergw:" */
    char *node;                 /* "" = host name and listen port */
    int64_t lease_ms;           /* 10s: heartbeat and lease lifetime */
    int on_error;               /* enum config_on_error */

    /* config.c's: the line that set each setting (config_line()). */
    int set_line[CONFIG_MAX_SETTINGS];
};

/*
 * Load 'path' over the defaults.  Unknown section or key, bad value,
 * duplicate key, duplicate tenant, upstream, model or API key, a
 * client's api_key ([tenant], [admin]) under CONFIG_MIN_KEY_LEN, an
 * [upstream NAME] without url: fails with one message "FILE:LINE: ..."
 * in 'err'.  On failure 'c' is released.
 * Returns 0, GW_EIO, GW_EPARSE, GW_EINVAL or GW_ENOMEM.
 */
int config_load(const char *path, struct gw_config *c, char *err,
                size_t errlen);

/* Free everything 'c' owns; API keys are zeroized first. */
void config_release(struct gw_config *c);

/*
 * The line of c->path that set the global setting [section] key, for a
 * "FILE:LINE: ..." message about it made elsewhere (the TLS files are
 * checked where the listener's server is built, generation.c); 0 when the
 * default stands, or for a setting of a tenant or an upstream.
 */
int config_line(const struct gw_config *c, const char *section,
                const char *key);

/* Label text of a balance setting ("least_inflight", ...). */
const char *config_balance_name(int balance);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* Fill 'c' with the defaults (owned strings; config_release frees them). */
int config_defaults(struct gw_config *c);

/* config_load() from text. */
int config_load_text(const char *name, const char *text,
                     struct gw_config *c, char *err, size_t errlen);

/* The upstream called 'name', or NULL. */
const struct config_upstream *config_find_upstream(const struct gw_config *c,
                                                   const char *name);
#endif

#endif
