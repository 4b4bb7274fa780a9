/* SPDX-License-Identifier: MIT */
/*
 * config.c - the gateway's settings: the schema table, defaults, loading
 * and validation.
 *
 * Design: 'settings' below is the single source of truth.  Each row names
 * a section and key, the value's type, where it lives in struct gw_config
 * (or struct config_tenant), its default as the text a user would write,
 * and its bounds.  config_defaults() applies the default texts through the
 * same parsers a file goes through, so a default can never be a value the
 * file could not hold, and etc/gateway.conf is tested against the result.
 *
 * common/cfg.c turns the file into entries; this file walks them in order.
 * A section header arrives as an entry with an empty key (see cfg.c), which
 * is how a [tenant x] with no keys is noticed and why errors about a
 * section point at its header line.  The first problem stops the load with
 * one message "FILE:LINE: ..."; a half-valid config is never used.
 *
 * API keys (upstream.api_key, tenant api_key) are never echoed in messages
 * and are wiped before their memory is freed; a tenant's key is kept only
 * as its SHA-256, and the file's text is wiped by cfg.c.
 */
#include "base/config.h"

#include <assert.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/platform_util.h>
#include <mbedtls/sha256.h>

#include "alloc.h"
#include "cfg.h"
#include "log.h"
#include "net.h"
#include "util.h"

#define DEFAULT_URL "http://127.0.0.1:8000"
#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define DAY_MS (UINT64_C(24) * 60 * 60 * 1000)

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

#define C(field) S_GLOBAL, offsetof(struct gw_config, field)
#define TN(field) S_TENANT, offsetof(struct config_tenant, field)
#define UP(field) S_UPSTREAM, offsetof(struct config_upstream, field)
#define MAX_EJECT_MS (UINT64_C(5) * 60 * 1000)

/* Keep in step with etc/gateway.conf; check_cfg proves that it is. */
static const struct setting settings[] = {
    { "server", "listen", T_LISTEN, C(listen), "127.0.0.1:8080", 1, 0 },
    { "server", "tls_listen", T_LISTEN, C(tls_listen), "", 1, 0 },
    { "server", "tls_cert", T_PATH, C(tls_cert), "", 0, 0 },
    { "server", "tls_key", T_PATH, C(tls_key), "", 0, 0 },
    { "server", "tls_min_version", T_TLS_VERSION, C(tls_min_version), "1.2",
      0, 0 },
    { "server", "tls_handshake_timeout", T_DURATION,
      C(tls_handshake_timeout_ms), "10s", 1, DAY_MS },
    { "server", "tls_session_timeout", T_DURATION,
      C(tls_session_timeout_ms), "1h", 0, 7 * DAY_MS },
    { "server", "max_connections", T_UINT, C(max_connections), "1024",
      1, 1000000 },
    { "server", "thread_stack_size", T_SIZE, C(thread_stack_size), "256k",
      64 * KIB, 64 * MIB },
    { "server", "max_header_size", T_SIZE, C(max_header_size), "16k",
      KIB, MIB },
    { "server", "max_request_body", T_SIZE, C(max_request_body), "16m",
      KIB, GIB },
    { "server", "header_timeout", T_DURATION, C(header_timeout_ms), "10s",
      1, DAY_MS },
    { "server", "body_timeout", T_DURATION, C(body_timeout_ms), "60s",
      1, DAY_MS },
    { "server", "idle_timeout", T_DURATION, C(idle_timeout_ms), "60s",
      1, DAY_MS },
    { "server", "send_timeout", T_DURATION, C(send_timeout_ms), "60s",
      1, DAY_MS },
    { "server", "drain_timeout", T_DURATION, C(drain_timeout_ms), "30s",
      1, DAY_MS },
    { "server", "log_level", T_LOG_LEVEL, C(log_level), "info", 0, 0 },
    { "server", "log_format", T_LOG_FORMAT, C(log_format), "kv", 0, 0 },
    { "server", "access_log", T_BOOL, C(access_log), "on", 0, 0 },
    { "server", "log_repeat_interval", T_DURATION,
      C(log_repeat_interval_ms), "10s", 0, DAY_MS },
    { "server", "trusted_proxies", T_CIDRS, C(trusted_proxies), "", 0, 0 },

    { "upstream", "url", T_URL, UP(url), NULL, 0, 0 },
    { "upstream", "api_key", T_SECRET, UP(api_key), "", 0, 0 },
    { "upstream", "ca_file", T_PATH, UP(ca_file), "", 0, 0 },
    { "upstream", "client_cert", T_PATH, UP(client_cert), "", 0, 0 },
    { "upstream", "client_key", T_PATH, UP(client_key), "", 0, 0 },
    { "upstream", "tls_verify", T_BOOL, UP(tls_verify), "on", 0, 0 },
    { "upstream", "models", T_MODELS, UP(models), "", 0, 0 },
    { "upstream", "weight", T_UINT, UP(weight), "1", 1, 1000 },
    { "upstream", "max_inflight", T_UINT, UP(max_inflight), "0",
      0, 1000000 },
    { "upstream", "connect_timeout", T_DURATION, UP(connect_timeout_ms),
      NULL, 1, DAY_MS },
    { "upstream", "first_byte_timeout", T_DURATION,
      UP(first_byte_timeout_ms), NULL, 1, DAY_MS },
    { "upstream", "idle_timeout", T_DURATION, UP(idle_timeout_ms), NULL,
      1, DAY_MS },
    { "upstream", "total_timeout", T_DURATION, UP(total_timeout_ms), NULL,
      1, DAY_MS },
    /* Global, and kept here for configs written before [routing]. */
    { "upstream", "forward_client_auth", T_BOOL, C(forward_client_auth),
      NULL, 0, 0 },

    { "routing", "forward_client_auth", T_BOOL, C(forward_client_auth),
      "off", 0, 0 },
    { "routing", "balance", T_BALANCE, C(balance), "least_load", 0, 0 },
    { "routing", "health_interval", T_DURATION, C(health_interval_ms), "5s",
      0, DAY_MS },
    { "routing", "eject_after", T_UINT, C(eject_after), "3", 1, 1000 },
    { "routing", "eject_time", T_DURATION, C(eject_time_ms), "10s",
      1, MAX_EJECT_MS },
    { "routing", "max_ejected", T_PERCENT, C(max_ejected), "50%", 0, 100 },
    { "routing", "panic_below", T_PERCENT, C(panic_below), "50%", 0, 100 },
    { "routing", "retries", T_UINT, C(retries), "2", 0,
      CONFIG_MAX_UPSTREAMS - 1 },
    { "routing", "retry_budget", T_PERCENT, C(retry_budget), "20%", 0, 100 },
    { "routing", "retry_budget_min", T_UINT, C(retry_budget_min), "3",
      0, 1000000 },
    { "routing", "hedge_after", T_DURATION, C(hedge_after_ms), "0",
      0, DAY_MS },
    { "routing", "queue_timeout", T_DURATION, C(queue_timeout_ms), "2s",
      0, DAY_MS },
    { "routing", "prefix_epsilon", T_DECIMAL, C(prefix_epsilon), "0.1",
      0, 10 },
    { "routing", "prefix_bytes", T_SIZE, C(prefix_bytes), "1k", 16,
      64 * KIB },
    { "routing", "connect_timeout", T_DURATION, C(connect_timeout_ms),
      "5s", 1, DAY_MS },
    { "routing", "first_byte_timeout", T_DURATION,
      C(first_byte_timeout_ms), "60s", 1, DAY_MS },
    { "routing", "idle_timeout", T_DURATION, C(upstream_idle_timeout_ms),
      "30s", 1, DAY_MS },
    { "routing", "total_timeout", T_DURATION, C(total_timeout_ms), "10m",
      1, DAY_MS },
    { "routing", "keepalive", T_UINT, C(keepalive), "32", 0,
      CONFIG_MAX_KEEPALIVE },
    { "routing", "keepalive_timeout", T_DURATION, C(keepalive_timeout_ms),
      "4s", 1, DAY_MS },
    { "routing", "load_interval", T_DURATION, C(load_interval_ms), "100ms",
      0, DAY_MS },
    { "routing", "load_timeout", T_DURATION, C(load_timeout_ms), "200ms",
      1, DAY_MS },
    { "routing", "load_stale", T_DURATION, C(load_stale_ms), "1s",
      1, DAY_MS },
    { "routing", "kv_high", T_DECIMAL, C(kv_high), "0.9", 0, 1 },
    { "routing", "max_waiting", T_UINT, C(max_waiting), "4", 1, 1000000 },
    { "routing", "headroom", T_PERCENT, C(headroom), "10%", 0, 50 },

    { "coalesce", "enabled", T_BOOL, C(coalesce), "on", 0, 0 },
    { "coalesce", "omitted_temperature", T_DECIMAL,
      C(omitted_temperature), "0", 0, 2 },
    { "coalesce", "max_followers", T_UINT, C(max_followers), "4096",
      1, 1000000 },
    { "coalesce", "max_flight_bytes", T_SIZE, C(max_flight_bytes), "8m",
      KIB, GIB },
    { "coalesce", "max_reader_lag", T_SIZE, C(max_reader_lag), "32m",
      KIB, GIB },
    { "coalesce", "max_flights", T_UINT, C(max_flights), "1024",
      1, 1000000 },
    { "coalesce", "follower_timeout", T_DURATION, C(follower_timeout_ms),
      "10m", 1, DAY_MS },
    { "coalesce", "leader_writes", T_BOOL, C(leader_writes), "on", 0, 0 },

    { "tenant", "api_key", T_TENANT_KEY, TN(key_sha256), NULL,
      CONFIG_MIN_KEY_LEN, 0 },
    { "tenant", "api_key_sha256", T_TENANT_KEY_SHA256, TN(key_sha256), NULL,
      0, 0 },
    { "tenant", "coalesce", T_BOOL, TN(coalesce), "on", 0, 0 },
    { "tenant", "max_inflight", T_UINT, TN(max_inflight), "0", 0, 1000000 },
    { "tenant", "requests_per_minute", T_UINT, TN(requests_per_minute), "0",
      0, 1000000000 },
    { "tenant", "weight", T_UINT, TN(weight), "1", 1, 1000 },
    { "tenant", "priority", T_INT, TN(priority), "0", 0, 1000 },

    { "admin", "listen", T_LISTEN, C(admin_listen), "", 1, 0 },
    { "admin", "api_key", T_TENANT_KEY, C(admin_key_sha256), NULL,
      CONFIG_MIN_KEY_LEN, 0 },
    { "admin", "api_key_sha256", T_TENANT_KEY_SHA256, C(admin_key_sha256),
      NULL, 0, 0 },
    { "admin", "status_flights", T_UINT, C(status_flights), "100", 0,
      10000 },
};

