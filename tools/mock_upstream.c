/* SPDX-License-Identifier: MIT */
/*
 * mock_upstream.c - a mock vLLM server speaking the OpenAI-compatible API,
 * with knobs for tests, demos and benchmarks.  docs/MOCK_UPSTREAM.md is its
 * specification.
 *
 * Design: the main thread accepts; each connection gets a detached thread
 * that owns a heap-allocated struct conn and serves requests on it until
 * the client closes or asks to (keep-alive).  Requests are read with
 * common/http_read.c, the reader and parser the gateway uses for its own
 * clients, so every test also runs that parser against libcurl's
 * requests.
 *
 * Responses copy vLLM's wire format: compact JSON with vLLM's key order,
 * one SSE event per HTTP chunk, "data: [DONE]" last.  The words of a
 * completion are picked by a hash of the whole request body, so identical
 * bodies get identical text, while the id and "created" are fresh per call
 * as vLLM's are (the gateway's coalescing is what makes clients of one
 * upstream call see the same bytes).
 *
 * Every wait (first-byte delay, inter-chunk delay, stall) is a poll() for
 * POLLRDHUP on the client socket, so a client that goes away ends the wait
 * at once and is counted in "aborted".  A hold waits on the shared
 * condition variable in short slices and checks the socket between them:
 * the cost is up to MOCK_HOLD_SLICE_MS of delay in noticing a hang-up.
 *
 * Engine mode (-e, -E): completions are not paced by -d but by a vLLM-like
 * engine (mock/engine.h): a scheduler thread runs a continuous batch over
 * a FIFO, and each content chunk waits for its token.  The connection
 * thread submits its request after the hold, the first-byte delay and
 * the faults that answer at once, then polls the client socket and its
 * sequence's eventfd together, so a hang-up takes the sequence out of
 * the engine at once.  GET /metrics shows vLLM's series, the engine's or,
 * without it, the completions in progress.
 *
 * The request record behind GET /recorded keeps each /v1 request head as
 * JSON text rendered once, outside the lock, when the head arrives; the
 * answer is then a concatenation.  It is a ring that drops its oldest
 * entries past MOCK_REC_MAX of them or MOCK_REC_BYTES of text: the most
 * recent requests are the ones a test has just made.
 *
 * Locking: one mutex, st.mu, guards every counter, the list of held
 * requests, the released tags, last_headers and the request record.  It
 * is never held across socket I/O.  The engine has its own lock, inside
 * engine.c; st.mu is never held while calling the engine, so the two are
 * never nested and there is no lock order.  The options and the 'engine'
 * pointer are set in main() before the first thread starts and never
 * change afterwards.
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread; the accept loop
 * waits in ppoll() with them unblocked, so the main thread alone takes
 * them.  It then exits 0 without waiting for connection threads: a mock
 * has nothing to drain, and tests want it gone promptly.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "http_read.h"
#include "jsonx.h"
#include "log.h"
#include "mock/engine.h"
#include "multipart.h"
#include "net.h"
#include "util.h"

#define MOCK_MODEL "mock-model"
#define MOCK_DEMO_MODEL "llama-3-8b"        /* the tutorial's demo asks it */
#define MOCK_MAX_HEAD (64 * 1024)           /* request line + fields */
#define MOCK_IN_LIMIT (256 * 1024)          /* read ahead of the parser */
#define MOCK_MAX_BODY (64 * 1024 * 1024)    /* request body */
#define MOCK_HDR_LIMIT (128 * 1024)         /* response head (big_headers) */
#define MOCK_OUT_LIMIT (16 * 1024 * 1024)   /* one response body or event */
#define MOCK_IDLE_MS 60000          /* keep-alive wait for the next request */
#define MOCK_HEADER_MS 10000        /* a whole head, from its first byte */
#define MOCK_BODY_MS 60000          /* a whole body */
#define MOCK_SEND_MS 30000          /* a client that stops reading */
#define MOCK_HOLD_MS 30000          /* longest mock_hold */
#define MOCK_GATE_MS 30000          /* longest wait at a mock_gate */
#define MOCK_HOLD_SLICE_MS 20       /* socket check interval while held */
#define MOCK_STALL_MS 60000         /* longest stall */
#define MOCK_PIECE_GAP_MS 20        /* between chunked_json pieces */
#define MOCK_LINGER_MS 1000         /* lingering close after an error */
#define MOCK_LINGER_BYTES (1024 * 1024)
#define MOCK_MAX_CHUNKS 100000
#define MOCK_MAX_MS 3600000
#define MOCK_MAX_TAG 256
#define MOCK_BIG_HEADER (64 * 1024)
#define MOCK_STACK_SIZE (512 * 1024)
#define MOCK_EMBED_DIM 8
#define MOCK_MAX_PAD (1024 * 1024)          /* mock_pad, per chunk */
#define MOCK_REC_MAX 10000                  /* /recorded entries kept */
#define MOCK_REC_BYTES (64 * 1024 * 1024)   /* their JSON text, in total */
#define MOCK_REC_ENTRY (4 * MOCK_MAX_HEAD)  /* one entry's JSON text */
#define MOCK_MAX_MODELS 16                  /* -m names */
#define MOCK_PREFIX_SLOTS 65536             /* prefixes remembered */
#define MOCK_MAX_PREFIX (64 * 1024)         /* -p bytes */
#define MOCK_METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define MOCK_STORED 4096                    /* responses kept for
                                               previous_response_id */
#define MOCK_ID_MAX 96                      /* a response id's bytes */

/* A padded content chunk's SSE event must fit in the output buffer. */
_Static_assert(MOCK_MAX_PAD + 64 * 1024 <= MOCK_OUT_LIMIT,
               "MOCK_MAX_PAD leaves no room for the event around it");
/* So the record's text, and the /recorded answer, stay under the cap. */
_Static_assert(MOCK_REC_ENTRY <= MOCK_REC_BYTES,
               "one /recorded entry may pass MOCK_REC_BYTES");

/* Command-line options; written by main() before any thread starts. */
static struct options {
    const char *listen;
    long chunks;
    long first_ms;
    long delay_ms;
    int quiet;                  /* -q: no request logged */
    int verbose;                /* -v: the beat's requests logged too */
    const char *models[MOCK_MAX_MODELS];    /* -m: GET /v1/models */
    size_t num_models;
    long slow_every;            /* -s N:MS: every Nth completion ... */
    long slow_ms;               /* ... waits this much more */
    long prefix_bytes;          /* -p: prompt bytes a prefix is */
    int engine;                 /* -e (or -E): engine mode */
    struct engine_params engine_params;     /* -E, over the defaults */
} opt = { "127.0.0.1:8000", 8, 0, 0, 0, 0,
          { MOCK_MODEL, MOCK_DEMO_MODEL }, 2, 0, 0, 256, 0, { 0 } };

/* The engine in engine mode, else NULL; set in main() before any thread. */
static struct engine *engine;

/* Unix time at start: the _created series of /metrics without the engine. */
static double start_time;

/* What GET /metrics answers (POST /control?metrics=...). */
enum metrics_mode {
    METRICS_ON = 0,             /* vLLM's current names */
    METRICS_OLD,                /* older vLLM's gpu_* names */
    METRICS_OFF,                /* 404: a server without the series */
};

static const char *const metrics_modes[] = { "on", "old", "off" };

/*
 * A request waiting on a mock_hold.  It lives on the waiting thread's stack
 * and is linked into st.holders only while that thread waits, under st.mu;
 * /release reaches it only under st.mu, so it never outlives its frame.
 */
struct holder {
    const char *tag;            /* borrowed from the held request's body */
    int released;
    struct holder *next;
};

/* One request head as GET /recorded shows it, rendered once. */
struct rec_entry {
    char *json;                 /* owned: {"method":..,"target":..,...} */
    size_t len;
};

/* Everything shared between connection threads; all fields under mu. */
static struct mock_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC; broadcast on release */
    uint64_t requests;
    uint64_t completions;
    uint64_t connections_total;
    uint64_t aborted;
    uint64_t connections_open;  /* gauges: not zeroed by /stats/reset */
    uint64_t in_progress;
    uint64_t completing;        /* completions in in_progress: /metrics */
    uint64_t held;
    struct holder *holders;
    json_t *released;           /* object used as a set of released tags */
    json_t *gates;              /* tag -> the content chunks a request
                                   gated on it may send (POST /gate) */
    uint64_t gated;             /* requests waiting at a gate now */
    json_t *last_headers;       /* of the last /v1 request */
    struct rec_entry *rec;      /* ring of MOCK_REC_MAX, for /recorded */
    size_t rec_head;            /* index of the oldest entry */
    size_t rec_count;
    size_t rec_bytes;           /* sum of the entries' len */
    uint64_t rec_dropped;       /* entries dropped or never recorded */
    int stopping;

    /* POST /control (docs/MOCK_UPSTREAM.md "Instance control"). */
    long force_status;          /* every completion answers this; 0 off */
    int force_fault;            /* ... or has this enum fault; 0 off */
    long force_retry_after;     /* ... with Retry-After: N; 0 none */
    long health_status;         /* GET /health answers this; 0 = 200 */
    char poison[MOCK_MAX_TAG + 1];  /* a completion whose body holds this
                                       answers poison_status; "" off */
    long poison_status;
    long slow_every, slow_ms;   /* from -s, changeable */
    int metrics_mode;           /* enum metrics_mode */
    long metrics_delay_ms;      /* GET /metrics waits this long first */
    uint64_t completion_seq;    /* completions so far, for slow_every */
    uint64_t probes;            /* GET /health and GET /v1/models */
    uint64_t *prefixes;         /* open-addressed set of prefix hashes */
    size_t num_prefixes;
    uint64_t prefix_hits, prefix_misses;
    char (*stored)[MOCK_ID_MAX];    /* ring of MOCK_STORED response ids
                                       (store: true), for
                                       previous_response_id */
    size_t stored_next, stored_count;
} st;

static volatile sig_atomic_t stop_signal;

struct conn {
    int fd;
    struct net_stream stream;   /* 'fd', plain: what the readers take */
    int counted;                /* in connections_open/_total (below) */
    int linger;                 /* input may be unread: linger_close() */
    struct buf in;              /* bytes read ahead of the parser */
    struct buf head;            /* the request head; views point here */
    struct buf body;            /* the request body */
    struct buf hdr;             /* the response head being written */
    struct buf out;             /* the response body or SSE event */
};

enum route {
    R_NOT_FOUND = 0,
    R_BAD_METHOD,
    R_CHAT,
    R_TEXT,
    R_EMBED,
    R_RESPONSES,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_RERANK,
    R_SCORE,
    R_POOLING,
    R_TRANSCRIBE,
    R_TRANSLATE,
    R_MODELS,
    R_HEALTH,
    R_STATS,
    R_RECORDED,
    R_RESET,
    R_RELEASE,
    R_GATE,
    R_CONTROL,
    R_METRICS,
};

static const struct route_def {
    const char *method;
    const char *path;
    enum route route;
    int control;                /* 1: not counted in "requests";
                                   2: a probe, counted in "probes" */
} routes[] = {
    { "POST", "/v1/chat/completions", R_CHAT, 0 },
    { "POST", "/v1/completions", R_TEXT, 0 },
    { "POST", "/v1/embeddings", R_EMBED, 0 },
    { "POST", "/v1/responses", R_RESPONSES, 0 },
    { "POST", "/tokenize", R_TOKENIZE, 0 },
    { "POST", "/detokenize", R_DETOKENIZE, 0 },
    { "POST", "/v1/rerank", R_RERANK, 0 },
    { "POST", "/rerank", R_RERANK, 0 },
    { "POST", "/v2/rerank", R_RERANK, 0 },
    { "POST", "/v1/score", R_SCORE, 0 },
    { "POST", "/score", R_SCORE, 0 },
    { "POST", "/pooling", R_POOLING, 0 },
    { "POST", "/v1/audio/transcriptions", R_TRANSCRIBE, 0 },
    { "POST", "/v1/audio/translations", R_TRANSLATE, 0 },
    { "GET", "/v1/models", R_MODELS, 2 },
    { "GET", "/health", R_HEALTH, 2 },
    { "GET", "/stats", R_STATS, 1 },
    { "POST", "/control", R_CONTROL, 1 },
    { "GET", "/metrics", R_METRICS, 1 },
    { "GET", "/recorded", R_RECORDED, 1 },
    { "POST", "/stats/reset", R_RESET, 1 },
    { "POST", "/release", R_RELEASE, 1 },
    { "POST", "/gate", R_GATE, 1 },
};

enum fault {
    FAULT_NONE = 0,
    FAULT_RESET,
    FAULT_STALL,
    FAULT_DIE,
    FAULT_STALL_MID,
    FAULT_BIG_HEADERS,
    FAULT_CHUNKED_JSON,
    FAULT_CHUNKED_JSON_DIE,
    FAULT_HEAD_DIE,
    FAULT_HEAD_STALL,
};

struct req;
static void note_prefix(const struct req *q);
static int gate_wait(struct req *q, long i);
static int query_param(const struct http_request *r, const char *name,
                       char *out, size_t outlen);

static const char *const fault_names[] = {
    "", "reset", "stall", "die_mid_stream", "stall_mid_stream",
    "big_headers", "chunked_json", "chunked_json_die", "head_then_die",
    "head_then_stall",
};

/* One request and what has been answered so far. */
struct req {
    struct conn *c;
    struct http_request *r;
    enum route route;
    const char *allow;          /* Allow field of a 405 */
    long retry_after;           /* Retry-After field; 0 none */
    int close;                  /* send Connection: close, then close */
    int chunked;                /* streamed bodies use chunked framing */
    int head_only;              /* HEAD: the answer has no body */
    int gone;                   /* the client went away mid-response */
    int status;                 /* status sent; 0 while none */
    uint64_t bytes;             /* body bytes written */
    int64_t t0_us;

    /* From the body of a /v1 POST; 'json' owns the strings. */
    json_t *json;
    const char *model;
    const char *hold;
    const char *gate;           /* mock_gate: chunks wait for POST /gate */
    enum fault fault;
    long chunks;
    long first_ms;
    long delay_ms;
    long mock_status;
    long pad;                   /* mock_pad: filler bytes per chunk */
    int stream;
    int include_usage;
    long seq_no;                /* the next Responses API event's */
    long audio_bytes;           /* an upload's file part */
    const char *finish;         /* "stop", or "length" when max_tokens cut */
    long prompt_tokens;
    uint64_t hash;              /* of the whole body: picks the words */
    struct engine_seq *seq;     /* engine mode: owned, engine_seq_free() */
    char id[96];
    json_int_t created;
};

/* The two completion routes: the engine, prefixes, "completions". */
static int
is_completion(enum route r)
{
    return r == R_CHAT || r == R_TEXT;
}

static int
is_audio(enum route r)
{
    return r == R_TRANSCRIBE || r == R_TRANSLATE;
}

/*
 * Words for completions.  Any list works; these read vaguely like text so
 * that demo output looks like a model answering.
 */
static const char *const words[] = {
    "the", "model", "streams", "tokens", "from", "a", "mock", "server",
    "that", "speaks", "like", "vLLM", "and", "never", "thinks", "about",
    "what", "it", "says", "but", "every", "word", "is", "chosen",
    "by", "hashing", "your", "request", "so", "same", "prompts", "get",
    "answers", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
    "gateway", "coalesces", "identical", "calls", "into", "one", "upstream",
    "flight", "followers", "replay", "chunks", "in", "order", "while",
    "leader", "drives", "stream", "to", "its", "end", "with", "done",
    "again", "today",
};

