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
 * and are wiped before their memory is freed.
 */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <mbedtls/platform_util.h>

#include "alloc.h"
#include "cfg.h"
#include "log.h"
#include "util.h"

#define TENANT_NAME_MAX 64
#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define DAY_MS (UINT64_C(24) * 60 * 60 * 1000)

enum setting_type {
    T_LISTEN,           /* char *: HOST:PORT, [v6]:PORT or :PORT */
    T_URL,              /* char *: http(s)://..., trailing '/' stripped */
    T_SECRET,           /* char *: wiped on free; 'min' = shortest length */
    T_TENANT_KEY,       /* appended to config_tenant.api_keys */
    T_UINT,             /* uint64_t in [min, max] */
    T_SIZE,             /* uint64_t bytes in [min, max] */
    T_DURATION,         /* int64_t milliseconds in [min, max] */
    T_BOOL,             /* int 0/1 */
    T_LOG_LEVEL,        /* int GW_LOG_* */
    T_TEMPERATURE,      /* double in [min, max] */
};

struct setting {
    const char *section;
    const char *key;
    enum setting_type type;
    size_t offset;      /* into struct gw_config, or struct config_tenant
                         * for section "tenant" */
    const char *def;    /* NULL: no default (repeatable tenant api_key) */
    uint64_t min, max;
};

#define C(field) offsetof(struct gw_config, field)
#define TN(field) offsetof(struct config_tenant, field)

/* Keep in step with etc/gateway.conf; check_cfg proves that it is. */
static const struct setting settings[] = {
    { "server", "listen", T_LISTEN, C(listen), "127.0.0.1:8080", 0, 0 },
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
    { "server", "access_log", T_BOOL, C(access_log), "on", 0, 0 },

    { "upstream", "url", T_URL, C(upstream_url), "http://127.0.0.1:8000",
      0, 0 },
    { "upstream", "api_key", T_SECRET, C(upstream_api_key), "", 0, 0 },
    { "upstream", "forward_client_auth", T_BOOL, C(forward_client_auth),
      "off", 0, 0 },
    { "upstream", "connect_timeout", T_DURATION, C(connect_timeout_ms),
      "5s", 1, DAY_MS },
    { "upstream", "first_byte_timeout", T_DURATION,
      C(first_byte_timeout_ms), "60s", 1, DAY_MS },
    { "upstream", "idle_timeout", T_DURATION, C(upstream_idle_timeout_ms),
      "30s", 1, DAY_MS },
    { "upstream", "total_timeout", T_DURATION, C(total_timeout_ms), "10m",
      1, DAY_MS },

    { "coalesce", "enabled", T_BOOL, C(coalesce), "on", 0, 0 },
    { "coalesce", "omitted_temperature", T_TEMPERATURE,
      C(omitted_temperature), "0", 0, 2 },
    { "coalesce", "max_followers", T_UINT, C(max_followers), "4096",
      1, 1000000 },
    { "coalesce", "max_flight_bytes", T_SIZE, C(max_flight_bytes), "8m",
      KIB, GIB },
    { "coalesce", "max_flights", T_UINT, C(max_flights), "1024",
      1, 1000000 },
    { "coalesce", "follower_timeout", T_DURATION, C(follower_timeout_ms),
      "10m", 1, DAY_MS },
    { "coalesce", "leader_writes", T_BOOL, C(leader_writes), "on", 0, 0 },

    { "tenant", "api_key", T_TENANT_KEY, TN(api_keys), NULL, 1, 0 },
    { "tenant", "coalesce", T_BOOL, TN(coalesce), "on", 0, 0 },
};

#define NUM_SETTINGS GW_ARRAY_LEN(settings)

