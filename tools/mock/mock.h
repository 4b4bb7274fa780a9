/* SPDX-License-Identifier: MIT */
/*
 * mock.h - what mock_upstream's files share, and private to them (as
 * gateway/upstream/upstream_call.h is to upstream.c): the limits more
 * than one file needs, the options, the shared state 'st' and its lock,
 * one connection and one request, and a few small helpers.  Only
 * tools/mock_upstream.c and tools/mock/ include it.
 *
 * Locking: one mutex, st.mu, guards every field of 'st' (mock_lock(),
 * mock_unlock()): every counter, the list of held requests, the released
 * tags and the gates, last_headers and the request record.  It is never
 * held across socket I/O.  The engine has its own lock, inside engine.c;
 * st.mu is never held while calling the engine, so the two are never
 * nested and there is no lock order.  The options, 'engine' and
 * 'start_time' are set in main() before the first thread starts and never
 * change afterwards.
 *
 * Ownership: a struct conn belongs to its connection thread (conn.c),
 * which frees it; a struct req lives on that thread's stack for one
 * request, and its 'json' owns the strings its other fields borrow.
 */
#ifndef INFERGW_TOOLS_MOCK_MOCK_H
#define INFERGW_TOOLS_MOCK_MOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "engine.h"
#include "net.h"

struct http_request;

#define MOCK_MODEL "mock-model"
#define MOCK_MAX_HEAD (64 * 1024)           /* request line + fields */
#define MOCK_MAX_BODY (64 * 1024 * 1024)    /* request body */
#define MOCK_OUT_LIMIT (16 * 1024 * 1024)   /* one response body or event */
#define MOCK_SEND_MS 30000          /* a client that stops reading */
#define MOCK_HOLD_MS 30000          /* longest mock_hold */
#define MOCK_STALL_MS 60000         /* longest stall */
#define MOCK_MAX_CHUNKS 100000
#define MOCK_MAX_MS 3600000
#define MOCK_MAX_TAG 256
#define MOCK_MAX_PAD (1024 * 1024)          /* mock_pad, per chunk */
#define MOCK_REC_MAX 10000                  /* /recorded entries kept */
#define MOCK_MAX_MODELS 16                  /* -m names */
#define MOCK_PREFIX_SLOTS 65536             /* prefixes remembered */
#define MOCK_STORED 4096                    /* responses kept for
                                               previous_response_id */
#define MOCK_ID_MAX 96                      /* a response id's bytes */

/* A padded content chunk's SSE event must fit in the output buffer. */
_Static_assert(MOCK_MAX_PAD + 64 * 1024 <= MOCK_OUT_LIMIT,
               "MOCK_MAX_PAD leaves no room for the event around it");

/* Command-line options; written by main() before any thread starts. */
struct mock_options {
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
    int engine;                 /* -e (or -E, --max-loras): engine mode */
    struct engine_params engine_params;     /* -E, over the defaults */
    const char *loras[LORA_MAX];    /* --lora: the adapters served at
                                       start, their parent models[0] */
    size_t num_loras;
};

extern struct mock_options opt;

/* The engine in engine mode, else NULL; set in main() before any thread. */
extern struct engine *engine;

/* Unix time at start: the _created series of /metrics without the engine. */
extern double start_time;

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
struct mock_state {
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
    json_t *last_body;          /* of the last /v1 POST: a string
                                   (record_body()), or NULL */
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
    int metrics_mode;           /* enum metrics_mode (control.c) */
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
};

extern struct mock_state st;

/*
 * One client connection; owned by its thread (conn.c).  The buffers are
 * sized once, when it is accepted, and reused by every request on it.
 */
struct conn {
    int fd;
    struct net_stream stream;   /* 'fd', plain: what the readers take */
    int counted;                /* in connections_open/_total (conn.c) */
    int linger;                 /* input may be unread: linger_close() */
    struct buf in;              /* bytes read ahead of the parser */
    struct buf head;            /* the request head; views point here */
    struct buf body;            /* the request body */
    struct buf hdr;             /* the response head being written */
    struct buf out;             /* the response body or SSE event */
};

/* What a request asks for: conn.c's table maps a method and path to it. */
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
    R_LORA_LOAD,
    R_LORA_UNLOAD,
};

/* How a request fails on purpose: mock_fault, or POST /control's fault=. */
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
    FAULT_ERROR_EVENT,          /* stream: an error event, then [DONE] */
    FAULT_NO_STORE,             /* Cache-Control: no-store on the head */
    FAULT_PRIVATE,              /* Cache-Control: private on the head */
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
    int open;                   /* counted in st.in_progress */
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
static inline int
mock_is_completion(enum route r)
{
    return r == R_CHAT || r == R_TEXT;
}

static inline int
mock_is_audio(enum route r)
{
    return r == R_TRANSCRIBE || r == R_TRANSLATE;
}

/*
 * Lock and unlock st.mu.  A pthread error here is a programming error (or
 * memory corruption), never something to carry on from: they abort.
 */
void mock_lock(void);
void mock_unlock(void);

/*
 * Set up 'st' from the options: its mutex, its condition variable on
 * CLOCK_MONOTONIC, its tables.  Called once by main() before any thread
 * starts.  Returns 0, GW_EIO (logged) or GW_ENOMEM.
 */
int mock_state_init(void);

/* The fault named 'name' (a mock_fault value), or FAULT_NONE. */
enum fault mock_fault_parse(const char *name);

/* The name of 'f' as mock_fault spells it; "" for FAULT_NONE. */
const char *mock_fault_name(enum fault f);

/* One splitmix64 step (its increment, then its finaliser). */
uint64_t mock_mix64(uint64_t x);

/* json_dump_callback() sink appending to a struct buf. */
int mock_dump_to_buf(const char *p, size_t n, void *arg);

/*
 * Copy at most 'size - 1' bytes of s[0..n) into 'out' for a log line,
 * replacing anything that is not printable ASCII with '?'.
 */
void mock_log_safe(char *out, size_t size, const char *s, size_t n);

#endif
