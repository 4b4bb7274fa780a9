/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - lock-free counters and the /metrics text.
 *
 * Design: see metrics.h.  The two name tables (models, upstreams) are
 * the only state with a lock, and it is taken only to add a name.
 */
#include "base/metrics.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "prom.h"
#include "util.h"
#include "window.h"

#define STATUS_MIN 100
#define STATUS_MAX 599
#define NUM_BUCKETS 17

/*
 * Upper bounds in microseconds.  LLM calls span milliseconds (a cached
 * /v1/models, an embedding) to minutes (a long stream): the finer steps
 * sit where time to first token lives, the wide ones where whole streams
 * end.  Prometheus's histogram_quantile() interpolates inside a bucket,
 * so its estimates are only as good as these steps.
 */
static const int64_t bucket_us[NUM_BUCKETS] = {
    1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000, 20000000, 30000000,
    60000000, 120000000, 300000000,
};

struct histogram {
    _Atomic uint64_t bucket[NUM_BUCKETS];   /* non-cumulative */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
};

/* The model label's slots: the known names, then these two. */
#define MODEL_OTHER METRICS_MODELS_MAX
#define MODEL_NONE (METRICS_MODELS_MAX + 1)
#define MODEL_SLOTS (METRICS_MODELS_MAX + 2)

/* Room for a configured name (CONFIG_NAME_MAX) and its NUL. */
#define NAME_LEN (CONFIG_NAME_MAX + 1)

/*
 * A bounded table of names, each in its slot for good (metrics.h).
 * v[0..n) and hash[0..n) are written before n is published (release)
 * and never change after, so a reader that loads n (acquire) may read
 * them without a lock; 'names_lock' serialises the writers.  The hash
 * (FNV-1a) lets a lookup compare one integer per name, and the text only
 * where it matches: a request's model is looked up in every request.
 */
struct names {
    char (*v)[NAME_LEN];
    uint64_t *hash;
    size_t cap;
    _Atomic size_t n;
};

static char model_names[METRICS_MODELS_MAX][NAME_LEN];
static uint64_t model_hashes[METRICS_MODELS_MAX];
static char upstream_names[METRICS_UPSTREAMS_MAX][NAME_LEN];
static uint64_t upstream_hashes[METRICS_UPSTREAMS_MAX];
static struct names models = {
    model_names, model_hashes, METRICS_MODELS_MAX, 0,
};
static struct names upstreams = {
    upstream_names, upstream_hashes, METRICS_UPSTREAMS_MAX, 0,
};
static struct gw_mutex names_lock = { PTHREAD_MUTEX_INITIALIZER, 0, 0 };

struct upstream_hist {
    struct histogram ttfb;
    struct histogram duration;
};

static struct {
    _Atomic uint64_t requests[METRICS_ROUTE_COUNT]
                             [STATUS_MAX - STATUS_MIN + 1];
    /* [route][model slot][stream] */
    struct histogram duration[METRICS_ROUTE_COUNT][MODEL_SLOTS][2];
    struct histogram ttfb[METRICS_ROUTE_COUNT][MODEL_SLOTS][2];
    struct upstream_hist upstream[METRICS_UPSTREAMS_MAX];   /* by slot in
                                                   'upstreams' */
    _Atomic uint64_t upstream_calls;
    _Atomic uint64_t proxied;
    struct window answers;          /* the client routes' answers of the
                                       last minute, by class */
    _Atomic int64_t connections;
    _Atomic uint64_t connections_total;
    _Atomic uint64_t rejected;
    _Atomic uint64_t leaders;
    _Atomic uint64_t followers;
    _Atomic uint64_t bypass[METRICS_BYPASS_COUNT];
    _Atomic uint64_t cut_lag;
    _Atomic int64_t flights;
    _Atomic uint64_t cache_result[METRICS_CACHE_RESULT_COUNT];
    _Atomic uint64_t cache_evicted[METRICS_EVICT_COUNT];
    _Atomic int64_t cache_entries;
    _Atomic int64_t cache_bytes;
    _Atomic int64_t parked;
    _Atomic uint64_t pushed;
    _Atomic uint64_t helpers;
    _Atomic int64_t keepalive_idle;
    _Atomic uint64_t keepalive_closed[METRICS_KEEPALIVE_COUNT];
    /* The configuration in force (metrics_config_loaded()). */
    _Atomic uint64_t generation;
    _Atomic int reload_ok;
    _Atomic int64_t reload_ok_us;   /* wall clock, since the epoch */
} m;