static void
usage(FILE *f)
{
    struct engine_params d;

    engine_params_init(&d);
    fprintf(f,
            "usage: mock_upstream [-l ADDR] [-n CHUNKS] [-f FIRST_MS] "
            "[-d DELAY_MS] [-m MODELS] [-s N:MS] [-p BYTES] [-e]\n"
            "                     [-E KEY=VALUE[,KEY=VALUE...]] [-q] [-v] "
            "[-h]\n"
            "A mock vLLM OpenAI-compatible server for tests, demos and "
            "benchmarks.\n"
            "  -l ADDR  listen on HOST:PORT, port 0 picks one "
            "(default 127.0.0.1:8000)\n"
            "  -n N     content chunks per completion (default 8)\n"
            "  -f MS    delay before the first byte of a completion "
            "(default 0)\n"
            "  -d MS    delay between streamed chunks (default 0)\n"
            "  -m LIST  models GET /v1/models lists, comma-separated "
            "(default mock-model,llama-3-8b)\n"
            "  -s N:MS  every Nth completion waits MS more for its first "
            "byte\n"
            "  -p N     prompt bytes that make a prefix, for prefix_hits "
            "(default 256)\n"
            "  -e       engine mode: a vLLM-like continuous batch paces "
            "completions\n"
            "           (-n and -d then do not apply)\n"
            "  -E LIST  engine parameters, KEY=VALUE,... (implies -e); "
            "defaults:\n"
            "           max_running=%ld step_ms=%g step_per_seq_ms=%g "
            "prefill_us_per_token=%g\n"
            "           kv_blocks=%ld block_tokens=%ld "
            "default_max_tokens=%ld\n"
            "  -q       quiet: no log line per request\n"
            "  -v       log a gateway's probes and scrapes too (GET /health,"
            "\n           /v1/models and /metrics), which are left out "
            "otherwise\n"
            "  -h       this help\n"
            "Prints \"mock_upstream listening port=N\" when ready.  "
            "Endpoints, the engine and the\nrequest-body knobs "
            "(mock_chunks, mock_hold, mock_fault, ...) are in\n"
            "docs/MOCK_UPSTREAM.md.\n",
            d.max_running, (double)d.step_ns / 1e6,
            (double)d.step_per_seq_ns / 1e6,
            (double)d.prefill_ns_per_token / 1e3, d.kv_blocks,
            d.block_tokens, d.default_max_tokens);
}

static void
on_signal(int sig)
{
    stop_signal = sig;
}

/*
 * Lock wrappers: a pthread error here is a programming error (or memory
 * corruption), never something to carry on from.
 */
static void
lock(void)
{
    int err = pthread_mutex_lock(&st.mu);

    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_mutex_lock");
        abort();
    }
}

static void
unlock(void)
{
    int err = pthread_mutex_unlock(&st.mu);

    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_mutex_unlock");
        abort();
    }
}

/*
 * Count the connection in connections_open and connections_total, once,
 * at its first request that is not a control request: a test asking
 * /stats then sees only the connections the gateway made.
 */
static void
count_conn(struct conn *c)
{
    if (c->counted)
        return;
    c->counted = 1;
    lock();
    st.connections_open++;
    st.connections_total++;
    unlock();
}

/* Add 'delta' to the counter or gauge '*field' (a member of st). */
static void
count(uint64_t *field, int delta)
{
    lock();
    *field += (uint64_t)(int64_t)delta;     /* wraps back for delta < 0 */
    unlock();
}

/* Is the view p[0..n) exactly the C string 's' (case-sensitive)? */
static int
view_eq(const char *p, size_t n, const char *s)
{
    return strlen(s) == n && memcmp(p, s, n) == 0;
}

/* One splitmix64 step (its increment, then its finaliser). */
static uint64_t
mix64(uint64_t x)
{
    return gw_mix64(x + UINT64_C(0x9e3779b97f4a7c15));
}

/* Word 'i' of the completion for body hash 'h'. */
static const char *
word_at(uint64_t h, long i)
{
    return words[mix64(h ^ mix64((uint64_t)i)) % GW_ARRAY_LEN(words)];
}

/* json_dump_callback() sink appending to a struct buf. */
static int
dump_to_buf(const char *p, size_t n, void *arg)
{
    return buf_append(arg, p, n) == 0 ? 0 : -1;
}

/* json_dump_callback() sink hashing the bytes into a uint64_t. */
static int
dump_to_hash(const char *p, size_t n, void *arg)
{
    uint64_t *h = arg;

    *h = gw_fnv1a64(*h, p, n);
    return 0;
}

/*
 * Copy at most 'size - 1' bytes of s[0..n) into 'out' for a log line,
 * replacing anything that is not printable ASCII with '?'.
 */
static void
log_safe(char *out, size_t size, const char *s, size_t n)
{
    size_t i;

    if (n > size - 1)
        n = size - 1;
    for (i = 0; i < n; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[n] = '\0';
}

/*
 * Sleep 'ms' milliseconds (-1: no limit) while watching the client, and
 * 'wake_fd' for POLLIN unless it is -1.  Returns 0 when the time is up,
 * 1 when wake_fd is readable, or GW_ECLOSED as soon as the client hangs
 * up or resets (and marks the request gone).  Only POLLRDHUP is asked
 * for, so bytes the client sends meanwhile (a pipelined request) do not
 * end the wait; POLLHUP and POLLERR are always reported.  A client that
 * half-closes after its request counts as gone: libcurl never does that.
 */
static int
wait_client_or(struct req *q, int64_t ms, int wake_fd)
{
    int64_t deadline = ms < 0 ? -1 : gw_now_ms() + ms;
    struct pollfd pfd[2];
    int n, err;

    for (;;) {
        pfd[0].fd = q->c->fd;
        pfd[0].events = POLLRDHUP;
        pfd[0].revents = 0;
        pfd[1].fd = wake_fd;    /* poll() skips a negative one */
        pfd[1].events = POLLIN;
        pfd[1].revents = 0;
        n = poll(pfd, 2, gw_ms_left(deadline));
        if (n == 0)
            return 0;
        if (n == -1) {
            err = errno;
            if (err == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, err, "mock: poll");
            q->close = 1;
            return GW_EIO;
        }
        if (pfd[0].revents == 0)
            return 1;
        q->gone = 1;
        q->close = 1;
        return GW_ECLOSED;
    }
}

/* wait_client_or() with nothing else to watch: 0 or an error. */
static int
wait_client(struct req *q, int64_t ms)
{
    return wait_client_or(q, ms, -1);
}

/*
 * Engine mode: wait until the request's sequence has 'n' tokens (at most
 * all of them, q->chunks), watching the client meanwhile.  Returns 0, or
 * wait_client()'s error; the sequence is then taken out of the engine
 * when handle_v1_post() frees it.
 */
static int
wait_tokens(struct req *q, long n)
{
    int rc;

    if (n > q->chunks)
        n = q->chunks;
    while (engine_seq_tokens(engine, q->seq) < n) {
        rc = wait_client_or(q, -1, engine_seq_fd(q->seq));
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * Wait until content chunk 'i' may be sent: its mock_gate is open that
 * far, then the -d or mock_delay_ms delay, or in engine mode until its
 * token has been generated.
 */
static int
wait_chunk(struct req *q, long i)
{
    int rc;

    if (q->gate != NULL && (rc = gate_wait(q, i)) != 0)
        return rc;
    if (q->seq != NULL)
        return wait_tokens(q, i + 1);
    return q->delay_ms > 0 ? wait_client(q, q->delay_ms) : 0;
}

/* A server that hangs: no answer until the client leaves (or
 * MOCK_STALL_MS), then close. */
static void
stall(struct req *q)
{
    wait_client(q, MOCK_STALL_MS);
    q->close = 1;
}

/* Append a 64 KiB header field, for the big_headers fault. */
static int
append_big_header(struct buf *h)
{
    char *p;
    int rc;

    rc = buf_append_str(h, "X-Mock-Big: ");
    if (rc == 0)
        rc = buf_reserve(h, MOCK_BIG_HEADER, &p);
    if (rc != 0)
        return rc;
    memset(p, 'x', MOCK_BIG_HEADER);
    buf_commit(h, MOCK_BIG_HEADER);
    return buf_append_str(h, "\r\n");
}

/*
 * Write the response head and the first 'n' body bytes at 'p' in one go.
 * 'clen' is the Content-Length to announce, or -1 for a streamed body:
 * chunked for HTTP/1.1, delimited by closing the connection for HTTP/1.0
 * (RFC 9112 section 6.3 rule 8; 1.0 clients know no chunked coding).
 * For chunked bodies 'n' must be 0: pieces go through write_piece().
 * Returns 0, or an error with q->close set (and q->gone on a write error).
 */
static int
send_head(struct req *q, int status, const char *ctype, int64_t clen,
          const char *p, size_t n)
{
    struct buf *h = &q->c->hdr;
    struct iovec iov[2];
    int rc;

    if (clen < 0 && !q->chunked)
        q->close = 1;
    buf_reset(h);
    rc = buf_printf(h, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
    if (rc == 0 && ctype != NULL)
        rc = buf_printf(h, "Content-Type: %s\r\n", ctype);
    if (rc == 0 && clen >= 0)
        rc = buf_printf(h, "Content-Length: %" PRId64 "\r\n", clen);
    if (rc == 0 && clen < 0 && q->chunked)
        rc = buf_append_str(h, "Transfer-Encoding: chunked\r\n");
    if (rc == 0 && q->allow != NULL)
        rc = buf_printf(h, "Allow: %s\r\n", q->allow);
    if (rc == 0 && q->retry_after > 0)
        rc = buf_printf(h, "Retry-After: %ld\r\n", q->retry_after);
    if (rc == 0 && q->close)
        rc = buf_append_str(h, "Connection: close\r\n");
    else if (rc == 0 && q->r->minor == 0)
        rc = buf_append_str(h, "Connection: keep-alive\r\n");
    if (rc == 0 && q->fault == FAULT_BIG_HEADERS)
        rc = append_big_header(h);
    if (rc == 0)
        rc = buf_append_str(h, "\r\n");
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: response head: %s", gw_strerror(rc));
        q->close = 1;
        return rc;
    }
    q->status = status;
    iov[0].iov_base = h->data + h->off;
    iov[0].iov_len = buf_len(h);
    iov[1].iov_base = (void *)p;
    iov[1].iov_len = q->head_only ? 0 : n;  /* RFC 9110 9.3.2 */
    rc = net_writev_all(q->c->fd, iov, 2, gw_now_ms() + MOCK_SEND_MS, -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
        return rc;
    }
    q->bytes += n;
    return 0;
}

/*
 * Write one piece of a streamed body: its own HTTP chunk when chunked
 * (so each SSE event is one chunk, as vLLM sends them), else raw.
 * Empty pieces are skipped: a zero-size chunk would end the body.
 */
static int
write_piece(struct req *q, const char *p, size_t n)
{
    char size[24];
    struct iovec iov[3];
    int cnt = 0, k, rc;

    if (n == 0)
        return 0;
    if (q->chunked) {
        k = snprintf(size, sizeof(size), "%zx\r\n", n);
        iov[cnt].iov_base = size;
        iov[cnt++].iov_len = (size_t)k;
    }
    iov[cnt].iov_base = (void *)p;
    iov[cnt++].iov_len = n;
    if (q->chunked) {
        iov[cnt].iov_base = (void *)"\r\n";
        iov[cnt++].iov_len = 2;
    }
    rc = net_writev_all(q->c->fd, iov, cnt, gw_now_ms() + MOCK_SEND_MS,
                        -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
        return rc;
    }
    q->bytes += n;
    return 0;
}

/* End a streamed body: the last chunk, or the close that ends 1.0 ones. */
static int
write_end(struct req *q)
{
    int rc;

    if (!q->chunked) {
        q->close = 1;
        return 0;
    }
    rc = net_write_all(q->c->fd, "0\r\n\r\n", 5, gw_now_ms() + MOCK_SEND_MS,
                       -1);
    if (rc != 0) {
        q->gone = 1;
        q->close = 1;
    }
    return rc;
}

/* A complete response with Content-Length.  'ctype' may be NULL. */
static int
send_simple(struct req *q, int status, const char *ctype, const char *p,
            size_t n)
{
    return send_head(q, status, ctype, (int64_t)n, p, n);
}

/*
 * An OpenAI error body: {"error":{"message":...,"type":...,"param":...,
 * "code":...}}.  'type' is "invalid_request_error" below 500, else
 * "server_error", as the gateway's own errors are.  'param' and 'code'
 * may be NULL.
 */
static int
send_error(struct req *q, int status, const char *msg, const char *param,
           const char *code)
{
    struct buf *b = &q->c->out;
    const char *type = status < 500 ? "invalid_request_error"
                                     : "server_error";

    buf_reset(b);
    if (jsonx_error_body(b, msg, type, param, code) != 0) {
        buf_reset(b);
        q->close = 1;           /* out of memory: say as little as we can */
    }
    return send_simple(q, status, "application/json", buf_ptr(b),
                       buf_len(b));
}

/* Send 'o' (stolen) as a JSON body with 'status'; 500 if it is NULL. */
static int
send_json(struct req *q, int status, json_t *o, size_t flags)
{
    struct buf *b = &q->c->out;
    int rc;

    buf_reset(b);
    rc = o != NULL ? json_dump_callback(o, dump_to_buf, b,
                                        JSON_COMPACT | flags)
                   : -1;
    json_decref(o);
    if (rc != 0)
        return send_error(q, 500, "mock: cannot build the response",
                          NULL, "internal_error");
    return send_simple(q, status, "application/json", buf_ptr(b),
                       buf_len(b));
}

/* Send 'o' (stolen) as one SSE event "data: {json}\n\n". */
static int
send_event(struct req *q, json_t *o)
{
    struct buf *b = &q->c->out;
    int rc = -1;

    buf_reset(b);
    if (o != NULL && buf_append_str(b, "data: ") == 0
        && json_dump_callback(o, dump_to_buf, b, JSON_COMPACT) == 0)
        rc = buf_append_str(b, "\n\n");
    json_decref(o);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: cannot build an SSE event");
        q->close = 1;           /* the body cannot end cleanly now */
        return GW_ENOMEM;
    }
    return write_piece(q, buf_ptr(b), buf_len(b));
}

/* Count whitespace-separated words in 's'. */
static long
count_words(const char *s)
{
    long n = 0;
    int in_word = 0;

    for (; *s != '\0'; s++) {
        if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            n++;
        }
    }
    return n;
}

/*
 * Call fn(text, length, arg) for each piece of prompt text in 'v', in
 * order: a string, an array of them, chat messages ({"content": ...}) or
 * content parts ({"text": ...}).  Stops at the first non-zero return of
 * 'fn' and returns it, else 0.  Recursion is bounded by the
 * JSONX_MAX_DEPTH the body was parsed with.
 */
static int
each_text(const json_t *v, int (*fn)(const char *, size_t, void *),
          void *arg)
{
    size_t i;
    int rc = 0;

    if (json_is_string(v))
        return fn(json_string_value(v), json_string_length(v), arg);
    if (json_is_array(v)) {
        for (i = 0; rc == 0 && i < json_array_size(v); i++)
            rc = each_text(json_array_get(v, i), fn, arg);
    } else if (json_is_object(v)) {
        rc = each_text(json_object_get(v, "content"), fn, arg);
        if (rc == 0)
            rc = each_text(json_object_get(v, "text"), fn, arg);
    }
    return rc;
}

/* each_text() callback adding the words of 'p' to *(long *)arg. */
static int
add_words(const char *p, size_t n, void *arg)
{
    (void)n;                    /* words end at a NUL, as they always did */
    *(long *)arg += count_words(p);
    return 0;
}

/* Words of prompt text in 'v' (each_text()). */
static long
count_text(const json_t *v)
{
    long n = 0;

    each_text(v, add_words, &n);
    return n;
}

/*
 * Read the optional integer member 'key' of 'o' into *out, unless it is
 * absent or null.  Returns 0, or GW_EINVAL with a message in 'err' when
 * it is not an integer in [lo, hi].
 */
static int
knob_int(const json_t *o, const char *key, long lo, long hi, long *out,
         char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, key);

    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo
        || json_integer_value(v) > hi) {
        snprintf(err, errlen, "%s must be an integer from %ld to %ld", key,
                 lo, hi);
        return GW_EINVAL;
    }
    *out = (long)json_integer_value(v);
    return 0;
}

