/* SPDX-License-Identifier: MIT */
/*
 * report.c - loadgen's summary and records (report.h): distributions by
 * nearest-rank percentile, per coalescing role, and the count of
 * distinct bodies among the good responses.
 */
#include "report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>

#include "alloc.h"
#include "lg.h"
#include "util.h"

static const char *const role_names[ROLE_COUNT] = {
    "none", "leader", "follower", "bypass", "other",
};

static const char *const error_names[LE_COUNT] = {
    "none", "connect", "write", "reset", "eof", "parse", "timeout",
    "refused",
};

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted 'v' in milliseconds. */
static double
pct_ms(const int64_t *v, size_t n, double p)
{
    size_t rank;

    if (n == 0)
        return -1;
    rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return (double)v[rank - 1] / 1000.0;
}

/*
 * Print 'sep' then "name":{"n":..,"p50":..,"p99":..,"max":..} for the
 * values in 'v' (sorted here), in milliseconds.
 */
static void
print_dist(const char *sep, const char *name, int64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_i64);
    printf("%s\"%s\":{\"n\":%zu,\"p50\":%.3f,\"p99\":%.3f,\"max\":%.3f}",
           sep, name, n, pct_ms(v, n, 50), pct_ms(v, n, 99),
           n > 0 ? (double)v[n - 1] / 1000.0 : -1.0);
}

static int
is_ok(const struct record *r)
{
    return r->err == LE_NONE && r->status >= 200 && r->status < 300;
}

/*
 * Our own CPU time: the benchmark shares its cores with the gateway, so
 * the script subtracts it when it accounts for the machine's load.
 */
static double
self_cpu_ms(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) == -1)
        return -1;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0
           + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
}

/*
 * "KEY":{"all":{...},"leader":{...},...}, the distribution of the good
 * requests' ttfb_us (or, with 'arrival', arrival_us) overall and per
 * role that occurred.  'v' has room for every record.
 */
static void
print_by_role(const char *key, int arrival, int64_t *v)
{
    size_t n;

    printf("\"%s\":{", key);
    for (int k = -1; k < ROLE_COUNT; k++) {
        n = 0;
        for (size_t i = 0; i < run.nrecs; i++) {
            const struct record *r = &run.recs[i];
            int64_t t = arrival ? r->arrival_us : r->ttfb_us;

            if (is_ok(r) && t >= 0 && (k < 0 || r->role == k))
                v[n++] = t;
        }
        if (k >= 0 && n == 0)
            continue;           /* roles that did not occur */
        print_dist(k < 0 ? "" : ",", k < 0 ? "all" : role_names[k], v, n);
    }
    printf("},");
}