/* Set once by metrics_start(), before any thread. */
static const char *build_version;
static double start_time_s;

static struct tls_stats tls_counts;

struct tls_stats *
metrics_tls_stats(void)
{
    return &tls_counts;
}

static const char *const route_names[METRICS_ROUTE_COUNT] = {
    "chat_completions", "completions", "embeddings", "models",
    "healthz", "readyz", "metrics", "status", "other",
    "responses", "tokenize", "detokenize", "rerank", "score", "pooling",
    "audio_transcriptions", "audio_translations",
};

static const char *const keepalive_close_names[METRICS_KEEPALIVE_COUNT] = {
    "stale", "timeout", "full",
};

static const char *const bypass_names[METRICS_BYPASS_COUNT] = {
    "disabled", "tenant", "opt_out", "sampling", "max_followers",
    "max_flight_bytes", "max_flights", "nomem",
};

static const char *const cache_result_names[METRICS_CACHE_RESULT_COUNT] = {
    "hit", "miss", "bypass",
};

static const char *const cache_evict_names[METRICS_EVICT_COUNT] = {
    "expired", "size", "replaced", "reload",
};

const char *
metrics_cache_result_name(enum metrics_cache_result r)
{
    return r < METRICS_CACHE_RESULT_COUNT ? cache_result_names[r]
                                          : "unknown";
}

const char *
metrics_bypass_name(enum metrics_bypass b)
{
    return b < METRICS_BYPASS_COUNT ? bypass_names[b] : "unknown";
}

#define INC(x) atomic_fetch_add_explicit(&(x), 1, memory_order_relaxed)

static uint64_t
name_hash(const char *name)
{
    return gw_fnv1a64(GW_FNV1A64_OFFSET, name, strlen(name));
}

/* The slot of 'name' in 't', or -1.  Lock-free (struct names). */
static int
names_find(struct names *t, const char *name)
{
    size_t n = atomic_load_explicit(&t->n, memory_order_acquire);
    uint64_t h = name_hash(name);

    /* A scan of at most a few hundred integers, not a hash table: simple
     * to publish without a lock, and cheap next to a client request. */
    for (size_t i = 0; i < n; i++)
        if (t->hash[i] == h && strcmp(t->v[i], name) == 0)
            return (int)i;
    return -1;
}

/* The slot of 'name' in 't', added if new; -1 when 't' is full or the
 * name too long for a slot. */
static int
names_add(struct names *t, const char *name)
{
    size_t len = strlen(name), n;
    int i = names_find(t, name);

    if (i >= 0 || len == 0 || len >= NAME_LEN)
        return i;
    gw_mutex_lock(&names_lock);
    i = names_find(t, name);        /* another writer may have won */
    n = atomic_load_explicit(&t->n, memory_order_relaxed);
    if (i < 0 && n < t->cap) {
        memcpy(t->v[n], name, len + 1);
        t->hash[n] = name_hash(name);
        atomic_store_explicit(&t->n, n + 1, memory_order_release);
        i = (int)n;
    }
    gw_mutex_unlock(&names_lock);
    return i;
}

/* Seconds since the epoch, on the wall clock. */
static double
wall_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void
metrics_start(const char *version)
{
    build_version = version;
    start_time_s = wall_s();
    window_start(&m.answers, gw_now_ms());
}