/*
 * The tag knob 'key' of 'o' into OUT *tag (borrowed from 'o'; left alone
 * when the knob is absent or null).  Returns 0, or GW_EINVAL with a
 * message in 'err' when it is not a string of 1 to MOCK_MAX_TAG bytes.
 */
static int
knob_tag(const json_t *o, const char *key, const char **tag, char *err,
         size_t errlen)
{
    const json_t *v = json_object_get(o, key);

    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v) || json_string_length(v) == 0
        || json_string_length(v) > MOCK_MAX_TAG) {
        snprintf(err, errlen, "%s must be a tag of 1 to %d bytes", key,
                 MOCK_MAX_TAG);
        return GW_EINVAL;
    }
    *tag = json_string_value(v);
    return 0;
}

/*
 * Read the mock_* knobs of the body, over the command-line defaults.
 * A knob of the wrong type or out of range is refused rather than
 * ignored, so a test with a typo fails loudly.
 * Returns 0, or GW_EINVAL with a message in 'err' and OUT *param naming
 * the knob.
 */
static int
read_knobs(struct req *q, char *err, size_t errlen, const char **param)
{
    const json_t *v;
    size_t i;
    int completion = q->route == R_CHAT || q->route == R_TEXT;

    q->chunks = opt.chunks;
    q->first_ms = completion ? opt.first_ms : 0;
    q->delay_ms = opt.delay_ms;
    *param = "mock_chunks";
    if (knob_int(q->json, *param, 0, MOCK_MAX_CHUNKS, &q->chunks, err,
                 errlen) != 0)
        return GW_EINVAL;
    *param = "mock_first_ms";
    if (knob_int(q->json, *param, 0, MOCK_MAX_MS, &q->first_ms, err,
                 errlen) != 0)
        return GW_EINVAL;
    *param = "mock_delay_ms";
    if (knob_int(q->json, *param, 0, MOCK_MAX_MS, &q->delay_ms, err,
                 errlen) != 0)
        return GW_EINVAL;
    *param = "mock_status";
    if (knob_int(q->json, *param, 400, 599, &q->mock_status, err,
                 errlen) != 0)
        return GW_EINVAL;
    *param = "mock_pad";
    if (knob_int(q->json, *param, 0, MOCK_MAX_PAD, &q->pad, err,
                 errlen) != 0)
        return GW_EINVAL;

    *param = "mock_hold";
    if (knob_tag(q->json, *param, &q->hold, err, errlen) != 0)
        return GW_EINVAL;
    *param = "mock_gate";
    if (knob_tag(q->json, *param, &q->gate, err, errlen) != 0)
        return GW_EINVAL;

    *param = "mock_fault";
    v = json_object_get(q->json, *param);
    if (v != NULL && !json_is_null(v)) {
        for (i = 1; i < GW_ARRAY_LEN(fault_names); i++)
            if (json_is_string(v)
                && strcmp(json_string_value(v), fault_names[i]) == 0)
                q->fault = (enum fault)i;
        if (q->fault == FAULT_NONE) {
            snprintf(err, errlen, "mock_fault must be one of reset, stall, "
                     "die_mid_stream, stall_mid_stream, big_headers, "
                     "chunked_json, chunked_json_die, head_then_die, "
                     "head_then_stall");
            return GW_EINVAL;
        }
    }
    *param = NULL;
    return 0;
}

/*
 * The OpenAI parameters the answer depends on: model, stream,
 * stream_options.include_usage and max_tokens.  Nothing here is refused:
 * vLLM's validation is not what the gateway's tests exercise.
 */
static void
read_params(struct req *q)
{
    const struct http_header *rid;
    const json_t *v;
    const char *prefix;

    v = json_object_get(q->json, "model");
    q->model = json_is_string(v) ? json_string_value(v) : MOCK_MODEL;
    q->stream = (is_completion(q->route) || q->route == R_RESPONSES
                 || is_audio(q->route))
                && json_is_true(json_object_get(q->json, "stream"));
    v = json_object_get(q->json, "stream_options");
    q->include_usage = json_is_object(v)
                       && json_is_true(json_object_get(v, "include_usage"));
    /* An upload's form flattens the option (vLLM's form field). */
    if (is_audio(q->route))
        q->include_usage = json_is_true(json_object_get(
                               q->json, "stream_include_usage"));

    q->finish = "stop";
    v = json_object_get(q->json, q->route == R_RESPONSES ? "max_output_tokens"
                                                         : "max_tokens");
    if (!json_is_integer(v) && q->route == R_CHAT)
        v = json_object_get(q->json, "max_completion_tokens");
    if (json_is_integer(v) && json_integer_value(v) >= 0
        && json_integer_value(v) < q->chunks) {
        q->chunks = (long)json_integer_value(v);
        q->finish = "length";
    }

    if (q->route == R_CHAT)
        q->prompt_tokens = count_text(json_object_get(q->json, "messages"));
    else if (q->route == R_TEXT)
        q->prompt_tokens = count_text(json_object_get(q->json, "prompt"));
    else if (q->route == R_TOKENIZE)
        q->prompt_tokens = count_text(json_object_get(q->json, "prompt"))
                           + count_text(json_object_get(q->json,
                                                        "messages"));
    else if (q->route == R_RERANK)
        q->prompt_tokens = count_text(json_object_get(q->json, "query"))
                           + count_text(json_object_get(q->json,
                                                        "documents"));
    else if (q->route == R_SCORE)
        q->prompt_tokens = count_text(json_object_get(q->json, "text_1"))
                           + count_text(json_object_get(q->json, "text_2"));
    else if (is_audio(q->route))
        q->prompt_tokens = 1 + q->audio_bytes / 640;  /* 16 kHz, 20 ms */
    else
        q->prompt_tokens = count_text(json_object_get(q->json, "input"));
    if (q->prompt_tokens < 1)
        q->prompt_tokens = 1;   /* vLLM always counts at least BOS */

    q->hash = gw_fnv1a64(GW_FNV1A64_OFFSET, buf_ptr(&q->c->body), buf_len(&q->c->body));
    /*
     * vLLM's ids: a prefix and the request's X-Request-Id when it has one
     * (OpenAIServing._base_request_id), else a random UUID's 32 hex
     * digits.  So a gateway that forwards its client's id would leak it
     * into every body it shares.
     */
    prefix = q->route == R_CHAT ? "chatcmpl-"
             : q->route == R_TEXT ? "cmpl-"
             : q->route == R_RESPONSES ? "resp_"
             : q->route == R_RERANK ? "rerank-"
             : q->route == R_SCORE ? "score-"
             : q->route == R_POOLING ? "pool-"
             : q->route == R_TRANSCRIBE ? "trsc-"
             : q->route == R_TRANSLATE ? "trsl-" : "embd-";
    rid = http_find_header(q->r, "X-Request-Id");
    if (rid != NULL && rid->value_len > 0 && rid->value_len <= 64) {
        snprintf(q->id, sizeof(q->id), "%s", prefix);
        log_safe(q->id + strlen(prefix), sizeof(q->id) - strlen(prefix),
                 rid->value, rid->value_len);
    } else {
        snprintf(q->id, sizeof(q->id), "%s", prefix);
        gw_random_hex(q->id + strlen(prefix), 32);
    }
    q->created = (json_int_t)time(NULL);
}

/* {"prompt_tokens":P,"total_tokens":T,"completion_tokens":C}, vLLM's order */
static json_t *
usage_new(const struct req *q, long completion_tokens)
{
    return json_pack("{s:I, s:I, s:I}",
                     "prompt_tokens", (json_int_t)q->prompt_tokens,
                     "total_tokens",
                     (json_int_t)(q->prompt_tokens + completion_tokens),
                     "completion_tokens", (json_int_t)completion_tokens);
}

/*
 * One streamed chunk carrying 'choices' (stolen; a NULL one fails) and,
 * unless NULL, 'usage' (stolen).  Returns a new reference or NULL.
 */
static json_t *
chunk_new(const struct req *q, json_t *choices, json_t *usage)
{
    const char *object = q->route == R_CHAT ? "chat.completion.chunk"
                         : q->route == R_TRANSCRIBE ? "transcription.chunk"
                         : q->route == R_TRANSLATE ? "translation.chunk"
                                                   : "text_completion";
    json_t *o;

    /* "o" steals its argument even when the pack fails (jansson 2.11+). */
    o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", q->id,
                  "object", object, "created", q->created, "model", q->model,
                  "choices", choices);
    if (usage != NULL) {
        if (o == NULL)
            json_decref(usage);
        else if (json_object_set_new(o, "usage", usage) != 0) {
            json_decref(o);     /* set_new stole 'usage' */
            o = NULL;
        }
    }
    return o;
}

/*
 * The choices array of a streamed chunk.  Chat: 'role' set gives the role
 * chunk's delta, 'text' set a content delta, neither the finish chunk's
 * empty delta.  Completions carry "text" instead of a delta.
 * 'finish' is the finish_reason, NULL for null.
 */
static json_t *
choices_new(const struct req *q, const char *role, const char *text,
            const char *finish)
{
    json_t *delta, *fin = finish != NULL ? json_string(finish) : json_null();

    if (q->route == R_TEXT)
        return json_pack("[{s:i, s:s, s:n, s:o}]", "index", 0, "text",
                         text != NULL ? text : "", "logprobs",
                         "finish_reason", fin);
    if (is_audio(q->route))     /* vLLM's TranscriptionResponseStreamChoice */
        return json_pack("[{s:o, s:o, s:n}]", "delta",
                         text != NULL ? json_pack("{s:s}", "content", text)
                                      : json_object(),
                         "finish_reason", fin, "stop_reason");
    if (role != NULL)
        delta = json_pack("{s:s, s:s}", "role", role, "content", "");
    else if (text != NULL)
        delta = json_pack("{s:s}", "content", text);
    else
        delta = json_object();
    return json_pack("[{s:i, s:o, s:n, s:o}]", "index", 0, "delta", delta,
                     "logprobs", "finish_reason", fin);
}

/*
 * Append the text of content chunk 'i' to 'b': its word and a space, then
 * q->pad filler bytes (mock_pad), the alphabet over and over from 'a'.
 * The filler is plain ASCII so that JSON carries it unescaped and a test
 * can predict every byte.  Returns 0, GW_ENOMEM or GW_ETOOBIG.
 */
static int
append_chunk_text(const struct req *q, long i, struct buf *b)
{
    static const char filler[] = "abcdefghijklmnopqrstuvwxyz";
    size_t n = (size_t)q->pad, k;
    char *p;
    int rc;

    rc = buf_printf(b, "%s ", word_at(q->hash, i));
    if (rc != 0 || n == 0)
        return rc;
    rc = buf_reserve(b, n, &p);
    if (rc != 0)
        return rc;
    for (k = 0; k < n; k++)
        p[k] = filler[k % (sizeof(filler) - 1)];
    buf_commit(b, n);
    return 0;
}

/*
 * die_mid_stream and stall_mid_stream, once a stream sent its first two
 * content chunks: 1 when the fault ended the stream here (cut short
 * without its last chunk, or stalled), else 0.
 */
static int
fault_mid_stream(struct req *q)
{
    if (q->fault == FAULT_DIE) {
        q->close = 1;           /* no last chunk: the body is cut short */
        return 1;
    }
    if (q->fault == FAULT_STALL_MID) {
        stall(q);
        return 1;
    }
    return 0;
}

/*
 * A streamed completion: the role chunk (chat only: vLLM's completions
 * stream has none), the content chunks, the finish chunk, the usage chunk
 * when asked for, [DONE].  The faults die_mid_stream and stall_mid_stream
 * stop after two content chunks.
 */
static void
stream_completion(struct req *q)
{
    struct buf text;
    long n = q->chunks, i;

    buf_init(&text, MOCK_MAX_PAD + 64);     /* the longest word and pad */
    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID)
        n = 2;
    if (send_head(q, 200, "text/event-stream", -1, NULL, 0) != 0)
        goto out;
    /* vLLM's head comes at once, its first event after the prefill: a
     * server that dies or hangs in between has sent no body byte. */
    if (q->fault == FAULT_HEAD_DIE) {
        q->close = 1;
        goto out;
    }
    if (q->fault == FAULT_HEAD_STALL) {
        stall(q);
        goto out;
    }
    /* The engine's first token: the queue, the prefill and one step.
     * vLLM sends the role chunk with it, not before. */
    if (q->seq != NULL && wait_tokens(q, 1) != 0)
        goto out;
    if (q->route == R_CHAT
        && send_event(q, chunk_new(q, choices_new(q, "assistant", NULL,
                                                  NULL), NULL)) != 0)
        goto out;
    for (i = 0; i < n; i++) {
        if (wait_chunk(q, i) != 0)
            goto out;
        buf_reset(&text);
        if (append_chunk_text(q, i, &text) != 0) {
            log_msg(GW_LOG_ERROR, "mock: out of memory for a chunk");
            q->close = 1;       /* the body cannot end cleanly now */
            goto out;
        }
        if (send_event(q, chunk_new(q, choices_new(q, NULL, buf_ptr(&text),
                                                   NULL), NULL)) != 0)
            goto out;
    }
    if (fault_mid_stream(q))
        goto out;
    if (send_event(q, chunk_new(q, choices_new(q, NULL, NULL, q->finish),
                                NULL)) != 0)
        goto out;
    if (q->include_usage
        && send_event(q, chunk_new(q, json_array(),
                                   usage_new(q, q->chunks))) != 0)
        goto out;
    if (write_piece(q, "data: [DONE]\n\n", 14) != 0)
        goto out;
    write_end(q);

out:
    buf_release(&text);
}

/*
 * A JSON body p[0..n) with its Content-Length, under a mock_gate: in
 * q->chunks pieces of about the same size (at least one), piece i sent
 * once the gate is open past i, so that a test decides how far the body
 * has gone.  A gate that stays shut cuts the body short (gate_wait()).
 */
