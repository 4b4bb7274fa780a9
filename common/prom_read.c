/* SPDX-License-Identifier: MIT */
/*
 * prom_read.c - sums of named series in Prometheus text, and the labels
 * of a series' latest sample, one line at a time (the grammar is in
 * prom_read.h).
 *
 * Every function here reads a range [p, end) of one line, with the line
 * end already cut off, and never looks at *end: so no byte past the
 * caller's len is read, whatever the line holds.
 */
#include "prom_read.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int
is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static int
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* [a-zA-Z_], and ':' too in a metric name (never in a label name). */
static int
is_name_start(char c, int colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'
           || (colon && c == ':');
}

static const char *
skip_blanks(const char *p, const char *end)
{
    while (p < end && is_blank(*p))
        p++;
    return p;
}

/*
 * The end of the name at p: [a-zA-Z_:][a-zA-Z0-9_:]* for a metric
 * ('colon' 1), the same without ':' for a label.  p itself when there is
 * none.
 */
static const char *
skip_name(const char *p, const char *end, int colon)
{
    if (p == end || !is_name_start(*p, colon))
        return p;
    for (p++; p < end && (is_name_start(*p, colon) || is_digit(*p)); p++)
        ;
    return p;
}

/* The end of the token at p: the bytes up to a blank. */
static const char *
skip_token(const char *p, const char *end)
{
    while (p < end && !is_blank(*p))
        p++;
    return p;
}

/* Whether the C string 'want' is the n bytes of name characters at p. */
static int
same_name(const char *want, const char *p, size_t n)
{
    /* p holds no NUL, so strncmp() matching means want has n bytes. */
    return strncmp(want, p, n) == 0 && want[n] == '\0';
}

/*
 * Skip the label set whose '{' is just before *pp, its '}' included:
 * *pp is left past the '}'.  Only '"' and '\\' matter inside a value, so
 * a '}' or ',' there is part of it; \\, \" and \n are its only escapes
 * (the writer's, prom.c).  Each of cap[0..ncap) (none when ncap is 0)
 * whose value is still NULL and whose name a label has gets a view of
 * that label's value.  Returns 0 or GW_EPARSE.
 */
static int
skip_labels(const char **pp, const char *end, struct prom_read_label *cap,
            size_t ncap)
{
    const char *p = *pp, *name, *value;
    size_t name_len;

    for (;;) {
        p = skip_blanks(p, end);
        if (p < end && *p == '}')
            break;                      /* "{}", or after a last ',' */
        name = p;
        p = skip_name(p, end, 0);
        if (p == name)
            return GW_EPARSE;
        name_len = (size_t)(p - name);
        p = skip_blanks(p, end);
        if (p == end || *p != '=')
            return GW_EPARSE;
        p = skip_blanks(p + 1, end);
        if (p == end || *p != '"')
            return GW_EPARSE;
        value = p + 1;
        for (p++; p < end && *p != '"'; p++) {
            if (*p != '\\')
                continue;
            p++;
            if (p == end || (*p != '\\' && *p != '"' && *p != 'n'))
                return GW_EPARSE;
        }
        if (p == end)
            return GW_EPARSE;           /* the value is not closed */
        for (size_t i = 0; i < ncap; i++) {
            if (cap[i].value == NULL
                && same_name(cap[i].name, name, name_len)) {
                cap[i].value = value;
                cap[i].len = (size_t)(p - value);
            }
        }
        p = skip_blanks(p + 1, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}')
            break;
        return GW_EPARSE;
    }
    *pp = p + 1;
    return 0;
}

/* The end of 1*DIGIT at p, or p itself. */
static const char *
skip_digits(const char *p, const char *end)
{
    while (p < end && is_digit(*p))
        p++;
    return p;
}

/*
 * p[0..n) as a finite decimal (prom_read.h's 'value'), into *out.  The
 * grammar is checked here, so strtod() sees no hex, "inf" or "nan" it
 * would take; it needs a NUL, hence the copy.  Returns 0 or GW_EPARSE.
 */
static int
parse_value(const char *p, size_t n, double *out)
{
    const char *end = p + n, *q = p, *digits;
    char s[PROM_READ_MAX_VALUE + 1];
    size_t ndigits;
    char *stop;
    double v;

    if (n == 0 || n > PROM_READ_MAX_VALUE)
        return GW_EPARSE;
    if (*q == '+' || *q == '-')
        q++;
    digits = q;
    q = skip_digits(q, end);
    ndigits = (size_t)(q - digits);
    if (q < end && *q == '.') {
        digits = q + 1;
        q = skip_digits(digits, end);
        ndigits += (size_t)(q - digits);
    }
    if (ndigits == 0)
        return GW_EPARSE;               /* "+", ".", "-.e1" */
    if (q < end && (*q == 'e' || *q == 'E')) {
        const char *exp;

        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        exp = q;
        q = skip_digits(q, end);
        if (q == exp)
            return GW_EPARSE;
    }
    if (q != end)
        return GW_EPARSE;
    memcpy(s, p, n);
    s[n] = '\0';
    v = strtod(s, &stop);
    /* Short of the end only where the decimal point is not '.'. */
    if (stop != s + n || !isfinite(v))
        return GW_EPARSE;
    *out = v;
    return 0;
}