size_t
report_summary(int64_t wall_us)
{
    size_t nerr[LE_COUNT] = { 0 }, nrole[ROLE_COUNT] = { 0 };
    size_t ok = 0, non2xx = 0, distinct = 0, nh = 0, n;
    unsigned long long body_len = 0;
    size_t s1xx_5xx[6] = { 0 };
    uint64_t *hashes;
    int64_t *v;

    hashes = gw_calloc(run.nrecs + 1, sizeof(*hashes));
    v = gw_calloc(run.nrecs + 1, sizeof(*v));
    if (hashes == NULL || v == NULL) {
        fprintf(stderr, "loadgen: out of memory for the summary\n");
        gw_free(hashes);
        gw_free(v);
        return run.nrecs + 1;
    }
    for (size_t i = 0; i < run.nrecs; i++) {
        const struct record *r = &run.recs[i];

        nerr[r->err]++;
        if (r->err != LE_NONE)
            continue;
        nrole[r->role]++;
        if (r->status >= 100 && r->status < 600)
            s1xx_5xx[r->status / 100]++;
        if (!is_ok(r)) {
            non2xx++;
            continue;
        }
        if (ok++ == 0)
            body_len = (unsigned long long)r->bytes;
        hashes[nh++] = r->hash;
    }
    qsort(hashes, nh, sizeof(*hashes), cmp_u64);
    for (size_t i = 0; i < nh; i++)
        if (i == 0 || hashes[i] != hashes[i - 1])
            distinct++;

    printf("{\"mode\":\"%s\",\"clients\":%zu,", opt.loop_s > 0 ? "loop"
           : "fanout", run.nclients);
    if (opt.loop_s > 0)
        printf("\"loop_s\":%.3f,\"rps\":%.1f,", opt.loop_s,
               wall_us > 0 ? (double)ok * 1e6 / (double)wall_us : 0.0);
    printf("\"requests\":%zu,\"ok\":%zu,\"errors\":%zu,\"non_2xx\":%zu,",
           run.nrecs, ok, run.nrecs - ok - non2xx, non2xx);
    printf("\"error_kinds\":{");
    for (int e = 1; e < LE_COUNT; e++)
        printf("\"%s\":%zu%s", error_names[e], nerr[e],
               e + 1 < LE_COUNT ? "," : "");
    printf("},\"status_classes\":{\"1xx\":%zu,\"2xx\":%zu,\"3xx\":%zu,"
           "\"4xx\":%zu,\"5xx\":%zu},", s1xx_5xx[1], s1xx_5xx[2],
           s1xx_5xx[3], s1xx_5xx[4], s1xx_5xx[5]);
    printf("\"distinct_bodies\":%zu,\"roles\":{", distinct);
    for (int k = 0; k < ROLE_COUNT; k++)
        printf("\"%s\":%zu%s", role_names[k], nrole[k],
               k + 1 < ROLE_COUNT ? "," : "");
    printf("},");
    print_by_role("ttfb_ms", 0, v);
    print_by_role("arrival_ms", 1, v);
    n = 0;
    for (size_t i = 0; i < run.nrecs; i++)
        if (is_ok(&run.recs[i]))
            v[n++] = run.recs[i].done_us;
    printf("\"complete_ms\":{");
    print_dist("", "all", v, n);
    printf("},\"connect_ms\":%.3f,\"ready_ms\":%.3f,\"send_spread_ms\":%.3f,"
           "\"wall_ms\":%.3f,\"body_bytes\":%llu,\"cpu_ms\":%.1f,"
           "\"records_lost\":%d}\n",
           (double)run.connect_us / 1000.0, (double)run.ready_us / 1000.0,
           (double)run.spread_us / 1000.0, (double)wall_us / 1000.0,
           body_len, self_cpu_ms(), run.oom);
    fflush(stdout);
    gw_free(hashes);
    gw_free(v);
    return run.nrecs - ok + (run.oom ? 1 : 0);
}

int
report_records(const char *path)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        fprintf(stderr, "loadgen: %s: %s\n", path, strerror(errno));
        return GW_EIO;
    }
    fputs("[\n", f);
    for (size_t i = 0; i < run.nrecs; i++) {
        const struct record *r = &run.recs[i];

        fprintf(f, "{\"client\":%u,\"status\":%d,\"role\":\"%s\","
                "\"error\":\"%s\",\"send_us\":%lld,\"ttfb_us\":%lld,"
                "\"arrival_us\":%lld,\"done_us\":%lld,\"hash\":\"%016llx\","
                "\"bytes\":%llu}%s\n",
                (unsigned)r->client, (int)r->status, role_names[r->role],
                error_names[r->err], (long long)r->send_us,
                (long long)r->ttfb_us, (long long)r->arrival_us,
                (long long)r->done_us,
                (unsigned long long)r->hash, (unsigned long long)r->bytes,
                i + 1 < run.nrecs ? "," : "");
    }
    fputs("]\n", f);
    if (fclose(f) != 0) {
        fprintf(stderr, "loadgen: %s: %s\n", path, strerror(errno));
        return GW_EIO;
    }
    return 0;
}
