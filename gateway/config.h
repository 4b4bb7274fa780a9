/*
 * config.h - the gateway's settings: schema, defaults and loading.
 *
 * Every setting is documented, with its default, in etc/gateway.conf; the
 * table in config.c is the single source of truth for names and defaults.
 * A loaded struct gw_config is immutable and shared by every thread.
 */
#ifndef INFERGW_GATEWAY_CONFIG_H
#define INFERGW_GATEWAY_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAX_TENANTS 64
#define CONFIG_MAX_TENANT_KEYS 16

struct config_tenant {
    char *name;
    char *api_keys[CONFIG_MAX_TENANT_KEYS];   /* wiped before free */
    size_t num_keys;
    int coalesce;               /* per-tenant switch, default on */
};

struct gw_config {
    char *path;

    /* [server] */
    char *listen;               /* "127.0.0.1:8080" */
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
    int access_log;             /* on */

    /* [upstream] */
    char *upstream_url;         /* "http://127.0.0.1:8000", no trailing / */
    char *upstream_api_key;     /* "" = none; sent as Bearer; wiped */
    int forward_client_auth;    /* off: the client's Authorization stays */
    int64_t connect_timeout_ms; /* 5s */
    int64_t first_byte_timeout_ms;  /* 60s */
    int64_t upstream_idle_timeout_ms;   /* 30s: between body bytes */
    int64_t total_timeout_ms;   /* 10m */

    /* [coalesce] */
    int coalesce;               /* on */
    double omitted_temperature; /* 0: what a request without one means */
    uint64_t max_followers;     /* 4096 per flight */
    uint64_t max_flight_bytes;  /* 8m */
    uint64_t max_flights;       /* 1024 */
    int64_t follower_timeout_ms;    /* 10m: a follower's longest wait */
    int leader_writes;          /* on: the leader writes to caught-up readers */

    /* [tenant NAME] */
    struct config_tenant tenants[CONFIG_MAX_TENANTS];
    size_t num_tenants;
};

/* Fill 'c' with the defaults (owned strings; config_release frees them). */
int config_defaults(struct gw_config *c);

/*
 * Load 'path' over the defaults.  Unknown section or key, bad value,
 * duplicate key, duplicate tenant or API key: fails with one message
 * "FILE:LINE: ..." in 'err'.  On failure 'c' is released.
 * Returns 0, GW_EIO, GW_EPARSE, GW_EINVAL or GW_ENOMEM.
 */
int config_load(const char *path, struct gw_config *c, char *err,
                size_t errlen);

/* The same from text (tests). */
int config_load_text(const char *name, const char *text,
                     struct gw_config *c, char *err, size_t errlen);

/* Free everything 'c' owns; API keys are zeroized first. */
void config_release(struct gw_config *c);

#endif