#define NUM_SETTINGS GW_ARRAY_LEN(settings)
_Static_assert(NUM_SETTINGS <= CONFIG_MAX_SETTINGS, "CONFIG_MAX_SETTINGS");

/* How a section is named. */
enum section_naming {
    N_NONE,             /* [server]: one, no name */
    N_REQUIRED,         /* [tenant NAME]: repeats */
    N_OPTIONAL,         /* [upstream NAME] repeats; [upstream] = "default" */
};

static const struct {
    const char *name;
    enum section_naming named;
} sections[] = {
    { "server", N_NONE },
    { "upstream", N_OPTIONAL },
    { "routing", N_NONE },
    { "coalesce", N_NONE },
    { "tenant", N_REQUIRED },
    { "admin", N_NONE },
};

#define NUM_SECTIONS GW_ARRAY_LEN(sections)

/* State while walking the entries of one file. */
struct loader {
    struct gw_config *c;
    const char *name;               /* file name for messages; borrowed */
    char *err;
    size_t errlen;
    int section_line[NUM_SECTIONS]; /* header line of each unnamed one */
    int set_line[NUM_SETTINGS];     /* line that set each key, 0 = unset */
    struct config_tenant *tenant;   /* the section being read, if a tenant */
    int tenant_line[CONFIG_MAX_TENANTS];
    struct config_upstream *upstream;   /* ... if an upstream */
    int upstream_plain;             /* ... and it is the plain [upstream] */
};

