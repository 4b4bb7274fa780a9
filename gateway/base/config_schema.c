/* SPDX-License-Identifier: MIT */
/*
 * config_schema.c - the schema of the gateway's settings: the table of
 * them, and how a value is checked, parsed and stored (the loader is
 * config.c; the private interface between them, config_schema.h).
 *
 * Design: 'config_settings' below is the single source of truth.  Each
 * row names a section and key, the value's type, where it lives in
 * struct gw_config (or struct config_tenant, or struct config_upstream),
 * its default as the text a user would write, and its bounds.  Defaults
 * go through the same parsers a file goes through
 * (config_apply_defaults()), so a default can never be a value the file
 * could not hold, and etc/gateway.conf is tested against the result.
 */
#include "base/config_schema.h"

#include <assert.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/platform_util.h>

#include "alloc.h"
#include "base/config.h"
#include "cfg.h"
#include "log.h"
#include "net.h"
#include "redis.h"
#include "util.h"

#define DAY_MS (UINT64_C(24) * 60 * 60 * 1000)

#define C(field) S_GLOBAL, offsetof(struct gw_config, field)
#define TN(field) S_TENANT, offsetof(struct config_tenant, field)
#define UP(field) S_UPSTREAM, offsetof(struct config_upstream, field)

/* Keep in step with etc/gateway.conf; check_cfg proves that it is. */
const struct setting config_settings[] = {
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
      64 * CFG_KIB, 64 * CFG_MIB },
    { "server", "max_header_size", T_SIZE, C(max_header_size), "16k",
      CFG_KIB, CFG_MIB },
    { "server", "max_request_body", T_SIZE, C(max_request_body), "16m",
      CFG_KIB, CFG_GIB },
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
      1, CONFIG_MAX_EJECT_MS },
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
    { "routing", "lora_aware", T_BOOL, C(lora_aware), "on", 0, 0 },
    { "routing", "prefix_bytes", T_SIZE, C(prefix_bytes), "1k", 16,
      64 * CFG_KIB },
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
      CFG_KIB, CFG_GIB },
    { "coalesce", "max_reader_lag", T_SIZE, C(max_reader_lag), "32m",
      CFG_KIB, CFG_GIB },
    { "coalesce", "max_flights", T_UINT, C(max_flights), "1024",
      1, 1000000 },
    { "coalesce", "follower_timeout", T_DURATION, C(follower_timeout_ms),
      "10m", 1, DAY_MS },
    { "coalesce", "leader_writes", T_BOOL, C(leader_writes), "on", 0, 0 },

    { "cache", "ttl", T_DURATION, C(cache_ttl_ms), "0", 0, DAY_MS },
    { "cache", "max_bytes", T_SIZE, C(cache_max_bytes), "256m",
      CFG_KIB, 64 * CFG_GIB },
    { "cache", "max_entry_bytes", T_SIZE, C(cache_max_entry_bytes), "4m",
      CFG_KIB, CFG_GIB },

    { "tenant", "api_key", T_TENANT_KEY, TN(key_sha256), NULL,
      CONFIG_MIN_KEY_LEN, 0 },
    { "tenant", "api_key_sha256", T_TENANT_KEY_SHA256, TN(key_sha256), NULL,
      0, 0 },
    { "tenant", "coalesce", T_BOOL, TN(coalesce), "on", 0, 0 },
    { "tenant", "cache", T_BOOL, TN(cache), "on", 0, 0 },
    { "tenant", "max_inflight", T_UINT, TN(max_inflight), "0", 0, 1000000 },
    { "tenant", "requests_per_minute", T_UINT, TN(requests_per_minute), "0",
      0, CONFIG_MAX_REQUESTS_PER_MINUTE },
    { "tenant", "tokens_per_minute", T_UINT, TN(tokens_per_minute), "0",
      0, CONFIG_MAX_TOKENS_PER_MINUTE },
    { "tenant", "tokens_per_day", T_UINT, TN(tokens_per_day), "0",
      0, CONFIG_MAX_TOKEN_BUDGET },
    { "tenant", "tokens_per_month", T_UINT, TN(tokens_per_month), "0",
      0, CONFIG_MAX_TOKEN_BUDGET },
    { "tenant", "weight", T_UINT, TN(weight), "1", 1, 1000 },
    { "tenant", "priority", T_INT, TN(priority), "0", 0, 1000 },

    { "cluster", "redis", T_REDIS_URL, C(redis), "", 0, 0 },
    { "cluster", "redis_password_file", T_PATH, C(redis_password_file), "",
      0, 0 },
    { "cluster", "redis_timeout", T_DURATION, C(redis_timeout_ms), "20ms",
      1, 10000 },
    { "cluster", "redis_connections", T_UINT, C(redis_connections), "8",
      1, REDIS_POOL_MAX },
    { "cluster", "key_prefix", T_KEY_TEXT, C(key_prefix), "infergw:",
      0, 64 },
    { "cluster", "node", T_KEY_TEXT, C(node), "", 0, CONFIG_NAME_MAX },
    { "cluster", "lease", T_DURATION, C(lease_ms), "10s", 1000,
      60 * 60 * 1000 },
    { "cluster", "on_error", T_ON_ERROR, C(on_error), "local", 0, 0 },

    { "admin", "listen", T_LISTEN, C(admin_listen), "", 1, 0 },
    { "admin", "api_key", T_TENANT_KEY, C(admin_key_sha256), NULL,
      CONFIG_MIN_KEY_LEN, 0 },
    { "admin", "api_key_sha256", T_TENANT_KEY_SHA256, C(admin_key_sha256),
      NULL, 0, 0 },
    { "admin", "status_flights", T_UINT, C(status_flights), "100", 0,
      10000 },
};

