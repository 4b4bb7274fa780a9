/* SPDX-License-Identifier: MIT */
/*
 * usage.c - token usage from a passing response (usage.h).
 */
#include "coalesce/usage.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "jsonx.h"
#include "util.h"

size_t
usage_limit(uint64_t max_request_body)
{
    uint64_t lim = max_request_body + USAGE_ANSWER_ROOM;

    if (lim < max_request_body || lim > SIZE_MAX)
        return SIZE_MAX;                /* config.c bounds it far below */
    return (size_t)lim;
}

void
usage_scan_init(struct usage_scan *u, size_t limit)
{
    memset(u, 0, sizeof(*u));
    u->limit = limit;
    buf_init(&u->pending, limit);
    u->prompt = u->completion = -1;
}

void
usage_scan_release(struct usage_scan *u)
{
    buf_release(&u->pending);
}

void
usage_scan_head(struct usage_scan *u, int status, const char *content_type)
{
    const char *ct = content_type != NULL ? content_type : "";

    buf_reset(&u->pending);
    u->headed = 1;
    u->overflow = 0;
    u->prompt = u->completion = -1;
    u->events = u->bytes = 0;
    u->done = u->error = 0;
    if (status < 200 || status > 299)
        u->mode = USAGE_OFF;
    else if (strncasecmp(ct, "text/event-stream", 17) == 0)
        u->mode = USAGE_SSE;
    else
        u->mode = USAGE_JSON;
}

/*
 * A count as usage has it: an integer 0..2^32.  No real call comes near
 * it, and a bill that sums such counts cannot wrap.
 */
static int
get_count(const json_t *usage, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(usage, name);

    if (v == NULL) {
        *out = 0;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0
        || json_integer_value(v) > (INT64_C(1) << 32))
        return GW_EINVAL;
    *out = json_integer_value(v);
    return 0;
}

/*
 * The counts of a usage object, under the names the API it came from
 * uses: prompt_tokens and completion_tokens (chat, completions,
 * embeddings, score, pooling; an embedding has no completion_tokens);
 * input_tokens and output_tokens (the Responses API); or total_tokens
 * alone (a rerank's: all of it is input).  Returns 0, or GW_EINVAL for
 * none of them (a transcription's {"type":"duration","seconds":N} is no
 * token count) or a count that is not one.
 */
static int
read_counts(const json_t *usage, int64_t *prompt, int64_t *completion)
{
    if (json_object_get(usage, "prompt_tokens") != NULL)
        return get_count(usage, "prompt_tokens", prompt) == 0
               && get_count(usage, "completion_tokens", completion) == 0
               ? 0 : GW_EINVAL;
    if (json_object_get(usage, "input_tokens") != NULL)
        return get_count(usage, "input_tokens", prompt) == 0
               && get_count(usage, "output_tokens", completion) == 0
               ? 0 : GW_EINVAL;
    if (json_object_get(usage, "total_tokens") != NULL) {
        *completion = 0;
        return get_count(usage, "total_tokens", prompt);
    }
    return GW_EINVAL;
}

/*
 * The count 'name' of the usage object whose text is v[0..vn), read from
 * the text as get_count() reads it from jansson's tree: 1 read (*out), 0
 * absent, -1 when the text does not say plainly (not a plain decimal
 * integer: a sign, a fraction, an exponent, leading zeros, past 2^32;
 * or the scan cannot tell): then jansson decides.
 */
static int
text_count(const char *v, size_t vn, const char *name, int64_t *out)
{
    const char *c;
    size_t cn;
    int64_t n = 0;
    int r = jsonx_member(v, vn, name, &c, &cn);

    if (r != 1)
        return r;
    if (cn == 0 || cn > 10 || (cn > 1 && c[0] == '0'))
        return -1;
    for (size_t i = 0; i < cn; i++) {
        if (c[i] < '0' || c[i] > '9')
            return -1;
        n = n * 10 + (c[i] - '0');
    }
    if (n > (INT64_C(1) << 32))
        return -1;
    *out = n;
    return 1;
}