static void
send_gated_body(struct req *q, const char *p, size_t n)
{
    size_t pieces = q->chunks > 0 ? (size_t)q->chunks : 1;
    size_t off = 0, len;
    size_t i;

    if (send_head(q, 200, "application/json", (int64_t)n, NULL, 0) != 0
        || q->head_only)
        return;
    for (i = 0; i < pieces; i++) {
        len = i + 1 < pieces ? n / pieces : n - off;
        if (gate_wait(q, (long)i) != 0)
            return;
        if (len > 0 && net_write_all(q->c->fd, p + off, len,
                                     gw_now_ms() + MOCK_SEND_MS, -1) != 0) {
            q->gone = 1;
            q->close = 1;
            return;
        }
        q->bytes += len;
        off += len;
    }
}

/*
 * Send a complete JSON body p[0..n) as a 200, applying the non-stream
 * faults: die_mid_stream announces the full length, sends half and
 * closes; stall_mid_stream sends half and stalls; chunked_json sends
 * three chunks a little apart, so that they reach the client in separate
 * reads; chunked_json_die sends the first of them and closes (a body of
 * unknown length, cut).
 */
static void
send_json_body(struct req *q, const char *p, size_t n)
{
    size_t third = n / 3, off = 0, len;
    int i;

    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID) {
        if (send_head(q, 200, "application/json", (int64_t)n, p, n / 2) == 0
            && q->fault == FAULT_STALL_MID)
            wait_client(q, MOCK_STALL_MS);
        q->close = 1;           /* the body is cut short */
        return;
    }
    if (q->gate != NULL && q->fault == FAULT_NONE) {
        send_gated_body(q, p, n);
        return;
    }
    if ((q->fault != FAULT_CHUNKED_JSON && q->fault != FAULT_CHUNKED_JSON_DIE)
        || !q->chunked) {
        send_simple(q, 200, "application/json", p, n);
        return;
    }
    if (send_head(q, 200, "application/json", -1, NULL, 0) != 0)
        return;
    for (i = 0; i < 3; i++) {
        if (i == 1 && q->fault == FAULT_CHUNKED_JSON_DIE) {
            q->close = 1;       /* no last chunk: the body is cut short */
            return;
        }
        len = i < 2 ? third : n - off;
        if (i > 0 && wait_client(q, MOCK_PIECE_GAP_MS) != 0)
            return;
        if (write_piece(q, p + off, len) != 0)
            return;
        off += len;
    }
    write_end(q);
}

/*
 * A non-streamed completion.  It waits as long as the stream would have
 * taken (chunks x delay, or in engine mode until the last token) before
 * answering, as vLLM does when it generates the whole answer first.  Its
 * text is the stream's content chunks joined, padding included; a body
 * that would pass MOCK_OUT_LIMIT (many chunks with a big mock_pad) is
 * answered with a 500 "response_too_big".
 */
static void
answer_completion(struct req *q)
{
    struct buf text;
    struct buf *b = &q->c->out;
    json_t *o = NULL;
    char msg[128];
    long i;
    int rc = 0;

    buf_init(&text, MOCK_OUT_LIMIT);
    if ((q->seq != NULL ? wait_tokens(q, q->chunks)
                        : wait_client(q, (int64_t)q->chunks * q->delay_ms))
        != 0)
        goto out;
    for (i = 0; i < q->chunks && rc == 0; i++)
        rc = append_chunk_text(q, i, &text);
    if (rc != 0)
        goto out;
    if (q->route == R_CHAT)
        o = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, "
                      "s:s}], s:o}", "id", q->id, "object",
                      "chat.completion", "created", q->created, "model",
                      q->model, "choices", "index", 0, "message", "role",
                      "assistant", "content", buf_ptr(&text), "logprobs",
                      "finish_reason", q->finish, "usage",
                      usage_new(q, q->chunks));
    else
        o = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:n, s:s}], "
                      "s:o}", "id", q->id, "object", "text_completion",
                      "created", q->created, "model", q->model, "choices",
                      "index", 0, "text", buf_ptr(&text), "logprobs",
                      "finish_reason", q->finish, "usage",
                      usage_new(q, q->chunks));
    buf_reset(b);
    if (o == NULL) {
        rc = GW_ENOMEM;
        goto out;
    }
    if (json_dump_callback(o, dump_to_buf, b, JSON_COMPACT) != 0) {
        /* Out of memory or past b's limit: json_dumpb() with no buffer
         * only measures, so it tells which. */
        rc = json_dumpb(o, NULL, 0, JSON_COMPACT) > b->limit ? GW_ETOOBIG
                                                           : GW_ENOMEM;
        goto out;
    }
    send_json_body(q, buf_ptr(b), buf_len(b));

out:
    if (rc == GW_ETOOBIG) {
        snprintf(msg, sizeof(msg), "mock: the response body would pass the "
                 "mock's %d MiB limit", MOCK_OUT_LIMIT / (1024 * 1024));
        send_error(q, 500, msg, NULL, "response_too_big");
    } else if (rc != 0) {
        send_error(q, 500, "mock: cannot build the response", NULL,
                   "internal_error");
    }
    json_decref(o);
    buf_release(&text);
}

/* MOCK_EMBED_DIM numbers in [-1, 1) with 6 decimals, from hash 'h'. */
static json_t *
embedding_new(uint64_t h)
{
    json_t *a = json_array();
    int i;
    long k;

    for (i = 0; a != NULL && i < MOCK_EMBED_DIM; i++) {
        k = (long)(mix64(h + (uint64_t)i) % 2000000) - 1000000;
        if (json_array_append_new(a, json_real((double)k / 1e6)) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

/* One data[] entry: the embedding of the hash 'h'. */
static int
append_embedding(json_t *data, uint64_t h)
{
    return json_array_append_new(data, json_pack(
               "{s:s, s:I, s:o}", "object", "embedding", "index",
               (json_int_t)json_array_size(data), "embedding",
               embedding_new(h)));
}

/*
 * /v1/embeddings: one vector per string when "input" is an array of
 * strings, else one vector for the whole input.
 */
static void
answer_embeddings(struct req *q)
{
    const json_t *in = json_object_get(q->json, "input");
    json_t *data = json_array(), *o;
    uint64_t h;
    size_t i;
    int rc = data != NULL ? 0 : -1;
    int strings = json_is_array(in) && json_array_size(in) > 0;

    for (i = 0; strings && i < json_array_size(in); i++)
        strings = json_is_string(json_array_get(in, i));
    for (i = 0; strings && rc == 0 && i < json_array_size(in); i++) {
        const json_t *s = json_array_get(in, i);

        rc = append_embedding(data, gw_fnv1a64(GW_FNV1A64_OFFSET, json_string_value(s),
                                          json_string_length(s)));
    }
    if (!strings && rc == 0) {
        h = GW_FNV1A64_OFFSET;
        if (in != NULL)
            json_dump_callback(in, dump_to_hash, &h,
                               JSON_COMPACT | JSON_ENCODE_ANY);
        rc = append_embedding(data, h);
    }
    if (rc != 0) {
        json_decref(data);
        send_error(q, 500, "mock: cannot build the response", NULL,
                   "internal_error");
        return;
    }
    o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", q->id, "object",
                  "list", "created", q->created, "model", q->model, "data",
                  data, "usage", usage_new(q, 0));
    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID
        || q->fault == FAULT_CHUNKED_JSON
        || q->fault == FAULT_CHUNKED_JSON_DIE) {
        struct buf *b = &q->c->out;

        buf_reset(b);
        if (o == NULL || json_dump_callback(o, dump_to_buf, b, JSON_COMPACT
                                            | JSON_REAL_PRECISION(6)) != 0)
            send_error(q, 500, "mock: cannot build the response", NULL,
                       "internal_error");
        else
            send_json_body(q, buf_ptr(b), buf_len(b));
        json_decref(o);
        return;
    }
    send_json(q, 200, o, JSON_REAL_PRECISION(6));
}

/*
 * Sleep on st.cv for at most MOCK_HOLD_SLICE_MS (st.mu held, and held
 * again on return): woken by a /release or /gate, or, the usual outcome,
 * by the time being up, to look at the client's socket.
 */
static void
wait_slice_locked(void)
{
    struct timespec ts;
    int rc;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += MOCK_HOLD_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    rc = pthread_cond_timedwait(&st.cv, &st.mu, &ts);
    if (rc != 0 && rc != ETIMEDOUT) {
        log_errno(GW_LOG_ERROR, rc, "mock: pthread_cond_timedwait");
        abort();
    }
}

/*
 * How a wait in slices ended (st.mu held): 0 when what it waited for
 * came ('came'), else GW_EABORTED (stopping), GW_ECLOSED (the client is
 * 'gone') or GW_ETIMEDOUT.
 */
static int
wait_result_locked(int came, int gone)
{
    if (came)
        return 0;
    if (st.stopping)
        return GW_EABORTED;
    return gone ? GW_ECLOSED : GW_ETIMEDOUT;
}

/*
 * Wait until /release?tag=<q->hold> (or an earlier one), the client goes
 * away, MOCK_HOLD_MS passes or the process stops.
 * Returns 0 (released), GW_ECLOSED (client gone, q->gone set),
 * GW_ETIMEDOUT or GW_EABORTED (stopping).
 * Takes st.mu; releases it around each socket check and while waiting.
 */
static int
hold_wait(struct req *q)
{
    struct holder h = { q->hold, 0, NULL };
    struct holder **pp;
    int64_t deadline = gw_now_ms() + MOCK_HOLD_MS;
    int gone = 0, rc;

    lock();
    if (json_object_get(st.released, q->hold) != NULL) {
        unlock();
        return 0;               /* released before it arrived */
    }
    h.next = st.holders;
    st.holders = &h;
    st.held++;
    while (!h.released && !st.stopping && !gone
           && gw_now_ms() < deadline) {
        wait_slice_locked();
        if (h.released || st.stopping)
            break;
        unlock();
        gone = net_peer_gone(q->c->fd);
        lock();
    }
    for (pp = &st.holders; *pp != &h; pp = &(*pp)->next)
        ;
    *pp = h.next;
    st.held--;
    rc = wait_result_locked(h.released, gone);
    unlock();
    if (rc == GW_ECLOSED)
        q->gone = 1;
    if (rc == GW_ECLOSED || rc == GW_EABORTED)
        q->close = 1;           /* a timeout is answered and kept alive */
    return rc;
}

/* The chunks a request gated on 'tag' may send so far.  st.mu held. */
static json_int_t
gate_open_locked(const char *tag)
{
    return json_integer_value(json_object_get(st.gates, tag));
}

/*
 * Wait until the request's mock_gate lets content chunk 'i' (from 0) go:
 * until POST /gate has opened it past 'i', the client goes away,
 * MOCK_GATE_MS passes or the process stops.  Returns 0, GW_ECLOSED
 * (client gone), GW_ETIMEDOUT or GW_EABORTED, with q->close set on an
 * error: the body is then cut short, which the client sees as a broken
 * upstream.  Takes st.mu; releases it around each socket check.
 */
static int
gate_wait(struct req *q, long i)
{
    int64_t deadline = gw_now_ms() + MOCK_GATE_MS;
    int gone = 0, counted = 0, rc;

    lock();
    while (gate_open_locked(q->gate) <= i && !st.stopping && !gone
           && gw_now_ms() < deadline) {
        if (!counted) {
            st.gated++;
            counted = 1;
        }
        wait_slice_locked();
        if (gate_open_locked(q->gate) > i || st.stopping)
            break;
        unlock();
        gone = net_peer_gone(q->c->fd);
        lock();
    }
    if (counted)
        st.gated--;
    rc = wait_result_locked(gate_open_locked(q->gate) > i, gone);
    unlock();
    if (rc == GW_ECLOSED)
        q->gone = 1;
    if (rc == GW_ETIMEDOUT)
        log_msg(GW_LOG_WARN, "mock: mock_gate \"%s\" not opened past "
                "chunk %ld within %d s: the body is cut short", q->gate, i,
                MOCK_GATE_MS / 1000);
    if (rc != 0)
        q->close = 1;
    return rc;
}

/*
 * Engine mode: the completion's length and finish_reason, then its
 * sequence in the engine (q->seq).  The length is max_tokens (for chat
 * also max_completion_tokens), at most ENGINE_MAX_TOKENS, and the finish
 * "length"; without one, default_max_tokens and "stop", as if the model
 * had ended there.  A max_tokens below 1 is refused as vLLM refuses it;
 * a prompt and output that could never fit the KV cache as a context
 * too long.  usage.prompt_tokens becomes the engine's count.  Returns 0,
 * or an error already answered.
 */
static int
enter_engine(struct req *q)
{
    const json_t *v = json_object_get(q->json, "max_tokens");
    struct buf prompt;
    json_int_t n;
    int rc;

    if (!json_is_integer(v) && q->route == R_CHAT)
        v = json_object_get(q->json, "max_completion_tokens");
    q->chunks = opt.engine_params.default_max_tokens;
    q->finish = "stop";
    if (json_is_integer(v)) {
        n = json_integer_value(v);
        if (n < 1) {
            send_error(q, 400, "max_tokens must be at least 1",
                       "max_tokens", "invalid_value");
            return GW_EINVAL;
        }
        q->chunks = n < ENGINE_MAX_TOKENS ? (long)n : ENGINE_MAX_TOKENS;
        q->finish = "length";
    }
    /* Unescaped text is never longer than the JSON that held it. */
    buf_init(&prompt, MOCK_MAX_BODY);
    rc = each_text(json_object_get(q->json, q->route == R_CHAT ? "messages"
                                                               : "prompt"),
                   dump_to_buf, &prompt) == 0 ? 0 : GW_ENOMEM;
    if (rc == 0)
        rc = engine_submit(engine, buf_ptr(&prompt), buf_len(&prompt),
                           q->chunks, q->stream, &q->seq);
    buf_release(&prompt);
    if (rc == 0)
        q->prompt_tokens = engine_seq_prompt_tokens(q->seq);
    else if (rc == GW_ETOOBIG)
        send_error(q, 400, "mock engine: the prompt and max_tokens need more "
                   "KV blocks than the cache holds (-E kv_blocks)", NULL,
                   "context_length_exceeded");
    else
        send_error(q, 500, "mock engine: cannot queue the request", NULL,
                   "internal_error");
    return rc;
}

/* ---- the other vLLM routes ---- */

/* Was response 'id' stored (store: true), among the last MOCK_STORED? */
static int
response_stored(const char *id)
{
    size_t i;
    int found = 0;

    lock();
    for (i = 0; !found && i < st.stored_count; i++)
        found = strcmp(st.stored[i], id) == 0;
    unlock();
    return found;
}

static void
store_response(const char *id)
{
    lock();
    snprintf(st.stored[st.stored_next], MOCK_ID_MAX, "%s", id);
    st.stored_next = (st.stored_next + 1) % MOCK_STORED;
    if (st.stored_count < MOCK_STORED)
        st.stored_count++;
    unlock();
}

/* The Responses API's usage: input_tokens, output_tokens, their details. */
static json_t *
response_usage_new(const struct req *q, long output_tokens)
{
    return json_pack("{s:I, s:{s:i}, s:I, s:{s:i}, s:I}",
                     "input_tokens", (json_int_t)q->prompt_tokens,
                     "input_tokens_details", "cached_tokens", 0,
                     "output_tokens", (json_int_t)output_tokens,
                     "output_tokens_details", "reasoning_tokens", 0,
                     "total_tokens",
                     (json_int_t)(q->prompt_tokens + output_tokens));
}

/* The assistant's message item with 'text', or an empty one in progress. */
static json_t *
message_item_new(const char *msg_id, const char *text)
{
    json_t *content = text == NULL ? json_array() : json_pack(
        "[{s:[], s:s, s:s, s:n}]", "annotations", "text", text, "type",
        "output_text", "logprobs");

    return json_pack("{s:s, s:o, s:s, s:s, s:s}", "id", msg_id, "content",
                     content, "role", "assistant", "status",
                     text == NULL ? "in_progress" : "completed", "type",
                     "message");
}

/*
 * The response object, in OpenAI's shape as vLLM sends it: in progress
 * (no output, usage null) when 'text' is NULL, else completed.
 */
static json_t *
response_new(const struct req *q, const char *msg_id, const char *text)
{
    const json_t *prev = json_object_get(q->json, "previous_response_id");
    const json_t *max = json_object_get(q->json, "max_output_tokens");
    json_t *output = text == NULL ? json_array()
                                  : json_pack("[o]", message_item_new(
                                                  msg_id, text));

    return json_pack("{s:s, s:I, s:n, s:n, s:n, s:s, s:s, s:o, s:b, s:f, "
                     "s:s, s:[], s:f, s:b, s:O, s:O, s:s, s:n, s:s, s:o, "
                     "s:n}",
                     "id", q->id, "created_at", q->created,
                     "incomplete_details", "instructions", "metadata",
                     "model", q->model, "object", "response",
                     "output", output, "parallel_tool_calls", 1,
                     "temperature", 1.0, "tool_choice", "auto", "tools",
                     "top_p", 1.0, "background", 0,
                     "max_output_tokens",
                     json_is_integer(max) ? max : json_null(),
                     "previous_response_id",
                     json_is_string(prev) ? prev : json_null(),
                     "status", text == NULL ? "in_progress" : "completed",
                     "text", "truncation", "disabled",
                     "usage", text == NULL ? json_null()
                                           : response_usage_new(q,
                                                                q->chunks),
                     "user");
}

/*
 * One Responses API event, "event: TYPE\ndata: {json}\n\n" as vLLM frames
 * them, with its sequence_number and type set last (OpenAI's key order).
 * 'o' is stolen.
 */
static int
send_named_event(struct req *q, const char *type, json_t *o)
{
    struct buf *b = &q->c->out;
    int rc = -1;

    if (o != NULL
        && (json_object_set_new(o, "sequence_number",
                                json_integer(q->seq_no++)) != 0
            || json_object_set_new(o, "type", json_string(type)) != 0)) {
        json_decref(o);
        o = NULL;
    }
    buf_reset(b);
    if (o != NULL && buf_printf(b, "event: %s\ndata: ", type) == 0
        && json_dump_callback(o, dump_to_buf, b, JSON_COMPACT) == 0)
        rc = buf_append_str(b, "\n\n");
    json_decref(o);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: cannot build an SSE event");
        q->close = 1;
        return GW_ENOMEM;
    }
    return write_piece(q, buf_ptr(b), buf_len(b));
}

