/* SPDX-License-Identifier: MIT */
/*
 * post.c - a POST to one of mock_upstream's vLLM routes (post.h): the
 * body, the knobs, the parameters, the prefix count, the engine, and the
 * order in which a hold, a delay and the faults apply.
 *
 * Knobs of the wrong type or out of range are refused with a 400 rather
 * than ignored, so a test with a typo fails loudly; the OpenAI
 * parameters are never refused, as vLLM's validation is not what the
 * gateway's tests exercise.
 */
#include "post.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <jansson.h>

#include "buf.h"
#include "complete.h"
#include "engine.h"
#include "http.h"
#include "jsonx.h"
#include "mock.h"
#include "multipart.h"
#include "record.h"
#include "send.h"
#include "util.h"
#include "vllm.h"
#include "wait.h"

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
        if (json_is_string(v))
            q->fault = mock_fault_parse(json_string_value(v));
        if (q->fault == FAULT_NONE) {
            snprintf(err, errlen, "mock_fault must be one of reset, stall, "
                     "die_mid_stream, stall_mid_stream, big_headers, "
                     "chunked_json, chunked_json_die, head_then_die, "
                     "head_then_stall, error_event, no_store, private");
            return GW_EINVAL;
        }
    }
    *param = NULL;
    return 0;
}

/*
 * Where body p[0..n)'s top-level "stream_options" member is, with the
 * comma that joins it to the others: OUT [*from, *to).  Returns 1, or
 * 0 for none.  The body parsed as a JSON object, so the scan checks
 * nothing: it skips strings (and their escapes) and nested values, and
 * finds the key only as written plainly.
 */
static int
options_span(const char *p, size_t n, size_t *from, size_t *to)
{
    static const char name[] = "\"stream_options\"";
    size_t i, s, member = 0;
    int depth = 0, key = 0, first = 0, hit = 0;

    for (i = 0; i < n; i++) {
        switch (p[i]) {
        case '"':
            for (s = i++; i < n && p[i] != '"'; i++)
                i += p[i] == '\\';        /* an escape: skip its char */
            hit |= key && i + 1 - s == sizeof(name) - 1
                   && memcmp(p + s, name, sizeof(name) - 1) == 0;
            key = 0;
            break;
        case '{':
        case '[':
            if (++depth == 1) {
                key = first = 1;
                member = i + 1;         /* the first: to its comma */
            }
            break;
        case ',':
            if (depth != 1)
                break;
            if (hit) {
                *from = member;
                *to = first ? i + 1 : i;
                return 1;
            }
            key = 1;
            first = 0;
            member = i;                 /* the others: from their comma */
            break;
        case '}':
        case ']':
            if (depth-- == 1 && hit) {
                *from = member;
                *to = i;
                return 1;
            }
            break;
        }
    }
    return 0;
}

/*
 * The hash an answer's words and numbers come from: the body's bytes,
 * but for a top-level "stream_options" member, which changes what a
 * stream carries around the text (its usage event), never the text.  So
 * a gateway that asks for the usage on its client's behalf, inserting
 * the member, gets the words its client's own body would have got.
 */