void
metrics_config_loaded(uint64_t generation)
{
    atomic_store_explicit(&m.generation, generation, memory_order_relaxed);
    atomic_store_explicit(&m.reload_ok_us, (int64_t)(wall_s() * 1e6),
                          memory_order_relaxed);
    atomic_store_explicit(&m.reload_ok, 1, memory_order_relaxed);
}

void
metrics_config_reload_failed(void)
{
    atomic_store_explicit(&m.reload_ok, 0, memory_order_relaxed);
}

void
metrics_model_known(const char *model)
{
    if (strlen(model) <= METRICS_MODEL_NAME_MAX)
        names_add(&models, model);
}

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

/* Is 'r' a client's route, as the summary counts them (metrics.h)? */
static int
client_route(enum metrics_route r)
{
    return r != METRICS_ROUTE_HEALTHZ && r != METRICS_ROUTE_READYZ
           && r != METRICS_ROUTE_METRICS && r != METRICS_ROUTE_STATUS;
}

void
metrics_request(enum metrics_route r, const char *model, int stream,
                int status, int64_t duration_us, int64_t ttfb_us)
{
    int mi;

    if (r >= METRICS_ROUTE_COUNT)
        r = METRICS_ROUTE_OTHER;
    if (model == NULL || model[0] == '\0') {
        mi = MODEL_NONE;
    } else {
        mi = names_find(&models, model);
        if (mi < 0)
            mi = MODEL_OTHER;
    }
    stream = stream != 0;
    if (status >= STATUS_MIN && status <= STATUS_MAX) {
        INC(m.requests[r][status - STATUS_MIN]);
        if (client_route(r))
            window_add(&m.answers, gw_now_ms(), (size_t)(status / 100 - 1));
    }
    observe(&m.duration[r][mi][stream], duration_us);
    observe(&m.ttfb[r][mi][stream], ttfb_us);
}

void
metrics_upstream_attempt(const char *upstream, int64_t ttfb_us,
                         int64_t duration_us)
{
    int i;

    if (ttfb_us < 0)
        return;
    i = names_add(&upstreams, upstream);
    if (i < 0)
        return;
    observe(&m.upstream[i].ttfb, ttfb_us);
    observe(&m.upstream[i].duration, duration_us);
}

void
metrics_upstream_call(void)
{
    INC(m.upstream_calls);
}