/* The text of the first 'n' content chunks, joined, into 'text' (its
 * buf_ptr() NUL-terminated, as a buf always is once written to). */
static int
joined_text(const struct req *q, long n, struct buf *text)
{
    int rc = 0;

    buf_reset(text);
    for (long i = 0; i < n && rc == 0; i++)
        rc = append_chunk_text(q, i, text);
    return rc;                  /* a buf keeps a NUL after its bytes */
}

/*
 * POST /v1/responses streamed: vLLM's event sequence for one message
 * (response.created, .in_progress, .output_item.added,
 * .content_part.added, an .output_text.delta per chunk,
 * .output_text.done, .content_part.done, .output_item.done,
 * .completed, whose response carries the usage).  No "data: [DONE]":
 * vLLM sends none on this route.
 */
static void
stream_response(struct req *q, const char *msg_id)
{
    struct buf text, all;
    long n = q->chunks, i;

    buf_init(&text, MOCK_MAX_PAD + 64);
    buf_init(&all, MOCK_OUT_LIMIT);
    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID)
        n = 2;
    if (send_head(q, 200, "text/event-stream", -1, NULL, 0) != 0)
        goto out;
    if (send_named_event(q, "response.created", json_pack(
            "{s:o}", "response", response_new(q, msg_id, NULL))) != 0
        || send_named_event(q, "response.in_progress", json_pack(
            "{s:o}", "response", response_new(q, msg_id, NULL))) != 0
        || send_named_event(q, "response.output_item.added", json_pack(
            "{s:o, s:i}", "item", message_item_new(msg_id, NULL),
            "output_index", 0)) != 0
        || send_named_event(q, "response.content_part.added", json_pack(
            "{s:i, s:s, s:i, s:{s:[], s:s, s:s, s:[]}}", "content_index", 0,
            "item_id", msg_id, "output_index", 0, "part", "annotations",
            "text", "", "type", "output_text", "logprobs")) != 0)
        goto out;
    for (i = 0; i < n; i++) {
        if (wait_chunk(q, i) != 0)
            goto out;
        buf_reset(&text);
        if (append_chunk_text(q, i, &text) != 0) {
            q->close = 1;
            goto out;
        }
        if (send_named_event(q, "response.output_text.delta", json_pack(
                "{s:i, s:s, s:s, s:[], s:i}", "content_index", 0, "delta",
                buf_ptr(&text), "item_id", msg_id, "logprobs",
                "output_index", 0)) != 0)
            goto out;
    }
    if (fault_mid_stream(q))
        goto out;
    if (joined_text(q, q->chunks, &all) != 0) {
        q->close = 1;
        goto out;
    }
    if (send_named_event(q, "response.output_text.done", json_pack(
            "{s:i, s:s, s:[], s:i, s:s}", "content_index", 0, "item_id",
            msg_id, "logprobs", "output_index", 0, "text",
            buf_ptr(&all))) != 0
        || send_named_event(q, "response.content_part.done", json_pack(
            "{s:i, s:s, s:i, s:{s:[], s:s, s:s, s:[]}}", "content_index", 0,
            "item_id", msg_id, "output_index", 0, "part", "annotations",
            "text", buf_ptr(&all), "type", "output_text", "logprobs")) != 0
        || send_named_event(q, "response.output_item.done", json_pack(
            "{s:o, s:i}", "item", message_item_new(msg_id, buf_ptr(&all)),
            "output_index", 0)) != 0
        || send_named_event(q, "response.completed", json_pack(
            "{s:o}", "response", response_new(q, msg_id,
                                              buf_ptr(&all)))) != 0)
        goto out;
    if (write_end(q) == 0
        && !json_is_false(json_object_get(q->json, "store")))
        store_response(q->id);

out:
    buf_release(&text);
    buf_release(&all);
}

/*
 * POST /v1/responses: the text of a completion (max_output_tokens caps
 * it) as a response object, streamed or not; with store (the default)
 * its id is kept, and a previous_response_id that was not stored is a
 * 404, as vLLM answers it.
 */
static void
answer_response(struct req *q)
{
    const json_t *prev = json_object_get(q->json, "previous_response_id");
    char msg_id[4 + 33], err[MOCK_ID_MAX + 64];
    struct buf text;

    if (json_is_string(prev) && !response_stored(json_string_value(prev))) {
        snprintf(err, sizeof(err), "Response with id '%.*s' not found.",
                 MOCK_ID_MAX, json_string_value(prev));
        send_error(q, 404, err, "previous_response_id", NULL);
        return;
    }
    memcpy(msg_id, "msg_", 4);
    gw_random_hex(msg_id + 4, 32);
    if (q->stream) {
        stream_response(q, msg_id);
        return;
    }
    if (wait_client(q, (int64_t)q->chunks * q->delay_ms) != 0)
        return;
    buf_init(&text, MOCK_OUT_LIMIT);
    if (joined_text(q, q->chunks, &text) != 0) {
        send_error(q, 500, "mock: the response is too big", NULL,
                   "response_too_big");
    } else {
        send_json(q, 200, response_new(q, msg_id, buf_ptr(&text)), 0);
        if (q->status == 200 && !q->gone
            && !json_is_false(json_object_get(q->json, "store")))
            store_response(q->id);
    }
    buf_release(&text);
}

/* A token id for piece 'i' of a prompt hashed to 'h'. */
static json_int_t
token_at(uint64_t h, long i)
{
    return (json_int_t)(mix64(h ^ mix64((uint64_t)i)) % 32000);
}

/* POST /tokenize: one token per word of the prompt (or messages). */
static void
answer_tokenize(struct req *q)
{
    json_t *tokens = json_array();
    long i;

    for (i = 0; tokens != NULL && i < q->prompt_tokens; i++)
        if (json_array_append_new(tokens,
                                  json_integer(token_at(q->hash, i))) != 0) {
            json_decref(tokens);
            tokens = NULL;
        }
    send_json(q, 200, json_pack("{s:I, s:i, s:o, s:n}", "count",
                                (json_int_t)q->prompt_tokens,
                                "max_model_len", 4096, "tokens", tokens,
                                "token_strs"), 0);
}

/* POST /detokenize: a word per token id ("tokens", an array of them). */
static void
answer_detokenize(struct req *q)
{
    const json_t *tokens = json_object_get(q->json, "tokens");
    struct buf *b = &q->c->out;
    size_t i;
    int rc = 0;

    if (!json_is_array(tokens)) {
        send_error(q, 400, "tokens must be an array of token ids", "tokens",
                   NULL);
        return;
    }
    buf_reset(b);
    for (i = 0; rc == 0 && i < json_array_size(tokens); i++) {
        const json_t *t = json_array_get(tokens, i);

        if (!json_is_integer(t) || json_integer_value(t) < 0) {
            send_error(q, 400, "tokens must be an array of token ids",
                       "tokens", NULL);
            return;
        }
        rc = buf_printf(b, "%s%s", i > 0 ? " " : "",
                        words[json_integer_value(t)
                              % (json_int_t)GW_ARRAY_LEN(words)]);
    }
    if (rc == 0)
        rc = buf_append(b, "", 1);
    if (rc != 0) {
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
        return;
    }
    /* json_pack copies the text before send_json() reuses the buffer. */
    send_json(q, 200, json_pack("{s:s}", "prompt", buf_ptr(b)), 0);
}

/* A relevance in [0, 1) of text 'b' to text 'a', from their hashes. */
static double
relevance(const json_t *a, const json_t *b)
{
    uint64_t h = GW_FNV1A64_OFFSET;

    if (a != NULL)
        json_dump_callback(a, dump_to_hash, &h,
                           JSON_COMPACT | JSON_ENCODE_ANY);
    h = mix64(h);
    if (b != NULL)
        json_dump_callback(b, dump_to_hash, &h,
                           JSON_COMPACT | JSON_ENCODE_ANY);
    return (double)(mix64(h) % 1000000) / 1e6;
}

/*
 * POST /v1/rerank (/rerank, /v2/rerank): "query" and "documents"; the
 * results by relevance, highest first, "top_n" of them; usage as vLLM's
 * RerankUsage, total_tokens alone.
 */
static void
answer_rerank(struct req *q)
{
    const json_t *query = json_object_get(q->json, "query");
    const json_t *docs = json_object_get(q->json, "documents");
    const json_t *top = json_object_get(q->json, "top_n");
    json_t *results = json_array(), *r;
    size_t n = json_array_size(docs), i, j, want = n;
    double score[64];
    size_t order[64];

    if (!json_is_array(docs) || n == 0 || n > GW_ARRAY_LEN(order)) {
        json_decref(results);
        send_error(q, 400, "documents must be an array of 1 to 64 texts",
                   "documents", NULL);
        return;
    }
    if (json_is_integer(top) && json_integer_value(top) > 0
        && (size_t)json_integer_value(top) < n)
        want = (size_t)json_integer_value(top);
    for (i = 0; i < n; i++) {
        score[i] = relevance(query, json_array_get(docs, i));
        for (j = i; j > 0 && score[order[j - 1]] < score[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (i = 0; results != NULL && i < want; i++) {
        const json_t *d = json_array_get(docs, order[i]);

        r = json_pack("{s:I, s:{s:O}, s:f}", "index",
                      (json_int_t)order[i], "document", "text", d,
                      "relevance_score", score[order[i]]);
        if (json_array_append_new(results, r) != 0) {
            json_decref(results);
            results = NULL;
        }
    }
    send_json(q, 200, json_pack("{s:s, s:s, s:{s:I}, s:o}", "id", q->id,
                                "model", q->model, "usage", "total_tokens",
                                (json_int_t)q->prompt_tokens, "results",
                                results), JSON_REAL_PRECISION(6));
}

/*
 * POST /v1/score (/score): "text_1" against "text_2", a text or an array
 * of them (one score per pair).
 */
static void
answer_score(struct req *q)
{
    const json_t *t1 = json_object_get(q->json, "text_1");
    const json_t *t2 = json_object_get(q->json, "text_2");
    size_t n = json_is_array(t2) ? json_array_size(t2) : 1, i;
    json_t *data = json_array();

    if (t1 == NULL || t2 == NULL || n == 0) {
        json_decref(data);
        send_error(q, 400, "text_1 and text_2 are required", "text_2",
                   NULL);
        return;
    }
    for (i = 0; data != NULL && i < n; i++) {
        const json_t *a = json_is_array(t1) ? json_array_get(t1, i) : t1;
        const json_t *b = json_is_array(t2) ? json_array_get(t2, i) : t2;

        if (json_array_append_new(data, json_pack(
                "{s:I, s:s, s:f}", "index", (json_int_t)i, "object", "score",
                "score", relevance(a, b))) != 0) {
            json_decref(data);
            data = NULL;
        }
    }
    send_json(q, 200, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id",
                                q->id, "object", "list", "created",
                                q->created, "model", q->model, "data", data,
                                "usage", usage_new(q, 0)),
              JSON_REAL_PRECISION(6));
}

/* POST /pooling: the pooled hidden state of "input", as an embedding. */
static void
answer_pooling(struct req *q)
{
    const json_t *in = json_object_get(q->json, "input");
    uint64_t h = GW_FNV1A64_OFFSET;

    if (in != NULL)
        json_dump_callback(in, dump_to_hash, &h,
                           JSON_COMPACT | JSON_ENCODE_ANY);
    send_json(q, 200, json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:o}], "
                                "s:o}", "id", q->id, "object", "list",
                                "created", q->created, "model", q->model,
                                "data", "index", 0, "object", "pooling",
                                "data", embedding_new(h), "usage",
                                usage_new(q, 0)), JSON_REAL_PRECISION(6));
}

/*
 * POST /v1/audio/transcriptions and /translations: the text of a
 * completion; {"text":...,"usage":{"type":"duration","seconds":S}} (vLLM's
 * TranscriptionResponse), response_format "text" as text/plain, or with
 * stream a chunk stream like a completion's (stream_include_usage for
 * its usage chunk).
 */
static void
answer_audio(struct req *q)
{
    const char *format = json_string_value(json_object_get(
                             q->json, "response_format"));
    struct buf text;

    if (q->stream) {
        stream_completion(q);
        return;
    }
    if (wait_client(q, (int64_t)q->chunks * q->delay_ms) != 0)
        return;
    buf_init(&text, MOCK_OUT_LIMIT);
    if (joined_text(q, q->chunks, &text) != 0)
        send_error(q, 500, "mock: the text is too big", NULL,
                   "response_too_big");
    else if (format != NULL && strcmp(format, "text") == 0)
        send_simple(q, 200, "text/plain; charset=utf-8", buf_ptr(&text),
                    buf_len(&text));
    else
        send_json(q, 200, json_pack("{s:s, s:{s:s, s:I}}", "text",
                                    buf_ptr(&text), "usage", "type",
                                    "duration", "seconds",
                                    (json_int_t)(1 + q->audio_bytes
                                                 / 32000)), 0);
    buf_release(&text);
}