/*
 * read_counts() over the usage object's text (jsonx_member()), without a
 * jansson tree: the same names in the same order.  Returns 0, GW_EINVAL
 * (no count there), or -1 when the text does not say plainly
 * (text_count()): then the caller asks jansson.
 */
static int
text_counts(const char *v, size_t vn, int64_t *prompt, int64_t *completion)
{
    static const char *const names[][2] = {
        { "prompt_tokens", "completion_tokens" },
        { "input_tokens", "output_tokens" },
        { "total_tokens", NULL },
    };

    for (size_t i = 0; i < GW_ARRAY_LEN(names); i++) {
        int r = text_count(v, vn, names[i][0], prompt);

        if (r <= 0) {
            if (r < 0)
                return -1;
            continue;           /* not this API's names */
        }
        *completion = 0;
        if (names[i][1] != NULL
            && text_count(v, vn, names[i][1], completion) < 0)
            return -1;
        return 0;
    }
    return GW_EINVAL;
}

/*
 * The usage object of the JSON object in p[0..n), if it has one: at the
 * top level, or in the Responses API's events (response.completed,
 * .incomplete, .failed) inside their "response" object.
 */
static void
take_usage(struct usage_scan *u, const char *p, size_t n)
{
    json_t *root = NULL, *usage;
    int64_t prompt, completion;
    const char *v;
    size_t vn;
    char err[96];
    int r;

    /* Only the usage object is parsed: the rest of an answer (its text,
     * kilobytes of it) is scanned for its structure, not built into a
     * document (jsonx_member()); where the scan cannot tell, the whole. */
    r = jsonx_member(p, n, "usage", &v, &vn);
    if (r == 0 && jsonx_member(p, n, "response", &v, &vn) == 1)
        r = jsonx_member(v, vn, "usage", &v, &vn);
    if (r == 1) {
        /* Its counts read from the text where it says them plainly. */
        r = text_counts(v, vn, &prompt, &completion);
        if (r == 0) {
            u->prompt = prompt;
            u->completion = completion;
        }
        if (r != -1)
            return;
        if (jsonx_parse_object(v, vn, JSONX_MAX_DEPTH, &usage, err,
                               sizeof(err)) != 0)
            return;             /* null, or not an object */
        if (read_counts(usage, &prompt, &completion) == 0) {
            u->prompt = prompt;
            u->completion = completion;
        }
        json_decref(usage);
        return;
    }
    if (r == 0)
        return;
    if (jsonx_parse_object(p, n, JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)) != 0)
        return;
    usage = json_object_get(root, "usage");
    if (usage == NULL)
        usage = json_object_get(json_object_get(root, "response"), "usage");
    if (json_is_object(usage)
        && read_counts(usage, &prompt, &completion) == 0) {
        u->prompt = prompt;
        u->completion = completion;
    }
    json_decref(root);
}

/* Could this line hold a usage object: "usage", blanks, ':', blanks, '{'? */
static int
may_hold_usage(const char *p, size_t n)
{
    static const char tag[] = "\"usage\"";
    const char *end = p + n, *q;

    while ((q = memmem(p, (size_t)(end - p), tag, sizeof(tag) - 1)) != NULL) {
        q += sizeof(tag) - 1;
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        if (q < end && *q == ':') {
            q++;
            while (q < end && (*q == ' ' || *q == '\t'))
                q++;
            if (q < end && *q == '{')
                return 1;
        }
        p = q;
    }
    return 0;
}

/*
 * Does p[0..n) hold "KEY", blanks, ':', blanks, then a string that is
 * not empty?  (KEY given with its quotes.)  Inside a JSON string every
 * quote is escaped, so text that quotes a key never matches.
 */
