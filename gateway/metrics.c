/*
 * metrics.c - lock-free counters and the /metrics text.
 */
#include "metrics.h"

#include <stdatomic.h>

#include "config.h"
#include "tls.h"

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
    _Atomic uint64_t requests[ROUTE_COUNT][STATUS_MAX - STATUS_MIN + 1];
    struct histogram duration[ROUTE_COUNT];
    struct histogram ttfb[ROUTE_COUNT];
    _Atomic uint64_t upstream_calls;
    _Atomic int64_t connections;
    _Atomic uint64_t connections_total;
    _Atomic uint64_t rejected;
    _Atomic uint64_t leaders;
    _Atomic uint64_t followers;
    _Atomic uint64_t followers_by_tenant[CONFIG_MAX_TENANTS + 1];
    _Atomic uint64_t bypass[BYPASS_COUNT];
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

static const char *const route_names[ROUTE_COUNT] = {
    "chat_completions", "completions", "embeddings", "models",
    "healthz", "readyz", "metrics", "other",
};

static const char *const keepalive_close_names[METRICS_KEEPALIVE_COUNT] = {
    "stale", "timeout", "full",
};

static const char *const bypass_names[BYPASS_COUNT] = {
    "disabled", "tenant", "opt_out", "sampling", "max_followers",
    "max_flight_bytes", "max_flights", "nomem",
};

const char *
metrics_route_name(enum metrics_route r)
{
    return r < ROUTE_COUNT ? route_names[r] : "other";
}

const char *
metrics_bypass_name(enum metrics_bypass b)
{
    return b < BYPASS_COUNT ? bypass_names[b] : "unknown";
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
    if (r >= ROUTE_COUNT)
        r = ROUTE_OTHER;
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
    if (b < BYPASS_COUNT)
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

int64_t
metrics_connections_active(void)
{
    return atomic_load(&m.connections);
}

int64_t
metrics_flights_active(void)
{
    return atomic_load(&m.flights);
}

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

static int
render_histogram(struct buf *out, const char *name, const char *help,
                 struct histogram *h)
{
    int rc = buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n",
                        name, help, name);

    for (size_t r = 0; r < ROUTE_COUNT && rc == 0; r++) {
        uint64_t cum = 0, count = LOAD(h[r].count);

        if (count == 0)
            continue;
        for (size_t i = 0; i < NUM_BUCKETS && rc == 0; i++) {
            cum += LOAD(h[r].bucket[i]);
            rc = buf_printf(out, "%s_bucket{route=\"%s\",le=\"%g\"} %llu\n",
                            name, route_names[r],
                            (double)bucket_us[i] / 1e6,
                            (unsigned long long)cum);
        }
        if (rc == 0)
            rc = buf_printf(out,
                            "%s_bucket{route=\"%s\",le=\"+Inf\"} %llu\n"
                            "%s_sum{route=\"%s\"} %.6f\n"
                            "%s_count{route=\"%s\"} %llu\n",
                            name, route_names[r], (unsigned long long)count,
                            name, route_names[r],
                            (double)LOAD(h[r].sum_us) / 1e6,
                            name, route_names[r], (unsigned long long)count);
    }
    return rc;
}