/* The form fields an upload's answer and the knobs read, with their type. */
static const struct {
    const char *name;
    char type;                  /* 's' string, 'i' integer, 'b' boolean */
} form_fields[] = {
    { "model", 's' }, { "language", 's' }, { "prompt", 's' },
    { "response_format", 's' }, { "stream", 'b' },
    { "stream_include_usage", 'b' }, { "mock_hold", 's' },
    { "mock_fault", 's' }, { "mock_status", 'i' }, { "mock_chunks", 'i' },
    { "mock_first_ms", 'i' }, { "mock_delay_ms", 'i' },
};

/*
 * An upload's body as the JSON object the rest of the mock reads: its
 * fields (form_fields) converted, and the file's size in q->audio_bytes.
 * A malformed form, or one without a file, is answered with a 400 (as
 * vLLM's form parsing would refuse it).  Returns 0, or GW_EINVAL after
 * the answer.
 */
static int
read_form(struct req *q)
{
    const struct http_header *h = http_find_header(q->r, "Content-Type");
    const char *body = buf_ptr(&q->c->body), *why = "", *v;
    size_t n = buf_len(&q->c->body), blen, vlen, i;
    char boundary[MULTIPART_MAX_BOUNDARY + 1], num[24];
    json_t *val;
    int rc;

    if (h == NULL || multipart_boundary(h->value, h->value_len, boundary,
                                        &blen, &why) != 0) {
        send_error(q, 400, h == NULL ? "no Content-Type" : why, NULL,
                   "invalid_multipart");
        return GW_EINVAL;
    }
    rc = multipart_find(body, n, boundary, blen, "file", &v, &vlen, &why);
    if (rc != 0) {
        send_error(q, 400, rc == GW_ENOTFOUND ? "the form has no file" : why,
                   "file", "invalid_multipart");
        return GW_EINVAL;
    }
    q->audio_bytes = (long)vlen;
    q->json = json_object();
    for (i = 0; q->json != NULL && i < GW_ARRAY_LEN(form_fields); i++) {
        if (multipart_find(body, n, boundary, blen, form_fields[i].name, &v,
                           &vlen, &why) != 0)
            continue;
        if (form_fields[i].type == 'b') {
            val = json_boolean(vlen == 4 && memcmp(v, "true", 4) == 0);
        } else if (form_fields[i].type == 'i' && vlen < sizeof(num)) {
            memcpy(num, v, vlen);
            num[vlen] = '\0';
            val = json_integer(strtoll(num, NULL, 10));
        } else {
            val = json_stringn(v, vlen);
        }
        if (json_object_set_new(q->json, form_fields[i].name, val) != 0) {
            json_decref(q->json);
            q->json = NULL;
        }
    }
    if (q->json == NULL) {
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
        return GW_EINVAL;
    }
    return 0;
}

/*
 * The POST routes (/v1/chat/completions, /v1/completions, /v1/embeddings
 * and the others vLLM serves): parse the body (an upload's form, else a
 * JSON object), then hold, delay, fail or answer as the knobs say.
 */
static void
handle_v1_post(struct req *q)
{
    char err[256], msg[MOCK_MAX_TAG + 64];
    const char *param = NULL;
    int rc;

    lock();
    st.in_progress++;
    if (is_completion(q->route))
        st.completing++;
    unlock();
    if (is_audio(q->route)) {
        if (read_form(q) != 0)
            goto out;
    } else {
        rc = jsonx_parse_object(buf_ptr(&q->c->body), buf_len(&q->c->body),
                                JSONX_MAX_DEPTH, &q->json, err, sizeof(err));
        if (rc != 0) {
            send_error(q, 400, err, NULL, "invalid_json");
            goto out;
        }
    }
    if (read_knobs(q, err, sizeof(err), &param) != 0) {
        send_error(q, 400, err, param, "invalid_mock_knob");
        goto out;
    }
    read_params(q);
    if (is_completion(q->route))
        note_prefix(q);

    if (q->hold != NULL) {
        rc = hold_wait(q);
        if (rc == GW_ETIMEDOUT) {
            snprintf(msg, sizeof(msg), "mock_hold \"%s\" was not released "
                     "within %d s", q->hold, MOCK_HOLD_MS / 1000);
            send_error(q, 503, msg, "mock_hold", "hold_timeout");
        }
        if (rc != 0)
            goto out;
    }
    if (is_completion(q->route)) {
        long every, ms, force, retry_after, poison_status;
        char poison[MOCK_MAX_TAG + 1];
        enum fault fault;
        uint64_t seq;

        lock();
        seq = ++st.completion_seq;
        every = st.slow_every;
        ms = st.slow_ms;
        force = st.force_status;
        retry_after = st.force_retry_after;
        fault = (enum fault)st.force_fault;
        memcpy(poison, st.poison, sizeof(poison));
        poison_status = st.poison_status;
        unlock();
        if (every > 0 && seq % (uint64_t)every == 0)
            q->first_ms += ms;
        if (poison[0] != '\0' && q->mock_status == 0
            && memmem(buf_ptr(&q->c->body), buf_len(&q->c->body), poison,
                      strlen(poison)) != NULL)
            q->mock_status = poison_status;
        if (force != 0 && q->mock_status == 0) {
            q->mock_status = force;
            q->retry_after = retry_after;
        }
        if (q->fault == FAULT_NONE)
            q->fault = fault;
    }
    if (q->first_ms > 0 && wait_client(q, q->first_ms) != 0)
        goto out;

    if (q->fault == FAULT_RESET) {
        /* SO_LINGER 0: close() sends a TCP RST instead of a FIN. */
        struct linger lg = { 1, 0 };

        setsockopt(q->c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        q->close = 1;
        goto out;
    }
    if (q->fault == FAULT_STALL) {
        stall(q);
        goto out;
    }
    if (q->mock_status >= 400) {
        snprintf(msg, sizeof(msg), "mock_status %ld requested",
                 q->mock_status);
        send_error(q, (int)q->mock_status, msg, NULL, "mock_status");
        goto out;
    }
    if (is_completion(q->route) && engine != NULL && enter_engine(q) != 0)
        goto out;
    switch (q->route) {
    case R_EMBED:
        answer_embeddings(q);
        break;
    case R_RESPONSES:
        answer_response(q);
        break;
    case R_TOKENIZE:
        answer_tokenize(q);
        break;
    case R_DETOKENIZE:
        answer_detokenize(q);
        break;
    case R_RERANK:
        answer_rerank(q);
        break;
    case R_SCORE:
        answer_score(q);
        break;
    case R_POOLING:
        answer_pooling(q);
        break;
    case R_TRANSCRIBE:
    case R_TRANSLATE:
        answer_audio(q);
        break;
    default:
        if (q->stream)
            stream_completion(q);
        else
            answer_completion(q);
        break;
    }

out:
    engine_seq_free(engine, q->seq);    /* out of the engine, wherever */
    q->seq = NULL;
    lock();
    st.in_progress--;
    if (is_completion(q->route))
        st.completing--;
    if (q->gone)
        st.aborted++;
    unlock();
}

/* GET /v1/models: the -m models, in vLLM's shape. */
static void
handle_models(struct req *q)
{
    json_t *data = json_array();
    size_t i;

    for (i = 0; data != NULL && i < opt.num_models; i++)
        json_array_append_new(data, json_pack(
            "{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", opt.models[i],
            "object", "model", "created", (json_int_t)time(NULL),
            "owned_by", "vllm", "root", opt.models[i], "parent",
            "max_model_len", 4096));
    send_json(q, 200, json_pack("{s:s, s:o}", "object", "list", "data",
                                data), 0);
}

/* GET /health: 200 with an empty body as vLLM's, or /control's status. */
static void
handle_health(struct req *q)
{
    long status;

    lock();
    status = st.health_status;
    unlock();
    if (status == 0)
        send_simple(q, 200, NULL, "", 0);
    else
        send_error(q, (int)status, "health status set by /control", NULL,
                   "mock_control");
}

/* One query parameter as a long in [lo, hi]; absent leaves *out. */
static int
control_param(struct req *q, const char *name, long lo, long hi, long *out)
{
    char v[32];
    long n;

    if (query_param(q->r, name, v, sizeof(v)) != 0 || v[0] == '\0')
        return 0;
    if (gw_parse_long(v, lo, hi, &n) != 0)
        return GW_EINVAL;
    *out = n;
    return 0;
}

/*
 * POST /control?status=S&retry_after=N&health=S&slow_every=N&slow_ms=MS
 * &fault=F&poison=MARKER&poison_status=S&metrics=on|old|off
 * &metrics_delay_ms=MS: change how this instance answers from now on
 * (docs/MOCK_UPSTREAM.md).
 */
static void
handle_control(struct req *q)
{
    long status, retry_after, health, every, ms, poison_status;
    long metrics_delay;
    char name[32], poison[MOCK_MAX_TAG + 1], mode_name[8];
    enum fault fault;
    size_t i;
    int bad = 0, rc, mode;

    lock();
    status = st.force_status;
    retry_after = st.force_retry_after;
    health = st.health_status;
    every = st.slow_every;
    ms = st.slow_ms;
    fault = (enum fault)st.force_fault;
    memcpy(poison, st.poison, sizeof(poison));
    poison_status = st.poison_status;
    mode = st.metrics_mode;
    metrics_delay = st.metrics_delay_ms;
    unlock();
    rc = query_param(q->r, "metrics", mode_name, sizeof(mode_name));
    bad |= rc != 0 && rc != GW_EINVAL;
    if (rc == 0) {
        for (i = 0; i < GW_ARRAY_LEN(metrics_modes)
                    && strcmp(mode_name, metrics_modes[i]) != 0; i++)
            ;
        bad |= i == GW_ARRAY_LEN(metrics_modes);
        mode = (int)i;
    }
    if (query_param(q->r, "fault", name, sizeof(name)) == 0) {
        fault = FAULT_NONE;
        for (i = 1; i < GW_ARRAY_LEN(fault_names); i++)
            if (strcmp(name, fault_names[i]) == 0)
                fault = (enum fault)i;
        bad |= fault == FAULT_NONE && strcmp(name, "none") != 0;
    }
    /* An empty marker turns it off.  Printable ASCII only: it is
     * matched with memmem() and echoed in the JSON answer. */
    rc = query_param(q->r, "poison", poison, sizeof(poison));
    bad |= rc != 0 && rc != GW_EINVAL;
    for (i = 0; rc == 0 && poison[i] != '\0'; i++)
        bad |= poison[i] < 0x20 || poison[i] > 0x7e;
    bad |= control_param(q, "status", 0, 599, &status);
    bad |= control_param(q, "retry_after", 0, 3600, &retry_after);
    bad |= control_param(q, "health", 0, 599, &health);
    bad |= control_param(q, "slow_every", 0, 1000000, &every);
    bad |= control_param(q, "slow_ms", 0, MOCK_MAX_MS, &ms);
    bad |= control_param(q, "poison_status", 400, 599, &poison_status);
    bad |= control_param(q, "metrics_delay_ms", 0, MOCK_MAX_MS,
                         &metrics_delay);
    if (bad || (status != 0 && status < 200)
        || (health != 0 && health < 200)) {
        send_error(q, 400, "use POST /control?status=S&retry_after=N&"
                   "health=S&slow_every=N&slow_ms=MS&fault=F&poison=M&"
                   "poison_status=P&metrics=on|old|off&metrics_delay_ms=MS "
                   "(S 0 or 200..599, F a mock_fault or none, M at most 256 "
                   "printable ASCII bytes, P 400..599)", NULL,
                   "invalid_control");
        return;
    }
    lock();
    st.force_status = status;
    st.force_retry_after = retry_after;
    st.health_status = health;
    st.slow_every = every;
    st.slow_ms = ms;
    st.force_fault = (int)fault;
    memcpy(st.poison, poison, sizeof(poison));
    st.poison_status = poison_status;
    st.metrics_mode = mode;
    st.metrics_delay_ms = metrics_delay;
    unlock();
    send_json(q, 200, json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:s, "
                                "s:i}",
                                "status", (int)status, "retry_after",
                                (int)retry_after, "health", (int)health,
                                "slow_every", (int)every, "slow_ms", (int)ms,
                                "poison", poison, "poison_status",
                                (int)poison_status, "metrics",
                                metrics_modes[mode], "metrics_delay_ms",
                                (int)metrics_delay), 0);
}

/* The 404 of a path the mock does not serve. */
static void
send_not_found(struct req *q)
{
    send_error(q, 404, "no such route on the mock upstream", NULL,
               "not_found");
}

/*
 * GET /metrics: vLLM's series (engine_metrics()), with the engine's
 * numbers or, without the engine, the completions being answered as
 * running and zeros for the rest.  /control's metrics= picks the current
 * names, older vLLM's or a 404; its metrics_delay_ms= makes every answer
 * (the 404 too) wait that long first, watching the client.
 */
static void
handle_metrics(struct req *q)
{
    struct buf *b = &q->c->out;
    struct engine_stats s;
    long delay;
    int mode;

    memset(&s, 0, sizeof(s));
    lock();
    mode = st.metrics_mode;
    delay = st.metrics_delay_ms;
    s.running = st.completing;
    unlock();
    if (delay > 0 && wait_client(q, delay) != 0)
        return;
    if (mode == METRICS_OFF) {
        send_not_found(q);
        return;
    }
    if (engine != NULL)
        engine_snapshot(engine, &s);
    else
        s.created = start_time;
    buf_reset(b);
    if (engine_metrics(b, &s, opt.num_models > 0 ? opt.models[0]
                                                 : MOCK_MODEL,
                       mode == METRICS_OLD ? ENGINE_NAMES_OLD
                                           : ENGINE_NAMES_CURRENT) != 0) {
        send_error(q, 500, "mock: cannot build the response", NULL,
                   "internal_error");
        return;
    }
    send_simple(q, 200, MOCK_METRICS_TYPE, buf_ptr(b), buf_len(b));
}

/* FNV-1a over the prompt's text, as a prefix of opt.prefix_bytes. */
struct prefix_hash {
    uint64_t h;
    long left;
};

static void
prefix_feed(struct prefix_hash *px, const char *p, size_t n)
{
    if ((size_t)px->left < n)
        n = (size_t)px->left;
    px->h = gw_fnv1a64(px->h, p, n);
    px->left -= (long)n;
}

/*
 * Has this instance seen the request's prompt prefix before?  Counts a
 * hit or a miss, the way vLLM's prefix cache would see it: the leading
 * opt.prefix_bytes of the chat messages' contents in order, or of the
 * prompt.  A request with neither is not counted.
 */
