/* SPDX-License-Identifier: MIT */
/*
 * redis_url.c - the redis URL (redis.h): "redis://[user[:password]@]host
 * [:port][/db]" or "unix:/path[?db=N&user=U]" parsed, wiped and shown
 * without its password.  Split from redis.c, which holds the pool: a URL
 * is configuration, checked at load time, long before any connection.
 */
#include "redis.h"

#include <stdio.h>
#include <string.h>

#include <mbedtls/platform_util.h>

#include "util.h"

/* ---- URLs ---- */

void
redis_url_wipe(struct redis_url *u)
{
    mbedtls_platform_zeroize(u, sizeof(*u));
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * p[0..n) with %XX decoded into out[0..cap), NUL-terminated.  Refuses a
 * bad escape, a decoded NUL or control byte, and what does not fit.
 */
static int
unescape(const char *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];

        if (c == '%') {
            int hi, lo;

            if (i + 2 >= n)
                return GW_EINVAL;
            hi = hexval(p[i + 1]);
            lo = hexval(p[i + 2]);
            if (hi < 0 || lo < 0)
                return GW_EINVAL;
            c = (unsigned char)(hi * 16 + lo);
            i += 2;
        }
        if (c < 0x20 || c == 0x7f || o + 1 >= cap)
            return GW_EINVAL;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* A host name or IPv4 address: letters, digits, '.', '-', '_'. */
static int
valid_host(const char *p, size_t n, int v6)
{
    if (n == 0 || n > REDIS_URL_HOST_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];

        if (v6 ? strchr("0123456789abcdefABCDEF:.", c) == NULL
               : !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                   || (c >= '0' && c <= '9') || c == '.' || c == '-'
                   || c == '_'))
            return 0;
    }
    return 1;
}

/*
 * A socket URL's query, "db=N&user=U" (either, in any order, once
 * each; U may hold %XX escapes): a path has no other place for them.
 */
static int
parse_unix_query(const char *q, struct redis_url *u)
{
    int seen_db = 0, seen_user = 0;

    while (*q != '\0') {
        const char *amp = strchr(q, '&');
        size_t n = amp != NULL ? (size_t)(amp - q) : strlen(q);
        char num[16];

        if (n > 3 && strncmp(q, "db=", 3) == 0 && !seen_db
            && n - 3 < sizeof(num)) {
            memcpy(num, q + 3, n - 3);
            num[n - 3] = '\0';
            if (gw_parse_long(num, 0, REDIS_URL_DB_MAX, &u->db) != 0)
                return GW_EINVAL;
            seen_db = 1;
        } else if (n > 5 && strncmp(q, "user=", 5) == 0 && !seen_user) {
            if (unescape(q + 5, n - 5, u->user, sizeof(u->user)) != 0)
                return GW_EINVAL;
            seen_user = 1;
        } else {
            return GW_EINVAL;
        }
        q += n;
        if (*q == '&' && *++q == '\0')
            return GW_EINVAL;           /* a trailing '&' */
    }
    return 0;
}

/*
 * "unix:/path[?db=N&user=U]": absolute, fits a sockaddr_un, printable
 * ASCII (it is shown in log lines and the status view's JSON as it is).
 * No password: it comes from redis_password_file.
 */
static int
parse_unix(const char *path, struct redis_url *u)
{
    const char *query = strchr(path, '?');
    size_t n = query != NULL ? (size_t)(query - path) : strlen(path);

    if (path[0] != '/' || n >= 108)
        return GW_EINVAL;
    for (size_t i = 0; path[i] != '\0'; i++)
        if ((unsigned char)path[i] <= 0x20 || (unsigned char)path[i] >= 0x7f
            || path[i] == '#')
            return GW_EINVAL;
    u->unix_socket = 1;
    memcpy(u->host, path, n);
    u->host[n] = '\0';
    return query != NULL ? parse_unix_query(query + 1, u) : 0;
}

/*
 * "user:password", ":password" or "user" (p[0..n), before the '@'): a
 * user alone takes its password from redis_password_file (config.c
 * refuses it without one).
 */
static int
parse_userinfo(const char *p, size_t n, struct redis_url *u)
{
    const char *colon = memchr(p, ':', n);

    if (colon == NULL)
        return n > 0 ? unescape(p, n, u->user, sizeof(u->user)) : GW_EINVAL;
    if (colon + 1 == p + n)
        return GW_EINVAL;           /* an empty password: say none */
    if (unescape(p, (size_t)(colon - p), u->user, sizeof(u->user)) != 0)
        return GW_EINVAL;
    return unescape(colon + 1, (size_t)(p + n - colon - 1), u->password,
                    sizeof(u->password));
}