#define NUM_SETTINGS GW_ARRAY_LEN(config_settings)
_Static_assert(NUM_SETTINGS <= CONFIG_MAX_SETTINGS, "CONFIG_MAX_SETTINGS");

const size_t config_num_settings = NUM_SETTINGS;

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

/*
 * A piece of a Redis key (key_prefix, node): printable ASCII without
 * blanks, quotes or backslashes, and without braces, which would move
 * the key's hash tag ({tenant}, cluster.h) off the tenant.
 */
static int
valid_key_text(const char *s, uint64_t min, uint64_t max)
{
    size_t n = strlen(s);

    if (n < min || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f
            || strchr("\"\\{}", s[i]) != NULL)
            return 0;
    return 1;
}

/* A key goes into an HTTP header: printable, no blanks, no quotes. */
int
config_valid_secret(const char *s, uint64_t min_len)
{
    const char *p;

    for (p = s; *p != '\0'; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f
            || *p == '"')
            return 0;
    return (uint64_t)(p - s) >= min_len;
}

void
config_describe(const struct setting *s, char *out, size_t n)
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
    case T_REDIS_URL:
        snprintf(out, n, "redis://[user[:password]@]host[:port][/db] or "
                 "unix:/path[?db=N&user=U]");
        break;
    case T_KEY_TEXT:
        snprintf(out, n, "at most %" PRIu64 " printable characters without "
                 "blanks, quotes, backslashes or braces", s->max);
        break;
    case T_ON_ERROR:
        snprintf(out, n, "local or deny");
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

void
config_models_clear(struct config_upstream *u)
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

    config_models_clear(u);
    while (more) {
        more = list_next(&p, &item, &n);
        if (!valid_model(item, n) || u->num_models == CONFIG_MAX_MODELS) {
            config_models_clear(u);
            return GW_EINVAL;
        }
        u->models[u->num_models] = gw_strndup(item, n);
        if (u->models[u->num_models] == NULL) {
            config_models_clear(u);
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

int
config_set_value(const struct setting *s, char *base, const char *v)
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
        if (!config_valid_secret(v, s->min))
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
    case T_REDIS_URL: {
        struct redis_url ru;

        /* Parsed again where it is used (cluster.c): a secret is kept
         * in one place only, the configuration's string. */
        if (v[0] != '\0') {
            if (redis_url_parse(v, &ru) != 0)
                return GW_EINVAL;
            redis_url_wipe(&ru);
        }
        return replace_string(field, v, 1);
    }
    case T_KEY_TEXT:
        if (!valid_key_text(v, s->min, s->max))
            return GW_EINVAL;
        return replace_string(field, v, 0);
    case T_ON_ERROR:
        if (strcmp(v, "local") != 0 && strcmp(v, "deny") != 0)
            return GW_EINVAL;
        *(int *)field = v[0] == 'l' ? ON_ERROR_LOCAL : ON_ERROR_DENY;
        return 0;
    }
    return GW_EINVAL;
}