static void
note_prefix(const struct req *q)
{
    const json_t *msgs = json_object_get(q->json, "messages");
    const json_t *prompt = json_object_get(q->json, "prompt");
    struct prefix_hash px = { GW_FNV1A64_OFFSET, opt.prefix_bytes };
    const json_t *m;
    size_t i, slot;
    int hit = 0;

    if (json_is_array(msgs)) {
        json_array_foreach(msgs, i, m) {
            const json_t *c = json_object_get(m, "content");

            if (json_is_string(c))
                prefix_feed(&px, json_string_value(c), json_string_length(c));
        }
    } else if (json_is_string(prompt)) {
        prefix_feed(&px, json_string_value(prompt),
                    json_string_length(prompt));
    } else {
        return;
    }
    if (px.h == 0)
        px.h = 1;               /* 0 marks a free slot */
    lock();
    if (st.prefixes != NULL) {
        for (slot = px.h % MOCK_PREFIX_SLOTS; st.prefixes[slot] != 0;
             slot = (slot + 1) % MOCK_PREFIX_SLOTS) {
            if (st.prefixes[slot] == px.h) {
                hit = 1;
                break;
            }
        }
        if (!hit && st.num_prefixes < MOCK_PREFIX_SLOTS / 2) {
            st.prefixes[slot] = px.h;
            st.num_prefixes++;
        }
    }
    if (hit)
        st.prefix_hits++;
    else
        st.prefix_misses++;
    unlock();
}

/* GET /stats: the counters, copied under the lock and sent without it. */
static void
handle_stats(struct req *q)
{
    uint64_t v[11];
    json_t *hdrs;

    lock();
    v[0] = st.requests;
    v[1] = st.completions;
    v[2] = st.connections_open;
    v[3] = st.connections_total;
    v[4] = st.aborted;
    v[5] = st.in_progress;
    v[6] = st.held;
    v[7] = st.probes;
    v[8] = st.prefix_hits;
    v[9] = st.prefix_misses;
    v[10] = st.gated;
    hdrs = json_deep_copy(st.last_headers);
    unlock();
    send_json(q, 200, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                                "s:I, s:I, s:I, s:o}",
                                "probes", (json_int_t)v[7],
                                "prefix_hits", (json_int_t)v[8],
                                "prefix_misses", (json_int_t)v[9],
                                "requests", (json_int_t)v[0],
                                "completions", (json_int_t)v[1],
                                "connections_open", (json_int_t)v[2],
                                "connections_total", (json_int_t)v[3],
                                "aborted", (json_int_t)v[4],
                                "in_progress", (json_int_t)v[5],
                                "held", (json_int_t)v[6],
                                "gated", (json_int_t)v[10],
                                "last_headers", hdrs), 0);
}

/*
 * GET /recorded: {"requests":[entry, ...],"dropped":N}, the recorded
 * request heads oldest first.  The entries are already JSON text, so the
 * answer is built by copying them, under the lock, into a buffer of its
 * own (up to MOCK_REC_BYTES: more than c->out may hold), which is sent
 * after the lock is dropped.  That holds the lock for one memcpy() of
 * the record: well under a millisecond for a test's few hundred requests,
 * tens of milliseconds for a full 64 MiB one.  Sharing refcounted
 * entries across threads would avoid the copy; it was not worth its
 * subtlety in a mock.
 */
static void
handle_recorded(struct req *q)
{
    const struct rec_entry *e;
    struct buf b;
    char *p;
    uint64_t dropped;
    size_t i;
    int rc;

    buf_init(&b, MOCK_REC_BYTES + MOCK_REC_MAX + 64);
    lock();
    /* One allocation: the entries, their commas and the framing. */
    rc = buf_reserve(&b, st.rec_bytes + st.rec_count + 64, &p);
    if (rc == 0)
        rc = buf_append_str(&b, "{\"requests\":[");
    for (i = 0; rc == 0 && i < st.rec_count; i++) {
        e = &st.rec[(st.rec_head + i) % MOCK_REC_MAX];
        if (i > 0)
            rc = buf_append(&b, ",", 1);
        if (rc == 0)
            rc = buf_append(&b, e->json, e->len);
    }
    dropped = st.rec_dropped;
    unlock();
    if (rc == 0)
        rc = buf_printf(&b, "],\"dropped\":%" PRIu64 "}", dropped);
    if (rc != 0)
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
    else
        send_simple(q, 200, "application/json", buf_ptr(&b), buf_len(&b));
    buf_release(&b);
}

/* Free the 'count' entries of 'ring' from index 'head', then the ring. */
static void
rec_free(struct rec_entry *ring, size_t head, size_t count)
{
    size_t i;

    if (ring == NULL)
        return;
    for (i = 0; i < count; i++)
        gw_free(ring[(head + i) % MOCK_REC_MAX].json);
    gw_free(ring);
}

/*
 * POST /stats/reset: zero the counters, forget released tags,
 * last_headers and the request record, and empty the engine's prefix
 * cache and zero its counters.  The gauges (connections_open,
 * in_progress, held, the engine's) describe the present and stay.  The
 * old record is swapped out under the lock and freed after it.
 */
static void
handle_reset(struct req *q)
{
    json_t *fresh = json_object(), *old;
    struct rec_entry *ring = gw_calloc(MOCK_REC_MAX, sizeof(*ring));
    struct rec_entry *old_ring;
    size_t old_head, old_count;

    if (fresh == NULL || ring == NULL) {
        json_decref(fresh);
        gw_free(ring);
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
        return;
    }
    lock();
    st.requests = 0;
    st.completions = 0;
    st.connections_total = 0;
    st.aborted = 0;
    st.probes = 0;
    st.prefix_hits = 0;
    st.prefix_misses = 0;
    st.completion_seq = 0;
    memset(st.prefixes, 0, MOCK_PREFIX_SLOTS * sizeof(*st.prefixes));
    st.num_prefixes = 0;
    st.stored_next = st.stored_count = 0;
    json_object_clear(st.released);
    json_object_clear(st.gates);
    old = st.last_headers;
    st.last_headers = fresh;
    old_ring = st.rec;
    old_head = st.rec_head;
    old_count = st.rec_count;
    st.rec = ring;
    st.rec_head = 0;
    st.rec_count = 0;
    st.rec_bytes = 0;
    st.rec_dropped = 0;
    unlock();
    if (engine != NULL)
        engine_reset(engine);   /* its own lock, never under st.mu */
    json_decref(old);
    rec_free(old_ring, old_head, old_count);
    send_json(q, 200, json_pack("{s:b}", "reset", 1), 0);
}

static int
hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Find 'name' in the query of 'r' and percent-decode its value
 * (form-style: '+' is a space) into out[0..size).
 * Returns 0, GW_EINVAL (absent), GW_EPARSE (bad escape) or GW_ETOOBIG.
 */
static int
query_param(const struct http_request *r, const char *name, char *out,
            size_t size)
{
    const char *p = r->target + r->path_len;
    const char *end = r->target + r->target_len;
    const char *amp;
    size_t nl = strlen(name), k;
    int hi, lo;

    if (p == end || *p != '?')
        return GW_EINVAL;
    for (p++; p < end; p = amp + 1) {
        amp = memchr(p, '&', (size_t)(end - p));
        if (amp == NULL)
            amp = end;
        if ((size_t)(amp - p) <= nl || memcmp(p, name, nl) != 0
            || p[nl] != '=')
            continue;
        for (p += nl + 1, k = 0; p < amp; p++, k++) {
            if (k + 1 >= size)
                return GW_ETOOBIG;
            if (*p == '%') {
                if (amp - p < 3 || (hi = hex_val(p[1])) < 0
                    || (lo = hex_val(p[2])) < 0)
                    return GW_EPARSE;
                out[k] = (char)(hi * 16 + lo);
                p += 2;
            } else {
                out[k] = *p == '+' ? ' ' : *p;
            }
        }
        out[k] = '\0';
        return 0;
    }
    return GW_EINVAL;
}

/* POST /release?tag=T: release every request held on T, now and later. */
static void
handle_release(struct req *q)
{
    char tag[MOCK_MAX_TAG + 1];
    struct holder *h;
    json_int_t n = 0;
    int rc;

    rc = query_param(q->r, "tag", tag, sizeof(tag));
    if (rc != 0 || tag[0] == '\0' || strlen(tag) > MOCK_MAX_TAG) {
        send_error(q, 400, "use POST /release?tag=T with a tag of 1 to 256 "
                   "bytes", "tag", "invalid_tag");
        return;
    }
    lock();
    /* Keys must be UTF-8: a tag that is not cannot match a JSON string. */
    rc = json_object_set_new(st.released, tag, json_true());
    for (h = st.holders; rc == 0 && h != NULL; h = h->next) {
        if (!h->released && strcmp(h->tag, tag) == 0) {
            h->released = 1;
            n++;
        }
    }
    pthread_cond_broadcast(&st.cv);
    unlock();
    if (rc != 0) {
        send_error(q, 400, "tag must be UTF-8", "tag", "invalid_tag");
        return;
    }
    send_json(q, 200, json_pack("{s:I}", "released", n), 0);
}

/*
 * POST /gate?tag=T&chunks=N: requests gated on T (mock_gate) may send
 * their content chunks up to N (now and later requests; it only opens
 * further: a smaller N leaves it as it was).  Answers {"gate": the
 * opening now, "gated": requests waiting at any gate}.
 */
static void
handle_gate(struct req *q)
{
    char tag[MOCK_MAX_TAG + 1], num[24];
    json_int_t open = 0, gated = 0;
    long chunks;
    int rc;

    rc = query_param(q->r, "tag", tag, sizeof(tag));
    if (rc != 0 || tag[0] == '\0' || strlen(tag) > MOCK_MAX_TAG) {
        send_error(q, 400, "use POST /gate?tag=T&chunks=N with a tag of 1 "
                   "to 256 bytes", "tag", "invalid_tag");
        return;
    }
    if (query_param(q->r, "chunks", num, sizeof(num)) != 0
        || gw_parse_long(num, 0, MOCK_MAX_CHUNKS, &chunks) != 0) {
        send_error(q, 400, "use POST /gate?tag=T&chunks=N with N from 0 to "
                   "100000", "chunks", "invalid_chunks");
        return;
    }
    lock();
    open = gate_open_locked(tag);
    rc = 0;
    if (chunks > open) {
        /* Keys must be UTF-8, as /release's. */
        rc = json_object_set_new(st.gates, tag, json_integer(chunks));
        if (rc == 0)
            open = chunks;
    }
    gated = (json_int_t)st.gated;
    pthread_cond_broadcast(&st.cv);
    unlock();
    if (rc != 0) {
        send_error(q, 400, "tag must be UTF-8", "tag", "invalid_tag");
        return;
    }
    send_json(q, 200, json_pack("{s:I, s:I}", "gate", open, "gated", gated),
              0);
}

/*
 * A new JSON string holding p[0..n).  HTTP lets field values carry
 * obs-text (bytes 0x80-0xff, RFC 9110 section 5.5) but JSON strings must
 * be UTF-8, so when p[0..n) is not valid UTF-8 every byte >= 0x80 becomes
 * '?'.  Borrows 'p'.  Returns a new reference, or NULL (out of memory).
 */
static json_t *
lossy_string(const char *p, size_t n)
{
    json_t *s = json_stringn(p, n);
    char *copy;
    size_t i;

    if (s != NULL)
        return s;
    copy = gw_malloc(n + 1);
    if (copy == NULL)
        return NULL;
    for (i = 0; i < n; i++)
        copy[i] = (unsigned char)p[i] >= 0x80 ? '?' : p[i];
    s = json_stringn(copy, n);
    gw_free(copy);
    return s;
}

/*
 * Remember the fields of a /v1 request for /stats, names lower-cased.
 * Repeated fields are joined with ", " (RFC 9110 section 5.3).  Bytes
 * that are not UTF-8 (obs-text) become '?', as lossy_string() says.
 */
static void
record_headers(const struct http_request *r)
{
    json_t *o = json_object(), *old;
    struct buf v;
    char *name = NULL;
    const json_t *prev;
    size_t i, k;
    int rc = o != NULL ? 0 : GW_ENOMEM;

    buf_init(&v, MOCK_MAX_HEAD);
    for (i = 0; rc == 0 && i < r->num_headers; i++) {
        const struct http_header *f = &r->headers[i];

        gw_free(name);
        name = gw_strndup(f->name, f->name_len);
        if (name == NULL) {
            rc = GW_ENOMEM;
            break;
        }
        for (k = 0; name[k] != '\0'; k++)
            if (name[k] >= 'A' && name[k] <= 'Z')
                name[k] = (char)(name[k] - 'A' + 'a');
        buf_reset(&v);
        prev = json_object_get(o, name);
        if (prev != NULL)
            rc = buf_printf(&v, "%s, ", json_string_value(prev));
        if (rc == 0)
            rc = buf_append(&v, f->value, f->value_len);
        if (rc != 0)
            break;
        if (json_object_set_new(o, name, lossy_string(buf_ptr(&v),
                                                      buf_len(&v))) != 0)
            rc = GW_ENOMEM;
    }
    gw_free(name);
    buf_release(&v);
    if (rc != 0) {
        json_decref(o);
        return;                 /* keep the previous ones; only a test aid */
    }
    lock();
    old = st.last_headers;
    st.last_headers = o;
    unlock();
    json_decref(old);
}

/*
 * Record the head of a /v1 request for /recorded: method, target and
 * every field as received, names in their original case, in wire order,
 * repeats kept, values with '?' for bytes that cannot be UTF-8
 * (lossy_string()).  The entry is rendered here, before taking the lock.
 * Past MOCK_REC_MAX entries or MOCK_REC_BYTES of text the oldest are
 * dropped; a head that cannot be rendered (out of memory) counts as
 * dropped too, so "dropped": 0 means the list is complete.
 */
static void
record_request(const struct http_request *r)
{
    const struct http_header *f;
    json_t *fields = json_array(), *o;
    struct rec_entry *e;
    struct buf b;
    char *text = NULL;
    size_t i, len = 0;

    buf_init(&b, MOCK_REC_ENTRY);
    for (i = 0; fields != NULL && i < r->num_headers; i++) {
        f = &r->headers[i];
        /* "o" steals both strings, even when one is NULL and it fails. */
        if (json_array_append_new(fields, json_pack(
                "[o, o]", lossy_string(f->name, f->name_len),
                lossy_string(f->value, f->value_len))) != 0) {
            json_decref(fields);
            fields = NULL;
        }
    }
    o = json_pack("{s:o, s:o, s:o}",
                  "method", lossy_string(r->method, r->method_len),
                  "target", lossy_string(r->target, r->target_len),
                  "headers", fields);
    if (o != NULL && json_dump_callback(o, dump_to_buf, &b,
                                        JSON_COMPACT) == 0)
        text = buf_take(&b, &len);
    json_decref(o);
    buf_release(&b);

    lock();
    if (text == NULL) {
        st.rec_dropped++;
    } else {
        while (st.rec_count > 0 && (st.rec_count == MOCK_REC_MAX
                                    || st.rec_bytes + len > MOCK_REC_BYTES)) {
            e = &st.rec[st.rec_head];
            st.rec_bytes -= e->len;
            gw_free(e->json);
            e->json = NULL;
            st.rec_head = (st.rec_head + 1) % MOCK_REC_MAX;
            st.rec_count--;
            st.rec_dropped++;
        }
        e = &st.rec[(st.rec_head + st.rec_count) % MOCK_REC_MAX];
        e->json = text;
        e->len = len;
        st.rec_count++;
        st.rec_bytes += len;
    }
    unlock();
}