/* p[0..n) as an int64 in decimal, with an optional sign.  0 or GW_EPARSE. */
static int
check_timestamp(const char *p, size_t n)
{
    uint64_t max = INT64_MAX, t;

    if (n > 0 && (*p == '+' || *p == '-')) {
        if (*p == '-')
            max = (uint64_t)INT64_MAX + 1;     /* INT64_MIN's magnitude */
        p++;
        n--;
    }
    return gw_parse_uint(p, n, max, &t) == 0 ? 0 : GW_EPARSE;
}

/*
 * The rest of a sample line, p just past its name, up to 'end' (the line
 * end cut off): the labels (skipped, but those cap[0..ncap) ask for:
 * skip_labels()), the value (OUT *out), and a timestamp (checked,
 * ignored).  Returns 0 or GW_EPARSE.
 */
static int
parse_sample(const char *p, const char *end, double *out,
             struct prom_read_label *cap, size_t ncap)
{
    const char *q = skip_blanks(p, end), *tok;
    double v;

    if (q < end && *q == '{') {
        p = q + 1;
        if (skip_labels(&p, end, cap, ncap) != 0)
            return GW_EPARSE;
        p = skip_blanks(p, end);
    } else if (q == p) {
        return GW_EPARSE;               /* "x-1", or no value at all */
    } else {
        p = q;
    }
    tok = p;
    p = skip_token(p, end);
    if (parse_value(tok, (size_t)(p - tok), &v) != 0)
        return GW_EPARSE;
    p = skip_blanks(p, end);
    if (p < end) {
        tok = p;
        p = skip_token(p, end);
        if (check_timestamp(tok, (size_t)(p - tok)) != 0)
            return GW_EPARSE;
        if (skip_blanks(p, end) != end)
            return GW_EPARSE;           /* a third token */
    }
    *out = v;
    return 0;
}

/*
 * Call fn(p, end, arg) for each line of text[0..len), [p, end) without
 * its line end: '\n', and a '\r' before it.
 */
static void
each_line(const char *text, size_t len,
          void (*fn)(const char *, const char *, void *), void *arg)
{
    const char *p = text, *end, *eol, *next;

    if (len == 0)
        return;                         /* text may be NULL: no NULL + 0 */
    end = text + len;
    while (p < end) {
        eol = memchr(p, '\n', (size_t)(end - p));
        next = eol != NULL ? eol + 1 : end;
        if (eol == NULL)
            eol = end;
        if (eol > p && eol[-1] == '\r')
            eol--;
        fn(p, eol, arg);
        p = next;
    }
}

/* What prom_read_sums() asks each line for. */
struct sums {
    struct prom_read_sum *want;
    size_t n;
};

/*
 * One line, [p, end) without its line end: read past its name only when
 * some want[i] asks for it, and then once for all of them.
 */
static void
read_line(const char *p, const char *end, void *arg)
{
    struct prom_read_sum *want = ((struct sums *)arg)->want;
    size_t n = ((struct sums *)arg)->n;
    const char *name = skip_blanks(p, end);
    const char *name_end = skip_name(name, end, 1);
    size_t len = (size_t)(name_end - name);
    int parsed = 0, rc = 0;
    double v = 0;

    if (len == 0)
        return;                         /* blank, '#', or not a sample */
    for (size_t i = 0; i < n; i++) {
        if (!same_name(want[i].name, name, len))
            continue;
        if (!parsed) {
            rc = parse_sample(name_end, end, &v, NULL, 0);
            parsed = 1;
        }
        if (rc != 0) {
            want[i].refused++;
        } else {
            want[i].sum += v;
            want[i].samples++;
        }
    }
}

int
prom_read_sums(const char *text, size_t len, struct prom_read_sum *want,
               size_t n)
{
    struct sums s = { want, n };
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        want[i].sum = 0;
        want[i].samples = 0;
        want[i].refused = 0;
    }
    each_line(text, len, read_line, &s);
    for (size_t i = 0; i < n; i++)
        if (want[i].refused > 0)
            rc = GW_EPARSE;
    return rc;
}

/*
 * One line for prom_read_latest(): a sample of want->name replaces the
 * latest so far when its value is higher (or it is the first).
 */
static void
latest_line(const char *p, const char *end, void *arg)
{
    struct prom_read_latest *want = arg;
    struct prom_read_label cap[PROM_READ_MAX_LABELS];
    const char *name = skip_blanks(p, end);
    const char *name_end = skip_name(name, end, 1);
    size_t i;
    double v;

    if (name_end == name
        || !same_name(want->name, name, (size_t)(name_end - name)))
        return;
    for (i = 0; i < want->num_labels; i++) {
        cap[i].name = want->labels[i].name;
        cap[i].value = NULL;
        cap[i].len = 0;
    }
    if (parse_sample(name_end, end, &v, cap, want->num_labels) != 0) {
        want->refused++;
        return;
    }
    if (want->samples++ > 0 && !(v > want->value))
        return;
    want->value = v;
    for (i = 0; i < want->num_labels; i++) {
        want->labels[i].value = cap[i].value;
        want->labels[i].len = cap[i].len;
    }
}

int
prom_read_latest(const char *text, size_t len, struct prom_read_latest *want)
{
    assert(want->num_labels <= PROM_READ_MAX_LABELS);
    want->value = 0;
    want->samples = 0;
    want->refused = 0;
    for (size_t i = 0; i < want->num_labels; i++) {
        want->labels[i].value = NULL;
        want->labels[i].len = 0;
    }
    each_line(text, len, latest_line, want);
    return want->refused > 0 ? GW_EPARSE : 0;
}
