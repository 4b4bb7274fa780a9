/*
 * metrics.c - lock-free counters and the /metrics text.
 */
#include "metrics.h"

#include <stdatomic.h>
#include <stdio.h>

#include "config.h"
#include "prom.h"

#define STATUS_MIN 100
#define STATUS_MAX 599
#define NUM_BUCKETS 12

/* Upper bounds in microseconds; LLM calls span milliseconds to minutes. */
static const int64_t bucket_us[NUM_BUCKETS] = {
    1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 5000000, 30000000, 120000000,
};

struct histogram {
    _Atomic uint64_t bucket[NUM_BUCKETS];   /* non-cumulative */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
};

static struct {
    _Atomic uint64_t requests[METRICS_ROUTE_COUNT]
                             [STATUS_MAX - STATUS_MIN + 1];
    struct histogram duration[METRICS_ROUTE_COUNT];
    struct histogram ttfb[METRICS_ROUTE_COUNT];
    _Atomic uint64_t upstream_calls;
    _Atomic int64_t connections;
    _Atomic uint64_t connections_total;
    _Atomic uint64_t rejected;
    _Atomic uint64_t leaders;
    _Atomic uint64_t followers;
    _Atomic uint64_t followers_by_tenant[CONFIG_MAX_TENANTS + 1];
    _Atomic uint64_t bypass[METRICS_BYPASS_COUNT];
    _Atomic uint64_t cut_lag;
    _Atomic int64_t flights;
    _Atomic int64_t parked;
    _Atomic uint64_t pushed;
    _Atomic uint64_t helpers;
    _Atomic int64_t keepalive_idle;
    _Atomic uint64_t keepalive_closed[METRICS_KEEPALIVE_COUNT];
} m;

static struct tls_stats tls_counts;

struct tls_stats *
metrics_tls_stats(void)
{
    return &tls_counts;
}

static const char *const route_names[METRICS_ROUTE_COUNT] = {
    "chat_completions", "completions", "embeddings", "models",
    "healthz", "readyz", "metrics", "status", "other",
};

static const char *const keepalive_close_names[METRICS_KEEPALIVE_COUNT] = {
    "stale", "timeout", "full",
};

static const char *const bypass_names[METRICS_BYPASS_COUNT] = {
    "disabled", "tenant", "opt_out", "sampling", "max_followers",
    "max_flight_bytes", "max_flights", "nomem",
};

const char *
metrics_bypass_name(enum metrics_bypass b)
{
    return b < METRICS_BYPASS_COUNT ? bypass_names[b] : "unknown";
}

#define INC(x) atomic_fetch_add_explicit(&(x), 1, memory_order_relaxed)

static void
observe(struct histogram *h, int64_t us)
{
    size_t i;

    if (us < 0)
        return;
    for (i = 0; i < NUM_BUCKETS && us > bucket_us[i]; i++)
        ;
    if (i < NUM_BUCKETS)
        INC(h->bucket[i]);
    INC(h->count);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us,
                              memory_order_relaxed);
}

void
metrics_request(enum metrics_route r, int status, int64_t duration_us,
                int64_t ttfb_us)
{
    if (r >= METRICS_ROUTE_COUNT)
        r = METRICS_ROUTE_OTHER;
    if (status >= STATUS_MIN && status <= STATUS_MAX)
        INC(m.requests[r][status - STATUS_MIN]);
    observe(&m.duration[r], duration_us);
    observe(&m.ttfb[r], ttfb_us);
}

void
metrics_upstream_call(void)
{
    INC(m.upstream_calls);
}

void
metrics_connections_add(int delta)
{
    atomic_fetch_add_explicit(&m.connections, delta, memory_order_relaxed);
    if (delta > 0)
        INC(m.connections_total);
}

void
metrics_connection_rejected(void)
{
    INC(m.rejected);
}

void
metrics_coalesce_leader(void)
{
    INC(m.leaders);
}

void
metrics_coalesce_follower(size_t tenant)
{
    INC(m.followers);
    if (tenant > CONFIG_MAX_TENANTS)
        tenant = CONFIG_MAX_TENANTS;
    INC(m.followers_by_tenant[tenant]);
}

