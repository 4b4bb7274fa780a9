/* SPDX-License-Identifier: MIT */
/*
 * fuzz_prom_read.c - libFuzzer target for common/prom_read.c, the sums
 * of named series read from Prometheus text, and a series' latest
 * sample with its labels (prom_read_latest()).
 *
 * An input is the text, byte for byte (the corpus files are /metrics
 * pages and pieces of them), read for a fixed list of names: vLLM's four
 * load gauges, and "x" (twice) and "x:y", short enough for the fuzzer to
 * write lines of them.
 *
 * Besides crashes and sanitizer reports, the target aborts when one of
 * these properties fails:
 *   reference  every entry's sum, samples and refused are those of a
 *              reference reader written another way: a line's name is
 *              the run of bytes from a set after its blanks, and a line
 *              of a wanted name counts as a sample when the whole line
 *              matches prom_read.h's grammar written as one POSIX
 *              extended regular expression and its value is finite and
 *              at most PROM_READ_MAX_VALUE bytes, else as refused; the
 *              sums add the same doubles in the same order, so they must
 *              be equal to the bit.
 *   lines      reading each line alone, from a heap block of its exact
 *              size (so ASan catches a read past a line), and adding up
 *              what the lines give, gives what the whole text does: no
 *              state carries from one line to the next; and a line
 *              alone gives each entry one sample or refusal at most.
 *   result     the call returns GW_EPARSE exactly when some entry has a
 *              refused line, else 0; a name asked for twice gets the
 *              same answer twice.
 *   latest     prom_read_latest() for "x" with the labels "a" and "b"
 *              reads the samples and refusals the sums do; its value is
 *              the highest of the lines' (each read alone, from its own
 *              heap block), the first of equals; its label views lie in
 *              the text, at the offsets and with the bytes that line's
 *              read alone has; a line alone gives one sample or refusal
 *              at most.
 * regexec() needs a C string, so the reference sees each NUL byte as
 * 0x01: both are bytes the grammar gives no role, so that changes
 * nothing the reader does.
 */
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "prom_read.h"
#include "util.h"

static const char *const names[] = {
    "vllm:num_requests_waiting", "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",  "vllm:gpu_cache_usage_perc",
    "x",                         "x:y",
    "x",
};
#define NAMES GW_ARRAY_LEN(names)
#define X_FIRST 4                       /* names[X_FIRST] is names[X_AGAIN] */
#define X_AGAIN 6

/* The grammar of prom_read.h as EREs ("[{]": a bare '{' is an interval). */
#define NAME_RE "[a-zA-Z_:][a-zA-Z0-9_:]*"
#define BLANKS "[ \t]*"
#define LABEL_RE                                                          \
    "[a-zA-Z_][a-zA-Z0-9_]*" BLANKS "=" BLANKS                            \
    "\"([^\"\\\\]|\\\\[\\\\\"n])*\""
#define LABELS_RE                                                         \
    BLANKS "(" LABEL_RE "(" BLANKS "," BLANKS LABEL_RE ")*"               \
    "(" BLANKS ",)?)?" BLANKS
#define VALUE_RE "[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?"
#define BEFORE_VALUE_RE                                                   \
    "^" BLANKS NAME_RE "(" BLANKS "[{]" LABELS_RE "[}]" BLANKS "|[ \t]+)"
#define SAMPLE_RE                                                         \
    BEFORE_VALUE_RE "(" VALUE_RE ")([ \t]+([+-]?[0-9]+))?" BLANKS "$"

#define NAME_CHARS                                                        \
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:0123456789"

static regex_t sample_re;
static size_t value_group, stamp_group;     /* in sample_re */

/* How many groups the ERE 're' opens (none of ours has a literal '('). */
static size_t
groups(const char *re)
{
    size_t n = 0;

    for (; *re != '\0'; re++)
        n += *re == '(';
    return n;
}

/* Subexpression g of a match of s, as a new C string (free() it). */
static char *
group_str(const char *s, const regmatch_t *m, size_t g)
{
    size_t n = (size_t)(m[g].rm_eo - m[g].rm_so);
    char *out = malloc(n + 1);

    REQUIRE(out != NULL);
    memcpy(out, s + m[g].rm_so, n);
    out[n] = '\0';
    return out;
}

