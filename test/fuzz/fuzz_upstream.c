/* SPDX-License-Identifier: MIT */
/*
 * fuzz_upstream.c - libFuzzer target for the upstream response path in
 * gateway/upstream/upstream.c: its header and body callbacks, fed the way libcurl
 * feeds them, and what they pass on to the sink (the clients' side).
 *
 * An input is a script, one command per line.  The first line holds the
 * options: bit 0 of its first byte sets opts.stop_on_retryable.  Every
 * other line starts with a command letter; the rest of the line, with
 * its '\n', is the payload:
 *   h LINE   a header line (its line end included: "...\r\n" in a file
 *            with CRLF lines, as libcurl hands them over)
 *   b DATA   a body piece: the payload with its '\n'
 *   c DATA   a body piece: the payload without its '\n'
 *   e        libcurl ends the transfer: complete (CURLE_OK)
 *   x K      libcurl ends it with an error: K's byte picks which (lost
 *            connection, timeout, TLS, ...; see curl_errors[])
 *   g        start the hedge, a second attempt (ignored if it may not)
 *   H B C E X   the same as h b c e x, for the hedge
 *   s K      the sink refuses its next callback, with the code K picks
 *            (the client is gone; n: no memory; q: stopping; t: too big)
 *   r        the transfer loop wakes up: an attempt that lost is ended
 * Other letters are skipped.  At the end the loop reaps, and every
 * attempt still running ends complete.  A callback that refuses ends its
 * attempt at once with CURLE_WRITE_ERROR, as libcurl does, and the
 * script's later commands for it are skipped.  Payloads are copied into
 * heap blocks of their exact size, so ASan catches a read past one.
 * (test/fuzz/corpus/upstream/ has readable examples.)
 *
 * Besides crashes and sanitizer reports, the target aborts when one of
 * these properties fails:
 *   head     the sink hears one head per call, never two (not even with a
 *            hedge), before any body byte; its status is 200..599 (1xx
 *            heads are skipped) and, with stop_on_retryable, never 429,
 *            502, 503 or 504; the head had at most 32 KiB.
 *   fields   the Content-Type relayed, if any, has no control byte but
 *            HTAB and no blank at either end, and is the value of the
 *            last Content-Type line of the head that was relayed (a
 *            model of the head, built from the lines the code accepted,
 *            says which); Content-Length is that head's last one, -1
 *            with Transfer-Encoding; Retry-After only on 429 and 503,
 *            at most 60 s.
 *   framing  no relayed head had a Content-Length that is not 1*DIGIT,
 *            two that differ, one with Transfer-Encoding, a transfer
 *            coding but one "chunked", or a content coding but
 *            identity (RFC 9112 6.3).
 *   body     the bytes the sink takes are exactly the pieces the body
 *            callback accepted, in order, all from one attempt, the one
 *            whose head the sink heard, and only after that head.
 *   result   a callback returns its 'n' or refuses; an attempt that a
 *            callback stopped ends with an error; one that lost the
 *            hedge ends with GW_EABORTED; rc 0 means the sink heard this
 *            attempt's head; res.bytes counts the bytes offered to the
 *            sink; opts.on_winner hears of the relayed attempt, once,
 *            before its head.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "fuzz.h"
#include "buf.h"
#include "log.h"
#include "upstream/upstream.h"
#include "upstream/upstream_testcall.h"
#include "util.h"

#define FUZZ_ATTEMPTS 2
#define FUZZ_MAX_HEAD (32 * 1024)       /* upstream.c's UP_MAX_HEAD */
#define FUZZ_DATA_LIMIT (1 << 24)       /* more than any input */


/*
 * The harness's model of one attempt's response head, built only from
 * the header lines the code accepted (a refused line ends the attempt, so
 * the model never needs to know why).
 */
struct model {
    int want_status;            /* the next line starts a head */
    int head_done;              /* the final head's empty line is in */
    int status;
    size_t head_bytes;
    char *ctype;                /* last Content-Type value (owned copy);
                                   NULL none */
    size_t ctype_len;
    int has_te;
    int64_t content_length;
    int framing_bad;            /* a line that makes the body's end
                                   untrustworthy (RFC 9112 6.3), or a
                                   content coding, was accepted */
    struct buf accepted;        /* body pieces the callback took */
    uint64_t offered;           /* bytes the sink was offered */
};

