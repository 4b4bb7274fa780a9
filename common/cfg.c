/* SPDX-License-Identifier: MIT */
/*
 * cfg.c - the configuration file syntax: lines into entries, and value
 * parsers with units.
 *
 * Design: the whole file is read into memory (at most CFG_MAX_FILE bytes)
 * and split into lines.  Each line is one of: blank, a comment, a section
 * header or "key = value".  The parser keeps the current section as a view
 * into the text and copies each entry out into one allocation holding
 * "section\0name\0key\0value\0", so an entry costs one malloc and one free
 * and cfg_file_release() can wipe it in one go (values may be API keys).
 *
 * Every section header also yields an entry, with an empty key and value.
 * No real key is empty, so consumers can tell them apart, and this is how
 * gateway/base/config.c sees a section that has no keys at all (a [tenant x]
 * without api_key) and reports errors at the header's own line.
 *
 * Values are strict: the parsers accept the whole string or nothing, so a
 * typo such as "10x" or "5 m" is an error rather than a silent 10 or 5.
 */
#include "cfg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "buf.h"
#include "util.h"

#define CFG_MAX_FILE (1024 * 1024)

/* The parser's position and the current section, as views into the text. */
struct parser {
    const char *name;           /* file name for messages; borrowed */
    const char *section;
    size_t section_len;
    const char *sname;          /* the section's name ("[tenant NAME]") */
    size_t sname_len;
    int line;
    size_t cap;                 /* allocated slots in f->entries */
    char *err;
    size_t errlen;
};

/*
 * Write "NAME:LINE: message" (or "NAME: message" when line is 0) into
 * 'err'.  Truncates silently: a cut message still names the place.
 */
static void GW_PRINTF(5, 6)
set_err(char *err, size_t errlen, const char *name, int line,
        const char *fmt, ...)
{
    va_list ap;
    int n;

    if (err == NULL || errlen == 0)
        return;
    if (line > 0)
        n = snprintf(err, errlen, "%s:%d: ", name, line);
    else
        n = snprintf(err, errlen, "%s: ", name);
    if (n < 0 || (size_t)n >= errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static int
is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* Characters of a section or key name: the ones a human types for one. */
static int
is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

static int
all_name_chars(const char *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!is_name_char(p[i]))
            return 0;
    return n > 0;
}

/* Trim blanks on both sides of the view [*p, *p + *n). */
static void
trim(const char **p, size_t *n)
{
    while (*n > 0 && is_blank(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n > 0 && is_blank((*p)[*n - 1]))
        (*n)--;
}

/*
 * Append one entry to f, copying the views.  A quoted value is unescaped
 * on the way (\" and \\ were validated by the caller).
 * Returns 0 or GW_ENOMEM.
 */
static int
add_entry(struct parser *ps, struct cfg_file *f, const char *key,
          size_t key_len, const char *val, size_t val_len, int quoted)
{
    struct cfg_entry *e, *grown;
    size_t size, ncap, i;
    char *block, *w;

    if (f->count == ps->cap) {
        ncap = ps->cap > 0 ? ps->cap * 2 : 16;
        if (ncap > SIZE_MAX / sizeof(*f->entries))
            return GW_ENOMEM;
        grown = gw_realloc(f->entries, ncap * sizeof(*f->entries));
        if (grown == NULL)
            return GW_ENOMEM;
        f->entries = grown;
        ps->cap = ncap;
    }
    /* The four views lie inside a text of at most SIZE_MAX bytes, so the
     * sum can only overflow if they overlap, and they do not. */
    size = ps->section_len + ps->sname_len + key_len + val_len + 4;
    block = gw_malloc(size);
    if (block == NULL)
        return GW_ENOMEM;

    e = &f->entries[f->count];
    w = block;
    e->section = w;
    memcpy(w, ps->section, ps->section_len);
    w += ps->section_len;
    *w++ = '\0';
    e->name = w;
    memcpy(w, ps->sname, ps->sname_len);
    w += ps->sname_len;
    *w++ = '\0';
    e->key = w;
    memcpy(w, key, key_len);
    w += key_len;
    *w++ = '\0';
    e->value = w;
    for (i = 0; i < val_len; i++) {
        if (quoted && val[i] == '\\')
            i++;
        *w++ = val[i];
    }
    *w = '\0';
    e->line = ps->line;
    f->count++;
    return 0;
}

/*
 * "[section]" or "[section name]", optionally followed by a comment.
 * 'p' starts at the '['.  Returns 0, GW_EPARSE or GW_ENOMEM.
 */
static int
parse_header(struct parser *ps, struct cfg_file *f, const char *p, size_t n)
{
    const char *close, *in, *rest, *name;
    size_t in_len, rest_len, sec_len, name_len;

    close = memchr(p, ']', n);
    if (close == NULL) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "unterminated section header");
        return GW_EPARSE;
    }
    rest = close + 1;
    rest_len = n - (size_t)(rest - p);
    trim(&rest, &rest_len);
    if (rest_len > 0 && rest[0] != '#') {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "unexpected text after section header");
        return GW_EPARSE;
    }
    in = p + 1;
    in_len = (size_t)(close - in);
    trim(&in, &in_len);
    if (in_len == 0) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "empty section header");
        return GW_EPARSE;
    }
    for (sec_len = 0; sec_len < in_len && !is_blank(in[sec_len]); sec_len++)
        ;
    name = in + sec_len;
    name_len = in_len - sec_len;
    trim(&name, &name_len);
    if (!all_name_chars(in, sec_len)
        || (name_len > 0 && !all_name_chars(name, name_len))) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "bad section header '[%.*s]': expected [section] or "
                "[section name] made of letters, digits, '_', '-' and '.'",
                (int)in_len, in);
        return GW_EPARSE;
    }
    ps->section = in;
    ps->section_len = sec_len;
    ps->sname = name;
    ps->sname_len = name_len;
    return add_entry(ps, f, "", 0, "", 0, 0);
}

