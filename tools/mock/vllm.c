/* SPDX-License-Identifier: MIT */
/*
 * vllm.c - mock_upstream's vLLM routes but the completions (vllm.h).
 *
 * Numbers that vLLM would compute (embeddings, scores, token ids) come
 * from hashes of the input, so the same input gets the same answer.
 */
#include "vllm.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "complete.h"
#include "engine.h"
#include "jsonx.h"
#include "log.h"
#include "lora.h"
#include "mock.h"
#include "send.h"
#include "util.h"
#include "wait.h"

#define MOCK_EMBED_DIM 8

/* json_dump_callback() sink hashing the bytes into a uint64_t. */
static int
dump_to_hash(const char *p, size_t n, void *arg)
{
    uint64_t *h = arg;

    *h = gw_fnv1a64(*h, p, n);
    return 0;
}

/* MOCK_EMBED_DIM numbers in [-1, 1) with 6 decimals, from hash 'h'. */
static json_t *
embedding_new(uint64_t h)
{
    json_t *a = json_array();
    int i;
    long k;

    for (i = 0; a != NULL && i < MOCK_EMBED_DIM; i++) {
        k = (long)(mock_mix64(h + (uint64_t)i) % 2000000) - 1000000;
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

void
vllm_embeddings(struct req *q)
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

        rc = append_embedding(data, gw_fnv1a64(GW_FNV1A64_OFFSET,
                                               json_string_value(s),
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
                  data, "usage", complete_usage_new(q, 0));
    if (q->fault == FAULT_DIE || q->fault == FAULT_STALL_MID
        || q->fault == FAULT_CHUNKED_JSON
        || q->fault == FAULT_CHUNKED_JSON_DIE) {
        struct buf *b = &q->c->out;

        buf_reset(b);
        if (o == NULL || json_dump_callback(o, mock_dump_to_buf, b, JSON_COMPACT
                                            | JSON_REAL_PRECISION(6)) != 0)
            send_error(q, 500, "mock: cannot build the response", NULL,
                       "internal_error");
        else
            complete_json_body(q, buf_ptr(b), buf_len(b));
        json_decref(o);
        return;
    }
    send_json(q, 200, o, JSON_REAL_PRECISION(6));
}

/* Was response 'id' stored (store: true), among the last MOCK_STORED? */
static int
response_stored(const char *id)
{
    size_t i;
    int found = 0;

    mock_lock();
    for (i = 0; !found && i < st.stored_count; i++)
        found = strcmp(st.stored[i], id) == 0;
    mock_unlock();
    return found;
}

static void
store_response(const char *id)
{
    mock_lock();
    snprintf(st.stored[st.stored_next], MOCK_ID_MAX, "%s", id);
    st.stored_next = (st.stored_next + 1) % MOCK_STORED;
    if (st.stored_count < MOCK_STORED)
        st.stored_count++;
    mock_unlock();
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
        && json_dump_callback(o, mock_dump_to_buf, b, JSON_COMPACT) == 0)
        rc = buf_append_str(b, "\n\n");
    json_decref(o);
    if (rc != 0) {
        log_msg(GW_LOG_ERROR, "mock: cannot build an SSE event");
        q->close = 1;
        return GW_ENOMEM;
    }
    return send_piece(q, buf_ptr(b), buf_len(b));
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
        if (complete_chunk_text(q, i, &text) != 0) {
            q->close = 1;
            goto out;
        }
        if (send_named_event(q, "response.output_text.delta", json_pack(
                "{s:i, s:s, s:s, s:[], s:i}", "content_index", 0, "delta",
                buf_ptr(&text), "item_id", msg_id, "logprobs",
                "output_index", 0)) != 0)
            goto out;
    }
    if (complete_fault_mid_stream(q))
        goto out;
    if (complete_joined_text(q, q->chunks, &all) != 0) {
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
    if (send_end(q) == 0
        && !json_is_false(json_object_get(q->json, "store")))
        store_response(q->id);

out:
    buf_release(&text);
    buf_release(&all);
}

void
vllm_responses(struct req *q)
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
    if (complete_joined_text(q, q->chunks, &text) != 0) {
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
    return (json_int_t)(mock_mix64(h ^ mock_mix64((uint64_t)i)) % 32000);
}

void
vllm_tokenize(struct req *q)
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

void
vllm_detokenize(struct req *q)
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
                        complete_word((uint64_t)json_integer_value(t)));
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
    h = mock_mix64(h);
    if (b != NULL)
        json_dump_callback(b, dump_to_hash, &h,
                           JSON_COMPACT | JSON_ENCODE_ANY);
    return (double)(mock_mix64(h) % 1000000) / 1e6;
}

void
vllm_rerank(struct req *q)
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

void
vllm_score(struct req *q)
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
                                "usage", complete_usage_new(q, 0)),
              JSON_REAL_PRECISION(6));
}

void
vllm_pooling(struct req *q)
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
                                complete_usage_new(q, 0)),
              JSON_REAL_PRECISION(6));
}