const struct setting *
config_find_setting(const char *section, const char *key, size_t *idx)
{
    size_t i;

    for (i = 0; i < NUM_SETTINGS; i++) {
        if (strcmp(config_settings[i].section, section) == 0
            && strcmp(config_settings[i].key, key) == 0) {
            *idx = i;
            return &config_settings[i];
        }
    }
    return NULL;
}

int
config_apply_defaults(const char *section, enum setting_scope scope,
                      char *base)
{
    size_t i;
    int rc;

    for (i = 0; i < NUM_SETTINGS; i++) {
        if (strcmp(config_settings[i].section, section) != 0
            || config_settings[i].scope != scope
            || config_settings[i].def == NULL)
            continue;
        rc = config_set_value(&config_settings[i], base,
                              config_settings[i].def);
        /* A default the parser refuses is a bug in the table above. */
        assert(rc != GW_EINVAL);
        if (rc != 0)
            return rc;
    }
    return 0;
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
    *section = config_settings[i].section;
    *key = config_settings[i].key;
    *alias = config_settings[i].scope == S_GLOBAL
             && config_settings[i].def == NULL
             && config_settings[i].type != T_TENANT_KEY
             && config_settings[i].type != T_TENANT_KEY_SHA256;
    return 0;
}
#endif


/*
 * Is a secret file's mode too open?  Group or others may read or write
 * it: refused, as libpq ignores such a .pgpass.  One exception, libpq's
 * for a server key: owned by root, readable by its group (0640), so
 * that a secret shared with a service group can stay root's.
 */
static int
too_open(const struct stat *st)
{
    if (st->st_uid == 0)
        return (st->st_mode & 0037) != 0;
    return (st->st_mode & 0077) != 0;
}

int
config_read_password_file(const char *path, char **out, char *msg,
                          size_t msglen)
{
    char buf[REDIS_URL_PASSWORD_MAX + 3];
    struct stat st;
    ssize_t n = -1;
    size_t len, i;
    int fd, rc = GW_EINVAL;

    /* O_NONBLOCK: a FIFO put there must not hang the load on open(). */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd == -1 || fstat(fd, &st) == -1) {
        snprintf(msg, msglen, "redis_password_file %s: not a readable "
                 "file", path);
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(msg, msglen, "redis_password_file %s: not a regular "
                 "file", path);
        goto out;
    }
    if (too_open(&st)) {
        snprintf(msg, msglen, "redis_password_file %s: group or others "
                 "may read it (mode %04o): chmod 0600 it (a Kubernetes "
                 "secret: defaultMode 0400)", path,
                 (unsigned)(st.st_mode & 07777));
        goto out;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0) {
        snprintf(msg, msglen, "redis_password_file %s: not a readable "
                 "file", path);
        goto out;
    }
    len = (size_t)n;
    buf[len] = '\0';
    len = strcspn(buf, "\r\n");
    buf[len] = '\0';
    for (i = 0; i < len; i++)
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
            break;
    if (len == 0 || len > REDIS_URL_PASSWORD_MAX || i < len) {
        snprintf(msg, msglen, "redis_password_file %s: expected a password "
                 "of 1..%d printable characters on its first line", path,
                 REDIS_URL_PASSWORD_MAX);
        goto out;
    }
    gw_wipe_free_str(*out);
    *out = gw_strdup(buf);
    rc = *out != NULL ? 0 : GW_ENOMEM;

out:
    if (fd != -1)
        close(fd);
    mbedtls_platform_zeroize(buf, sizeof(buf));
    return rc;
}