/* The ERE, and which of its groups are the value and the timestamp. */
static void
compile_once(void)
{
    static const char line[] = "x{a=\"(\\\")\",} -1.5e3 -42";
    static int done;
    regmatch_t m[32];
    char *v, *t;

    if (done)
        return;
    REQUIRE(regcomp(&sample_re, SAMPLE_RE, REG_EXTENDED) == 0);
    value_group = groups(BEFORE_VALUE_RE) + 1;
    stamp_group = value_group + groups(VALUE_RE) + 2;
    REQUIRE(stamp_group == groups(SAMPLE_RE) && stamp_group < 32);
    REQUIRE(regexec(&sample_re, line, 32, m, 0) == 0);
    v = group_str(line, m, value_group);
    t = group_str(line, m, stamp_group);
    REQUIRE(strcmp(v, "-1.5e3") == 0 && strcmp(t, "-42") == 0);
    free(v);
    free(t);
    done = 1;
}

/*
 * The reference's reading of the sample line s (a C string, its line
 * end cut off): 1 and *v when it is one, 0 when refused.
 */
static int
reference_sample(const char *s, double *v)
{
    regmatch_t m[32];
    char *value, *stamp, *end;
    int ok = 0;

    if (regexec(&sample_re, s, GW_ARRAY_LEN(m), m, 0) != 0)
        return 0;
    value = group_str(s, m, value_group);
    *v = strtod(value, &end);
    ok = *end == '\0' && strlen(value) <= PROM_READ_MAX_VALUE && isfinite(*v);
    if (ok && m[stamp_group].rm_so != -1) {
        stamp = group_str(s, m, stamp_group);
        errno = 0;
        strtoll(stamp, &end, 10);
        ok = *end == '\0' && errno == 0;
        free(stamp);
    }
    free(value);
    return ok;
}

/* The length of the run of bytes of 'set' at p[0..n) (NUL in none). */
static size_t
span(const char *p, size_t n, const char *set)
{
    size_t k = 0;

    while (k < n && p[k] != '\0' && strchr(set, p[k]) != NULL)
        k++;
    return k;
}

/*
 * The reference reads line p[0..n) (no line end) into ref[]: its name
 * is the run of name bytes after the blanks (none when the first is a
 * digit, and so none for '#' lines and blank ones).  Only a wanted line
 * is copied and matched: unwanted ones are most of a text.
 */
static void
reference_line(const char *p, size_t n, struct prom_read_sum *ref)
{
    size_t blanks = span(p, n, " \t"), len;
    const char *name = p + blanks;
    char *s = NULL;
    int parsed = 0, ok = 0;
    double v = 0;

    len = span(name, n - blanks, NAME_CHARS);
    if (len > 0 && strchr("0123456789", name[0]) != NULL)
        len = 0;
    for (size_t i = 0; i < NAMES && len > 0; i++) {
        if (strlen(names[i]) != len || memcmp(names[i], name, len) != 0)
            continue;
        if (!parsed) {
            s = malloc(n + 1);
            REQUIRE(s != NULL);
            for (size_t j = 0; j < n; j++)
                s[j] = p[j] != '\0' ? p[j] : '\x01';
            s[n] = '\0';
            ok = reference_sample(s, &v);
            parsed = 1;
        }
        if (ok) {
            ref[i].sum += v;
            ref[i].samples++;
        } else {
            ref[i].refused++;
        }
    }
    free(s);
}

/* Read p[0..n) for names[] into want[]; checks 'result'. */
static void
read_sums(const char *p, size_t n, struct prom_read_sum *want)
{
    size_t refused = 0;
    int rc;

    for (size_t i = 0; i < NAMES; i++)
        want[i].name = names[i];
    rc = prom_read_sums(p, n, want, NAMES);
    for (size_t i = 0; i < NAMES; i++)
        refused += want[i].refused;
    REQUIRE(rc == (refused > 0 ? GW_EPARSE : 0));
    REQUIRE(memcmp(&want[X_FIRST].sum, &want[X_AGAIN].sum, sizeof(double))
                == 0
            && want[X_FIRST].samples == want[X_AGAIN].samples
            && want[X_FIRST].refused == want[X_AGAIN].refused);
}

