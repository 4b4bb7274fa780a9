/* SPDX-License-Identifier: MIT */
/*
 * config.c - the gateway's settings: defaults, loading and validation.
 * What each setting is (its section, key, type, default and bounds), and
 * how one value is parsed, is the schema's (config_schema.c, behind the
 * private config_schema.h); this file is the loader and the lifecycle of
 * struct gw_config.
 *
 * Design: config_defaults() applies the schema's default texts through the
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

#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/platform_util.h>
#include <mbedtls/sha256.h>

#include "alloc.h"
#include "base/config_schema.h"
#include "cfg.h"
#include "net.h"
#include "redis.h"
#include "util.h"

#define DEFAULT_URL "http://127.0.0.1:8000"

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
    { "cache", N_NONE },
    { "tenant", N_REQUIRED },
    { "admin", N_NONE },
    { "cluster", N_NONE },
};

#define NUM_SECTIONS GW_ARRAY_LEN(sections)

/* State while walking the entries of one file. */
struct loader {
    struct gw_config *c;
    const char *name;               /* file name for messages; borrowed */
    char *err;
    size_t errlen;
    int section_line[NUM_SECTIONS]; /* header line of each unnamed one */
    int set_line[CONFIG_MAX_SETTINGS];  /* line that set each key (a row
                                           of config_settings), 0 = unset */
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

static void
config_upstream_release(struct config_upstream *u)
{
    gw_free(u->name);
    gw_free(u->url);
    gw_wipe_free_str(u->api_key);
    gw_free(u->ca_file);
    gw_free(u->client_cert);
    gw_free(u->client_key);
    config_models_clear(u);
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
    rc = config_apply_defaults("upstream", S_UPSTREAM, (char *)u);
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

/* Fill 'c' with the defaults (owned strings; config_release frees them). */
GW_TESTABLE int
config_defaults(struct gw_config *c)
{
    struct config_upstream *u;
    size_t i;
    int rc;

    memset(c, 0, sizeof(*c));
    for (i = 0; i < NUM_SECTIONS; i++) {
        if (sections[i].named != N_NONE)
            continue;
        rc = config_apply_defaults(sections[i].name, S_GLOBAL, (char *)c);
        if (rc != 0)
            goto out;
    }
    /* Not a setting of its own: read from redis_password_file. */
    c->redis_password = gw_strdup("");
    if (c->redis_password == NULL) {
        rc = GW_ENOMEM;
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

#ifdef INFERGW_UNIT_TEST
const struct config_upstream *
config_find_upstream(const struct gw_config *c, const char *name)
{
    size_t i;

    for (i = 0; i < c->num_upstreams; i++)
        if (strcmp(c->upstreams[i].name, name) == 0)
            return &c->upstreams[i];
    return NULL;
}
#endif

int
config_line(const struct gw_config *c, const char *section, const char *key)
{
    size_t idx;

    return config_find_setting(section, key, &idx) != NULL
           && config_settings[idx].scope == S_GLOBAL ? c->set_line[idx] : 0;
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
        config_upstream_release(&c->upstreams[i]);
    for (i = 0; i < c->num_tenants; i++) {
        struct config_tenant *t = &c->tenants[i];

        gw_free(t->name);
        mbedtls_platform_zeroize(t->key_sha256, sizeof(t->key_sha256));
    }
    gw_free(c->admin_listen);
    gw_wipe_free_str(c->redis);
    gw_free(c->redis_password_file);
    gw_wipe_free_str(c->redis_password);
    gw_free(c->key_prefix);
    gw_free(c->node);
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

    for (i = 0; i < config_num_settings; i++)
        if (config_settings[i].scope == scope)
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
        config_upstream_release(&c->upstreams[0]);
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
    rc = config_apply_defaults("tenant", S_TENANT, (char *)t);
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
    for (i = 0; i < config_num_settings; i++)
        if (config_settings[i].scope == S_GLOBAL
            && config_settings[i].offset == s->offset
            && ld->set_line[i] != 0)
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
    s = config_find_setting(e->section, e->key, &idx);
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
    rc = config_set_value(s, setting_base(ld, s), e->value);
    if (rc == GW_EINVAL && s->type == T_TENANT_KEY && e->value[0] != '\0'
        && config_valid_secret(e->value, 0)) {
        /* A key a client presents must not be guessable. */
        set_err(ld, e->line, "%s: a weak key: at least %" PRIu64
                " characters are needed", e->key, s->min);
        return rc;
    }
    if (rc == GW_EINVAL) {
        config_describe(s, expected, sizeof(expected));
        /* A redis URL may hold a password: never echoed either. */
        if (s->type == T_SECRET || s->type == T_TENANT_KEY
            || s->type == T_TENANT_KEY_SHA256 || s->type == T_REDIS_URL)
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

    return config_find_setting(section, key, &idx) != NULL
           ? ld->set_line[idx] : 0;
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

/* The section's index in sections[]. */
static size_t
section_index(const char *name)
{
    size_t i;

    for (i = 0; i < NUM_SECTIONS; i++)
        if (strcmp(sections[i].name, name) == 0)
            break;
    return i;
}

/* redis_password_file into c->redis_password (config_schema.c). */
static int
read_password_file(struct loader *ld, int line)
{
    char msg[300];
    int rc = config_read_password_file(ld->c->redis_password_file,
                                       &ld->c->redis_password, msg,
                                       sizeof(msg));

    if (rc == GW_EINVAL)
        set_err(ld, line, "%s", msg);
    return rc;
}

/*
 * [cluster]: on only with the section, and then Redis must be named; a
 * password comes from the URL or from redis_password_file, not both, and
 * a user in the URL needs one of them.
 */
static int
check_cluster(struct loader *ld)
{
    struct gw_config *c = ld->c;
    int header = ld->section_line[section_index("cluster")];
    int file_line = line_of(ld, "cluster", "redis_password_file");
    int has_file = c->redis_password_file[0] != '\0';
    struct redis_url url;
    int rc;

    c->cluster = header != 0;
    if (!c->cluster)
        return 0;
    if (c->redis[0] == '\0') {
        set_err(ld, header, "[cluster] needs redis = redis://HOST:PORT or "
                "unix:/PATH");
        return GW_EINVAL;
    }
    rc = redis_url_parse(c->redis, &url);
    if (rc == 0 && url.password[0] != '\0' && has_file) {
        set_err(ld, file_line, "redis_password_file: the redis URL has a "
                "password already: give it in one place");
        rc = GW_EINVAL;
    } else if (rc == 0 && url.user[0] != '\0' && url.password[0] == '\0'
               && !has_file) {
        set_err(ld, line_of(ld, "cluster", "redis"), "redis: user %s "
                "needs a password, in the URL or redis_password_file",
                url.user);
        rc = GW_EINVAL;
    }
    redis_url_wipe(&url);
    if (rc != 0 || !has_file)
        return rc;
    return read_password_file(ld, file_line);
}

/* [cache]: an entry must fit the whole cache. */
static int
check_cache(struct loader *ld)
{
    const struct gw_config *c = ld->c;
    int line = line_of(ld, "cache", "max_entry_bytes");

    if (c->cache_max_entry_bytes > c->cache_max_bytes) {
        set_err(ld, line != 0 ? line : line_of(ld, "cache", "max_bytes"),
                "max_entry_bytes (%" PRIu64 ") is more than max_bytes "
                "(%" PRIu64 "): no entry that size could be kept",
                c->cache_max_entry_bytes, c->cache_max_bytes);
        return GW_EINVAL;
    }
    if (c->cache_ttl_ms % 1000 != 0) {
        set_err(ld, line_of(ld, "cache", "ttl"), "ttl: a whole number of "
                "seconds (Age and max-age count seconds), not %lldms",
                (long long)c->cache_ttl_ms);
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
    if (rc == 0)
        rc = check_cluster(ld);
    if (rc == 0)
        rc = check_cache(ld);
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
 * Parse the file 'name', or, in test builds (config_load_text), 'text'
 * unless it is NULL: reading from memory is for tests only, so the
 * binary carries no path to it (test/check_exports.py).
 */
static int
parse(const char *name, const char *text, struct cfg_file *f, char *err,
      size_t errlen)
{
#ifdef INFERGW_UNIT_TEST
    if (text != NULL)
        return cfg_parse_text(name, text, strlen(text), f, err, errlen);
#else
    (void)text;
#endif
    return cfg_parse_file(name, f, err, errlen);
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
    rc = parse(name, text, &f, err, errlen);
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

#ifdef INFERGW_UNIT_TEST
int
config_load_text(const char *name, const char *text, struct gw_config *c,
                 char *err, size_t errlen)
{
    return load(name, text, c, err, errlen);
}
#endif