int
metrics_render(struct buf *out, const struct gw_config *cfg)
{
    int rc;

    rc = buf_append_str(out,
        "# HELP infergw_requests_total Client requests by route and status.\n"
        "# TYPE infergw_requests_total counter\n");
    for (size_t r = 0; r < ROUTE_COUNT && rc == 0; r++)
        for (int s = STATUS_MIN; s <= STATUS_MAX && rc == 0; s++) {
            uint64_t v = LOAD(m.requests[r][s - STATUS_MIN]);

            if (v != 0)
                rc = buf_printf(out, "infergw_requests_total{route=\"%s\","
                                "status=\"%d\"} %llu\n", route_names[r], s,
                                (unsigned long long)v);
        }
    if (rc == 0)
        rc = buf_printf(out,
            "# HELP infergw_upstream_requests_total Calls made upstream.\n"
            "# TYPE infergw_upstream_requests_total counter\n"
            "infergw_upstream_requests_total %llu\n"
            "# HELP infergw_connections_active Client connections open.\n"
            "# TYPE infergw_connections_active gauge\n"
            "infergw_connections_active %lld\n"
            "# HELP infergw_connections_total Client connections accepted.\n"
            "# TYPE infergw_connections_total counter\n"
            "infergw_connections_total %llu\n"
            "# HELP infergw_connections_rejected_total Refused with 503 at "
            "max_connections.\n"
            "# TYPE infergw_connections_rejected_total counter\n"
            "infergw_connections_rejected_total %llu\n"
            "# HELP infergw_coalesce_leaders_total Requests that led a "
            "flight (made the upstream call).\n"
            "# TYPE infergw_coalesce_leaders_total counter\n"
            "infergw_coalesce_leaders_total %llu\n"
            "# HELP infergw_coalesce_followers_total Requests served by "
            "another request's upstream call.\n"
            "# TYPE infergw_coalesce_followers_total counter\n"
            "infergw_coalesce_followers_total %llu\n"
            "# HELP infergw_flights_active Coalescing flights in flight.\n"
            "# TYPE infergw_flights_active gauge\n"
            "infergw_flights_active %lld\n"
            "# HELP infergw_coalesce_parked Clients that have been sent "
            "everything so far and wait for the next chunk.\n"
            "# TYPE infergw_coalesce_parked gauge\n"
            "infergw_coalesce_parked %lld\n"
            "# HELP infergw_coalesce_pushed_chunks_total Chunks the upstream "
            "thread (or a helper) wrote for parked clients.\n"
            "# TYPE infergw_coalesce_pushed_chunks_total counter\n"
            "infergw_coalesce_pushed_chunks_total %llu\n"
            "# HELP infergw_coalesce_helpers_total Follower threads woken "
            "to help the upstream thread write a chunk to parked clients.\n"
            "# TYPE infergw_coalesce_helpers_total counter\n"
            "infergw_coalesce_helpers_total %llu\n"
            "# HELP infergw_coalesce_readers_cut_total Clients of a flight "
            "cut off with an error, by reason (lag: further behind than "
            "max_reader_lag).\n"
            "# TYPE infergw_coalesce_readers_cut_total counter\n"
            "infergw_coalesce_readers_cut_total{reason=\"lag\"} %llu\n",
            (unsigned long long)LOAD(m.upstream_calls),
            (long long)LOAD(m.connections),
            (unsigned long long)LOAD(m.connections_total),
            (unsigned long long)LOAD(m.rejected),
            (unsigned long long)LOAD(m.leaders),
            (unsigned long long)LOAD(m.followers),
            (long long)LOAD(m.flights),
            (long long)LOAD(m.parked),
            (unsigned long long)LOAD(m.pushed),
            (unsigned long long)LOAD(m.helpers),
            (unsigned long long)LOAD(m.cut_lag));
    if (rc == 0)
        rc = buf_append_str(out,
            "# HELP infergw_coalesce_followers_by_tenant_total Followers by "
            "tenant, for billing.\n"
            "# TYPE infergw_coalesce_followers_by_tenant_total counter\n");
    for (size_t t = 0; t <= cfg->num_tenants && rc == 0; t++)
        rc = buf_printf(out, "infergw_coalesce_followers_by_tenant_total"
                        "{tenant=\"%s\"} %llu\n",
                        t < cfg->num_tenants ? cfg->tenants[t].name
                                             : "default",
                        (unsigned long long)LOAD(m.followers_by_tenant[
                            t < cfg->num_tenants ? t : CONFIG_MAX_TENANTS]));
    if (rc == 0)
        rc = buf_append_str(out,
            "# HELP infergw_coalesce_bypass_total Eligible-route requests "
            "sent upstream alone, by reason.\n"
            "# TYPE infergw_coalesce_bypass_total counter\n");
    for (size_t b = 0; b < BYPASS_COUNT && rc == 0; b++)
        rc = buf_printf(out, "infergw_coalesce_bypass_total{reason=\"%s\"} "
                        "%llu\n", bypass_names[b],
                        (unsigned long long)LOAD(m.bypass[b]));
    if (rc == 0)
        rc = buf_printf(out,
            "# HELP infergw_upstream_keepalive_idle Idle upstream "
            "connections kept alive now.\n"
            "# TYPE infergw_upstream_keepalive_idle gauge\n"
            "infergw_upstream_keepalive_idle %lld\n"
            "# HELP infergw_upstream_keepalive_closed_total Idle upstream "
            "connections closed, by reason: readable while idle (stale), "
            "idle past keepalive_timeout, or past keepalive (full).\n"
            "# TYPE infergw_upstream_keepalive_closed_total counter\n",
            (long long)LOAD(m.keepalive_idle));
    for (size_t k = 0; k < METRICS_KEEPALIVE_COUNT && rc == 0; k++)
        rc = buf_printf(out, "infergw_upstream_keepalive_closed_total"
                        "{reason=\"%s\"} %llu\n", keepalive_close_names[k],
                        (unsigned long long)LOAD(m.keepalive_closed[k]));
    if (rc == 0)
        rc = buf_printf(out,
            "# HELP infergw_tls_handshakes_total TLS handshakes with "
            "clients, by result.\n"
            "# TYPE infergw_tls_handshakes_total counter\n"
            "infergw_tls_handshakes_total{result=\"ok\"} %llu\n"
            "infergw_tls_handshakes_total{result=\"timeout\"} %llu\n"
            "infergw_tls_handshakes_total{result=\"protocol\"} %llu\n"
            "infergw_tls_handshakes_total{result=\"other\"} %llu\n"
            "# HELP infergw_tls_resumed_total Of the TLS handshakes with "
            "result ok, those that resumed a session from a ticket.\n"
            "# TYPE infergw_tls_resumed_total counter\n"
            "infergw_tls_resumed_total %llu\n",
            (unsigned long long)LOAD(tls_counts.handshakes),
            (unsigned long long)LOAD(tls_counts.failed_timeout),
            (unsigned long long)LOAD(tls_counts.failed_protocol),
            (unsigned long long)LOAD(tls_counts.failed_other),
            (unsigned long long)LOAD(tls_counts.resumed));
    if (rc == 0)
        rc = render_histogram(out, "infergw_request_duration_seconds",
                              "Client request latency, head in to last "
                              "byte out.", m.duration);
    if (rc == 0)
        rc = render_histogram(out, "infergw_time_to_first_byte_seconds",
                              "Client request head in to first response "
                              "body byte out (TTFT for streams).", m.ttfb);
    return rc;
}