static struct {
    const struct upstream_opts *opts;
    int current;                /* the attempt whose callback runs */
    int heads;                  /* on_head calls */
    int head_from;              /* the attempt the sink heard; -1 */
    int head_taken;             /* on_head was accepted */
    int refuse;                 /* refuse the next callback with it */
    int winners;                /* on_winner calls */
    int winner;                 /* its attempt; -1 */
    struct buf data;            /* the body bytes the sink took */
    struct model m[FUZZ_ATTEMPTS];
} st;

static int
is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* A field value as RFC 9110 5.5 allows it: no control byte but HTAB. */
static int
clean(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] < 0x20 && p[i] != '\t')
            || (unsigned char)p[i] == 0x7f)
            return 0;
    return 1;
}

static int
name_is(const char *p, size_t n, const char *name)
{
    return strlen(name) == n && gw_strieq(p, n, name);
}

/* Content-Length as 1*DIGIT, else -1 (as the code reads it). */
static int64_t
length_of(const char *p, size_t n)
{
    int64_t v = 0;

    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* The model takes header line p[0..n), which the code accepted. */
static void
model_line(struct model *m, const char *p, size_t n)
{
    const char *colon, *v, *end;
    size_t len = n, name_len;

    if (m->head_done)
        return;                         /* a trailer */
    while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n'))
        len--;
    if (m->want_status) {
        /* Accepted, so "HTTP/x NNN...": the digits after the space. */
        v = memchr(p, ' ', len);
        REQUIRE(v != NULL && p + len - v > 3);
        m->status = (v[1] - '0') * 100 + (v[2] - '0') * 10 + (v[3] - '0');
        m->want_status = 0;
        m->head_bytes = n;
        free(m->ctype);
        m->ctype = NULL;
        m->has_te = 0;
        m->content_length = -1;
        m->framing_bad = 0;
        return;
    }
    m->head_bytes += n;
    if (len == 0) {
        if (m->status < 200)
            m->want_status = 1;         /* 1xx: another head follows */
        else
            m->head_done = 1;
        if (m->has_te && m->content_length >= 0)
            m->framing_bad = 1;
        return;
    }
    colon = memchr(p, ':', len);
    if (colon == NULL)
        return;
    name_len = (size_t)(colon - p);
    v = colon + 1;
    end = p + len;
    while (v < end && is_blank(*v))
        v++;
    while (end > v && is_blank(end[-1]))
        end--;
    if (name_is(p, name_len, "content-type")) {
        free(m->ctype);
        m->ctype = dup_exact(v, (size_t)(end - v));
        m->ctype_len = (size_t)(end - v);
    } else if (name_is(p, name_len, "content-length")) {
        int64_t cl = length_of(v, (size_t)(end - v));

        if (cl < 0 || (m->content_length >= 0 && cl != m->content_length))
            m->framing_bad = 1;
        m->content_length = cl;
    } else if (name_is(p, name_len, "transfer-encoding")) {
        if (m->has_te || !name_is(v, (size_t)(end - v), "chunked"))
            m->framing_bad = 1;
        m->has_te = 1;
    } else if (name_is(p, name_len, "content-encoding")) {
        if (end > v && !name_is(v, (size_t)(end - v), "identity"))
            m->framing_bad = 1;
    }
}

static int
retryable(int status)
{
    return status == 429 || status == 502 || status == 503 || status == 504;
}

/* The sink says no, once, with the code the script asked for. */
static int
refusal(void)
{
    int rc = st.refuse;

    st.refuse = 0;
    return rc;
}

/* The code of 's K'. */
static int
refusal_code(char k)
{
    switch (k) {
    case 'n':
        return GW_ENOMEM;
    case 'q':
        return GW_ESTOPPING;
    case 't':
        return GW_ETOOBIG;
    default:
        return GW_EABORTED;
    }
}

/* How libcurl may end a transfer, for 'x K' (K's byte, modulo). */
static const int curl_errors[] = {
    CURLE_RECV_ERROR, CURLE_PARTIAL_FILE, CURLE_OPERATION_TIMEDOUT,
    CURLE_GOT_NOTHING, CURLE_WEIRD_SERVER_REPLY, CURLE_COULDNT_CONNECT,
    CURLE_SSL_CONNECT_ERROR, CURLE_OUT_OF_MEMORY, CURLE_SEND_ERROR,
};

static void
on_winner(void *arg, size_t idx, int status)
{
    (void)arg;
    REQUIRE(++st.winners == 1 && st.heads == 0);
    REQUIRE(idx == (size_t)st.current && status == st.m[st.current].status);
    st.winner = st.current;
}

static int
sink_head(void *arg, const struct http_head *h)
{
    const struct model *m = &st.m[st.current];
    size_t n;

    (void)arg;
    REQUIRE(++st.heads == 1 && st.winner == st.current);
    st.head_from = st.current;
    REQUIRE(m->head_done && h->status == m->status);
    REQUIRE(h->status >= 200 && h->status <= 599);
    REQUIRE(!st.opts->stop_on_retryable || !retryable(h->status));
    REQUIRE(m->head_bytes <= FUZZ_MAX_HEAD);
    if (m->ctype == NULL) {
        REQUIRE(h->content_type[0] == '\0');
    } else {
        /* A longer one was refused, not cut (HTTP_CTYPE_MAX). */
        REQUIRE(m->ctype_len < HTTP_CTYPE_MAX);
        n = strlen(h->content_type);
        REQUIRE(n == m->ctype_len
                && memcmp(h->content_type, m->ctype, n) == 0);
        REQUIRE(clean(h->content_type, n));
        REQUIRE(n == 0 || (!is_blank(h->content_type[0])
                           && !is_blank(h->content_type[n - 1])));
    }
    REQUIRE(!m->framing_bad);
    REQUIRE(h->content_length == (m->has_te ? -1 : m->content_length));
    REQUIRE(h->retry_after_s >= 0 && h->retry_after_s <= 60);
    REQUIRE(h->retry_after_s == 0 || h->status == 429 || h->status == 503);
    if (st.refuse != 0)
        return refusal();
    st.head_taken = 1;
    return 0;
}

static int
sink_data(void *arg, const char *p, size_t n)
{
    (void)arg;
    REQUIRE(st.head_taken && st.head_from == st.current && n > 0);
    st.m[st.current].offered += n;
    if (st.refuse != 0)
        return refusal();
    REQUIRE(buf_append(&st.data, p, n) == 0);
    return 0;
}

/* Attempt i's result, once it has ended.  'stopped': a callback of it
 * refused; 'lost': the other attempt's head was relayed. */
static void
check_result(const struct upstream_result *res, int i, int stopped,
             int lost)
{
    REQUIRE(!stopped || res->outcome.kind != CALL_OK);
    REQUIRE(!lost || call_kind_rc(res->outcome.kind) == GW_EABORTED);
    if (res->outcome.kind == CALL_OK) {
        REQUIRE(st.head_from == i && res->head_seen);
        REQUIRE(res->outcome.status == st.m[i].status);
    }
    REQUIRE(res->bytes == st.m[i].offered);
}

/*
 * libcurl ends running attempt 'i' with 'code'.  'stopped': a callback
 * refused, so the code is CURLE_WRITE_ERROR.
 */
static void
finish(struct upstream_testcall *t, int i, int code, int stopped)
{
    int lost = st.head_from >= 0 && st.head_from != i;
    const struct upstream_result *res;

    st.current = i;
    res = upstream_testcall_finish(t, i, code);
    REQUIRE(!upstream_testcall_running(t, i));
    check_result(res, i, stopped, lost);
}

/* The loop's wake-up: exactly the attempts that lost end. */
static void
reap(struct upstream_testcall *t)
{
    int lost[FUZZ_ATTEMPTS];

    for (int i = 0; i < FUZZ_ATTEMPTS; i++)
        lost[i] = upstream_testcall_running(t, i) && st.head_from >= 0
                  && st.head_from != i;
    upstream_testcall_reap(t);
    for (int i = 0; i < FUZZ_ATTEMPTS; i++) {
        if (!lost[i])
            continue;
        REQUIRE(!upstream_testcall_running(t, i));
        /* Already ended: this only returns its result. */
        check_result(upstream_testcall_finish(t, i, CURLE_OK), i, 0, 1);
    }
}

static void
feed_header(struct upstream_testcall *t, int i, const char *p, size_t n)
{
    char *q;
    size_t rc;

    if (n == 0)
        return;                 /* libcurl's lines have their line end */
    q = dup_exact(p, n);
    st.current = i;
    rc = upstream_testcall_header(t, i, q, n);
    REQUIRE(rc == n || rc == 0);
    if (rc == n)
        model_line(&st.m[i], q, n);
    free(q);
    if (rc != n)
        finish(t, i, CURLE_WRITE_ERROR, 1);
}

static void
feed_body(struct upstream_testcall *t, int i, const char *p, size_t n)
{
    size_t before = buf_len(&st.data);
    char *q;
    size_t rc;

    if (n == 0)
        return;                 /* libcurl has no empty pieces to give */
    q = dup_exact(p, n);
    st.current = i;
    rc = upstream_testcall_body(t, i, q, n);
    REQUIRE(rc == n || rc == 0);
    if (rc == n) {
        REQUIRE(st.head_from == i && st.m[i].head_done);
        REQUIRE(buf_len(&st.data) == before + n);
        REQUIRE(memcmp(buf_ptr(&st.data) + before, q, n) == 0);
        REQUIRE(buf_append(&st.m[i].accepted, q, n) == 0);
    } else {
        REQUIRE(buf_len(&st.data) == before);
    }
    free(q);
    if (rc != n)
        finish(t, i, CURLE_WRITE_ERROR, 1);
}

static void
model_init(struct model *m)
{
    memset(m, 0, sizeof(*m));
    m->want_status = 1;
    m->content_length = -1;
    buf_init(&m->accepted, FUZZ_DATA_LIMIT);
}

/* Run one script line: command 'cmd', payload p[0..n) ending at a '\n'
 * or at the end of the input. */
static void
run_line(struct upstream_testcall *t, char cmd, const char *p, size_t n)
{
    int i = cmd >= 'A' && cmd <= 'Z' ? 1 : 0;
    size_t bare = n > 0 && p[n - 1] == '\n' ? n - 1 : n;

    switch (cmd) {
    case 'g':
        upstream_testcall_start(t);
        return;
    case 's':
        st.refuse = refusal_code(n > 0 ? p[0] : 0);
        return;
    case 'r':
        reap(t);
        return;
    default:
        break;
    }
    if (!upstream_testcall_running(t, i))
        return;
    switch (cmd) {
    case 'h':
    case 'H':
        feed_header(t, i, p, n);
        break;
    case 'b':
    case 'B':
        feed_body(t, i, p, n);
        break;
    case 'c':
    case 'C':
        feed_body(t, i, p, bare);
        break;
    case 'e':
    case 'E':
        finish(t, i, CURLE_OK, 0);
        break;
    case 'x':
    case 'X':
        finish(t, i, curl_errors[(unsigned char)(n > 0 ? p[0] : 0)
                                 % GW_ARRAY_LEN(curl_errors)], 0);
        break;
    default:
        break;
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    const char *p = (const char *)data, *end = p + size, *nl;
    struct upstream_testcall *t;
    struct upstream_opts opts;
    struct upstream_sink sink = { NULL, sink_head, sink_data, NULL, NULL };

    if (!quiet) {
        log_set_level(GW_LOG_ERROR);    /* failed attempts log warnings */
        quiet = 1;
    }
    if (size == 0)
        return 0;
    memset(&opts, 0, sizeof(opts));
    opts.stop_on_retryable = data[0] & 1;
    opts.watch_fd = -1;
    opts.stop_fd = -1;
    opts.on_winner = on_winner;
    memset(&st, 0, sizeof(st));
    st.opts = &opts;
    st.head_from = -1;
    st.winner = -1;
    buf_init(&st.data, FUZZ_DATA_LIMIT);
    for (int i = 0; i < FUZZ_ATTEMPTS; i++)
        model_init(&st.m[i]);
    t = upstream_testcall_new(&opts, &sink);
    REQUIRE(t != NULL && upstream_testcall_start(t) == 0);

    nl = memchr(p, '\n', size);
    p = nl != NULL ? nl + 1 : end;      /* past the options line */
    while (p < end) {
        nl = memchr(p, '\n', (size_t)(end - p));
        nl = nl != NULL ? nl + 1 : end;
        run_line(t, p[0], p + 1, (size_t)(nl - p - 1));
        p = nl;
    }
    reap(t);
    for (int i = 0; i < FUZZ_ATTEMPTS; i++)
        if (upstream_testcall_running(t, i))
            finish(t, i, CURLE_OK, 0);

    /* The body the sink took is the winner's accepted pieces, whole. */
    REQUIRE(st.heads <= 1);
    if (st.head_from >= 0) {
        const struct buf *w = &st.m[st.head_from].accepted;

        REQUIRE(buf_len(&st.data) == buf_len(w));
        REQUIRE(memcmp(buf_ptr(&st.data), buf_ptr(w), buf_len(w)) == 0);
    } else {
        REQUIRE(buf_len(&st.data) == 0);
    }

    upstream_testcall_free(t);
    buf_release(&st.data);
    for (int i = 0; i < FUZZ_ATTEMPTS; i++) {
        free(st.m[i].ctype);
        buf_release(&st.m[i].accepted);
    }
    return 0;
}