/*
 * A double-quoted value; 'p' is just past the opening quote.  Only \" and
 * \\ are escapes, so a Windows path or a regex needs no second thought
 * beyond those two.  OUT *inner, *inner_len: the raw inside, still escaped.
 */
static int
parse_quoted(struct parser *ps, const char *p, size_t n, const char **inner,
             size_t *inner_len)
{
    const char *rest;
    size_t i, rest_len;

    for (i = 0; i < n; i++) {
        if (p[i] == '"')
            break;
        if (p[i] == '\\') {
            if (i + 1 == n || (p[i + 1] != '"' && p[i + 1] != '\\')) {
                set_err(ps->err, ps->errlen, ps->name, ps->line,
                        "bad escape in quoted value (only \\\" and \\\\)");
                return GW_EPARSE;
            }
            i++;
        }
    }
    if (i == n) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "unterminated quoted value");
        return GW_EPARSE;
    }
    rest = p + i + 1;
    rest_len = n - i - 1;
    trim(&rest, &rest_len);
    if (rest_len > 0 && rest[0] != '#') {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "unexpected text after quoted value");
        return GW_EPARSE;
    }
    *inner = p;
    *inner_len = i;
    return 0;
}

/* "key = value"; 'p' is the line without leading blanks. */
static int
parse_setting(struct parser *ps, struct cfg_file *f, const char *p, size_t n)
{
    const char *eq, *key, *val;
    size_t key_len, val_len, i;
    int rc;

    eq = memchr(p, '=', n);
    key = p;
    key_len = eq != NULL ? (size_t)(eq - p) : 0;
    trim(&key, &key_len);
    if (eq == NULL || key_len == 0) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "expected 'key = value'");
        return GW_EPARSE;
    }
    if (!all_name_chars(key, key_len)) {
        set_err(ps->err, ps->errlen, ps->name, ps->line,
                "bad key '%.*s': use letters, digits, '_', '-' and '.'",
                (int)key_len, key);
        return GW_EPARSE;
    }
    val = eq + 1;
    val_len = n - (size_t)(val - p);
    while (val_len > 0 && is_blank(*val)) {
        val++;
        val_len--;
    }
    if (val_len > 0 && val[0] == '"') {
        rc = parse_quoted(ps, val + 1, val_len - 1, &val, &val_len);
        if (rc != 0)
            return rc;
        return add_entry(ps, f, key, key_len, val, val_len, 1);
    }
    /* A '#' starts a comment only after a blank, so "a#b" keeps its '#'
     * (and "key = #x" is an empty value: its '#' follows a blank). */
    for (i = 0; i < val_len; i++) {
        /* val[-1] is still inside the line: the '=' or a blank. */
        if (val[i] == '#' && is_blank(val[(ptrdiff_t)i - 1]))
            break;
    }
    val_len = i;
    trim(&val, &val_len);
    return add_entry(ps, f, key, key_len, val, val_len, 0);
}

