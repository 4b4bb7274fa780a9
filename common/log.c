/* SPDX-License-Identifier: MIT */
/*
 * log.c - single-write log lines with timestamp, level and request id,
 * as key=value text or as JSON objects.
 *
 * Design: a line is built in a buffer on the caller's stack and written
 * with one write(), so threads need no lock to keep lines whole.  The
 * buffers are fixed (LINE_MAX_KV, LINE_MAX_JSON): a longer line is cut,
 * never allocated for, since logging must work when memory is gone.  A
 * JSON line is built by a writer that keeps room for the object's end,
 * so a cut line still parses: a string is cut between characters and
 * closed, a field that does not fit whole is left out.
 */
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The longest line of each format, newline included. */
#define LINE_MAX_KV 2048
#define LINE_MAX_JSON 4096

_Atomic int gw_log_level_cur = GW_LOG_INFO;
static _Atomic int log_format = GW_LOG_FORMAT_KV;
static int log_fd = 2;
static _Thread_local char request_id[65];

static const char *const level_names[] = { "error", "warn", "info", "debug" };
static const char *const format_names[] = { "kv", "json" };

/* The index of 's' in names[0..n), or -1. */
static int
name_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return (int)i;
    return -1;
}

int
log_level_parse(const char *s)
{
    return name_index(level_names, GW_ARRAY_LEN(level_names), s);
}

void
log_set_level(int level)
{
    atomic_store_explicit(&gw_log_level_cur, level, memory_order_relaxed);
}

int
log_format_parse(const char *s)
{
    return name_index(format_names, GW_ARRAY_LEN(format_names), s);
}

void
log_set_format(int format)
{
    atomic_store_explicit(&log_format, format, memory_order_relaxed);
}

#ifdef INFERGW_UNIT_TEST
void
log_set_fd(int fd)
{
    log_fd = fd;
}
#endif

void
log_set_request_id(const char *id)
{
    size_t n;

    if (id == NULL) {
        request_id[0] = '\0';
        return;
    }
    n = strnlen(id, sizeof(request_id) - 1);   /* cut as snprintf() would */
    memcpy(request_id, id, n);
    request_id[n] = '\0';
}

/* This thread's request id, "-" when none. */
static const char *
log_request_id(void)
{
    return request_id[0] != '\0' ? request_id : "-";
}

static int
json_format(void)
{
    return atomic_load_explicit(&log_format, memory_order_relaxed)
           == GW_LOG_FORMAT_JSON;
}

static const char *
level_name(int level)
{
    return level_names[level < 0 || level > GW_LOG_DEBUG ? GW_LOG_ERROR
                                                         : level];
}

/* Now, as RFC 3339 UTC with milliseconds, into out[0..64). */
static void
timestamp(char out[64])
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

/* strerror_r(err) as text, in 'buf' or static. */
static const char *
error_text(int err, char *buf, size_t n)
{
    /* GNU strerror_r may return a static string instead of filling buf */
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(err, buf, n);
#else
    if (strerror_r(err, buf, n) != 0)
        snprintf(buf, n, "errno %d", err);
    return buf;
#endif
}

static void
emit(const char *line, size_t n)
{
    while (write(log_fd, line, n) == -1 && errno == EINTR)
        ;
}

/* 'v' in decimal into out[0..21); its length (no NUL). */
static size_t
format_int(long long v, char *out)
{
    uint64_t m = v < 0 ? 0ULL - (unsigned long long)v
                       : (unsigned long long)v;

    if (v >= 0)
        return gw_fmt_u64(m, out);
    out[0] = '-';
    return 1 + gw_fmt_u64(m, out + 1);
}

/* ---- JSON lines --------------------------------------------------- */

/*
 * A JSON line under construction in p[0..cap + 2): 'cap' keeps the last
 * two bytes for "}\n", so the object always closes.  'full': something
 * did not fit (the caller drops that field whole).
 */
struct jline {
    char *p;
    size_t n, cap;
    int full;
};

static void
jl_raw(struct jline *j, const char *s, size_t len)
{
    if (j->full || len > j->cap - j->n) {
        j->full = 1;
        return;
    }
    memcpy(j->p + j->n, s, len);
    j->n += len;
}

/*
 * The length of the well-formed UTF-8 sequence at s[0..n), or 0 if
 * there is none (Unicode 15 table 3-7: no overlong forms, no
 * surrogates, nothing past U+10FFFF).
 */
static size_t
utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len, i;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        len = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        len = 3;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        len = 4;
    else
        return 0;
    if (s[0] == 0xe0)
        lo = 0xa0;
    else if (s[0] == 0xed)
        hi = 0x9f;
    else if (s[0] == 0xf0)
        lo = 0x90;
    else if (s[0] == 0xf4)
        hi = 0x8f;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/*
 * s[0..len) as a JSON string: '"' and '\' escaped, control characters
 * and DEL as \u escapes (\u001b for ESC: a terminal showing the log
 * obeys none of them), well-formed UTF-8 as it is, any other byte as
 * U+FFFD.  Cut between
 * characters if the line runs out; 'full' only if not even "" fits.
 */