void
metrics_coalesce_bypass(enum metrics_bypass b)
{
    if (b < METRICS_BYPASS_COUNT)
        INC(m.bypass[b]);
}

void
metrics_reader_cut_lag(void)
{
    INC(m.cut_lag);
}

void
metrics_flights_add(int delta)
{
    atomic_fetch_add_explicit(&m.flights, delta, memory_order_relaxed);
}

void
metrics_parked_add(int delta)
{
    atomic_fetch_add_explicit(&m.parked, delta, memory_order_relaxed);
}

void
metrics_pushed(uint64_t chunks)
{
    atomic_fetch_add_explicit(&m.pushed, chunks, memory_order_relaxed);
}

void
metrics_helpers(uint64_t n)
{
    atomic_fetch_add_explicit(&m.helpers, n, memory_order_relaxed);
}

void
metrics_keepalive_idle_add(int delta)
{
    atomic_fetch_add_explicit(&m.keepalive_idle, delta,
                              memory_order_relaxed);
}

void
metrics_keepalive_closed(enum metrics_keepalive_close why)
{
    if (why < METRICS_KEEPALIVE_COUNT)
        INC(m.keepalive_closed[why]);
}

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* One histogram per route that has seen a request, in seconds. */
static void
render_histogram(struct prom *w, const char *name, const char *help,
                 struct histogram *h)
{
    double le[NUM_BUCKETS];
    uint64_t counts[NUM_BUCKETS];
    struct prom_histogram ph = { .le = le, .counts = counts,
                                 .n = NUM_BUCKETS };

    for (size_t i = 0; i < NUM_BUCKETS; i++)
        le[i] = (double)bucket_us[i] / 1e6;
    prom_family(w, name, PROM_HISTOGRAM, help);
    for (size_t r = 0; r < METRICS_ROUTE_COUNT; r++) {
        const struct prom_label route = { "route", route_names[r] };

        uint64_t in_buckets = 0;

        /* Observations land while this reads: a count read before one's
         * bucket would be below the buckets, which Prometheus refuses as
         * a histogram (+Inf under a bucket).  So at least their sum. */
        for (size_t i = 0; i < NUM_BUCKETS; i++) {
            counts[i] = LOAD(h[r].bucket[i]);
            in_buckets += counts[i];
        }
        ph.count = LOAD(h[r].count);
        if (ph.count < in_buckets)
            ph.count = in_buckets;
        if (ph.count == 0)
            continue;
        ph.sum = (double)LOAD(h[r].sum_us) / 1e6;
        prom_histogram(w, &route, 1, &ph);
    }
}

/* A sample per name of 'names' (n of them), as label 'label': v[i]. */
static void
by_name(struct prom *w, const char *label, const char *const *names,
        const _Atomic uint64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct prom_label l = { label, names[i] };

        prom_uint(w, &l, 1, LOAD(v[i]));
    }
}

/* Families of one sample without labels: a counter or a gauge. */
struct scalar {
    const char *name;
    const char *help;
    const _Atomic uint64_t *counter;    /* one of the two */
    const _Atomic int64_t *gauge;
};

static const struct scalar scalars[] = {
    { "infergw_upstream_requests_total", "Calls made upstream.",
      &m.upstream_calls, NULL },
    { "infergw_connections_active", "Client connections open.",
      NULL, &m.connections },
    { "infergw_connections_total", "Client connections accepted.",
      &m.connections_total, NULL },
    { "infergw_connections_rejected_total",
      "Refused with 503 at max_connections.", &m.rejected, NULL },
    { "infergw_coalesce_leaders_total",
      "Requests that led a flight (made the upstream call).",
      &m.leaders, NULL },
    { "infergw_coalesce_followers_total",
      "Requests served by another request's upstream call.",
      &m.followers, NULL },
    { "infergw_flights_active", "Coalescing flights in flight.",
      NULL, &m.flights },
    { "infergw_coalesce_parked", "Clients that have been sent everything "
      "so far and wait for the next chunk.", NULL, &m.parked },
    { "infergw_coalesce_pushed_chunks_total", "Chunks the upstream thread "
      "(or a helper) wrote for parked clients.", &m.pushed, NULL },
    { "infergw_coalesce_helpers_total", "Follower threads woken to help "
      "the upstream thread write a chunk to parked clients.",
      &m.helpers, NULL },
};