void
vllm_audio(struct req *q)
{
    const char *format = json_string_value(json_object_get(
                             q->json, "response_format"));
    struct buf text;

    if (q->stream) {
        complete_stream(q);
        return;
    }
    if (wait_client(q, (int64_t)q->chunks * q->delay_ms) != 0)
        return;
    buf_init(&text, MOCK_OUT_LIMIT);
    if (complete_joined_text(q, q->chunks, &text) != 0)
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

void
vllm_models(struct req *q)
{
    struct engine_lora_card *cards = NULL;
    json_t *data = json_array();
    size_t i, n = 0;

    for (i = 0; data != NULL && i < opt.num_models; i++)
        json_array_append_new(data, json_pack(
            "{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", opt.models[i],
            "object", "model", "created", (json_int_t)time(NULL),
            "owned_by", "vllm", "root", opt.models[i], "parent",
            "max_model_len", 4096));
    /* vLLM's lora_cards: the adapter's path as root, the base model as
     * parent, no max_model_len. */
    if (engine != NULL) {
        cards = gw_calloc(LORA_MAX, sizeof(*cards));
        n = cards != NULL ? engine_lora_cards(engine, cards, LORA_MAX) : 0;
    }
    for (i = 0; data != NULL && i < n; i++)
        if (cards[i].served)
            json_array_append_new(data, json_pack(
                "{s:s, s:s, s:I, s:s, s:s, s:s, s:n}", "id", cards[i].name,
                "object", "model", "created", (json_int_t)time(NULL),
                "owned_by", "vllm", "root", cards[i].path, "parent",
                opt.num_models > 0 ? opt.models[0] : MOCK_MODEL,
                "max_model_len"));
    gw_free(cards);
    send_json(q, 200, json_pack("{s:s, s:o}", "object", "list", "data",
                                data), 0);
}

/*
 * The body of a POST /v1/load_lora_adapter or /v1/unload_lora_adapter
 * into OUT *name and *path (borrowed from OUT *root, which the caller
 * frees; *path NULL when absent).  Answers a malformed body itself.
 * Returns 0, or -1 after the answer.
 */
static int
lora_request(struct req *q, json_t **root, const char **name,
             const char **path)
{
    char err[256];

    *root = NULL;
    if (engine == NULL || opt.engine_params.max_loras == 0) {
        send_error(q, 400, "LoRA is not enabled (mock_upstream "
                   "--max-loras)", NULL, "lora_disabled");
        return -1;
    }
    if (jsonx_parse_object(buf_ptr(&q->c->body), buf_len(&q->c->body),
                           JSONX_MAX_DEPTH, root, err, sizeof(err)) != 0) {
        send_error(q, 400, err, NULL, "invalid_json");
        return -1;
    }
    *name = json_string_value(json_object_get(*root, "lora_name"));
    *path = json_string_value(json_object_get(*root, "lora_path"));
    return 0;
}

/* vLLM's answer to a load or unload that worked: text, no Content-Type. */
static void
lora_done(struct req *q, const char *name, const char *done)
{
    char msg[LORA_NAME_MAX + 64];

    snprintf(msg, sizeof(msg), "Success: LoRA adapter '%s' %s "
             "successfully.", name, done);
    send_simple(q, 200, NULL, msg, strlen(msg));
}

void
vllm_load_lora(struct req *q)
{
    const char *name, *path;
    char msg[LORA_NAME_MAX + 96];
    json_t *root;
    int rc;

    if (lora_request(q, &root, &name, &path) != 0)
        return;
    if (name == NULL || name[0] == '\0' || path == NULL || path[0] == '\0') {
        send_error(q, 400, "Both 'lora_name' and 'lora_path' must be "
                   "provided.", NULL, "InvalidUserInput");
    } else if (!lora_name_ok(name) || strlen(path) > LORA_PATH_MAX) {
        snprintf(msg, sizeof(msg), "mock: a lora_name is 1 to %d printable "
                 "ASCII bytes but ',', a lora_path at most %d",
                 LORA_NAME_MAX, LORA_PATH_MAX);
        send_error(q, 400, msg, "lora_name", "InvalidUserInput");
    } else if ((rc = engine_lora_add(engine, name, path)) == GW_EINVAL) {
        snprintf(msg, sizeof(msg), "The lora adapter '%s' has already been "
                 "loaded.", name);
        send_error(q, 400, msg, "lora_name", "InvalidUserInput");
    } else if (rc < 0) {
        send_error(q, 400, "mock: no room for another adapter (LORA_MAX)",
                   NULL, "InvalidUserInput");
    } else {
        lora_done(q, name, "added");
    }
    json_decref(root);
}

void
vllm_unload_lora(struct req *q)
{
    const char *name, *path;
    char msg[LORA_NAME_MAX + 96];
    json_t *root;

    if (lora_request(q, &root, &name, &path) != 0)
        return;
    if (name == NULL || name[0] == '\0') {
        send_error(q, 400, "either 'lora_name' and 'lora_int_id' needs to "
                   "be provided.", NULL, "InvalidUserInput");
    } else if (strlen(name) > LORA_NAME_MAX
               || engine_lora_remove(engine, name) != 0) {
        snprintf(msg, sizeof(msg), "The lora adapter '%.*s' cannot be "
                 "found.", LORA_NAME_MAX, name);
        send_error(q, 404, msg, "lora_name", "NotFoundError");
    } else {
        lora_done(q, name, "removed");
    }
    json_decref(root);
}

void
vllm_health(struct req *q)
{
    long status;

    mock_lock();
    status = st.health_status;
    mock_unlock();
    if (status == 0)
        send_simple(q, 200, NULL, "", 0);
    else
        send_error(q, (int)status, "health status set by /control", NULL,
                   "mock_control");
}