static int
has_text(const char *p, size_t n, const char *key, size_t klen)
{
    const char *end = p + n, *q;

    while ((q = memmem(p, (size_t)(end - p), key, klen)) != NULL) {
        q += klen;
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        if (q < end && *q == ':') {
            q++;
            while (q < end && (*q == ' ' || *q == '\t'))
                q++;
            if (end - q >= 2 && q[0] == '"' && q[1] != '"')
                return 1;
        }
        p = q;
    }
    return 0;
}

/* Does this event's JSON carry text (usage.h: the count)? */
static int
carries_text(const char *p, size_t n)
{
#define KEY(k) { "\"" k "\"", sizeof(k) + 1 }
    static const struct {
        const char *key;
        size_t len;
    } keys[] = { KEY("content"), KEY("text"), KEY("delta"), KEY("arguments"),
                 KEY("reasoning_content"), KEY("refusal") };
#undef KEY

    for (size_t i = 0; i < GW_ARRAY_LEN(keys); i++)
        if (has_text(p, n, keys[i].key, keys[i].len))
            return 1;
    return 0;
}

/*
 * A "data:" line's value p[0..n): the stream's end ("[DONE]"), or an
 * error event (vLLM's mid-stream failure: {"error": {...}}, or an
 * ErrorResponse, "object": "error"), which it may still end with [DONE].
 */
static void
note_end(struct usage_scan *u, const char *p, size_t n)
{
    static const char oerr[] = "\"object\"";
    const char *q;

    while (n > 0 && (*p == ' ' || *p == '\t')) {
        p++;
        n--;
    }
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0) {
        u->done = 1;
        return;
    }
    if (n == 0 || *p != '{')
        return;
    q = p + 1;
    while (q < p + n && (*q == ' ' || *q == '\t'))
        q++;
    if ((size_t)(p + n - q) >= 7 && memcmp(q, "\"error\"", 7) == 0)
        u->error = 1;
    else if ((q = memmem(p, n, oerr, sizeof(oerr) - 1)) != NULL) {
        q += sizeof(oerr) - 1;
        while (q < p + n && (*q == ' ' || *q == '\t' || *q == ':'))
            q++;
        if ((size_t)(p + n - q) >= 7 && memcmp(q, "\"error\"", 7) == 0)
            u->error = 1;
    }
}

/* One whole SSE line (no '\n'): a "data:" event with a usage object?
 * With text? */
static void
sse_line(struct usage_scan *u, const char *p, size_t n)
{
    if (n > 0 && p[n - 1] == '\r')
        n--;
    if (n < 5 || memcmp(p, "data:", 5) != 0)
        return;
    p += 5;
    n -= 5;
    note_end(u, p, n);
    if (may_hold_usage(p, n))
        take_usage(u, p, n);
    if (carries_text(p, n))
        u->events++;
}

static void
feed_sse(struct usage_scan *u, const char *p, size_t n)
{
    const char *end = p + n, *nl;

    while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        size_t len = (size_t)(nl - p);

        if (buf_len(&u->pending) == 0 && !u->overflow) {
            sse_line(u, p, len);        /* whole in this piece: no copy */
        } else if (!u->overflow
                   && buf_len(&u->pending) + len <= u->limit
                   && buf_append(&u->pending, p, len) == 0) {
            sse_line(u, buf_ptr(&u->pending), buf_len(&u->pending));
        }
        buf_reset(&u->pending);
        u->overflow = 0;
        p = nl + 1;
    }
    if (p < end && !u->overflow) {
        if (buf_len(&u->pending) + (size_t)(end - p) > u->limit
            || buf_append(&u->pending, p, (size_t)(end - p)) != 0) {
            buf_reset(&u->pending);
            u->overflow = 1;            /* ignored up to its '\n' */
        }
    }
}