/* Sections that exist; a named one is "[tenant NAME]" and repeats. */
static const struct {
    const char *name;
    int named;
} sections[] = {
    { "server", 0 },
    { "upstream", 0 },
    { "coalesce", 0 },
    { "tenant", 1 },
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

static void
wipe_free(char *s)
{
    if (s == NULL)
        return;
    mbedtls_platform_zeroize(s, strlen(s));
    gw_free(s);
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
        wipe_free(*field);
    else
        gw_free(*field);
    *field = dup;
    return 0;
}

static int
all_digits(const char *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return n > 0;
}

/* PORT is 0..65535; 0 asks the kernel for a free one (tests use it). */
static int
valid_port(const char *p)
{
    size_t n = strlen(p);

    return n <= 5 && all_digits(p, n) && atoi(p) <= 65535;
}

/*
 * "HOST:PORT", "[IPv6]:PORT" or ":PORT" (every address).  The host is
 * only checked for plausible characters: whether it resolves is for the
 * listener to say, with the resolver's own message.
 */
static int
valid_listen(const char *s)
{
    const char *colon, *close, *p;

    if (s[0] == '[') {
        close = strchr(s, ']');
        if (close == NULL || close == s + 1 || close[1] != ':')
            return 0;
        for (p = s + 1; p < close; p++)
            if (strchr("0123456789abcdefABCDEF:.", *p) == NULL)
                return 0;
        return valid_port(close + 2);
    }
    colon = strchr(s, ':');
    if (colon == NULL || strchr(colon + 1, ':') != NULL)
        return 0;
    for (p = s; p < colon; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
              || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            return 0;
    return valid_port(colon + 1);
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

/* "0", "0.7", "2.0", ".5": plain decimals only, no exponent or sign. */
static int
parse_temperature(const char *s, double lo, double hi, double *out)
{
    const char *p;
    int digits = 0, dots = 0;
    double v;

    for (p = s; *p != '\0'; p++) {
        if (*p >= '0' && *p <= '9')
            digits++;
        else if (*p == '.' && dots == 0)
            dots++;
        else
            return GW_EINVAL;
    }
    if (digits == 0)
        return GW_EINVAL;
    v = strtod(s, NULL);
    if (!(v >= lo && v <= hi))
        return GW_EINVAL;
    *out = v;
    return 0;
}

/* Bytes as the shortest exact "64k" / "1m" / "123" for messages. */
static void
fmt_size(uint64_t v, char *out, size_t n)
{
    if (v != 0 && v % GIB == 0)
        snprintf(out, n, "%" PRIu64 "g", v / GIB);
    else if (v != 0 && v % MIB == 0)
        snprintf(out, n, "%" PRIu64 "m", v / MIB);
    else if (v != 0 && v % KIB == 0)
        snprintf(out, n, "%" PRIu64 "k", v / KIB);
    else
        snprintf(out, n, "%" PRIu64, v);
}

/* Milliseconds as the shortest exact "24h" / "5m" / "30s" / "1ms". */
static void
fmt_ms(uint64_t v, char *out, size_t n)
{
    if (v != 0 && v % 3600000 == 0)
        snprintf(out, n, "%" PRIu64 "h", v / 3600000);
    else if (v != 0 && v % 60000 == 0)
        snprintf(out, n, "%" PRIu64 "m", v / 60000);
    else if (v != 0 && v % 1000 == 0)
        snprintf(out, n, "%" PRIu64 "s", v / 1000);
    else
        snprintf(out, n, "%" PRIu64 "ms", v);
}

/* What a setting accepts, for "KEY: expected <this>, got 'V'". */
static void
describe(const struct setting *s, char *out, size_t n)
{
    char lo[32], hi[32];

    switch (s->type) {
    case T_LISTEN:
        snprintf(out, n, "HOST:PORT, [IPv6]:PORT or :PORT (PORT 0..65535)");
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
    case T_UINT:
        snprintf(out, n, "an integer %" PRIu64 "..%" PRIu64, s->min,
                 s->max);
        break;
    case T_SIZE:
        fmt_size(s->min, lo, sizeof(lo));
        fmt_size(s->max, hi, sizeof(hi));
        snprintf(out, n, "a size %s..%s (bytes, or a number with k, m or g)",
                 lo, hi);
        break;
    case T_DURATION:
        fmt_ms(s->min, lo, sizeof(lo));
        fmt_ms(s->max, hi, sizeof(hi));
        snprintf(out, n, "a duration %s..%s (e.g. 250ms, 30s, 5m, 1h)",
                 lo, hi);
        break;
    case T_BOOL:
        snprintf(out, n, "on or off (or yes/no, true/false, 1/0)");
        break;
    case T_LOG_LEVEL:
        snprintf(out, n, "error, warn, info or debug");
        break;
    case T_TEMPERATURE:
        snprintf(out, n, "a number %" PRIu64 "..%" PRIu64, s->min, s->max);
        break;
    }
}

/*
 * Parse 'v' as setting 's' and store it in 'base' (struct gw_config or
 * struct config_tenant).  Borrows both.  Returns 0, GW_EINVAL (nothing
 * stored) or GW_ENOMEM.  T_TENANT_KEY is stored by the caller, which also
 * checks it against every other tenant.
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
        if (!valid_listen(v))
            return GW_EINVAL;
        return replace_string(field, v, 0);
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
    case T_UINT:
        if (cfg_parse_uint(v, s->max, &u) != 0 || u < s->min)
            return GW_EINVAL;
        *(uint64_t *)field = u;
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
    case T_TEMPERATURE:
        if (parse_temperature(v, (double)s->min, (double)s->max, &d) != 0)
            return GW_EINVAL;
        *(double *)field = d;
        return 0;
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

/* Apply every defaulted setting of 'section' to 'base'. */
static int
apply_defaults(const char *section, char *base)
{
    size_t i;
    int rc;

    for (i = 0; i < NUM_SETTINGS; i++) {
        if (strcmp(settings[i].section, section) != 0
            || settings[i].def == NULL)
            continue;
        rc = set_value(&settings[i], base, settings[i].def);
        /* A default the parser refuses is a bug in the table above. */
        assert(rc != GW_EINVAL);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int
config_defaults(struct gw_config *c)
{
    size_t i;
    int rc;

    memset(c, 0, sizeof(*c));
    for (i = 0; i < NUM_SECTIONS; i++) {
        if (sections[i].named)
            continue;
        rc = apply_defaults(sections[i].name, (char *)c);
        if (rc != 0) {
            config_release(c);
            return rc;
        }
    }
    return 0;
}

void
config_release(struct gw_config *c)
{
    size_t i, k;

    gw_free(c->path);
    gw_free(c->listen);
    gw_free(c->upstream_url);
    wipe_free(c->upstream_api_key);
    for (i = 0; i < c->num_tenants; i++) {
        struct config_tenant *t = &c->tenants[i];

        gw_free(t->name);
        for (k = 0; k < t->num_keys; k++)
            wipe_free(t->api_keys[k]);
    }
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

static int
on_tenant_header(struct loader *ld, const struct cfg_entry *e)
{
    struct gw_config *c = ld->c;
    struct config_tenant *t;
    size_t i;
    int rc;

    if (strlen(e->name) > TENANT_NAME_MAX) {
        set_err(ld, e->line, "tenant name longer than %d characters",
                TENANT_NAME_MAX);
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
    rc = apply_defaults("tenant", (char *)t);
    if (rc != 0)
        return rc;
    ld->tenant = t;
    for (i = 0; i < NUM_SETTINGS; i++)
        if (strcmp(settings[i].section, "tenant") == 0)
            ld->set_line[i] = 0;
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
    if (!sections[i].named && e->name[0] != '\0') {
        set_err(ld, e->line, "section [%s] takes no name", e->section);
        return GW_EINVAL;
    }
    if (sections[i].named && e->name[0] == '\0') {
        set_err(ld, e->line, "section [%s] needs a name, as in "
                "[%s NAME]", e->section, e->section);
        return GW_EINVAL;
    }
    rc = end_tenant(ld);
    if (rc != 0)
        return rc;
    if (sections[i].named)
        return on_tenant_header(ld, e);
    if (ld->section_line[i] != 0) {
        set_err(ld, e->line, "duplicate section [%s], first at line %d",
                e->section, ld->section_line[i]);
        return GW_EINVAL;
    }
    ld->section_line[i] = e->line;
    return 0;
}

/* A tenant's api_key: unique across all tenants, at most 16 each. */
static int
add_tenant_key(struct loader *ld, const struct cfg_entry *e)
{
    struct gw_config *c = ld->c;
    struct config_tenant *t = ld->tenant;
    size_t i, k;

    if (t->num_keys == CONFIG_MAX_TENANT_KEYS) {
        set_err(ld, e->line, "tenant '%s' has more than %d api_key lines",
                t->name, CONFIG_MAX_TENANT_KEYS);
        return GW_EINVAL;
    }
    for (i = 0; i < c->num_tenants; i++) {
        for (k = 0; k < c->tenants[i].num_keys; k++) {
            if (strcmp(c->tenants[i].api_keys[k], e->value) == 0) {
                set_err(ld, e->line, "this api_key is already used by "
                        "tenant '%s'", c->tenants[i].name);
                return GW_EINVAL;
            }
        }
    }
    t->api_keys[t->num_keys] = gw_strdup(e->value);
    if (t->api_keys[t->num_keys] == NULL)
        return GW_ENOMEM;
    t->num_keys++;
    return 0;
}

static int
on_setting(struct loader *ld, const struct cfg_entry *e)
{
    const struct setting *s;
    char where[160], expected[160];
    size_t idx;
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
    if (s->type != T_TENANT_KEY && ld->set_line[idx] != 0) {
        set_err(ld, e->line, "duplicate key '%s' in %s, first set at "
                "line %d", e->key, where, ld->set_line[idx]);
        return GW_EINVAL;
    }
    rc = set_value(s, ld->tenant != NULL ? (char *)ld->tenant
                                         : (char *)ld->c, e->value);
    if (rc == GW_EINVAL) {
        describe(s, expected, sizeof(expected));
        if (s->type == T_SECRET || s->type == T_TENANT_KEY)
            set_err(ld, e->line, "%s: expected %s", e->key, expected);
        else
            set_err(ld, e->line, "%s: expected %s, got '%s'", e->key,
                    expected, e->value);
        return rc;
    }
    if (rc != 0)
        return rc;
    if (s->type == T_TENANT_KEY) {
        rc = add_tenant_key(ld, e);
        if (rc != 0)
            return rc;
    }
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
    return end_tenant(ld);
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
int config_schema_entry(size_t i, const char **section, const char **key);

int
config_schema_entry(size_t i, const char **section, const char **key)
{
    if (i >= NUM_SETTINGS)
        return GW_EINVAL;
    *section = settings[i].section;
    *key = settings[i].key;
    return 0;
}
#endif
