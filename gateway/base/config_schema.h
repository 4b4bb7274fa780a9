/* SPDX-License-Identifier: MIT */
/*
 * config_schema.h - the settings' schema (struct setting and the table of
 * them, config_schema.c), private to the config module: config.c, the
 * loader, looks keys up in it, parses values through it and applies its
 * defaults.  Nothing else includes it.
 *
 * The table is constant: it is read by any thread without a lock.
 */
#ifndef INFERGW_GATEWAY_BASE_CONFIG_SCHEMA_H
#define INFERGW_GATEWAY_BASE_CONFIG_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "base/config.h"

enum setting_type {
    T_LISTEN,           /* char *: HOST:PORT, [v6]:PORT or :PORT, or ""
                           (none) when 'min' is 1 */
    T_PATH,             /* char *: a file name, "" = none */
    T_TLS_VERSION,      /* int 12 or 13, from "1.2" or "1.3" */
    T_URL,              /* char *: http(s)://..., trailing '/' stripped */
    T_SECRET,           /* char *: wiped on free; 'min' = shortest length */
    T_TENANT_KEY,       /* its SHA-256 appended to the section's keys: a
                           tenant's key_sha256, or [admin]'s */
    T_TENANT_KEY_SHA256,    /* 64 hex digits, appended likewise */
    T_UINT,             /* uint64_t in [min, max] */
    T_INT,              /* int64_t in [-max, max] ('min' unused) */
    T_SIZE,             /* uint64_t bytes in [min, max] */
    T_DURATION,         /* int64_t milliseconds in [min, max] */
    T_BOOL,             /* int 0/1 */
    T_LOG_LEVEL,        /* int GW_LOG_* */
    T_LOG_FORMAT,       /* int GW_LOG_FORMAT_* */
    T_CIDRS,            /* gw_config.trusted_proxies, comma-separated */
    T_DECIMAL,          /* double in [min, max] */
    T_PERCENT,          /* double in [min, max] / 100, from "20%" */
    T_BALANCE,          /* int enum config_balance */
    T_MODELS,           /* config_upstream.models, comma-separated */
    T_REDIS_URL,        /* char *: redis.h's URL; a secret (a password) */
    T_KEY_TEXT,         /* char *: a piece of a Redis key: printable, no
                           blanks, quotes or braces, 'min'..'max' bytes */
    T_ON_ERROR,         /* int enum config_on_error */
};

/* Where a setting is stored. */
enum setting_scope {
    S_GLOBAL,           /* struct gw_config */
    S_TENANT,           /* the struct config_tenant being read */
    S_UPSTREAM,         /* the struct config_upstream being read */
};

struct setting {
    const char *section;
    const char *key;
    enum setting_type type;
    enum setting_scope scope;
    size_t offset;      /* into the struct 'scope' names */
    const char *def;    /* NULL: no default (a tenant's api_key; an
                         * upstream's timeouts, which take [routing]'s) */
    uint64_t min, max;
};

/* The rows: config_num_settings of them, at most CONFIG_MAX_SETTINGS. */
extern const struct setting config_settings[];
extern const size_t config_num_settings;

/* The row of [section] key, and OUT *idx its index, or NULL. */
const struct setting *config_find_setting(const char *section,
                                          const char *key, size_t *idx);

/*
 * Parse 'v' as setting 's' and store it in 'base' (the struct its scope
 * names).  Borrows both.  Returns 0, GW_EINVAL (nothing
 * stored) or GW_ENOMEM.  A tenant's key is only checked here: the
 * caller stores its digest, and checks it against every other tenant's.
 */
int config_set_value(const struct setting *s, char *base, const char *v);

/* What a setting accepts, for "KEY: expected <this>, got 'V'". */
void config_describe(const struct setting *s, char *out, size_t n);

/* A key goes into an HTTP header: printable, no blanks, no quotes; at
 * least 'min_len' bytes. */
int config_valid_secret(const char *s, uint64_t min_len);

/*
 * Apply every defaulted setting of 'section' stored in 'scope' to 'base'.
 * Returns 0 or GW_ENOMEM.
 */
int config_apply_defaults(const char *section, enum setting_scope scope,
                          char *base);

/* Free u's models and empty the list. */
void config_models_clear(struct config_upstream *u);

/*
 * redis_password_file 'path': its first line, without its line end,
 * 1..REDIS_URL_PASSWORD_MAX printable bytes, into *out (owned; the old
 * one wiped and freed).  Refused (GW_EINVAL, the reason without the
 * password in msg[0..msglen)): not a readable regular file, readable or
 * writable by group or others (but root's with mode 0640), not such a
 * line.  Read at every load, so a reload picks a rotated password up.
 * Returns 0, GW_EINVAL or GW_ENOMEM.
 */
int config_read_password_file(const char *path, char **out, char *msg,
                              size_t msglen);

#endif