static int
parse_line(struct parser *ps, struct cfg_file *f, const char *p, size_t n)
{
    size_t i;

    /* CRLF files are fine; any other control byte is a mistake or an
     * attack on whoever reads the error message in a terminal. */
    if (n > 0 && p[n - 1] == '\r')
        n--;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];

        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            set_err(ps->err, ps->errlen, ps->name, ps->line,
                    "control character 0x%02x in line", c);
            return GW_EPARSE;
        }
    }
    while (n > 0 && is_blank(*p)) {
        p++;
        n--;
    }
    if (n == 0 || p[0] == '#')
        return 0;
    if (p[0] == '[')
        return parse_header(ps, f, p, n);
    return parse_setting(ps, f, p, n);
}

void
cfg_file_release(struct cfg_file *f)
{
    size_t i;

    for (i = 0; i < f->count; i++) {
        struct cfg_entry *e = &f->entries[i];
        char *end = e->value + strlen(e->value) + 1;

        /* Values may be API keys: wipe the whole block before free(). */
        gw_wipe_free(e->section, (size_t)(end - e->section));
    }
    gw_free(f->entries);
    gw_free(f->path);
    f->entries = NULL;
    f->path = NULL;
    f->count = 0;
}

/* cfg_parse_file() over text in memory; 'name' is used in messages. */
GW_TESTABLE int
cfg_parse_text(const char *name, const char *text, size_t len,
               struct cfg_file *f, char *err, size_t errlen)
{
    struct parser ps;
    const char *p, *end, *nl;
    int rc = GW_ENOMEM;

    f->path = NULL;
    f->entries = NULL;
    f->count = 0;
    memset(&ps, 0, sizeof(ps));
    ps.name = name;
    ps.section = "";
    ps.sname = "";
    ps.err = err;
    ps.errlen = errlen;
    if (err != NULL && errlen > 0)
        err[0] = '\0';

    f->path = gw_strdup(name);
    if (f->path == NULL)
        goto out;
    p = text;
    end = text + len;
    while (p < end) {
        ps.line++;
        nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            nl = end;
        rc = parse_line(&ps, f, p, (size_t)(nl - p));
        if (rc != 0)
            goto out;
        p = nl + 1;
    }
    rc = 0;

out:
    if (rc == GW_ENOMEM)
        set_err(err, errlen, name, 0, "out of memory");
    if (rc != 0)
        cfg_file_release(f);
    return rc;
}

/*
 * Read all of 'fd' into 'b' (whose limit is CFG_MAX_FILE).  Returns 0,
 * GW_EIO (OUT *saved_errno set), GW_ETOOBIG or GW_ENOMEM.
 */
static int
read_all(int fd, struct buf *b, int *saved_errno)
{
    char *dst, probe;
    size_t room;
    ssize_t got;
    int rc;

    /* One allocation for the largest file allowed: growing by realloc()
     * would leave copies of the API keys in freed memory, unwiped. */
    rc = buf_reserve(b, b->limit, &dst);
    if (rc != 0)
        return rc;
    for (;;) {
        room = b->limit - buf_len(b);
        if (room == 0) {
            /* Full: one more byte means the file is over the limit. */
            got = read(fd, &probe, 1);
            if (got == -1 && errno == EINTR)
                continue;
            if (got == -1) {
                *saved_errno = errno;
                return GW_EIO;
            }
            return got == 0 ? 0 : GW_ETOOBIG;
        }
        rc = buf_reserve(b, room, &dst);     /* fits: no reallocation */
        if (rc != 0)
            return rc;
        got = read(fd, dst, room);
        if (got == -1 && errno == EINTR)
            continue;
        if (got == -1) {
            *saved_errno = errno;
            return GW_EIO;
        }
        if (got == 0)
            return 0;
        buf_commit(b, (size_t)got);
    }
}