/* "FILE:LINE: message" into ld->err; line 0 gives "FILE: message". */
static void GW_PRINTF(3, 4)
set_err(struct loader *ld, int line, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (ld->err == NULL || ld->errlen == 0)
        return;
    if (line > 0)
        n = snprintf(ld->err, ld->errlen, "%s:%d: ", ld->name, line);
    else
        n = snprintf(ld->err, ld->errlen, "%s: ", ld->name);
    if (n < 0 || (size_t)n >= ld->errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

/*
 * Replace the string at *field with a copy of 'v'.  Borrows 'v'; frees
 * the old string (wiped first when 'secret').  GW_ENOMEM leaves *field.
 */
static int
replace_string(char **field, const char *v, int secret)
{
    char *dup = gw_strdup(v);

    if (dup == NULL)
        return GW_ENOMEM;
    if (secret)
        gw_wipe_free_str(*field);
    else
        gw_free(*field);
    *field = dup;
    return 0;
}

/*
 * "HOST:PORT", "[IPv6]:PORT" or ":PORT" (every address), as
 * net_parse_hostport() reads them; PORT 0 asks the kernel for a free one
 * (tests use it).  The host is only checked for plausible characters:
 * whether it resolves is for the listener to say, with the resolver's
 * own message.
 */
static int
valid_listen(const char *s)
{
    const char *host, *p;
    size_t n;
    int port;

    if (net_parse_hostport(s, &host, &n, &port) != 0)
        return 0;
    for (p = host; p < host + n; p++) {
        if (s[0] == '[' ? strchr("0123456789abcdefABCDEF:.", *p) == NULL
            : !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
                || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            return 0;
    }
    return 1;
}

/* A file name: anything but control characters ("" = none). */
static int
valid_path(const char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

/*
 * An http:// or https:// base URL with a host, no blanks or control
 * characters, and no query or fragment (paths are appended to it).
 */
static int
valid_url(const char *s)
{
    const char *host, *p;

    if (strncasecmp(s, "http://", 7) == 0)
        host = s + 7;
    else if (strncasecmp(s, "https://", 8) == 0)
        host = s + 8;
    else
        return 0;
    if (*host == '\0' || *host == '/')
        return 0;
    for (p = s; *p != '\0'; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f
            || *p == '?' || *p == '#' || *p == '"')
            return 0;
    return 1;
}

/* A key goes into an HTTP header: printable, no blanks, no quotes. */
static int
valid_secret(const char *s, uint64_t min_len)
{
    const char *p;

    for (p = s; *p != '\0'; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f
            || *p == '"')
            return 0;
    return (uint64_t)(p - s) >= min_len;
}

/* What a setting accepts, for "KEY: expected <this>, got 'V'". */
static void
describe(const struct setting *s, char *out, size_t n)
{
    char lo[32], hi[32];

    switch (s->type) {
    case T_LISTEN:
        snprintf(out, n, "HOST:PORT, [IPv6]:PORT or :PORT (PORT 0..65535)%s",
                 s->min == 1 ? ", or nothing for none" : "");
        break;
    case T_PATH:
        snprintf(out, n, "a file name without control characters");
        break;
    case T_TLS_VERSION:
        snprintf(out, n, "1.2 or 1.3");
        break;
    case T_URL:
        snprintf(out, n, "an http:// or https:// URL without ?query or "
                 "#fragment");
        break;
    case T_SECRET:
    case T_TENANT_KEY:
        snprintf(out, n, "a %skey without blanks, quotes or control "
                 "characters", s->min > 0 ? "non-empty " : "");
        break;
    case T_TENANT_KEY_SHA256:
        snprintf(out, n, "64 hex digits (the SHA-256 of the key)");
        break;
    case T_UINT:
        snprintf(out, n, "an integer %" PRIu64 "..%" PRIu64, s->min,
                 s->max);
        break;
    case T_INT:
        snprintf(out, n, "an integer -%" PRIu64 "..%" PRIu64, s->max,
                 s->max);
        break;
    case T_SIZE:
        cfg_format_size(s->min, lo, sizeof(lo));
        cfg_format_size(s->max, hi, sizeof(hi));
        snprintf(out, n, "a size %s..%s (bytes, or a number with k, m or g)",
                 lo, hi);
        break;
    case T_DURATION:
        cfg_format_duration_ms(s->min, lo, sizeof(lo));
        cfg_format_duration_ms(s->max, hi, sizeof(hi));
        snprintf(out, n, "a duration %s..%s (e.g. 250ms, 30s, 5m, 1h)",
                 lo, hi);
        break;
    case T_BOOL:
        snprintf(out, n, "on or off (or yes/no, true/false, 1/0)");
        break;
    case T_LOG_LEVEL:
        snprintf(out, n, "error, warn, info or debug");
        break;
    case T_LOG_FORMAT:
        snprintf(out, n, "kv or json");
        break;
    case T_CIDRS:
        snprintf(out, n, "IP addresses or networks (10.0.0.0/8, fd00::/8) "
                 "separated by commas, at most %d, no host bits past the "
                 "prefix", CONFIG_MAX_TRUSTED_PROXIES);
        break;
    case T_DECIMAL:
        snprintf(out, n, "a number %" PRIu64 "..%" PRIu64, s->min, s->max);
        break;
    case T_PERCENT:
        snprintf(out, n, "a share %" PRIu64 "%%..%" PRIu64 "%%, as in 20%%",
                 s->min, s->max);
        break;
    case T_BALANCE:
        snprintf(out, n, "least_load, least_inflight, round_robin or "
                 "prefix");
        break;
    case T_MODELS:
        snprintf(out, n, "model names separated by commas (at most %d, "
                 "each at most %d characters, without blanks or quotes)",
                 CONFIG_MAX_MODELS, CONFIG_NAME_MAX);
        break;
    }
}

static const char *const balance_names[] = {
    [BALANCE_LEAST_LOAD] = "least_load",
    [BALANCE_LEAST_INFLIGHT] = "least_inflight",
    [BALANCE_ROUND_ROBIN] = "round_robin",
    [BALANCE_PREFIX] = "prefix",
};

const char *
config_balance_name(int balance)
{
    if (balance < 0 || (size_t)balance >= GW_ARRAY_LEN(balance_names))
        return "?";
    return balance_names[balance];
}

/* A model name: printable, no blanks, quotes or commas. */
static int
valid_model(const char *p, size_t n)
{
    size_t i;

    if (n == 0 || n > CONFIG_NAME_MAX)
        return 0;
    for (i = 0; i < n; i++)
        if ((unsigned char)p[i] <= 0x20 || (unsigned char)p[i] >= 0x7f
            || p[i] == '"' || p[i] == ',' || p[i] == '\\')
            return 0;
    return 1;
}

static void
models_clear(struct config_upstream *u)
{
    while (u->num_models > 0) {
        u->num_models--;
        gw_free(u->models[u->num_models]);
        u->models[u->num_models] = NULL;
    }
}

/*
 * The next element of the comma-separated list at *p, blanks around it
 * trimmed: OUT *item, *n (a view into the list, empty for ",," or a last
 * comma).  Returns whether another element follows (*p then points past
 * this one's comma).
 */
static int
list_next(const char **p, const char **item, size_t *n)
{
    const char *s = *p, *comma = strchr(s, ','), *end;

    end = comma != NULL ? comma : s + strlen(s);
    while (*s == ' ' || *s == '\t')
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *item = s;
    *n = (size_t)(end - s);
    if (comma != NULL)
        *p = comma + 1;
    return comma != NULL;
}

/* Is the list 'v' empty (nothing but blanks)? */
static int
list_empty(const char *v)
{
    return v[strspn(v, " \t")] == '\0';
}

/* "a, b,c" into u->models (replacing them); "" is the empty list. */
static int
parse_models(struct config_upstream *u, const char *v)
{
    const char *p = v, *item;
    size_t n;
    int more = !list_empty(v);

    models_clear(u);
    while (more) {
        more = list_next(&p, &item, &n);
        if (!valid_model(item, n) || u->num_models == CONFIG_MAX_MODELS) {
            models_clear(u);
            return GW_EINVAL;
        }
        u->models[u->num_models] = gw_strndup(item, n);
        if (u->models[u->num_models] == NULL) {
            models_clear(u);
            return GW_ENOMEM;
        }
        u->num_models++;
    }
    return 0;
}

/*
 * "10.0.0.0/8, ::1" into c->trusted_proxies (replacing them); "" is the
 * empty list.  Nothing is stored on GW_EINVAL.
 */
static int
parse_cidrs(struct gw_config *c, const char *v)
{
    struct net_cidr nets[CONFIG_MAX_TRUSTED_PROXIES];
    const char *p = v, *item;
    size_t count = 0, n;
    int more = !list_empty(v);

    while (more) {
        more = list_next(&p, &item, &n);
        if (count == CONFIG_MAX_TRUSTED_PROXIES
            || net_cidr_parse(item, n, &nets[count]) != 0)
            return GW_EINVAL;
        count++;
    }
    memcpy(c->trusted_proxies, nets, count * sizeof(nets[0]));
    c->num_trusted_proxies = count;
    return 0;
}

/*
 * Parse 'v' as setting 's' and store it in 'base' (the struct its scope
 * names).  Borrows both.  Returns 0, GW_EINVAL (nothing
 * stored) or GW_ENOMEM.  A tenant's key is only checked here: the
 * caller stores its digest, and checks it against every other tenant's.
 */
static int
set_value(const struct setting *s, char *base, const char *v)
{
    void *field = base + s->offset;
    uint64_t u;
    int64_t ms;
    double d;
    int b, rc;
    char *url;
    size_t n;

    switch (s->type) {
    case T_LISTEN:
        if (!(valid_listen(v) || (s->min == 1 && v[0] == '\0')))
            return GW_EINVAL;
        return replace_string(field, v, 0);
    case T_PATH:
        if (!valid_path(v))
            return GW_EINVAL;
        return replace_string(field, v, 0);
    case T_TLS_VERSION:
        if (strcmp(v, "1.2") != 0 && strcmp(v, "1.3") != 0)
            return GW_EINVAL;
        *(int *)field = v[2] == '2' ? 12 : 13;
        return 0;
    case T_URL:
        if (!valid_url(v))
            return GW_EINVAL;
        rc = replace_string(field, v, 0);
        if (rc != 0)
            return rc;
        /* Request paths are appended as "/v1/...": avoid "//v1". */
        url = *(char **)field;
        n = strlen(url);
        while (n > 0 && url[n - 1] == '/')
            url[--n] = '\0';
        return 0;
    case T_SECRET:
    case T_TENANT_KEY:
        if (!valid_secret(v, s->min))
            return GW_EINVAL;
        if (s->type == T_TENANT_KEY)
            return 0;
        return replace_string(field, v, 1);
    case T_TENANT_KEY_SHA256:
        return strlen(v) == 2 * CONFIG_KEY_DIGEST_LEN
               && strspn(v, "0123456789abcdefABCDEF") == strlen(v)
               ? 0 : GW_EINVAL;
    case T_UINT:
        if (cfg_parse_uint(v, s->max, &u) != 0 || u < s->min)
            return GW_EINVAL;
        *(uint64_t *)field = u;
        return 0;
    case T_INT:
        if (cfg_parse_uint(v + (*v == '-'), s->max, &u) != 0)
            return GW_EINVAL;
        *(int64_t *)field = *v == '-' ? -(int64_t)u : (int64_t)u;
        return 0;
    case T_SIZE:
        if (cfg_parse_size(v, &u) != 0 || u < s->min || u > s->max)
            return GW_EINVAL;
        *(uint64_t *)field = u;
        return 0;
    case T_DURATION:
        if (cfg_parse_duration_ms(v, &ms) != 0 || ms < (int64_t)s->min
            || ms > (int64_t)s->max)
            return GW_EINVAL;
        *(int64_t *)field = ms;
        return 0;
    case T_BOOL:
        if (cfg_parse_bool(v, &b) != 0)
            return GW_EINVAL;
        *(int *)field = b;
        return 0;
    case T_LOG_LEVEL:
        b = log_level_parse(v);
        if (b < 0)
            return GW_EINVAL;
        *(int *)field = b;
        return 0;
    case T_LOG_FORMAT:
        b = log_format_parse(v);
        if (b < 0)
            return GW_EINVAL;
        *(int *)field = b;
        return 0;
    case T_CIDRS:
        return parse_cidrs((struct gw_config *)(void *)base, v);
    case T_DECIMAL:
        if (cfg_parse_decimal(v, (double)s->min, (double)s->max, &d) != 0)
            return GW_EINVAL;
        *(double *)field = d;
        return 0;
    case T_PERCENT:
        if (cfg_parse_percent(v, (double)s->min, (double)s->max, &d) != 0)
            return GW_EINVAL;
        *(double *)field = d;
        return 0;
    case T_BALANCE:
        for (n = 0; n < GW_ARRAY_LEN(balance_names); n++) {
            if (strcmp(v, balance_names[n]) == 0) {
                *(int *)field = (int)n;
                return 0;
            }
        }
        return GW_EINVAL;
    case T_MODELS:
        return parse_models((struct config_upstream *)(void *)base, v);
    }
    return GW_EINVAL;
}

static const struct setting *
find_setting(const char *section, const char *key, size_t *idx)
{
    size_t i;

    for (i = 0; i < NUM_SETTINGS; i++) {
        if (strcmp(settings[i].section, section) == 0
            && strcmp(settings[i].key, key) == 0) {
            *idx = i;
            return &settings[i];
        }
    }
    return NULL;
}

/* Apply every defaulted setting of 'section' stored in 'scope' to 'base'. */
static int
apply_defaults(const char *section, enum setting_scope scope, char *base)
{
    size_t i;
    int rc;

    for (i = 0; i < NUM_SETTINGS; i++) {
        if (strcmp(settings[i].section, section) != 0
            || settings[i].scope != scope || settings[i].def == NULL)
            continue;
        rc = set_value(&settings[i], base, settings[i].def);
        /* A default the parser refuses is a bug in the table above. */
        assert(rc != GW_EINVAL);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void
upstream_release(struct config_upstream *u)
{
    gw_free(u->name);
    gw_free(u->url);
    gw_wipe_free_str(u->api_key);
    gw_free(u->ca_file);
    gw_free(u->client_cert);
    gw_free(u->client_key);
    models_clear(u);
    memset(u, 0, sizeof(*u));
}

/*
 * Start upstream 'name' in the next free slot (the caller checked there
 * is one): its defaults, and its timeouts unset (-1) until resolve().
 */
static int
upstream_start(struct gw_config *c, const char *name, int line,
               struct config_upstream **out)
{
    struct config_upstream *u = &c->upstreams[c->num_upstreams];
    int rc;

    memset(u, 0, sizeof(*u));
    u->name = gw_strdup(name);
    if (u->name == NULL)
        return GW_ENOMEM;
    /* Counted from here on, so config_release frees what it holds. */
    c->num_upstreams++;
    u->line = line;
    u->connect_timeout_ms = -1;
    u->first_byte_timeout_ms = -1;
    u->idle_timeout_ms = -1;
    u->total_timeout_ms = -1;
    rc = apply_defaults("upstream", S_UPSTREAM, (char *)u);
    if (rc != 0)
        return rc;
    *out = u;
    return 0;
}

/* An upstream's unset timeouts take [routing]'s; a missing url the default. */
static int
upstream_resolve(const struct gw_config *c, struct config_upstream *u)
{
    if (u->connect_timeout_ms < 0)
        u->connect_timeout_ms = c->connect_timeout_ms;
    if (u->first_byte_timeout_ms < 0)
        u->first_byte_timeout_ms = c->first_byte_timeout_ms;
    if (u->idle_timeout_ms < 0)
        u->idle_timeout_ms = c->upstream_idle_timeout_ms;
    if (u->total_timeout_ms < 0)
        u->total_timeout_ms = c->total_timeout_ms;
    if (u->url == NULL) {
        u->url = gw_strdup(DEFAULT_URL);
        if (u->url == NULL)
            return GW_ENOMEM;
    }
    return 0;
}

int
config_defaults(struct gw_config *c)
{
    struct config_upstream *u;
    size_t i;
    int rc;

    memset(c, 0, sizeof(*c));
    for (i = 0; i < NUM_SECTIONS; i++) {
        if (sections[i].named != N_NONE)
            continue;
        rc = apply_defaults(sections[i].name, S_GLOBAL, (char *)c);
        if (rc != 0)
            goto out;
    }
    /* The built-in upstream (line 0): a file's first [upstream] drops it. */
    rc = upstream_start(c, "default", 0, &u);
    if (rc == 0)
        rc = upstream_resolve(c, u);
out:
    if (rc != 0)
        config_release(c);
    return rc;
}

const struct config_upstream *
config_find_upstream(const struct gw_config *c, const char *name)
{
    size_t i;

    for (i = 0; i < c->num_upstreams; i++)
        if (strcmp(c->upstreams[i].name, name) == 0)
            return &c->upstreams[i];
    return NULL;
}

int
config_line(const struct gw_config *c, const char *section, const char *key)
{
    size_t idx;

    return find_setting(section, key, &idx) != NULL
           && settings[idx].scope == S_GLOBAL ? c->set_line[idx] : 0;
}

void
config_release(struct gw_config *c)
{
    size_t i;

    gw_free(c->path);
    gw_free(c->listen);
    gw_free(c->tls_listen);
    gw_free(c->tls_cert);
    gw_free(c->tls_key);
    for (i = 0; i < c->num_upstreams; i++)
        upstream_release(&c->upstreams[i]);
    for (i = 0; i < c->num_tenants; i++) {
        struct config_tenant *t = &c->tenants[i];

        gw_free(t->name);
        mbedtls_platform_zeroize(t->key_sha256, sizeof(t->key_sha256));
    }
    gw_free(c->admin_listen);
    mbedtls_platform_zeroize(c->admin_key_sha256,
                             sizeof(c->admin_key_sha256));
    /* Leaves every pointer NULL, so a second release is harmless. */
    memset(c, 0, sizeof(*c));
}

/* "[server]" or "[tenant acme]" for messages. */
static void
fmt_section(const struct cfg_entry *e, char *out, size_t n)
{
    snprintf(out, n, "[%s%s%s]", e->section, e->name[0] != '\0' ? " " : "",
             e->name);
}

/* A tenant section ends: it must have produced at least one key. */
static int
end_tenant(struct loader *ld)
{
    struct config_tenant *t = ld->tenant;

    ld->tenant = NULL;
    if (t == NULL || t->num_keys > 0)
        return 0;
    set_err(ld, ld->tenant_line[t - ld->c->tenants],
            "tenant '%s' has no api_key", t->name);
    return GW_EINVAL;
}

/*
 * A file an upstream names (ca_file, client_cert, client_key) is a
 * readable regular file, or libcurl would fail every call at run time.
 * O_NONBLOCK: a FIFO named by mistake must not hang the load.
 */
static int
check_upstream_file(struct loader *ld, const struct config_upstream *u,
                    const char *key, const char *path)
{
    struct stat st;
    int fd, ok;

    if (path[0] == '\0')
        return 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    ok = fd != -1 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (fd != -1)
        close(fd);
    if (ok)
        return 0;
    set_err(ld, u->line, "upstream '%s': %s %s: not a readable file",
            u->name, key, path);
    return GW_EINVAL;
}

/*
 * An upstream section ends: a named one must have said where it is, a
 * client certificate comes with its key, and the files it names can be
 * read.
 */
static int
end_upstream(struct loader *ld)
{
    struct config_upstream *u = ld->upstream;

    ld->upstream = NULL;
    if (u == NULL)
        return 0;
    if ((u->client_cert[0] != '\0') != (u->client_key[0] != '\0')) {
        set_err(ld, u->line, "upstream '%s': client_cert and client_key "
                "go together", u->name);
        return GW_EINVAL;
    }
    if (check_upstream_file(ld, u, "ca_file", u->ca_file) != 0
        || check_upstream_file(ld, u, "client_cert", u->client_cert) != 0
        || check_upstream_file(ld, u, "client_key", u->client_key) != 0)
        return GW_EINVAL;
    if (u->url != NULL || ld->upstream_plain)
        return 0;
    set_err(ld, u->line, "upstream '%s' has no url", u->name);
    return GW_EINVAL;
}

/* Forget the per-section "set at line" marks of a repeating section. */
static void
reset_set_lines(struct loader *ld, enum setting_scope scope)
{
    size_t i;

    for (i = 0; i < NUM_SETTINGS; i++)
        if (settings[i].scope == scope)
            ld->set_line[i] = 0;
}

/* An upstream name goes into metrics labels and logs: keep it plain. */
static int
valid_name(const char *s)
{
    size_t n = strlen(s), i;

    if (n == 0 || n > CONFIG_NAME_MAX)
        return 0;
    for (i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')
              || (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-'
              || s[i] == '_'))
            return 0;
    return 1;
}

static int
on_upstream_header(struct loader *ld, const struct cfg_entry *e)
{
    struct gw_config *c = ld->c;
    const char *name = e->name[0] != '\0' ? e->name : "default";
    size_t i;
    int rc;

    if (!valid_name(name)) {
        set_err(ld, e->line, "upstream name '%s': expected at most %d "
                "letters, digits, '.', '-' or '_'", name, CONFIG_NAME_MAX);
        return GW_EINVAL;
    }
    /* The built-in upstream gives way to the file's. */
    if (c->num_upstreams == 1 && c->upstreams[0].line == 0) {
        upstream_release(&c->upstreams[0]);
        c->num_upstreams = 0;
    }
    for (i = 0; i < c->num_upstreams; i++) {
        if (strcmp(c->upstreams[i].name, name) == 0) {
            set_err(ld, e->line, "duplicate upstream '%s', first at line %d",
                    name, c->upstreams[i].line);
            return GW_EINVAL;
        }
    }
    if (c->num_upstreams == CONFIG_MAX_UPSTREAMS) {
        set_err(ld, e->line, "too many upstreams (at most %d)",
                CONFIG_MAX_UPSTREAMS);
        return GW_EINVAL;
    }
    rc = upstream_start(c, name, e->line, &ld->upstream);
    if (rc != 0)
        return rc;
    ld->upstream_plain = e->name[0] == '\0';
    reset_set_lines(ld, S_UPSTREAM);
    return 0;
}

static int
on_tenant_header(struct loader *ld, const struct cfg_entry *e)
{
    struct gw_config *c = ld->c;
    struct config_tenant *t;
    size_t i;
    int rc;

    if (strlen(e->name) > CONFIG_NAME_MAX) {
        set_err(ld, e->line, "tenant name longer than %d characters",
                CONFIG_NAME_MAX);
        return GW_EINVAL;
    }
    for (i = 0; i < c->num_tenants; i++) {
        if (strcmp(c->tenants[i].name, e->name) == 0) {
            set_err(ld, e->line, "duplicate tenant '%s', first at line %d",
                    e->name, ld->tenant_line[i]);
            return GW_EINVAL;
        }
    }
    if (c->num_tenants == CONFIG_MAX_TENANTS) {
        set_err(ld, e->line, "too many tenants (at most %d)",
                CONFIG_MAX_TENANTS);
        return GW_EINVAL;
    }
    t = &c->tenants[c->num_tenants];
    memset(t, 0, sizeof(*t));
    t->name = gw_strdup(e->name);
    if (t->name == NULL)
        return GW_ENOMEM;
    /* Counted from here on, so config_release frees the name. */
    ld->tenant_line[c->num_tenants] = e->line;
    c->num_tenants++;
    rc = apply_defaults("tenant", S_TENANT, (char *)t);
    if (rc != 0)
        return rc;
    ld->tenant = t;
    reset_set_lines(ld, S_TENANT);
    return 0;
}

static int
on_header(struct loader *ld, const struct cfg_entry *e)
{
    size_t i;
    int rc;

    for (i = 0; i < NUM_SECTIONS; i++)
        if (strcmp(sections[i].name, e->section) == 0)
            break;
    if (i == NUM_SECTIONS) {
        set_err(ld, e->line, "unknown section [%s]", e->section);
        return GW_EINVAL;
    }
    if (sections[i].named == N_NONE && e->name[0] != '\0') {
        set_err(ld, e->line, "section [%s] takes no name", e->section);
        return GW_EINVAL;
    }
    if (sections[i].named == N_REQUIRED && e->name[0] == '\0') {
        set_err(ld, e->line, "section [%s] needs a name, as in "
                "[%s NAME]", e->section, e->section);
        return GW_EINVAL;
    }
    rc = end_tenant(ld);
    if (rc == 0)
        rc = end_upstream(ld);
    if (rc != 0)
        return rc;
    if (sections[i].named == N_REQUIRED)
        return on_tenant_header(ld, e);
    if (sections[i].named == N_OPTIONAL)
        return on_upstream_header(ld, e);
    if (ld->section_line[i] != 0) {
        set_err(ld, e->line, "duplicate section [%s], first at line %d",
                e->section, ld->section_line[i]);
        return GW_EINVAL;
    }
    ld->section_line[i] = e->line;
    return 0;
}

/* 64 hex digits (set_value checked them) to CONFIG_KEY_DIGEST_LEN bytes. */
static void
unhex_digest(const char *hex, unsigned char *out)
{
    for (size_t i = 0; i < CONFIG_KEY_DIGEST_LEN; i++) {
        unsigned v = 0;

        for (size_t j = 0; j < 2; j++) {
            char ch = hex[2 * i + j];

            v = v * 16 + (unsigned)(ch <= '9' ? ch - '0'
                                    : (ch | 0x20) - 'a' + 10);
        }
        out[i] = (unsigned char)v;
    }
}

/*
 * 'd' is already a key of a tenant or of [admin]: who has it, for the
 * message, or NULL.
 */
static const char *
key_owner(const struct gw_config *c, const unsigned char *d, char *buf,
          size_t n)
{
    size_t i, k;

    for (i = 0; i < c->num_tenants; i++)
        for (k = 0; k < c->tenants[i].num_keys; k++)
            if (memcmp(c->tenants[i].key_sha256[k], d,
                       CONFIG_KEY_DIGEST_LEN) == 0) {
                snprintf(buf, n, "tenant '%s'", c->tenants[i].name);
                return buf;
            }
    for (k = 0; k < c->num_admin_keys; k++)
        if (memcmp(c->admin_key_sha256[k], d, CONFIG_KEY_DIGEST_LEN) == 0)
            return "[admin]";
    return NULL;
}

/*
 * An api_key or api_key_sha256 line of a [tenant] ('s' scoped S_TENANT)
 * or of [admin]: its digest, appended to that section's keys, at most
 * CONFIG_MAX_TENANT_KEYS of them.  A key is one section's only, so a
 * tenant's key never reads /metrics (a key and its own digest are the
 * same key).
 */
static int
add_key(struct loader *ld, const struct setting *s,
        const struct cfg_entry *e)
{
    struct gw_config *c = ld->c;
    int tenant = s->scope == S_TENANT;
    unsigned char (*keys)[CONFIG_KEY_DIGEST_LEN] =
        tenant ? ld->tenant->key_sha256 : c->admin_key_sha256;
    size_t *n = tenant ? &ld->tenant->num_keys : &c->num_admin_keys;
    unsigned char d[CONFIG_KEY_DIGEST_LEN];
    const char *owner;
    char who[CONFIG_NAME_MAX + 16];

    if (*n == CONFIG_MAX_TENANT_KEYS) {
        if (tenant)
            set_err(ld, e->line, "tenant '%s' has more than %d api_key "
                    "lines", ld->tenant->name, CONFIG_MAX_TENANT_KEYS);
        else
            set_err(ld, e->line, "[admin] has more than %d api_key lines",
                    CONFIG_MAX_TENANT_KEYS);
        return GW_EINVAL;
    }
    if (s->type == T_TENANT_KEY_SHA256)
        unhex_digest(e->value, d);
    else
        mbedtls_sha256_ret((const unsigned char *)e->value,
                           strlen(e->value), d, 0);
    owner = key_owner(c, d, who, sizeof(who));
    if (owner != NULL) {
        mbedtls_platform_zeroize(d, sizeof(d));
        set_err(ld, e->line, "this api_key is already used by %s", owner);
        return GW_EINVAL;
    }
    memcpy(keys[(*n)++], d, sizeof(d));
    mbedtls_platform_zeroize(d, sizeof(d));
    return 0;
}

/*
 * The line that already set the value 's' stores, or 0.  Two rows may
 * store one global value (forward_client_auth in [upstream] and
 * [routing]); setting it twice is a duplicate either way.
 */
static int
first_set_line(const struct loader *ld, const struct setting *s, size_t idx)
{
    size_t i;

    if (s->scope != S_GLOBAL)
        return ld->set_line[idx];
    for (i = 0; i < NUM_SETTINGS; i++)
        if (settings[i].scope == S_GLOBAL
            && settings[i].offset == s->offset && ld->set_line[i] != 0)
            return ld->set_line[i];
    return 0;
}

/* Where setting 's' is stored while 'ld' reads its current section. */
static char *
setting_base(const struct loader *ld, const struct setting *s)
{
    switch (s->scope) {
    case S_TENANT:
        return (char *)ld->tenant;
    case S_UPSTREAM:
        return (char *)ld->upstream;
    case S_GLOBAL:
        break;
    }
    return (char *)ld->c;
}

/* One model twice in one upstream's list is a typo worth a message. */
static int
check_models(struct loader *ld, const struct cfg_entry *e)
{
    const struct config_upstream *u = ld->upstream;
    size_t i, k;

    for (i = 0; i < u->num_models; i++) {
        for (k = 0; k < i; k++) {
            if (strcmp(u->models[i], u->models[k]) == 0) {
                set_err(ld, e->line, "models: '%s' is listed twice",
                        u->models[i]);
                return GW_EINVAL;
            }
        }
    }
    return 0;
}

static int
on_setting(struct loader *ld, const struct cfg_entry *e)
{
    const struct setting *s;
    char where[160], expected[160];
    size_t idx;
    int line;
    int rc;

    if (e->section[0] == '\0') {
        set_err(ld, e->line, "'%s' is set before any [section]", e->key);
        return GW_EINVAL;
    }
    fmt_section(e, where, sizeof(where));
    s = find_setting(e->section, e->key, &idx);
    if (s == NULL) {
        set_err(ld, e->line, "unknown key '%s' in %s", e->key, where);
        return GW_EINVAL;
    }
    if (s->scope == S_GLOBAL && ld->upstream != NULL
        && !ld->upstream_plain) {
        /* It is every upstream's: only the old plain form may hold it. */
        set_err(ld, e->line, "'%s' applies to every upstream: set it in "
                "[routing]", e->key);
        return GW_EINVAL;
    }
    line = first_set_line(ld, s, idx);
    if (s->type != T_TENANT_KEY && s->type != T_TENANT_KEY_SHA256
        && line != 0) {
        set_err(ld, e->line, "duplicate key '%s' in %s, first set at "
                "line %d", e->key, where, line);
        return GW_EINVAL;
    }
    rc = set_value(s, setting_base(ld, s), e->value);
    if (rc == GW_EINVAL && s->type == T_TENANT_KEY && e->value[0] != '\0'
        && valid_secret(e->value, 0)) {
        /* A key a client presents must not be guessable. */
        set_err(ld, e->line, "%s: a weak key: at least %" PRIu64
                " characters are needed", e->key, s->min);
        return rc;
    }
    if (rc == GW_EINVAL) {
        describe(s, expected, sizeof(expected));
        if (s->type == T_SECRET || s->type == T_TENANT_KEY
            || s->type == T_TENANT_KEY_SHA256)
            set_err(ld, e->line, "%s: expected %s", e->key, expected);
        else
            set_err(ld, e->line, "%s: expected %s, got '%s'", e->key,
                    expected, e->value);
        return rc;
    }
    if (rc != 0)
        return rc;
    if (s->type == T_TENANT_KEY || s->type == T_TENANT_KEY_SHA256)
        rc = add_key(ld, s, e);
    else if (s->type == T_MODELS)
        rc = check_models(ld, e);
    if (rc != 0)
        return rc;
    ld->set_line[idx] = e->line;
    return 0;
}

/* Walk the entries of 'f' over the defaults already in ld->c. */
static int
apply_file(struct loader *ld, const struct cfg_file *f)
{
    size_t i;
    int rc;

    for (i = 0; i < f->count; i++) {
        const struct cfg_entry *e = &f->entries[i];

        if (e->key[0] == '\0')
            rc = on_header(ld, e);
        else
            rc = on_setting(ld, e);
        if (rc != 0)
            return rc;
    }
    rc = end_tenant(ld);
    if (rc == 0)
        rc = end_upstream(ld);
    return rc;
}

/* The line that set [section] key (a global setting), else 0. */
static int
line_of(const struct loader *ld, const char *section, const char *key)
{
    size_t idx;

    return find_setting(section, key, &idx) != NULL ? ld->set_line[idx] : 0;
}

/* Is listener 's', whose host net_parse_hostport() gave, every address? */
static int
wildcard_host(const char *s, const char *host, size_t n)
{
    if (s[0] == '[')
        return n == 2 && memcmp(host, "::", 2) == 0;
    return n == 0 || (n == 7 && memcmp(host, "0.0.0.0", 7) == 0);
}

/*
 * Would listeners 'a' and 'b' (valid_listen() forms, or "" for none) take
 * the same port: the same port, not 0, and the same host or a wildcard
 * one?  Then the second bind fails at start with EADDRINUSE, which should
 * be a config error instead.  Hosts are compared as written, but for
 * case: "[::1]" and "[0::1]", or "[1.2.3.4]" and "1.2.3.4", are not
 * found alike, and the bind at start says so instead.
 */
static int
same_address(const char *a, const char *b)
{
    const char *ha, *hb;
    size_t na, nb;
    int port_a, port_b;

    if (net_parse_hostport(a, &ha, &na, &port_a) != 0
        || net_parse_hostport(b, &hb, &nb, &port_b) != 0
        || port_a == 0 || port_a != port_b)
        return 0;
    if (wildcard_host(a, ha, na) || wildcard_host(b, hb, nb))
        return 1;
    return (a[0] == '[') == (b[0] == '[') && na == nb
           && strncasecmp(ha, hb, na) == 0;
}

/* Something to listen on, and what TLS needs when it is one. */
static int
check_listeners(struct loader *ld)
{
    const struct gw_config *c = ld->c;
    int line = line_of(ld, "server", "tls_listen");

    if (same_address(c->listen, c->tls_listen)
        || same_address(c->listen, c->admin_listen)
        || same_address(c->tls_listen, c->admin_listen)) {
        set_err(ld, same_address(c->listen, c->tls_listen)
                    ? line : line_of(ld, "admin", "listen"),
                "two listeners on the same address: listen, tls_listen "
                "and [admin] listen must each have their own");
        return GW_EINVAL;
    }

    if (c->listen[0] == '\0' && c->tls_listen[0] == '\0') {
        set_err(ld, line_of(ld, "server", "listen"), "nothing to listen "
                "on: set listen, tls_listen or both");
        return GW_EINVAL;
    }
    if (c->tls_listen[0] != '\0'
        && (c->tls_cert[0] == '\0' || c->tls_key[0] == '\0')) {
        set_err(ld, line, "tls_listen needs tls_cert and tls_key");
        return GW_EINVAL;
    }
    if (c->tls_session_timeout_ms % 1000 != 0) {
        set_err(ld, line_of(ld, "server", "tls_session_timeout"),
                "tls_session_timeout: a whole number of seconds (session "
                "tickets count seconds), not %lldms",
                (long long)c->tls_session_timeout_ms);
        return GW_EINVAL;
    }
    return 0;
}

/* After the last entry: every upstream's timeouts from [routing]'s. */
static int
finish(struct loader *ld)
{
    struct gw_config *c = ld->c;
    struct config_upstream *u;
    size_t i;
    int rc;

    memcpy(c->set_line, ld->set_line, sizeof(ld->set_line));
    rc = check_listeners(ld);
    if (rc != 0)
        return rc;
    for (i = 0; i < c->num_upstreams; i++) {
        u = &c->upstreams[i];
        if (u->line == 0) {
            /* Built in: resolved by config_defaults before [routing]. */
            u->connect_timeout_ms = u->first_byte_timeout_ms = -1;
            u->idle_timeout_ms = u->total_timeout_ms = -1;
        }
        rc = upstream_resolve(c, u);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/*
 * The shared body of config_load and config_load_text: 'text' NULL means
 * read the file 'name'.
 */
static int
load(const char *name, const char *text, struct gw_config *c, char *err,
     size_t errlen)
{
    struct cfg_file f = { NULL, NULL, 0 };
    struct loader ld;
    int rc = GW_ENOMEM;

    memset(&ld, 0, sizeof(ld));
    ld.c = c;
    ld.name = name;
    ld.err = err;
    ld.errlen = errlen;
    if (err != NULL && errlen > 0)
        err[0] = '\0';

    rc = config_defaults(c);
    if (rc != 0)
        goto out;
    c->path = gw_strdup(name);
    if (c->path == NULL) {
        rc = GW_ENOMEM;
        goto out;
    }
    if (text != NULL)
        rc = cfg_parse_text(name, text, strlen(text), &f, err, errlen);
    else
        rc = cfg_parse_file(name, &f, err, errlen);
    if (rc == GW_ETOOBIG)
        rc = GW_EINVAL;         /* config.h promises no GW_ETOOBIG */
    if (rc != 0)
        goto out;
    rc = apply_file(&ld, &f);
    if (rc == 0)
        rc = finish(&ld);

out:
    if (rc == GW_ENOMEM)
        set_err(&ld, 0, "out of memory");
    cfg_file_release(&f);
    if (rc != 0)
        config_release(c);
    return rc;
}

int
config_load(const char *path, struct gw_config *c, char *err, size_t errlen)
{
    return load(path, NULL, c, err, errlen);
}

int
config_load_text(const char *name, const char *text, struct gw_config *c,
                 char *err, size_t errlen)
{
    return load(name, text, c, err, errlen);
}

#ifdef INFERGW_UNIT_TEST
/*
 * Test-only view of the schema: the i-th setting's section and key, or
 * GW_EINVAL past the end.  check_cfg walks it to prove etc/gateway.conf
 * documents every setting.
 */
int config_schema_entry(size_t i, const char **section, const char **key,
                        int *alias);

/* OUT *alias: a second name for a value set elsewhere (no default). */
int
config_schema_entry(size_t i, const char **section, const char **key,
                    int *alias)
{
    if (i >= NUM_SETTINGS)
        return GW_EINVAL;
    *section = settings[i].section;
    *key = settings[i].key;
    *alias = settings[i].scope == S_GLOBAL && settings[i].def == NULL
             && settings[i].type != T_TENANT_KEY
             && settings[i].type != T_TENANT_KEY_SHA256;
    return 0;
}
#endif
