/* SPDX-License-Identifier: MIT */
/*
 * prom.c - the Prometheus text exposition format, one line at a time.
 */
#include "prom.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Any double in %.17g: sign, 17 digits, '.', "e-308", NUL. */
#define FLOAT_LEN 32

static const char *const type_names[] = { "counter", "gauge", "histogram" };

void
prom_init(struct prom *w, struct buf *out)
{
    w->out = out;
    w->name = NULL;
    w->type = PROM_COUNTER;
    w->rc = 0;
}

/* Append p[0..n), unless an earlier write failed. */
static void
put(struct prom *w, const char *p, size_t n)
{
    if (w->rc == 0)
        w->rc = buf_append(w->out, p, n);
}

static void GW_PRINTF(2, 0)
vemit(struct prom *w, const char *fmt, va_list ap)
{
    if (w->rc == 0)
        w->rc = buf_vprintf(w->out, fmt, ap);
}

static void GW_PRINTF(2, 3)
emit(struct prom *w, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vemit(w, fmt, ap);
    va_end(ap);
}

/*
 * 's' with each byte of 'special' escaped: \ as \\, " as \", newline as
 * \n.  HELP text escapes \ and newline; a label value " as well.
 */
static void
put_escaped(struct prom *w, const char *s, const char *special)
{
    for (;;) {
        size_t n = strcspn(s, special);

        put(w, s, n);
        s += n;
        if (*s == '\0')
            return;
        put(w, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\", 2);
        s++;
    }
}

/*
 * 'v' as the format writes a float: +Inf, -Inf, NaN, or %g (6 significant
 * digits, no trailing zeros) with as many more digits as it takes to read
 * back as the same double (17 always do): "0.005", "120", "2.6e-05".  The
 * Prometheus client libraries write the same shortest digits (Go's
 * strconv 'g', -1).  In the C locale, which the gateway never changes.
 */
static void
format_float(double v, char s[FLOAT_LEN])
{
    if (isnan(v)) {
        snprintf(s, FLOAT_LEN, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(s, FLOAT_LEN, "%s", v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(s, FLOAT_LEN, "%.*g", digits, v);
        if (strtod(s, NULL) == v)
            return;
    }
}

void
prom_family(struct prom *w, const char *name, enum prom_type type,
            const char *help)
{
    assert((size_t)type < GW_ARRAY_LEN(type_names));
    w->name = name;
    w->type = type;
    emit(w, "# HELP %s ", name);
    put_escaped(w, help, "\\\n");
    emit(w, "\n# TYPE %s %s\n", name, type_names[type]);
}

/*
 * One sample line: the family's name and 'suffix', the labels in braces
 * (none: no braces) with le="le" last unless 'le' is NULL, and the value
 * as 'fmt' makes it.
 */
static void GW_PRINTF(6, 7)
sample(struct prom *w, const char *suffix, const struct prom_label *labels,
       size_t n, const char *le, const char *fmt, ...)
{
    va_list ap;

    assert(w->name != NULL);            /* prom_family() first */
    emit(w, "%s%s", w->name, suffix);
    if (n > 0 || le != NULL) {
        put(w, "{", 1);
        for (size_t i = 0; i < n; i++) {
            emit(w, "%s%s=\"", i > 0 ? "," : "", labels[i].name);
            put_escaped(w, labels[i].value, "\\\"\n");
            put(w, "\"", 1);
        }
        if (le != NULL)
            emit(w, "%sle=\"%s\"", n > 0 ? "," : "", le);
        put(w, "}", 1);
    }
    put(w, " ", 1);
    va_start(ap, fmt);
    vemit(w, fmt, ap);
    va_end(ap);
    put(w, "\n", 1);
}

void
prom_uint(struct prom *w, const struct prom_label *labels, size_t n,
          uint64_t value)
{
    assert(w->type != PROM_HISTOGRAM);
    sample(w, "", labels, n, NULL, "%" PRIu64, value);
}

void
prom_int(struct prom *w, const struct prom_label *labels, size_t n,
         int64_t value)
{
    assert(w->type != PROM_HISTOGRAM);
    sample(w, "", labels, n, NULL, "%" PRId64, value);
}

void
prom_double(struct prom *w, const struct prom_label *labels, size_t n,
            double value)
{
    char f[FLOAT_LEN];

    assert(w->type != PROM_HISTOGRAM);
    format_float(value, f);
    sample(w, "", labels, n, NULL, "%s", f);
}

void
prom_histogram(struct prom *w, const struct prom_label *labels, size_t n,
               const struct prom_histogram *h)
{
    char f[FLOAT_LEN];
    uint64_t cum = 0;

    assert(w->type == PROM_HISTOGRAM);
    for (size_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        format_float(h->le[i], f);
        sample(w, "_bucket", labels, n, f, "%" PRIu64, cum);
    }
    sample(w, "_bucket", labels, n, "+Inf", "%" PRIu64, h->count);
    format_float(h->sum, f);
    sample(w, "_sum", labels, n, NULL, "%s", f);
    sample(w, "_count", labels, n, NULL, "%" PRIu64, h->count);
}
