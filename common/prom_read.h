/* SPDX-License-Identifier: MIT */
/*
 * prom_read.h - reading the Prometheus text exposition format (0.0.4):
 * the sum, over every label set, of a few named series in a scrape; and
 * the labels of a series' latest sample.
 *
 * The gateway scrapes each vLLM upstream's GET /metrics (written by
 * prometheus_client) about ten times a second and needs a handful of
 * gauges from it: vllm:num_requests_waiting, vllm:num_requests_running,
 * vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc in older vLLM).
 * vLLM labels them with model_name (and engine), so a server with two
 * models has two samples of each, and what the gateway wants is their sum.
 *
 * Design: one pass over the text, a line at a time, that reads each
 * line's metric name and nothing more unless the name is wanted.  A
 * vLLM page is 100 KB and more, mostly histogram buckets nobody asked
 * for; those lines cost a name compare and a memchr() for the line end.
 * The writer is prom.h; this module shares no code with it (the writer
 * escapes, this skips escapes), and needs no buffer: it allocates
 * nothing, keeps no state between calls and is safe on any thread.
 *
 * What is read, per line (RFC-style; blank = space or tab):
 *
 *   line      = *blank [ sample / "#" *byte ]     "#" lines: HELP, TYPE,
 *                                                 comments, all skipped
 *   sample    = name ( *blank "{" labels "}" *blank / 1*blank ) value
 *               [ 1*blank timestamp ] *blank
 *   name      = [a-zA-Z_:] *[a-zA-Z0-9_:]
 *   labels    = *blank [ label *( *blank "," *blank label ) *blank
 *               [ "," *blank ] ]
 *   label     = [a-zA-Z_] *[a-zA-Z0-9_] *blank "=" *blank
 *               DQUOTE *( any byte but \ " and newline / "\\" / "\""
 *               / "\n" ) DQUOTE
 *   value     = [ "+" / "-" ] ( 1*DIGIT [ "." *DIGIT ] / "." 1*DIGIT )
 *               [ ( "e" / "E" ) [ "+" / "-" ] 1*DIGIT ]
 *   timestamp = [ "+" / "-" ] 1*DIGIT, an int64 (milliseconds; ignored)
 *
 * A line ends at '\n' (the last line may lack it), and a '\r' that ends
 * a line is dropped, so CRLF text reads the same.  A '}' or ',' inside
 * a quoted label value is part of the value: only the quotes delimit it.
 *
 * That reads every line prometheus_client writes as Prometheus's own
 * parser (expfmt's text_parse.go) does.  It differs elsewhere: it also
 * takes a '\r' or blanks ending a line, and does not check label values
 * for UTF-8 nor label names for repeats; and it refuses more: NaN, Inf
 * and Infinity in any spelling and a decimal outside the double range
 * ("1e999") (see prom_read_sums()), a value longer than
 * PROM_READ_MAX_VALUE bytes (prometheus_client writes at most 24), and a
 * name followed by anything but '{' or a blank ("x-1", which Go reads as
 * x = -1).
 *
 * Values are read with strtod() after the grammar above has been
 * checked byte by byte.  strtod() follows the locale's decimal point;
 * the gateway never calls setlocale(), so it is the C locale's '.'.  In
 * a locale whose point is ',', strtod() would stop at the '.', and the
 * line is then refused, never misread.
 */
#ifndef INFERGW_COMMON_PROM_READ_H
#define INFERGW_COMMON_PROM_READ_H

#include <stddef.h>

/* The longest value read, in bytes; a longer one is refused. */
#define PROM_READ_MAX_VALUE 64

/*
 * One series asked for, and what the text had of it.  A line is a sample
 * of 'name' when its name is exactly 'name': the whole run of name
 * characters, so "vllm:num_requests_waiting" is not a sample of
 * "vllm:num_requests" and "x_bucket" is not one of histogram "x" (ask
 * for "x_count" or "x_sum").
 */
struct prom_read_sum {
    const char *name;           /* borrowed: [a-zA-Z_:][a-zA-Z0-9_:]* */
    double sum;                 /* OUT: the sum of the samples read */
    size_t samples;             /* OUT: how many were read (0: absent) */
    size_t refused;             /* OUT: lines of 'name' that were not a
                                   well-formed sample with a finite value */
};

/*
 * Scan text[0..len) (borrowed; no NUL needed, none read past text + len;
 * NULL when len is 0) and fill want[0..n): first zero every sum, samples
 * and refused, then for each line that is a sample of want[i].name, add
 * its value to want[i].sum and count it in want[i].samples.  A line
 * counts for every entry with its name (a name asked for twice gets the
 * same sum twice).  Every other line is skipped unread past its name.
 *
 * A line of a wanted name that is not a well-formed sample, or whose
 * value is NaN or infinite, adds nothing and is counted in
 * want[i].refused instead.  Use want[i].sum only when
 * want[i].refused is 0 and want[i].samples is not: a sum with a sample
 * missing is not the upstream's load, and an upstream that writes NaN
 * has no load to tell (the caller falls back, as when the metric is
 * absent).  The values are not range-checked, and a sum of huge finite
 * values can still overflow to an infinity (not from vLLM's counts and
 * fractions).
 *
 * A text cut short inside a value's digits reads as a shorter value (the
 * last line may lack its '\n'): pass the whole body, not a prefix.
 *
 * Returns 0, or GW_EPARSE when some want[i].refused is not 0 (every
 * entry is filled either way).
 */
int prom_read_sums(const char *text, size_t len, struct prom_read_sum *want,
                   size_t n);

/* The most labels prom_read_latest() reads of a sample. */
#define PROM_READ_MAX_LABELS 8

/* A label of the latest sample (prom_read_latest()). */
struct prom_read_label {
    const char *name;           /* borrowed: [a-zA-Z_][a-zA-Z0-9_]* */
    const char *value;          /* OUT: its value as written, between the
                                   quotes, escapes and all (\\, \" and
                                   \n): a view into the text; NULL when
                                   the sample has no such label */
    size_t len;                 /* OUT: the view's length */
};

/*
 * One series whose latest sample is asked for: a gauge its writer sets to
 * the time with a new label set at each change (vLLM's
 * vllm:lora_requests_info, an "info" gauge set with prometheus_client's
 * set_to_current_time()), whose every label set ever seen stays on the
 * page.  The latest is the sample with the highest value.
 */
struct prom_read_latest {
    const char *name;           /* borrowed, as prom_read_sum's */
    struct prom_read_label *labels;     /* borrowed: the labels read of
                                           the latest sample */
    size_t num_labels;          /* 0..PROM_READ_MAX_LABELS */
    double value;               /* OUT: its value; 0 with no sample */
    size_t samples;             /* OUT: well-formed samples read */
    size_t refused;             /* OUT: lines of 'name' that were not */
};

/*
 * Scan text[0..len) as prom_read_sums() does, for the series want->name:
 * the sample with the highest value wins (the first of equals), and
 * want->labels[i] get views of its values of the labels they name (the
 * first, should a label name come twice).  The views point into 'text'
 * and are as valid as it is.  A huge label value is a view like any
 * other: nothing is copied, nothing allocated.  Lines are read and
 * refused as prom_read_sums() reads and refuses them; use the result
 * only when want->refused is 0 and want->samples is not (a refused line
 * may have been the latest).  Returns 0, or GW_EPARSE when
 * want->refused is not 0 (want is filled either way).
 */
int prom_read_latest(const char *text, size_t len,
                     struct prom_read_latest *want);

#endif