static void
jl_str(struct jline *j, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    char esc[8];
    const char *out;
    size_t i = 0, k, step;

    jl_raw(j, "\"", 1);
    if (j->full || j->cap - j->n < 1) {
        j->full = 1;
        return;
    }
    while (i < len) {
        out = esc;
        step = 1;
        if (u[i] == '"' || u[i] == '\\') {
            esc[0] = '\\';
            esc[1] = (char)u[i];
            k = 2;
        } else if (u[i] == '\n' || u[i] == '\t' || u[i] == '\r') {
            esc[0] = '\\';
            esc[1] = u[i] == '\n' ? 'n' : u[i] == '\t' ? 't' : 'r';
            k = 2;
        } else if (u[i] < 0x20 || u[i] == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[u[i] >> 4];
            esc[5] = hex[u[i] & 15];
            k = 6;
        } else if ((step = utf8_seq(u + i, len - i)) > 0) {
            out = s + i;
            k = step;
        } else {
            out = "\\ufffd";
            k = 6;
            step = 1;
        }
        if (k + 1 > j->cap - j->n)
            break;              /* cut here, and keep the closing quote */
        memcpy(j->p + j->n, out, k);
        j->n += k;
        i += step;
    }
    j->p[j->n++] = '"';
}

/* ,"key": and the value, or nothing at all if it does not fit. */
static void
jl_field(struct jline *j, const struct log_field *f)
{
    char num[24];
    size_t mark = j->n;

    jl_raw(j, ",\"", 2);
    jl_raw(j, f->key, strlen(f->key));
    jl_raw(j, "\":", 2);
    if ((f->type == LOG_FIELD_STR && f->s == NULL)
        || (f->type == LOG_FIELD_OPT_INT && f->i < 0)) {
        jl_raw(j, "null", 4);
    } else if (f->type == LOG_FIELD_STR) {
        jl_str(j, f->s, f->len);
    } else {
        jl_raw(j, num, format_int(f->i, num));
    }
    if (j->full) {
        j->n = mark;
        j->full = 0;
    }
}

/* {"ts":...,"level":...,"req":... into j, which starts empty. */
static void
jl_head(struct jline *j, int level)
{
    char ts[64];
    const char *req = log_request_id();

    timestamp(ts);
    jl_raw(j, "{\"ts\":\"", 7);
    jl_raw(j, ts, strlen(ts));
    jl_raw(j, "\",\"level\":\"", 11);
    jl_raw(j, level_name(level), strlen(level_name(level)));
    jl_raw(j, "\",\"req\":", 8);
    jl_str(j, req, strlen(req));
}

static void
jl_end(struct jline *j)
{
    j->p[j->n++] = '}';
    j->p[j->n++] = '\n';
    emit(j->p, j->n);
}

static void
json_write(int level, int err, const char *msg, size_t len)
{
    char line[LINE_MAX_JSON];
    struct jline j = { line, 0, sizeof(line) - 2, 0 };
    struct log_field f = log_strn("msg", msg, len);
    char ebuf[128];

    jl_head(&j, level);
    jl_field(&j, &f);
    if (err != 0) {
        f.key = "err";
        f.s = error_text(err, ebuf, sizeof(ebuf));
        f.len = strlen(f.s);
        jl_field(&j, &f);
    }
    jl_end(&j);
}

/* ---- key=value lines ---------------------------------------------- */

/* "ts=... level=... req=... " into line[0..LINE_MAX_KV); its length. */
static size_t
kv_head(char *line, int level)
{
    char ts[64];
    int k;

    timestamp(ts);
    k = snprintf(line, LINE_MAX_KV, "ts=%s level=%s req=%s ", ts,
                 level_name(level), log_request_id());
    return k > 0 ? (size_t)k : 0;
}

/* End the line (cut to fit, newline added) and write it. */
static void
kv_end(char *line, size_t n)
{
    if (n > LINE_MAX_KV - 1)
        n = LINE_MAX_KV - 1;    /* truncated: still one line */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';      /* one event, one line */
    line[n++] = '\n';
    emit(line, n);
}

/* Can s[0..len) stand in a kv line bare? */
static int
kv_bare(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f
            || s[i] == '"' || s[i] == '\\')
            return 0;
    return 1;
}

/* Append s[0..len) at line[n], as much as fits; the new length. */
static size_t
kv_put(char *line, size_t n, const char *s, size_t len)
{
    if (len > LINE_MAX_KV - n)
        len = LINE_MAX_KV - n;
    memcpy(line + n, s, len);
    return n + len;
}