/*
 * One access-log line per request (-q turns them off), but for what a
 * gateway's beats ask on their own all the time (-v logs those too): its
 * health probes (GET /health, GET /v1/models) and its load scrapes (GET
 * /metrics, ten a second by default).  Under 'make run' those buried
 * the completions the demo asks you to watch.
 */
static void
access_log(const struct req *q)
{
    const struct http_request *r = q->r;
    char model[65];

    if (opt.quiet)
        return;
    if (!opt.verbose && (q->route == R_HEALTH || q->route == R_MODELS
                         || q->route == R_METRICS))
        return;
    log_safe(model, sizeof(model), q->model != NULL ? q->model : "-",
             strlen(q->model != NULL ? q->model : "-"));
    log_msg(GW_LOG_INFO, "mock: method=%.*s path=%.*s model=%s stream=%d "
            "status=%d chunks=%ld bytes=%" PRIu64 " ms=%" PRId64 "%s%s%s",
            r->method != NULL ? (int)r->method_len : 1,
            r->method != NULL ? r->method : "-",
            r->path != NULL ? (int)r->path_len : 1,
            r->path != NULL ? r->path : "-", model, q->stream, q->status,
            q->json != NULL ? q->chunks : 0L, q->bytes,
            (gw_now_us() - q->t0_us) / 1000,
            q->fault != FAULT_NONE ? " fault=" : "", fault_names[q->fault],
            q->gone ? " aborted=1" : "");
}

static void
req_init(struct req *q, struct conn *c, struct http_request *r)
{
    memset(q, 0, sizeof(*q));
    q->c = c;
    q->r = r;
    q->close = !r->keep_alive;
    q->chunked = r->minor >= 1;
    q->head_only = r->method != NULL && view_eq(r->method, r->method_len,
                                                "HEAD");
    q->t0_us = gw_now_us();
}

/* Answer a head that could not be parsed; the connection then closes. */
static void
refuse(struct conn *c, struct http_request *r)
{
    struct req q;

    req_init(&q, c, r);
    q.close = 1;
    c->linger = 1;
    count_conn(c);
    count(&st.requests, 1);
    send_error(&q, r->error_status,
               r->error_msg != NULL ? r->error_msg : "bad request", NULL,
               "invalid_request");
    access_log(&q);
}

/* Which route, by path then method; sets q->allow for a 405. */
static void
route_find(struct req *q, int *control)
{
    const struct http_request *r = q->r;
    size_t i;

    q->route = R_NOT_FOUND;
    *control = 0;
    for (i = 0; i < GW_ARRAY_LEN(routes); i++) {
        if (!view_eq(r->path, r->path_len, routes[i].path))
            continue;
        *control = routes[i].control;
        if (view_eq(r->method, r->method_len, routes[i].method)) {
            q->route = routes[i].route;
        } else {
            q->route = R_BAD_METHOD;
            q->allow = routes[i].method;
        }
        return;
    }
}

/*
 * Serve one request whose head is parsed: read its body, answer it.
 * Returns 1 when the connection must close afterwards, else 0.
 */
static int
handle_request(struct conn *c, struct http_request *r)
{
    const struct http_header *h;
    struct req q;
    char rid[65];
    int control, rc;

    req_init(&q, c, r);
    h = http_find_header(r, "x-request-id");
    if (h != NULL) {
        log_safe(rid, sizeof(rid), h->value, h->value_len);
        log_set_request_id(rid);
    }
    route_find(&q, &control);
    if (control == 0) {
        count_conn(c);
        lock();
        st.requests++;
        if (q.route == R_CHAT || q.route == R_TEXT)
            st.completions++;
        unlock();
    } else if (control == 2) {
        count(&st.probes, 1);
    }
    if (control == 0) {
        record_headers(r);
        record_request(r);
    }

    buf_reset(&c->body);
    if (r->body_kind != HTTP_BODY_NONE) {
        /* RFC 9110 10.1.1: a client that asked may wait for this. */
        if (r->expect_continue && r->minor >= 1
            && net_write_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25,
                             gw_now_ms() + MOCK_SEND_MS, -1) != 0) {
            q.close = 1;
            goto out;
        }
        rc = http_read_body(&c->stream, &c->in, r, &c->body,
                            gw_now_ms() + MOCK_BODY_MS, -1);
        if (rc != 0) {
            q.close = 1;        /* the framing is lost */
            c->linger = 1;
            if (r->error_status != 0)
                send_error(&q, r->error_status,
                           r->error_msg != NULL ? r->error_msg
                                                : "bad request body",
                           NULL, "invalid_request");
            goto out;
        }
    }

    switch (q.route) {
    case R_CHAT:
    case R_TEXT:
    case R_EMBED:
    case R_RESPONSES:
    case R_TOKENIZE:
    case R_DETOKENIZE:
    case R_RERANK:
    case R_SCORE:
    case R_POOLING:
    case R_TRANSCRIBE:
    case R_TRANSLATE:
        handle_v1_post(&q);
        break;
    case R_MODELS:
        handle_models(&q);
        break;
    case R_HEALTH:
        handle_health(&q);
        break;
    case R_CONTROL:
        handle_control(&q);
        break;
    case R_STATS:
        handle_stats(&q);
        break;
    case R_RECORDED:
        handle_recorded(&q);
        break;
    case R_RESET:
        handle_reset(&q);
        break;
    case R_RELEASE:
        handle_release(&q);
        break;
    case R_GATE:
        handle_gate(&q);
        break;
    case R_BAD_METHOD:
        send_error(&q, 405, "method not allowed on this route", NULL,
                   "method_not_allowed");
        break;
    case R_METRICS:
        handle_metrics(&q);
        break;
    case R_NOT_FOUND:
        send_not_found(&q);
        break;
    }

out:
    access_log(&q);
    log_set_request_id(NULL);
    json_decref(q.json);
    return q.close;
}

/*
 * Close after an error answer while the client may still be sending (a
 * refused head, a body not read to its end).  Closing a socket that holds
 * unread input sends an RST, and the client's kernel may then drop our
 * answer before the client reads it (RFC 9112 section 9.6).  So half-close
 * and discard input until the client closes, MOCK_LINGER_MS pass or
 * MOCK_LINGER_BYTES arrive.
 */
static void
linger_close(int fd)
{
    int64_t deadline = gw_now_ms() + MOCK_LINGER_MS;
    char sink[4096];
    size_t n, total = 0;

    shutdown(fd, SHUT_WR);
    while (total < MOCK_LINGER_BYTES
           && net_read(fd, sink, sizeof(sink), deadline, -1, &n) == 0)
        total += n;
    close(fd);
}

static void
conn_free(struct conn *c)
{
    if (c == NULL)
        return;
    buf_release(&c->in);
    buf_release(&c->head);
    buf_release(&c->body);
    buf_release(&c->hdr);
    buf_release(&c->out);
    gw_free(c);
}

/* A connection thread: requests until close, error or idle timeout. */
static void *
conn_main(void *arg)
{
    struct conn *c = arg;
    struct http_request r;
    int rc;

    for (;;) {
        memset(&r, 0, sizeof(r));
        buf_compact(&c->in);
        rc = http_read_head(&c->stream, &c->in, &c->head, MOCK_MAX_HEAD,
                            gw_now_ms() + MOCK_IDLE_MS, MOCK_HEADER_MS, -1,
                            -1, &r);
        if (rc != 0) {
            /* A close or idle timeout between requests is no error. */
            if (r.error_status != 0)
                refuse(c, &r);
            break;
        }
        if (handle_request(c, &r) != 0)
            break;
    }
    if (c->linger)
        linger_close(c->fd);
    else
        close(c->fd);
    if (c->counted)
        count(&st.connections_open, -1);
    conn_free(c);
    return NULL;
}

/* Hand the accepted socket 'fd' to a new detached thread. */
static void
spawn(int fd, const pthread_attr_t *attr)
{
    struct conn *c;
    pthread_t tid;
    int err;

    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        log_msg(GW_LOG_ERROR, "mock: out of memory for a connection");
        close(fd);
        return;
    }
    c->fd = fd;
    net_stream_init(&c->stream, fd);
    buf_init(&c->in, MOCK_IN_LIMIT);
    buf_init(&c->head, MOCK_MAX_HEAD);
    buf_init(&c->body, MOCK_MAX_BODY);
    buf_init(&c->hdr, MOCK_HDR_LIMIT);
    buf_init(&c->out, MOCK_OUT_LIMIT);
    err = pthread_create(&tid, attr, conn_main, c);
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_create");
        close(fd);
        conn_free(c);
    }
}

static int
state_init(void)
{
    pthread_condattr_t ca;
    int err;

    err = pthread_mutex_init(&st.mu, NULL);
    if (err == 0)
        err = pthread_condattr_init(&ca);
    if (err == 0) {
        /* Hold deadlines are monotonic; a clock step must not move them. */
        err = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (err == 0)
            err = pthread_cond_init(&st.cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread init");
        return GW_EIO;
    }
    st.released = json_object();
    st.gates = json_object();
    st.last_headers = json_object();
    st.rec = gw_calloc(MOCK_REC_MAX, sizeof(*st.rec));
    st.prefixes = gw_calloc(MOCK_PREFIX_SLOTS, sizeof(*st.prefixes));
    st.stored = gw_calloc(MOCK_STORED, sizeof(*st.stored));
    if (st.released == NULL || st.gates == NULL || st.last_headers == NULL
        || st.rec == NULL
        || st.prefixes == NULL || st.stored == NULL)
        return GW_ENOMEM;
    st.slow_every = opt.slow_every;
    st.poison_status = 500;
    st.slow_ms = opt.slow_ms;
    return 0;
}

/*
 * Install the handlers and block SIGTERM/SIGINT; OUT *waitmask is the mask
 * the accept loop's ppoll() waits with (the same, with both unblocked).
 */
static int
signals_init(sigset_t *waitmask)
{
    struct sigaction sa;
    sigset_t block;
    int err;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGPIPE, &sa, NULL) == -1)
        return GW_EIO;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;            /* no SA_RESTART: ppoll must return EINTR */
    if (sigaction(SIGTERM, &sa, NULL) == -1
        || sigaction(SIGINT, &sa, NULL) == -1)
        return GW_EIO;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    err = pthread_sigmask(SIG_BLOCK, &block, waitmask);
    if (err != 0)
        return GW_EIO;
    sigdelset(waitmask, SIGTERM);
    sigdelset(waitmask, SIGINT);
    return 0;
}

/* Parse the command line into 'opt'; returns -1 to go on, else an exit. */
static int
parse_args(int argc, char **argv)
{
    int ch;

    char *colon, *tok, *save = NULL, err[256];

    engine_params_init(&opt.engine_params);
    while ((ch = getopt(argc, argv, "l:n:f:d:m:s:p:eE:qvh")) != -1) {
        switch (ch) {
        case 'e':
            opt.engine = 1;
            break;
        case 'E':
            opt.engine = 1;
            if (engine_params_parse(&opt.engine_params, optarg, err,
                                    sizeof(err)) != 0) {
                fprintf(stderr, "mock_upstream: %s\n", err);
                return 2;
            }
            break;
        case 'l':
            opt.listen = optarg;
            break;
        case 'm':
            opt.num_models = 0;
            for (tok = strtok_r(optarg, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                if (opt.num_models == MOCK_MAX_MODELS) {
                    fprintf(stderr, "mock_upstream: -m takes at most %d "
                            "models\n", MOCK_MAX_MODELS);
                    return 2;
                }
                opt.models[opt.num_models++] = tok;
            }
            break;
        case 's':
            colon = strchr(optarg, ':');
            if (colon != NULL)
                *colon = '\0';
            if (colon == NULL
                || gw_parse_long(optarg, 1, 1000000, &opt.slow_every) != 0
                || gw_parse_long(colon + 1, 0, MOCK_MAX_MS, &opt.slow_ms)
                   != 0) {
                fprintf(stderr, "mock_upstream: -s wants N:MS, every Nth "
                        "completion waits MS more for its first byte\n");
                return 2;
            }
            break;
        case 'p':
            if (gw_parse_long(optarg, 1, MOCK_MAX_PREFIX, &opt.prefix_bytes)
                != 0) {
                fprintf(stderr, "mock_upstream: -p wants 1..%d bytes\n",
                        MOCK_MAX_PREFIX);
                return 2;
            }
            break;
        case 'n':
            if (gw_parse_long(optarg, 0, MOCK_MAX_CHUNKS, &opt.chunks) != 0) {
                fprintf(stderr, "mock_upstream: -n wants 0..%d\n",
                        MOCK_MAX_CHUNKS);
                return 2;
            }
            break;
        case 'f':
        case 'd':
            if (gw_parse_long(optarg, 0, MOCK_MAX_MS,
                           ch == 'f' ? &opt.first_ms : &opt.delay_ms) != 0) {
                fprintf(stderr, "mock_upstream: -%c wants 0..%d ms\n", ch,
                        MOCK_MAX_MS);
                return 2;
            }
            break;
        case 'q':
            opt.quiet = 1;
            break;
        case 'v':
            opt.verbose = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    return -1;
}

int
main(int argc, char **argv)
{
    pthread_attr_t attr;
    struct pollfd pfd;
    sigset_t waitmask;
    uint16_t port = 0;
    int lfd = -1, cfd, rc, n, err;

    rc = parse_args(argc, argv);
    if (rc >= 0)
        return rc;
    rc = 1;
    start_time = (double)time(NULL);
    json_object_seed(0);        /* before any thread uses jansson */
    if (state_init() != 0 || signals_init(&waitmask) != 0) {
        fprintf(stderr, "mock_upstream: cannot initialise\n");
        return 1;
    }
    /* After signals_init(): the scheduler inherits the blocked signals. */
    if (opt.engine) {
        engine = engine_new(&opt.engine_params);
        if (engine == NULL || engine_start(engine) != 0) {
            fprintf(stderr, "mock_upstream: cannot start the engine\n");
            return 1;
        }
    }
    if (pthread_attr_init(&attr) != 0)
        return 1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Plenty for jansson at depth 64 and a 2 KiB log line, even under
     * ASan; thousands of benchmark connections stay cheap. */
    pthread_attr_setstacksize(&attr, MOCK_STACK_SIZE);

    if (net_listen(opt.listen, 1024, &lfd, &port) != 0)
        goto out;               /* net_listen logged why */
    printf("mock_upstream listening port=%u\n", (unsigned)port);
    fflush(stdout);

    while (!stop_signal) {
        pfd.fd = lfd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        n = ppoll(&pfd, 1, NULL, &waitmask);
        if (n == -1) {
            err = errno;
            if (err == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, err, "mock: ppoll");
            goto out;
        }
        for (;;) {
            rc = net_accept(lfd, &cfd);
            if (rc == GW_EAGAIN)
                break;
            if (rc != 0) {
                /* EMFILE and friends: back off instead of spinning. */
                err = errno;
                log_errno(GW_LOG_ERROR, err, "mock: accept");
                poll(NULL, 0, 100);
                break;
            }
            spawn(cfd, &attr);
        }
    }
    if (!opt.quiet)
        log_msg(GW_LOG_INFO, "mock: signal %d, exiting", (int)stop_signal);
    lock();
    st.stopping = 1;
    pthread_cond_broadcast(&st.cv);
    unlock();
    rc = 0;

out:
    engine_stop(engine);
    if (lfd != -1)
        close(lfd);
    pthread_attr_destroy(&attr);
    return rc;
}