/* "host[:port]" or "[v6][:port]" (p[0..n)). */
static int
parse_hostport(const char *p, size_t n, struct redis_url *u)
{
    const char *end = p + n, *host = p, *port = NULL;
    size_t hn;
    long v;
    char num[8];

    if (n > 0 && p[0] == '[') {
        const char *close = memchr(p, ']', n);

        if (close == NULL)
            return GW_EINVAL;
        host = p + 1;
        hn = (size_t)(close - host);
        if (close + 1 < end) {
            if (close[1] != ':')
                return GW_EINVAL;
            port = close + 2;
        }
        if (!valid_host(host, hn, 1))
            return GW_EINVAL;
    } else {
        const char *colon = memchr(p, ':', n);

        hn = colon != NULL ? (size_t)(colon - p) : n;
        if (colon != NULL)
            port = colon + 1;
        if (!valid_host(host, hn, 0))
            return GW_EINVAL;
    }
    memcpy(u->host, host, hn);
    u->host[hn] = '\0';
    u->port = 6379;
    if (port == NULL)
        return 0;
    if (port == end || (size_t)(end - port) >= sizeof(num))
        return GW_EINVAL;
    memcpy(num, port, (size_t)(end - port));
    num[end - port] = '\0';
    if (gw_parse_long(num, 1, 65535, &v) != 0)
        return GW_EINVAL;
    u->port = (int)v;
    return 0;
}

int
redis_url_parse(const char *s, struct redis_url *out)
{
    const char *p, *at, *slash, *end;
    char num[16];
    int rc = GW_EINVAL;

    memset(out, 0, sizeof(*out));
    if (strncmp(s, "unix:", 5) == 0) {
        rc = parse_unix(s + 5, out);
        goto out;
    }
    if (strncmp(s, "redis://", 8) != 0)
        goto out;
    p = s + 8;
    for (end = p; *end != '\0'; end++)
        if ((unsigned char)*end <= 0x20 || *end == 0x7f || *end == '?'
            || *end == '#')
            goto out;
    /* The last '@' ends the user info: a raw '@' in a password then
     * still parses, as redis-cli reads it. */
    slash = memchr(p, '/', (size_t)(end - p));
    at = NULL;
    for (const char *q = p; q < (slash != NULL ? slash : end); q++)
        if (*q == '@')
            at = q;
    if (at != NULL) {
        if (parse_userinfo(p, (size_t)(at - p), out) != 0)
            goto out;
        p = at + 1;
        slash = memchr(p, '/', (size_t)(end - p));
    }
    if (parse_hostport(p, (size_t)((slash != NULL ? slash : end) - p),
                       out) != 0)
        goto out;
    if (slash != NULL && slash + 1 < end) {
        if ((size_t)(end - slash - 1) >= sizeof(num))
            goto out;
        memcpy(num, slash + 1, (size_t)(end - slash - 1));
        num[end - slash - 1] = '\0';
        if (gw_parse_long(num, 0, REDIS_URL_DB_MAX, &out->db) != 0)
            goto out;
    }
    rc = 0;

out:
    if (rc != 0)
        redis_url_wipe(out);
    return rc;
}

void
redis_url_show(const struct redis_url *u, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    char user[3 * REDIS_URL_USER_MAX + 2];
    size_t k = 0;
    int v6 = strchr(u->host, ':') != NULL;

    /* The user as the URL would escape it: the line or page it goes to
     * gets printable ASCII only. */
    for (const char *p = u->user; *p != '\0'; p++) {
        unsigned char c = (unsigned char)*p;

        if (c > 0x20 && c < 0x7f && strchr("%@:/&?#", c) == NULL) {
            user[k++] = (char)c;
        } else {
            user[k++] = '%';
            user[k++] = hex[c >> 4];
            user[k++] = hex[c & 15];
        }
    }
    user[k] = '\0';
    if (u->unix_socket) {
        char db[32] = "";

        if (u->db != 0)
            snprintf(db, sizeof(db), "db=%ld", u->db);
        snprintf(out, n, "unix:%s%s%s%s%s%s", u->host,
                 u->db != 0 || k > 0 ? "?" : "", db,
                 u->db != 0 && k > 0 ? "&" : "", k > 0 ? "user=" : "",
                 user);
        return;
    }
    if (k > 0) {
        user[k++] = '@';
        user[k] = '\0';
    }
    snprintf(out, n, "redis://%s%s%s%s:%d/%ld", user, v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->db);
}