int
metrics_render(struct buf *out, const struct gw_config *cfg)
{
    static const char *const tls_results[] = {
        "ok", "timeout", "protocol", "other",
    };
    const _Atomic uint64_t *const tls[] = {
        &tls_counts.handshakes, &tls_counts.failed_timeout,
        &tls_counts.failed_protocol, &tls_counts.failed_other,
    };
    const struct prom_label lag = { "reason", "lag" };
    struct prom w;

    prom_init(&w, out);
    prom_family(&w, "infergw_requests_total", PROM_COUNTER,
                "Client requests by route and status.");
    for (size_t r = 0; r < METRICS_ROUTE_COUNT; r++)
        for (int s = STATUS_MIN; s <= STATUS_MAX; s++) {
            uint64_t v = LOAD(m.requests[r][s - STATUS_MIN]);
            char status[16];
            const struct prom_label l[] = { { "route", route_names[r] },
                                            { "status", status } };

            if (v == 0)
                continue;
            snprintf(status, sizeof(status), "%d", s);
            prom_uint(&w, l, GW_ARRAY_LEN(l), v);
        }
    for (size_t i = 0; i < GW_ARRAY_LEN(scalars); i++) {
        const struct scalar *c = &scalars[i];

        prom_family(&w, c->name, c->gauge != NULL ? PROM_GAUGE : PROM_COUNTER,
                    c->help);
        if (c->gauge != NULL)
            prom_int(&w, NULL, 0, LOAD(*c->gauge));
        else
            prom_uint(&w, NULL, 0, LOAD(*c->counter));
    }
    prom_family(&w, "infergw_coalesce_readers_cut_total", PROM_COUNTER,
                "Clients of a flight cut off with an error, by reason "
                "(lag: further behind than max_reader_lag).");
    prom_uint(&w, &lag, 1, LOAD(m.cut_lag));
    prom_family(&w, "infergw_coalesce_followers_by_tenant_total",
                PROM_COUNTER, "Followers by tenant, for billing.");
    for (size_t t = 0; t <= cfg->num_tenants; t++) {
        int named = t < cfg->num_tenants;
        const struct prom_label l = {
            "tenant", named ? cfg->tenants[t].name : "default",
        };

        prom_uint(&w, &l, 1, LOAD(m.followers_by_tenant[
                      named ? t : CONFIG_MAX_TENANTS]));
    }
    prom_family(&w, "infergw_coalesce_bypass_total", PROM_COUNTER,
                "Eligible-route requests sent upstream alone, by reason.");
    by_name(&w, "reason", bypass_names, m.bypass, METRICS_BYPASS_COUNT);
    prom_family(&w, "infergw_upstream_keepalive_idle", PROM_GAUGE,
                "Idle upstream connections kept alive now.");
    prom_int(&w, NULL, 0, LOAD(m.keepalive_idle));
    prom_family(&w, "infergw_upstream_keepalive_closed_total", PROM_COUNTER,
                "Idle upstream connections closed, by reason: readable "
                "while idle (stale), idle past keepalive_timeout, or past "
                "keepalive (full).");
    by_name(&w, "reason", keepalive_close_names, m.keepalive_closed,
            METRICS_KEEPALIVE_COUNT);
    prom_family(&w, "infergw_tls_handshakes_total", PROM_COUNTER,
                "TLS handshakes with clients, by result.");
    for (size_t i = 0; i < GW_ARRAY_LEN(tls); i++) {
        const struct prom_label l = { "result", tls_results[i] };

        prom_uint(&w, &l, 1, LOAD(*tls[i]));
    }
    prom_family(&w, "infergw_tls_resumed_total", PROM_COUNTER,
                "Of the TLS handshakes with result ok, those that resumed "
                "a session from a ticket.");
    prom_uint(&w, NULL, 0, LOAD(tls_counts.resumed));
    render_histogram(&w, "infergw_request_duration_seconds",
                     "Client request latency, head in to last byte out.",
                     m.duration);
    render_histogram(&w, "infergw_time_to_first_byte_seconds",
                     "Client request head in to first response body byte "
                     "out (TTFT for streams).", m.ttfb);
    return w.rc;
}