/* prom_read_latest() of "x" with labels "a" and "b" over p[0..n). */
static void
read_latest(const char *p, size_t n, struct prom_read_latest *want,
            struct prom_read_label *labels)
{
    labels[0].name = "a";
    labels[1].name = "b";
    want->name = names[X_FIRST];
    want->labels = labels;
    want->num_labels = 2;
    REQUIRE(prom_read_latest(p, n, want) == (want->refused > 0 ? GW_EPARSE
                                                               : 0));
    for (size_t i = 0; i < 2; i++)
        REQUIRE(labels[i].value == NULL
                || (labels[i].value >= p
                    && labels[i].value + labels[i].len <= p + n));
}

/*
 * The latest over lines: 'best' (from the line at offset 'best_at') is
 * replaced by the line at 'at' read alone ('one', views into 'copy')
 * when that is the first sample or a higher one.  OUT *best_labels:
 * offsets from the line's start, or -1.
 */
static void
take_latest(const struct prom_read_latest *one, const char *copy, size_t at,
            struct prom_read_latest *best, size_t *best_at,
            long best_off[2], size_t best_len[2])
{
    if (one->samples == 0 || (best->samples > 0
                              && !(one->value > best->value))) {
        best->samples += one->samples;
        best->refused += one->refused;
        return;
    }
    best->samples += one->samples;
    best->refused += one->refused;
    best->value = one->value;
    *best_at = at;
    for (size_t i = 0; i < 2; i++) {
        best_off[i] = one->labels[i].value == NULL
                      ? -1 : (long)(one->labels[i].value - copy);
        best_len[i] = one->labels[i].len;
    }
}

static void
same(const struct prom_read_sum *a, const struct prom_read_sum *b)
{
    for (size_t i = 0; i < NAMES; i++)
        REQUIRE(memcmp(&a[i].sum, &b[i].sum, sizeof(double)) == 0
                && a[i].samples == b[i].samples
                && a[i].refused == b[i].refused);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    struct prom_read_sum whole[NAMES], one[NAMES];
    struct prom_read_sum ref[NAMES] = { { 0 } }, lines[NAMES] = { { 0 } };
    struct prom_read_label lw[2], lo[2];
    struct prom_read_latest latest, one_latest, best = { 0 };
    long best_off[2] = { -1, -1 };
    size_t best_len[2] = { 0, 0 }, best_at = 0;
    size_t start = 0;

    compile_once();
    read_sums(size > 0 ? text : NULL, size, whole);
    read_latest(size > 0 ? text : NULL, size, &latest, lw);
    while (start < size) {
        const char *nl = memchr(text + start, '\n', size - start);
        size_t end = nl != NULL ? (size_t)(nl - text) : size;
        size_t next = nl != NULL ? end + 1 : size;
        char *copy = dup_exact(text + start, next - start);

        read_sums(copy, next - start, one);
        read_latest(copy, next - start, &one_latest, lo);
        REQUIRE(one_latest.samples + one_latest.refused <= 1);
        take_latest(&one_latest, copy, start, &best, &best_at, best_off,
                    best_len);
        free(copy);
        for (size_t i = 0; i < NAMES; i++) {
            REQUIRE(one[i].samples + one[i].refused <= 1);
            if (one[i].samples > 0)
                lines[i].sum += one[i].sum;
            lines[i].samples += one[i].samples;
            lines[i].refused += one[i].refused;
        }
        if (end > start && text[end - 1] == '\r')
            end--;
        reference_line(text + start, end - start, ref);
        start = next;
    }
    same(whole, ref);
    same(whole, lines);
    REQUIRE(latest.samples == whole[X_FIRST].samples
            && latest.refused == whole[X_FIRST].refused
            && latest.samples == best.samples
            && latest.refused == best.refused);
    if (latest.samples > 0) {
        REQUIRE(memcmp(&latest.value, &best.value, sizeof(double)) == 0);
        for (size_t i = 0; i < 2; i++) {
            if (best_off[i] < 0) {
                REQUIRE(lw[i].value == NULL);
                continue;
            }
            REQUIRE(lw[i].value == text + best_at + best_off[i]
                    && lw[i].len == best_len[i]);
        }
    }
    return 0;
}