/*
 * " key=value" appended at line[n] (n <= LINE_MAX_KV), as much as fits;
 * the new length.  By hand rather than with snprintf(): an access line
 * has some twenty fields, and one snprintf() each made a line cost 2.4
 * us against 1.4 us so (a loop of access lines to /dev/null).
 */
static size_t
kv_field(char *line, size_t n, const struct log_field *f)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)f->s;
    char num[24];

    n = kv_put(line, n, " ", 1);
    n = kv_put(line, n, f->key, strlen(f->key));
    n = kv_put(line, n, "=", 1);
    if ((f->type == LOG_FIELD_STR && f->s == NULL)
        || (f->type == LOG_FIELD_OPT_INT && f->i < 0))
        return kv_put(line, n, "-", 1);
    if (f->type != LOG_FIELD_STR)
        return kv_put(line, n, num, format_int(f->i, num));
    if (kv_bare(f->s, f->len))
        return kv_put(line, n, f->s, f->len);
    /* Quoted: \" \\ and \xNN for every byte outside printable ASCII. */
    n = kv_put(line, n, "\"", 1);
    for (size_t i = 0; i < f->len && n + 5 < LINE_MAX_KV; i++) {
        if (u[i] == '"' || u[i] == '\\') {
            line[n++] = '\\';
            line[n++] = (char)u[i];
        } else if (u[i] < ' ' || u[i] >= 0x7f) {
            line[n++] = '\\';
            line[n++] = 'x';
            line[n++] = hex[u[i] >> 4];
            line[n++] = hex[u[i] & 15];
        } else {
            line[n++] = (char)u[i];
        }
    }
    return kv_put(line, n, "\"", 1);
}

/* ---- the API ------------------------------------------------------ */

void
log_write(int level, int err, const char *fmt, ...)
{
    char line[LINE_MAX_KV];
    char ebuf[128];
    va_list ap;
    size_t n;
    int json = json_format(), k;

    /* json: the message alone here; the object is built around it. */
    n = json ? 0 : kv_head(line, level);
    va_start(ap, fmt);
    k = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (k > 0)
        n += (size_t)k;
    if (n > sizeof(line) - 1)
        n = sizeof(line) - 1;   /* vsnprintf's NUL is at line[n] */
    if (json) {
        json_write(level, err, line, n);
        return;
    }
    if (err != 0) {
        k = snprintf(line + n, sizeof(line) - n, " err=\"%s\"",
                     error_text(err, ebuf, sizeof(ebuf)));
        if (k > 0)
            n += (size_t)k;
    }
    kv_end(line, n);
}

void
log_fields(int level, const char *event, const struct log_field *f,
          size_t n)
{
    char line[LINE_MAX_JSON];
    size_t len, i;

    if (level > GW_LOG_LEVEL())
        return;
    if (json_format()) {
        struct jline j = { line, 0, sizeof(line) - 2, 0 };
        struct log_field ev = log_str("msg", event);

        jl_head(&j, level);
        jl_field(&j, &ev);
        for (i = 0; i < n; i++)
            jl_field(&j, &f[i]);
        jl_end(&j);
        return;
    }
    len = kv_head(line, level);
    len = kv_put(line, len, event, strlen(event));
    for (i = 0; i < n; i++)
        len = kv_field(line, len, &f[i]);
    kv_end(line, len);
}

/* ---- a repeating failure ------------------------------------------ */

void
log_repeat_init(struct log_repeat *r, int level, int64_t every_ms)
{
    memset(r, 0, sizeof(*r));
    r->level = level;
    r->every_ms = every_ms;
}

void
log_repeat_fail(struct log_repeat *r, int64_t now_ms, const char *what,
                const char *why)
{
    const char *sep = why[0] != '\0' ? " " : "";

    if (r->failures++ == 0) {
        r->since_ms = r->said_ms = now_ms;
        r->unsaid = 0;
        log_msg(r->level, "%s failing%s%s", what, sep, why);
        return;
    }
    r->unsaid++;
    if (now_ms - r->said_ms < r->every_ms)
        return;                 /* counted, said in the next line */
    log_msg(r->level, "%s still failing failures=%" PRIu64 " new=%" PRIu64
            " for_ms=%" PRId64 "%s%s", what, r->failures, r->unsaid,
            now_ms - r->since_ms, sep, why);
    r->said_ms = now_ms;
    r->unsaid = 0;
}

void
log_repeat_ok(struct log_repeat *r, int64_t now_ms, const char *what)
{
    if (r->failures == 0)
        return;
    log_msg(r->level, "%s recovered failures=%" PRIu64 " for_ms=%" PRId64,
            what, r->failures, now_ms - r->since_ms);
    r->failures = 0;
    r->unsaid = 0;
}
