/* SPDX-License-Identifier: MIT */
/*
 * complete.c - mock_upstream's completions (complete.h): the words, the
 * streamed chunks in vLLM's shape and the whole answer.
 *
 * A non-streamed answer is built whole in c->out and then sent, as one
 * body or, for the chunked_json faults and a mock_gate, in pieces.
 */
#include "complete.h"

#include <stdio.h>

#include "log.h"
#include "mock.h"
#include "net.h"
#include "send.h"
#include "util.h"
#include "wait.h"

#define MOCK_PIECE_GAP_MS 20        /* between chunked_json pieces */

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

/* Word 'i' of the completion for body hash 'h'. */
static const char *
word_at(uint64_t h, long i)
{
    return words[mock_mix64(h ^ mock_mix64((uint64_t)i)) % GW_ARRAY_LEN(words)];
}

const char *
complete_word(uint64_t n)
{
    return words[n % GW_ARRAY_LEN(words)];
}

json_t *
complete_usage_new(const struct req *q, long completion_tokens)
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
    /* vLLM's TranscriptionResponseStreamChoice */
    if (mock_is_audio(q->route))
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

int
complete_chunk_text(const struct req *q, long i, struct buf *b)
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

int
complete_joined_text(const struct req *q, long n, struct buf *text)
{
    int rc = 0;

    buf_reset(text);
    for (long i = 0; i < n && rc == 0; i++)
        rc = complete_chunk_text(q, i, text);
    return rc;                  /* a buf keeps a NUL after its bytes */
}

int
complete_fault_mid_stream(struct req *q)
{
    if (q->fault == FAULT_DIE) {
        q->close = 1;           /* no last chunk: the body is cut short */
        return 1;
    }
    if (q->fault == FAULT_STALL_MID) {
        wait_stall(q);
        return 1;
    }
    if (q->fault == FAULT_ERROR_EVENT) {
        /* vLLM's failure inside a stream: an error event, then [DONE],
         * in a body that ends cleanly. */
        if (send_event(q, json_pack("{s:{s:s, s:s, s:s, s:i}}", "error",
                                    "object", "error", "message",
                                    "mock: engine error mid-stream", "type",
                                    "InternalServerError", "code", 500)) == 0
            && send_piece(q, "data: [DONE]\n\n", 14) == 0)
            send_end(q);
        return 1;
    }
    return 0;
}

void
complete_stream(struct req *q)
{
    struct buf text;
    long n = q->chunks, i;

    buf_init(&text, MOCK_MAX_PAD + 64);     /* the longest word and pad */
    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID
        || q->fault == FAULT_ERROR_EVENT)
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
        wait_stall(q);
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
        if (complete_chunk_text(q, i, &text) != 0) {
            log_msg(GW_LOG_ERROR, "mock: out of memory for a chunk");
            q->close = 1;       /* the body cannot end cleanly now */
            goto out;
        }
        if (send_event(q, chunk_new(q, choices_new(q, NULL, buf_ptr(&text),
                                                   NULL), NULL)) != 0)
            goto out;
    }
    if (complete_fault_mid_stream(q))
        goto out;
    if (send_event(q, chunk_new(q, choices_new(q, NULL, NULL, q->finish),
                                NULL)) != 0)
        goto out;
    if (q->include_usage
        && send_event(q, chunk_new(q, json_array(),
                                   complete_usage_new(q, q->chunks))) != 0)
        goto out;
    if (send_piece(q, "data: [DONE]\n\n", 14) != 0)
        goto out;
    send_end(q);

out:
    buf_release(&text);
}

/*
 * A JSON body p[0..n) with its Content-Length, under a mock_gate: in
 * q->chunks pieces of about the same size (at least one), piece i sent
 * once the gate is open past i, so that a test decides how far the body
 * has gone.  A gate that stays shut cuts the body short (wait_gate()).
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
        if (wait_gate(q, (long)i) != 0)
            return;
        if (i + 1 == pieces)
            send_close_call(q);
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

void
complete_json_body(struct req *q, const char *p, size_t n)
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
        if (send_piece(q, p + off, len) != 0)
            return;
        off += len;
    }
    send_end(q);
}

void
complete_answer(struct req *q)
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
        rc = complete_chunk_text(q, i, &text);
    if (rc != 0)
        goto out;
    if (q->route == R_CHAT)
        o = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, "
                      "s:s}], s:o}", "id", q->id, "object",
                      "chat.completion", "created", q->created, "model",
                      q->model, "choices", "index", 0, "message", "role",
                      "assistant", "content", buf_ptr(&text), "logprobs",
                      "finish_reason", q->finish, "usage",
                      complete_usage_new(q, q->chunks));
    else
        o = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:n, s:s}], "
                      "s:o}", "id", q->id, "object", "text_completion",
                      "created", q->created, "model", q->model, "choices",
                      "index", 0, "text", buf_ptr(&text), "logprobs",
                      "finish_reason", q->finish, "usage",
                      complete_usage_new(q, q->chunks));
    buf_reset(b);
    if (o == NULL) {
        rc = GW_ENOMEM;
        goto out;
    }
    if (json_dump_callback(o, mock_dump_to_buf, b, JSON_COMPACT) != 0) {
        /* Out of memory or past b's limit: json_dumpb() with no buffer
         * only measures, so it tells which. */
        rc = json_dumpb(o, NULL, 0, JSON_COMPACT) > b->limit ? GW_ETOOBIG
                                                           : GW_ENOMEM;
        goto out;
    }
    complete_json_body(q, buf_ptr(b), buf_len(b));

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
