/* SPDX-License-Identifier: MIT */
/*
 * prom.h - the Prometheus text exposition format (version 0.0.4), written
 * into a caller's buffer: families, samples, label escaping, histograms.
 *
 * What /metrics sends is families, each one HELP line, one TYPE line and
 * then its samples, all together:
 *
 *   # HELP infergw_upstream_state Circuit breaker: 0 closed, ...
 *   # TYPE infergw_upstream_state gauge
 *   infergw_upstream_state{upstream="u0"} 0
 *   # HELP infergw_request_duration_seconds Client request latency, ...
 *   # TYPE infergw_request_duration_seconds histogram
 *   infergw_request_duration_seconds_bucket{route="models",le="0.001"} 1
 *   ...
 *   infergw_request_duration_seconds_bucket{route="models",le="+Inf"} 3
 *   infergw_request_duration_seconds_sum{route="models"} 0.0072
 *   infergw_request_duration_seconds_count{route="models"} 3
 *
 * A writer keeps the family it is in, so a sample can only go to the
 * family started last (the format needs a family's samples together), and
 * the first error, so that a page of calls needs one check at the end
 * (stdio's ferror()): after an error every call does nothing.  It owns
 * nothing: it borrows the buffer and every string passed to it.  It takes
 * no lock; one thread uses a writer, and the caller holds whatever guards
 * the values it reads.
 *
 * Names (metric and label) are the caller's constants and are not checked:
 * [a-zA-Z_:][a-zA-Z0-9_:]* for a metric, [a-zA-Z_][a-zA-Z0-9_]* for a
 * label, never "le".  Label values may be any bytes but NUL; they are
 * escaped here (\ " and newline), as is the HELP text (\ and newline).
 */
#ifndef INFERGW_COMMON_PROM_H
#define INFERGW_COMMON_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

enum prom_type {
    PROM_COUNTER,
    PROM_GAUGE,
    PROM_HISTOGRAM,
};

struct prom_label {
    const char *name;
    const char *value;
};

struct prom {
    struct buf *out;            /* borrowed */
    const char *name;           /* the family being written; borrowed */
    enum prom_type type;
    int rc;                     /* the first error (a buf_* code), or 0 */
};

/*
 * A histogram's counts as its owner keeps them, one per bucket (not
 * cumulative: counts[i] observations were at most le[i] and above
 * le[i - 1]).  'count' is every observation, those above le[n - 1] too;
 * 'sum' their total, in the unit of the bounds.
 */
struct prom_histogram {
    const double *le;           /* n upper bounds, ascending, finite */
    const uint64_t *counts;     /* n counts */
    size_t n;
    uint64_t count;
    double sum;
};

/* Prepare 'w' to append to 'out' (borrowed; it must outlive 'w'). */
void prom_init(struct prom *w, struct buf *out);

/*
 * Start family 'name': its "# HELP" and "# TYPE" lines.  Every sample
 * until the next prom_family() is one of this family's.  A family may
 * have no samples.  'name' (borrowed) must stay valid until then.
 */
void prom_family(struct prom *w, const char *name, enum prom_type type,
                 const char *help);

/*
 * One sample of a counter or gauge family:  name{labels} value
 * 'labels' (n of them; NULL when n is 0) are borrowed.
 */
void prom_uint(struct prom *w, const struct prom_label *labels, size_t n,
               uint64_t value);
void prom_int(struct prom *w, const struct prom_label *labels, size_t n,
              int64_t value);
/* The value as a float (prom_histogram() says how it is written). */
void prom_double(struct prom *w, const struct prom_label *labels, size_t n,
                 double value);

/*
 * One histogram of a histogram family: a cumulative _bucket line for each
 * bound and one for le="+Inf" (h->count), then _sum and _count; the
 * labels (borrowed) on each, "le" after them.  A bound or the sum is
 * written as the shortest decimal that reads back as the same double
 * ("0.005", "120", "2.6e-05"), as the Prometheus client libraries do.
 */
void prom_histogram(struct prom *w, const struct prom_label *labels,
                    size_t n, const struct prom_histogram *h);

#endif