int
cfg_parse_file(const char *path, struct cfg_file *f, char *err,
               size_t errlen)
{
    struct buf b;
    char ebuf[128];
    int fd = -1, saved_errno = 0;
    int rc = GW_EIO;

    f->path = NULL;
    f->entries = NULL;
    f->count = 0;
    buf_init(&b, CFG_MAX_FILE);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
        saved_errno = errno;
        set_err(err, errlen, path, 0, "cannot open: %s",
                strerror_r(saved_errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = read_all(fd, &b, &saved_errno);
    if (rc == GW_EIO) {
        set_err(err, errlen, path, 0, "cannot read: %s",
                strerror_r(saved_errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (rc == GW_ETOOBIG) {
        set_err(err, errlen, path, 0, "larger than %d bytes", CFG_MAX_FILE);
        goto out;
    }
    if (rc == GW_ENOMEM) {
        set_err(err, errlen, path, 0, "out of memory");
        goto out;
    }
    rc = cfg_parse_text(path, buf_ptr(&b), buf_len(&b), f, err, errlen);

out:
    /* The text holds every API key in the file. */
    if (b.data != NULL)
        explicit_bzero(b.data, b.cap);
    buf_release(&b);
    if (fd != -1)
        close(fd);
    return rc;
}

/*
 * Decimal digits at *sp into *out, advancing *sp.  At least one digit, no
 * sign, no blanks.  Returns 0 or GW_EINVAL (none, or above UINT64_MAX).
 */
static int
parse_digits(const char **sp, uint64_t *out)
{
    size_t n = strspn(*sp, "0123456789");

    if (gw_parse_uint(*sp, n, UINT64_MAX, out) != 0)
        return GW_EINVAL;
    *sp += n;
    return 0;
}

int
cfg_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    return gw_parse_uint(s, strlen(s), max, out) == 0 ? 0 : GW_EINVAL;
}

int
cfg_parse_size(const char *s, uint64_t *out)
{
    uint64_t v, mult = 1;

    if (parse_digits(&s, &v) != 0)
        return GW_EINVAL;
    switch (*s) {
    case '\0':
        break;
    case 'k': case 'K':
        mult = CFG_KIB;
        s++;
        break;
    case 'm': case 'M':
        mult = CFG_MIB;
        s++;
        break;
    case 'g': case 'G':
        mult = CFG_GIB;
        s++;
        break;
    default:
        return GW_EINVAL;
    }
    if (*s != '\0' || v > UINT64_MAX / mult)
        return GW_EINVAL;
    *out = v * mult;
    return 0;
}

/*
 * The duration units, read by cfg_parse_duration_ms() and written by
 * cfg_format_duration_ms(), largest first (the formatter takes the first
 * that divides; the last, 1, divides any).
 */
static const struct {
    const char *suffix;
    uint64_t ms;
} duration_units[] = {
    { "h", 60 * 60 * 1000 },
    { "m", 60 * 1000 },
    { "s", 1000 },
    { "ms", 1 },
};

int
cfg_parse_duration_ms(const char *s, int64_t *out)
{
    uint64_t v, ms;
    size_t i;

    if (parse_digits(&s, &v) != 0)
        return GW_EINVAL;
    if (*s == '\0')
        s = "s";                /* a bare number is seconds */
    for (i = 0; i < GW_ARRAY_LEN(duration_units); i++) {
        if (gw_strieq(s, strlen(s), duration_units[i].suffix)) {
            ms = duration_units[i].ms;
            if (v > (uint64_t)INT64_MAX / ms)
                return GW_EINVAL;
            *out = (int64_t)(v * ms);
            return 0;
        }
    }
    return GW_EINVAL;
}

int
cfg_parse_bool(const char *s, int *out)
{
    static const struct {
        const char *word;
        int value;
    } words[] = {
        { "on", 1 }, { "off", 0 },
        { "yes", 1 }, { "no", 0 },
        { "true", 1 }, { "false", 0 },
        { "1", 1 }, { "0", 0 },
    };
    size_t i;

    for (i = 0; i < GW_ARRAY_LEN(words); i++) {
        if (gw_strieq(s, strlen(s), words[i].word)) {
            *out = words[i].value;
            return 0;
        }
    }
    return GW_EINVAL;
}

int
cfg_parse_decimal(const char *s, double lo, double hi, double *out)
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

int
cfg_parse_percent(const char *s, double lo, double hi, double *out)
{
    size_t n = strlen(s);
    char num[32];
    double v;

    if (n < 2 || n >= sizeof(num) || s[n - 1] != '%')
        return GW_EINVAL;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    if (cfg_parse_decimal(num, lo, hi, &v) != 0)
        return GW_EINVAL;
    *out = v / 100;
    return 0;
}

void
cfg_format_size(uint64_t v, char *out, size_t n)
{
    if (v != 0 && v % CFG_GIB == 0)
        snprintf(out, n, "%" PRIu64 "g", v / CFG_GIB);
    else if (v != 0 && v % CFG_MIB == 0)
        snprintf(out, n, "%" PRIu64 "m", v / CFG_MIB);
    else if (v != 0 && v % CFG_KIB == 0)
        snprintf(out, n, "%" PRIu64 "k", v / CFG_KIB);
    else
        snprintf(out, n, "%" PRIu64, v);
}

void
cfg_format_duration_ms(uint64_t v, char *out, size_t n)
{
    const size_t last = GW_ARRAY_LEN(duration_units) - 1;  /* "ms" */
    size_t i = 0;

    /* The largest unit that divides 'v'; 0 is written in the smallest. */
    while (i < last && (v == 0 || v % duration_units[i].ms != 0))
        i++;
    snprintf(out, n, "%" PRIu64 "%s", v / duration_units[i].ms,
             duration_units[i].suffix);
}