void
metrics_proxied(void)
{
    INC(m.proxied);
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
metrics_coalesce_follower(void)
{
    INC(m.followers);
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
metrics_cache_result(enum metrics_cache_result r)
{
    if (r < METRICS_CACHE_RESULT_COUNT)
        INC(m.cache_result[r]);
}

void
metrics_cache_evicted(enum metrics_cache_evict why, uint64_t n)
{
    if (why < METRICS_EVICT_COUNT)
        atomic_fetch_add_explicit(&m.cache_evicted[why], n,
                                  memory_order_relaxed);
}

void
metrics_cache_size(uint64_t entries, uint64_t bytes)
{
    atomic_store_explicit(&m.cache_entries, (int64_t)entries,
                          memory_order_relaxed);
    atomic_store_explicit(&m.cache_bytes, (int64_t)bytes,
                          memory_order_relaxed);
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

void
metrics_summary(struct metrics_summary *out)
{
    memset(out, 0, sizeof(*out));
    out->minute_ms = window_read(&m.answers, gw_now_ms(), out->minute);
    for (size_t r = 0; r < METRICS_ROUTE_COUNT; r++) {
        if (!client_route((enum metrics_route)r))
            continue;
        for (int st = STATUS_MIN; st <= STATUS_MAX; st++)
            out->total[st / 100 - 1] += LOAD(m.requests[r][st - STATUS_MIN]);
    }
    out->upstream_calls = LOAD(m.upstream_calls);
    out->proxied = LOAD(m.proxied);
    out->followers = LOAD(m.followers);
    out->cache_hits = LOAD(m.cache_result[METRICS_CACHE_HIT]);
}

/*
 * A copy of 'h' in seconds for prom_histogram(): 'le' and 'counts' are
 * the caller's arrays of NUM_BUCKETS that 'ph' points to.
 */
static void
snapshot(struct histogram *h, double le[NUM_BUCKETS],
         uint64_t counts[NUM_BUCKETS], struct prom_histogram *ph)
{
    uint64_t in_buckets = 0;

    for (size_t i = 0; i < NUM_BUCKETS; i++) {
        le[i] = (double)bucket_us[i] / 1e6;
        counts[i] = LOAD(h->bucket[i]);
        in_buckets += counts[i];
    }
    ph->le = le;
    ph->counts = counts;
    ph->n = NUM_BUCKETS;
    /* Observations land while this reads: a count read before one's
     * bucket would be below the buckets, which Prometheus refuses as a
     * histogram (+Inf under a bucket).  So at least their sum. */
    ph->count = LOAD(h->count);
    if (ph->count < in_buckets)
        ph->count = in_buckets;
    ph->sum = (double)LOAD(h->sum_us) / 1e6;
}

/*
 * Quantile 'q' (0..1) of 'h' (count > 0) as Prometheus's
 * histogram_quantile() computes it (promql/quantile.go): the first
 * bucket whose cumulative count reaches the rank q * count, then linear
 * interpolation between its lower bound (0 for the first) and its upper
 * one; a rank past the finite buckets gives the highest finite bound.
 */
static double
quantile(const struct prom_histogram *h, double q)
{
    double rank = q * (double)h->count;
    uint64_t below = 0;         /* observations in the buckets before b */
    double lo;
    size_t b;

    for (b = 0; b < h->n; b++) {
        if ((double)(below + h->counts[b]) >= rank)
            break;
        below += h->counts[b];
    }
    if (b == h->n)
        return h->le[h->n - 1];
    lo = b == 0 ? 0 : h->le[b - 1];
    /* Only q = 0 can stop at an empty bucket (the first). */
    if (h->counts[b] == 0)
        return lo;
    return lo + (h->le[b] - lo) * ((rank - (double)below)
                                   / (double)h->counts[b]);
}

double
metrics_upstream_ttfb_quantile(const char *upstream, double q)
{
    double le[NUM_BUCKETS];
    uint64_t counts[NUM_BUCKETS];
    struct prom_histogram ph;
    int i;

    if (!(q >= 0 && q <= 1))            /* NaN too */
        return -1;
    i = names_find(&upstreams, upstream);
    if (i < 0)
        return -1;
    snapshot(&m.upstream[i].ttfb, le, counts, &ph);
    return ph.count > 0 ? quantile(&ph, q) : -1;
}

/*
 * A request histogram family: one histogram per route, model and stream
 * that has seen a request (metrics.h says which model names there are).
 */
static void
render_requests(struct prom *w, const char *name, const char *help,
                struct histogram (*h)[MODEL_SLOTS][2])
{
    size_t known = atomic_load_explicit(&models.n, memory_order_acquire);

    prom_family(w, name, PROM_HISTOGRAM, help);
    for (size_t r = 0; r < METRICS_ROUTE_COUNT; r++)
        for (size_t mi = 0; mi < MODEL_SLOTS; mi++)
            for (int st = 0; st < 2; st++) {
                double le[NUM_BUCKETS];
                uint64_t counts[NUM_BUCKETS];
                struct prom_histogram ph;
                const struct prom_label l[] = {
                    { "route", route_names[r] },
                    { "model", mi == MODEL_NONE ? METRICS_MODEL_NONE
                               : mi == MODEL_OTHER ? METRICS_MODEL_OTHER
                               : models.v[mi] },
                    { "stream", st ? "true" : "false" },
                };

                /* Most of them never see a request: skip those at the
                 * cost of one load (an observation whose bucket is in
                 * but its count not yet just shows at the next scrape). */
                if ((mi >= known && mi < MODEL_OTHER)
                    || LOAD(h[r][mi][st].count) == 0)
                    continue;
                snapshot(&h[r][mi][st], le, counts, &ph);
                prom_histogram(w, l, GW_ARRAY_LEN(l), &ph);
            }
}

/*
 * A per-upstream histogram family, one histogram per upstream of 'cfg'
 * (all zero before its first observation, so the series exist from the
 * start).  'ttfb': the time to first byte, else the duration.
 */
static void
render_upstreams(struct prom *w, const char *name, const char *help,
                 const struct gw_config *cfg, int ttfb)
{
    static struct histogram none;       /* never observed into */

    prom_family(w, name, PROM_HISTOGRAM, help);
    for (size_t u = 0; u < cfg->num_upstreams; u++) {
        int i = names_find(&upstreams, cfg->upstreams[u].name);
        struct histogram *h = i < 0 ? &none
                              : ttfb ? &m.upstream[i].ttfb
                                     : &m.upstream[i].duration;
        double le[NUM_BUCKETS];
        uint64_t counts[NUM_BUCKETS];
        struct prom_histogram ph;
        const struct prom_label l = { "upstream", cfg->upstreams[u].name };

        snapshot(h, le, counts, &ph);
        prom_histogram(w, &l, 1, &ph);
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
    { "infergw_proxied_requests_total", "Client requests that reached "
      "proxying: led or followed a flight, bypassed coalescing, or took "
      "a route that never coalesces.", &m.proxied, NULL },
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
    { "infergw_cache_entries", "Finished answers kept by the response "
      "cache now.", NULL, &m.cache_entries },
    { "infergw_cache_bytes", "Memory the response cache's entries take "
      "now, bookkeeping included.", NULL, &m.cache_bytes },
    { "infergw_coalesce_parked", "Clients that have been sent everything "
      "so far and wait for the next chunk.", NULL, &m.parked },
    { "infergw_coalesce_pushed_chunks_total", "Chunks the upstream thread "
      "(or a helper) wrote for parked clients.", &m.pushed, NULL },
    { "infergw_coalesce_helpers_total", "Follower threads woken to help "
      "the upstream thread write a chunk to parked clients.",
      &m.helpers, NULL },
};

/* The build, the configuration in force and its limits (a tenant's are
 * tenant.c's, with every per-tenant family). */
static void
render_config(struct prom *w, const struct gw_config *cfg)
{
    const struct prom_label version = {
        "version", build_version != NULL ? build_version : "unknown",
    };

    prom_family(w, "infergw_build_info", PROM_GAUGE,
                "Always 1; the label says which build runs.");
    prom_uint(w, &version, 1, 1);
    prom_family(w, "infergw_config_generation", PROM_GAUGE,
                "The configuration in force: 1 at start, one more per "
                "successful reload.");
    prom_uint(w, NULL, 0, LOAD(m.generation));
    prom_family(w, "infergw_config_last_reload_success", PROM_GAUGE,
                "1 when the last load of the configuration (the start's, "
                "or a reload's) succeeded, 0 when a reload failed and the "
                "configuration in force stayed.");
    prom_int(w, NULL, 0, LOAD(m.reload_ok));
    prom_family(w, "infergw_config_last_reload_success_timestamp_seconds",
                PROM_GAUGE, "When the configuration in force was loaded, "
                "in seconds since the Unix epoch.");
    prom_double(w, NULL, 0, (double)LOAD(m.reload_ok_us) / 1e6);
    prom_family(w, "infergw_max_connections", PROM_GAUGE,
                "[server] max_connections: client connections at once.");
    prom_uint(w, NULL, 0, cfg->max_connections);
    prom_family(w, "infergw_upstream_max_inflight", PROM_GAUGE,
                "[upstream] max_inflight: calls open at once; 0 none.");
    for (size_t u = 0; u < cfg->num_upstreams; u++) {
        const struct prom_label l = { "upstream", cfg->upstreams[u].name };

        prom_uint(w, &l, 1, cfg->upstreams[u].max_inflight);
    }
}

/* Open file descriptors: /proc/self/fd's entries but the one reading
 * it.  -1 if it cannot be read. */
static int64_t
open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int64_t n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/*
 * The process_* series every Prometheus client library exports (their
 * names and meaning are the convention), from /proc/self and
 * getrusage()/getrlimit(); one that cannot be read has no sample.
 */
static void
render_process(struct prom *w)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned long long pages_total = 0, pages_resident = 0;
    int statm = 0;
    int64_t fds = open_fds();
    struct rusage ru;
    struct rlimit rl;
    FILE *f = fopen("/proc/self/statm", "re");

    if (f != NULL) {
        statm = fscanf(f, "%llu %llu", &pages_total, &pages_resident) == 2
                && page > 0;
        fclose(f);
    }
    prom_family(w, "process_start_time_seconds", PROM_GAUGE,
                "Start time of the process since the Unix epoch, in "
                "seconds.");
    if (start_time_s > 0)
        prom_double(w, NULL, 0, start_time_s);
    prom_family(w, "process_cpu_seconds_total", PROM_COUNTER,
                "User and system CPU time spent, in seconds.");
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        prom_double(w, NULL, 0,
                    (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
                    + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)
                      / 1e6);
    prom_family(w, "process_resident_memory_bytes", PROM_GAUGE,
                "Resident memory size, in bytes.");
    if (statm)
        prom_uint(w, NULL, 0, pages_resident * (unsigned long long)page);
    prom_family(w, "process_virtual_memory_bytes", PROM_GAUGE,
                "Virtual memory size, in bytes.");
    if (statm)
        prom_uint(w, NULL, 0, pages_total * (unsigned long long)page);
    prom_family(w, "process_open_fds", PROM_GAUGE,
                "Open file descriptors.");
    if (fds >= 0)
        prom_int(w, NULL, 0, fds);
    prom_family(w, "process_max_fds", PROM_GAUGE,
                "The limit on open file descriptors (RLIMIT_NOFILE).");
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        prom_uint(w, NULL, 0, (uint64_t)rl.rlim_cur);
}

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
    prom_family(&w, "infergw_coalesce_bypass_total", PROM_COUNTER,
                "Eligible-route requests sent upstream alone, by reason.");
    by_name(&w, "reason", bypass_names, m.bypass, METRICS_BYPASS_COUNT);
    prom_family(&w, "infergw_cache_requests_total", PROM_COUNTER,
                "Requests by what the response cache did: answered from "
                "it (hit), not (miss), or not its to answer (bypass).");
    by_name(&w, "result", cache_result_names, m.cache_result,
            METRICS_CACHE_RESULT_COUNT);
    prom_family(&w, "infergw_cache_evictions_total", PROM_COUNTER,
                "Response cache entries dropped, by reason.");
    by_name(&w, "reason", cache_evict_names, m.cache_evicted,
            METRICS_EVICT_COUNT);
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
    render_requests(&w, "infergw_request_duration_seconds",
                    "Client request latency, head in to last byte out, by "
                    "route, model (one the gateway knows, else \""
                    METRICS_MODEL_OTHER "\"; \"" METRICS_MODEL_NONE "\" "
                    "for none) and stream.", m.duration);
    render_requests(&w, "infergw_time_to_first_byte_seconds",
                    "Client request head in to first response body byte "
                    "out (TTFT for streams), by route, model and stream.",
                    m.ttfb);
    render_upstreams(&w, "infergw_upstream_time_to_first_byte_seconds",
                     "Upstream attempts that got an answer: sent to its "
                     "first body byte.", cfg, 1);
    render_upstreams(&w, "infergw_upstream_request_duration_seconds",
                     "Upstream attempts that got an answer: sent to the "
                     "end of the response.", cfg, 0);
    render_config(&w, cfg);
    render_process(&w);
    return w.rc;
}