void
usage_scan_feed(struct usage_scan *u, const char *p, size_t n)
{
    u->bytes += n;
    switch (u->mode) {
    case USAGE_OFF:
        return;
    case USAGE_SSE:
        feed_sse(u, p, n);
        return;
    case USAGE_JSON:
        if (!u->overflow && buf_append(&u->pending, p, n) != 0) {
            buf_release(&u->pending);
            buf_init(&u->pending, u->limit);
            u->overflow = 1;
        }
        return;
    }
}

int
usage_scan_end(struct usage_scan *u, int64_t *prompt, int64_t *completion)
{
    if (u->mode == USAGE_JSON && !u->overflow && buf_len(&u->pending) > 0)
        take_usage(u, buf_ptr(&u->pending), buf_len(&u->pending));
    buf_reset(&u->pending);
    if (u->prompt < 0)
        return 0;
    *prompt = u->prompt;
    *completion = u->completion;
    return 1;
}

int
usage_scan_clean(const struct usage_scan *u)
{
    if (u->mode == USAGE_SSE)
        return u->done && !u->error;
    return u->mode == USAGE_JSON;
}

/* n / 4, rounded up. */
static uint64_t
quarter_ceil(uint64_t n)
{
    return n / 4 + (n % 4 != 0);
}

uint64_t
usage_count_prompt(size_t request_bytes)
{
    return quarter_ceil(request_bytes);
}

uint64_t
usage_scan_charge(const struct usage_scan *u, size_t request_bytes,
                  int *counted)
{
    *counted = 0;
    if (u->mode == USAGE_OFF)
        return 0;
    if (u->prompt >= 0)
        return (uint64_t)u->prompt + (uint64_t)u->completion;
    *counted = 1;
    return quarter_ceil(request_bytes)
           + (u->mode == USAGE_SSE ? u->events : quarter_ceil(u->bytes));
}

/* ---- asking for the usage of a stream, and cutting it out ---- */

int
usage_asked(const json_t *body)
{
    const json_t *so = json_object_get(body, "stream_options");

    return json_is_object(so)
           && json_is_true(json_object_get(so, "include_usage"));
}

int
usage_ask(const char *p, size_t n, const json_t *body, struct buf *out)
{
    size_t i = 0;
    int rc;

    if (!json_is_object(body)
        || !json_is_true(json_object_get(body, "stream"))
        || json_object_get(body, "stream_options") != NULL)
        return 0;
    /* RFC 8259 section 2: whitespace may come before the object. */
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n'
                     || p[i] == '\r'))
        i++;
    if (i == n || p[i] != '{')
        return 0;               /* not the bytes 'body' was parsed from */
    i++;
    /* The object has "stream": a member follows, so the comma is right. */
    rc = buf_append(out, p, i);
    if (rc == 0)
        rc = buf_append_str(out, USAGE_ASK);
    if (rc == 0)
        rc = buf_append(out, p + i, n - i);
    return rc != 0 ? rc : 1;
}

void
usage_split_init(struct usage_split *s)
{
    buf_init(&s->held, USAGE_SPLIT_MAX);
    s->blank = 1;
    s->passing = 0;
}

void
usage_split_release(struct usage_split *s)
{
    buf_release(&s->held);
}

/*
 * The length of the first event that ends in p[0..n), through the
 * blank line that ends it, or 0 when none does.  's->blank' carries
 * the state of the line being read from one call to the next: 1 while
 * it holds nothing but '\r' (a CRLF's), so an event ends at "\n\n" and
 * at "\r\n\r\n" alike.
 */
static size_t
event_len(struct usage_split *s, const char *p, size_t n)
{
    const char *q = p, *end = p + n, *nl;
    int blank;

    while ((nl = memchr(q, '\n', (size_t)(end - q))) != NULL) {
        for (blank = s->blank; blank && q < nl; q++)
            blank = *q == '\r';
        s->blank = 1;                   /* a line starts after the '\n' */
        if (blank)
            return (size_t)(nl + 1 - p);
        q = nl + 1;
    }
    for (; q < end && s->blank; q++)
        s->blank = *q == '\r';
    return 0;
}