static uint64_t
content_hash(const struct req *q)
{
    const char *p = buf_ptr(&q->c->body);
    size_t n = buf_len(&q->c->body), from, to;

    if (mock_is_audio(q->route)
        || json_object_get(q->json, "stream_options") == NULL
        || !options_span(p, n, &from, &to))
        return gw_fnv1a64(GW_FNV1A64_OFFSET, p, n);
    return gw_fnv1a64(gw_fnv1a64(GW_FNV1A64_OFFSET, p, from), p + to,
                      n - to);
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
    q->stream = (mock_is_completion(q->route) || q->route == R_RESPONSES
                 || mock_is_audio(q->route))
                && json_is_true(json_object_get(q->json, "stream"));
    v = json_object_get(q->json, "stream_options");
    q->include_usage = json_is_object(v)
                       && json_is_true(json_object_get(v, "include_usage"));
    /* An upload's form flattens the option (vLLM's form field). */
    if (mock_is_audio(q->route))
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
    else if (mock_is_audio(q->route))
        q->prompt_tokens = 1 + q->audio_bytes / 640;  /* 16 kHz, 20 ms */
    else
        q->prompt_tokens = count_text(json_object_get(q->json, "input"));
    if (q->prompt_tokens < 1)
        q->prompt_tokens = 1;   /* vLLM always counts at least BOS */

    q->hash = content_hash(q);
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
        mock_log_safe(q->id + strlen(prefix),
                      sizeof(q->id) - strlen(prefix), rid->value,
                      rid->value_len);
    } else {
        snprintf(q->id, sizeof(q->id), "%s", prefix);
        gw_random_hex(q->id + strlen(prefix), 32);
    }
    q->created = (json_int_t)time(NULL);
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
                   mock_dump_to_buf, &prompt) == 0 ? 0 : GW_ENOMEM;
    if (rc == 0)
        rc = engine_submit(engine, buf_ptr(&prompt), buf_len(&prompt),
                           q->chunks, q->stream, q->model, &q->seq);
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
    mock_lock();
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
    mock_unlock();
}

void
post_answer(struct req *q)
{
    char err[256], msg[MOCK_MAX_TAG + 64];
    const char *param = NULL;
    int rc;

    mock_lock();
    st.in_progress++;
    if (mock_is_completion(q->route))
        st.completing++;
    mock_unlock();
    q->open = 1;
    record_body(buf_ptr(&q->c->body), buf_len(&q->c->body));
    if (mock_is_audio(q->route)) {
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
    if (mock_is_completion(q->route))
        note_prefix(q);

    if (q->hold != NULL) {
        rc = wait_hold(q);
        if (rc == GW_ETIMEDOUT) {
            snprintf(msg, sizeof(msg), "mock_hold \"%s\" was not released "
                     "within %d s", q->hold, MOCK_HOLD_MS / 1000);
            send_error(q, 503, msg, "mock_hold", "hold_timeout");
        }
        if (rc != 0)
            goto out;
    }
    if (mock_is_completion(q->route)) {
        long every, ms, force, retry_after, poison_status;
        char poison[MOCK_MAX_TAG + 1];
        enum fault fault;
        uint64_t seq;

        mock_lock();
        seq = ++st.completion_seq;
        every = st.slow_every;
        ms = st.slow_ms;
        force = st.force_status;
        retry_after = st.force_retry_after;
        fault = (enum fault)st.force_fault;
        memcpy(poison, st.poison, sizeof(poison));
        poison_status = st.poison_status;
        mock_unlock();
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
        wait_stall(q);
        goto out;
    }
    if (q->mock_status >= 400) {
        snprintf(msg, sizeof(msg), "mock_status %ld requested",
                 q->mock_status);
        send_error(q, (int)q->mock_status, msg, NULL, "mock_status");
        goto out;
    }
    if (mock_is_completion(q->route) && engine != NULL && enter_engine(q) != 0)
        goto out;
    switch (q->route) {
    case R_EMBED:
        vllm_embeddings(q);
        break;
    case R_RESPONSES:
        vllm_responses(q);
        break;
    case R_TOKENIZE:
        vllm_tokenize(q);
        break;
    case R_DETOKENIZE:
        vllm_detokenize(q);
        break;
    case R_RERANK:
        vllm_rerank(q);
        break;
    case R_SCORE:
        vllm_score(q);
        break;
    case R_POOLING:
        vllm_pooling(q);
        break;
    case R_TRANSCRIBE:
    case R_TRANSLATE:
        vllm_audio(q);
        break;
    default:
        if (q->stream)
            complete_stream(q);
        else
            complete_answer(q);
        break;
    }

out:
    engine_seq_free(engine, q->seq);    /* out of the engine, wherever */
    q->seq = NULL;
    send_close_call(q);
    if (q->gone) {
        mock_lock();
        st.aborted++;
        mock_unlock();
    }
}