/*
 * Is the event p[0..n) (through its blank line) a usage event: one
 * "data:" line of JSON with a "usage" object and "choices": [] at its
 * top level, then the blank line?  vLLM's other events carry no usage
 * (or, with continuous_usage_stats, with their choices): never cut.
 */
static int
is_usage_event(const char *p, size_t n)
{
    const char *nl = memchr(p, '\n', n), *q;
    json_t *root = NULL;
    const json_t *choices;
    size_t len;
    int yes;
    char err[96];

    if (nl == NULL)
        return 0;
    for (q = nl + 1; q < p + n; q++)
        if (*q != '\r' && *q != '\n')
            return 0;                   /* more than one line */
    len = (size_t)(nl - p);
    if (len > 0 && p[len - 1] == '\r')
        len--;
    if (len < 5 || memcmp(p, "data:", 5) != 0
        || !may_hold_usage(p + 5, len - 5)
        || jsonx_parse_object(p + 5, len - 5, JSONX_MAX_DEPTH, &root, err,
                              sizeof(err)) != 0)
        return 0;
    choices = json_object_get(root, "choices");
    yes = json_is_object(json_object_get(root, "usage"))
          && json_is_array(choices) && json_array_size(choices) == 0;
    json_decref(root);
    return yes;
}

/* Hand p[0..n) on, unless it is empty. */
static int
give(usage_piece_fn *piece, void *arg, const char *p, size_t n, int usage)
{
    return n > 0 ? piece(arg, p, n, usage) : 0;
}

int
usage_split_feed(struct usage_split *s, const char *p, size_t n,
                 usage_piece_fn *piece, void *arg)
{
    const char *end = p + n, *run;
    size_t e, len;
    int rc;

    if (s->passing) {
        e = event_len(s, p, n);
        if (e == 0)
            return give(piece, arg, p, n, 0);
        s->passing = 0;
        if ((rc = give(piece, arg, p, e, 0)) != 0)
            return rc;
        p += e;
    } else if (buf_len(&s->held) > 0) {
        /* The event held back ends here, or is held on. */
        e = event_len(s, p, n);
        len = e > 0 ? e : n;
        if (buf_append(&s->held, p, len) == 0) {
            if (e == 0)
                return 0;
            rc = give(piece, arg, buf_ptr(&s->held), buf_len(&s->held),
                      is_usage_event(buf_ptr(&s->held), buf_len(&s->held)));
            buf_reset(&s->held);
        } else {
            /* Past the bound: what is held goes on as it is, this too,
             * and the rest of the event as it comes. */
            rc = give(piece, arg, buf_ptr(&s->held), buf_len(&s->held), 0);
            buf_release(&s->held);
            if (rc == 0)
                rc = give(piece, arg, p, len, 0);
            s->passing = e == 0;
        }
        if (rc != 0 || e == 0)
            return rc;
        p += e;
    }
    /* Whole events: runs of them as they are, a usage event alone. */
    run = p;
    while ((e = event_len(s, p, (size_t)(end - p))) > 0) {
        if (is_usage_event(p, e)) {
            if ((rc = give(piece, arg, run, (size_t)(p - run), 0)) != 0
                || (rc = piece(arg, p, e, 1)) != 0)
                return rc;
            run = p + e;
        }
        p += e;
    }
    if ((rc = give(piece, arg, run, (size_t)(p - run), 0)) != 0)
        return rc;
    /* The start of an event that has not ended: held back. */
    if (p < end && buf_append(&s->held, p, (size_t)(end - p)) != 0) {
        s->passing = 1;
        return give(piece, arg, p, (size_t)(end - p), 0);
    }
    return 0;
}

int
usage_split_end(struct usage_split *s, usage_piece_fn *piece, void *arg)
{
    int rc = give(piece, arg, buf_ptr(&s->held), buf_len(&s->held), 0);

    buf_reset(&s->held);
    return rc;
}
