/* SPDX-License-Identifier: MIT */
/*
 * check_usage.c - unit tests for gateway/coalesce/usage.c: the token usage a
 * tenant is billed for, read from the response bytes as they pass (a
 * JSON body's top-level "usage", or a stream's last usage event).
 *
 * The cases are a table fed three ways: whole, in two pieces split at
 * every offset, and one byte at a time; each piece ends at a guard page
 * (testutil.h), so a read past what was fed crashes.
 */
#include <check.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "coalesce/usage.h"
#include "jsonx.h"

#include "util.h"
#include "testutil.h"

/* The scans' limit here (the fixed bound of old). */
#define LIMIT ((size_t)1 << 20)

#define NONE (-1)               /* no usage found: not billed */

/* The SSE body a vLLM stream with include_usage sends, abridged. */
#define SSE_BODY                                                        \
    "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\": {\"}}],"  \
    "\"usage\":null}\n\n"                                               \
    "data: {\"choices\":[],\"usage\": {\"prompt_tokens\":7,"            \
    "\"completion_tokens\":3,\"total_tokens\":10}}\r\n\r\n"             \
    "data: [DONE]\n\n"

/* The events of a Responses API stream (vLLM's shapes), abridged. */
#define RESPONSES_SSE                                                   \
    "event: response.created\n"                                         \
    "data: {\"type\":\"response.created\",\"sequence_number\":0,"        \
    "\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\","          \
    "\"usage\":null}}\n\n"                                               \
    "event: response.output_text.delta\n"                               \
    "data: {\"type\":\"response.output_text.delta\",\"delta\":"           \
    "\"\\\"usage\\\": {\\\"input_tokens\\\":99}\"}\n\n"                     \
    "event: response.completed\n"                                       \
    "data: {\"type\":\"response.completed\",\"sequence_number\":9,"      \
    "\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":"  \
    "{\"input_tokens\":9,\"output_tokens\":5,\"total_tokens\":14}}}\n\n"

static const struct usage_case {
    int status;
    const char *ctype;          /* the response's Content-Type, or NULL */
    const char *body;
    int64_t prompt;             /* NONE: usage_scan_end() returns 0 */
    int64_t completion;
    const char *note;
} cases[] = {
    /* JSON bodies */
    { 200, "application/json",
      "{\"id\":\"x\",\"usage\":{\"prompt_tokens\":12,"
      "\"completion_tokens\":4}}", 12, 4, "a chat completion" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":9,\"total_tokens\":9}}", 9, 0,
      "an embedding has no completion_tokens: 0" },
    { 200, NULL, "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}",
      5, 1, "no Content-Type: read as JSON" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":0}}", 0, 0,
      "zero is a count" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":4294967296,"
      "\"completion_tokens\":4294967296}}", 4294967296, 4294967296,
      "2^32 is the largest count" },
    { 200, "application/json", "{\"usage\":null}", NONE, 0,
      "usage null" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":-1}}", NONE, 0,
      "a negative count" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":1.5}}", NONE, 0,
      "a real" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":\"7\"}}", NONE,
      0, "a string" },
    { 200, "application/json", "{\"usage\":{\"completion_tokens\":7}}", NONE,
      0, "no prompt_tokens" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":true}}", NONE, 0,
      "a boolean completion_tokens" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":4294967297}}",
      NONE, 0, "past 2^32" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":007}}",
      NONE, 0, "leading zeros are not JSON" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":1e2}}",
      NONE, 0, "an exponent makes a real" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":-0,\"completion_tokens\":2}}", 0, 2,
      "-0 is jansson's integer 0" },
    { 200, "application/json",
      "{\"usage\": { \"completion_tokens\" : 5 ,\n\"prompt_tokens\":6 }}",
      6, 5, "blanks and any order" },
    { 200, "application/json", "{\"usage\":{\"prompt_tokens\":1}", NONE, 0,
      "the body is cut" },
    { 200, "application/json", "{\"usage\":[1,2]}", NONE, 0,
      "usage is not an object" },
    { 200, "application/json",
      "{\"data\":{\"usage\":{\"prompt_tokens\":1}}}", NONE, 0,
      "only the top-level usage counts" },
    { 200, "application/json", "not json", NONE, 0, "not JSON" },
    { 200, "application/json", "", NONE, 0, "an empty body" },
    { 200, "application/json", SSE_BODY, NONE, 0,
      "a stream labelled JSON is not one JSON object" },

    /* The other routes' usage (usage.h) */
    { 200, "application/json",
      "{\"id\":\"resp_1\",\"object\":\"response\",\"usage\":"
      "{\"input_tokens\":11,\"input_tokens_details\":{\"cached_tokens\":0},"
      "\"output_tokens\":6,\"output_tokens_details\":{\"reasoning_tokens\""
      ":0},\"total_tokens\":17}}", 11, 6,
      "a Responses API body: input_tokens, output_tokens" },
    { 200, "application/json",
      "{\"usage\":{\"input_tokens\":3}}", 3, 0,
      "no output_tokens: 0" },
    { 200, "application/json",
      "{\"usage\":{\"input_tokens\":3,\"output_tokens\":-2}}", NONE, 0,
      "a negative output_tokens" },
    { 200, "application/json",
      "{\"usage\":{\"prompt_tokens\":2,\"input_tokens\":50,"
      "\"output_tokens\":50}}", 2, 0,
      "prompt_tokens first: one API's names, never a mix" },
    { 200, "application/json",
      "{\"id\":\"rerank-1\",\"usage\":{\"total_tokens\":21},"
      "\"results\":[]}", 21, 0, "a rerank: total_tokens, all input" },
    { 200, "application/json",
      "{\"text\":\"hi\",\"usage\":{\"type\":\"duration\","
      "\"seconds\":3}}", NONE, 0,
      "a transcription's duration is no token count" },
    { 200, "application/json",
      "{\"type\":\"response.completed\",\"response\":{\"usage\":"
      "{\"input_tokens\":4,\"output_tokens\":2}}}", 4, 2,
      "the usage of a \"response\" object, as in response.completed" },
    { 200, "application/json",
      "{\"usage\":null,\"response\":{\"usage\":{\"input_tokens\":4}}}",
      NONE, 0, "a top-level usage, even null, is the one" },
    { 200, "application/json",
      "{\"data\":{\"response\":{\"usage\":{\"input_tokens\":1}}}}", NONE,
      0, "a response object deeper down is not one" },
    { 200, "text/event-stream", RESPONSES_SSE, 9, 5,
      "a Responses API stream: response.completed's usage" },

    /* Event streams */
    { 200, "text/event-stream; charset=utf-8", SSE_BODY, 7, 3,
      "the usage event; a \"usage\": { in a string and usage:null before" },
    { 200, "TEXT/Event-Stream",
      "data: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n\n",
      2, 1, "the media type is case-insensitive" },
    { 200, "text/event-stream",
      "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n"
      "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n",
      3, 5, "running totals (continuous_usage_stats): the last one wins" },
    { 200, "text/event-stream",
      "data: {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n"
      "data: {\"usage\":null}\n\n", 4, 2,
      "a later usage:null keeps the count" },
    { 200, "text/event-stream",
      "data:{\"usage\" :\t{\"prompt_tokens\":6,\"completion_tokens\":1}}\n",
      6, 1, "no blank after data:, blanks around the colon" },
    { 200, "text/event-stream",
      ": {\"usage\":{\"prompt_tokens\":1}}\n"
      "event: {\"usage\":{\"prompt_tokens\":1}}\n\n", NONE, 0,
      "only data: lines are read" },
    { 200, "text/event-stream",
      "data: {\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1}}\n\n"
      "data: {\"usage\":{\"prompt_tokens\":9,\n\n", 8, 1,
      "a broken usage event leaves the last good one" },
    { 200, "text/event-stream",
      "data: {\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1}}", NONE,
      0, "a last line with no newline is not an event" },

    /* Only a 2xx response is billed. */
    { 299, "application/json", "{\"usage\":{\"prompt_tokens\":1}}", 1, 0,
      "299 is a success" },
    { 300, "application/json", "{\"usage\":{\"prompt_tokens\":1}}", NONE, 0,
      "300 is not" },
    { 199, "application/json", "{\"usage\":{\"prompt_tokens\":1}}", NONE, 0,
      "nor is 199" },
    { 429, "application/json", "{\"usage\":{\"prompt_tokens\":1}}", NONE, 0,
      "a refusal is free" },
    { 500, "text/event-stream", "data: {\"usage\":{\"prompt_tokens\":1}}\n",
      NONE, 0, "an upstream error is free" },
};

/* Feed body[0..n) as one piece, ending at a guard page. */
static void
feed_guarded(struct usage_scan *u, const char *body, size_t n)
{
    char *p = guarded_copy(body, n);

    usage_scan_feed(u, p, n);
    guarded_free(p, n);
}

/*
 * Scan c->body fed in the pieces that start at each offset of 'cuts'
 * (ascending, the first 0, the last below its length), and check it.
 */
static void
check_scan(const struct usage_case *c, const size_t *cuts, size_t ncuts,
           const char *how)
{
    struct usage_scan u;
    size_t n = strlen(c->body);
    int64_t prompt = NONE, completion = NONE;
    int found;

    usage_scan_init(&u, LIMIT);
    usage_scan_head(&u, c->status, c->ctype);
    for (size_t i = 0; i < ncuts; i++) {
        size_t end = i + 1 < ncuts ? cuts[i + 1] : n;

        feed_guarded(&u, c->body + cuts[i], end - cuts[i]);
    }
    found = usage_scan_end(&u, &prompt, &completion);
    usage_scan_release(&u);
    ck_assert_msg(found == (c->prompt != NONE),
                  "%s (%s): found %d", c->note, how, found);
    if (found)
        ck_assert_msg(prompt == c->prompt && completion == c->completion,
                      "%s (%s): %lld/%lld, want %lld/%lld", c->note, how,
                      (long long)prompt, (long long)completion,
                      (long long)c->prompt, (long long)c->completion);
}

/*
 * The three ways a table's row 'i' (of 'n' bytes) is fed to its check:
 * whole, in two pieces cut at every offset, and byte by byte ('cuts':
 * where each piece starts).
 */
typedef void row_check_fn(int i, const size_t *cuts, size_t ncuts,
                          const char *how);

static void
fed_whole(row_check_fn *check, int i)
{
    size_t cut = 0;

    check(i, &cut, 1, "whole");
}

static void
fed_in_two(row_check_fn *check, int i, size_t n)
{
    char how[32];

    for (size_t at = 1; at < n; at++) {
        size_t cuts[2] = { 0, at };

        snprintf(how, sizeof(how), "cut at %zu", at);
        check(i, cuts, 2, how);
    }
}

static void
fed_byte_by_byte(row_check_fn *check, int i, size_t n)
{
    size_t *cuts;

    if (n == 0)
        return;
    cuts = malloc(n * sizeof(*cuts));
    ck_assert_ptr_nonnull(cuts);
    for (size_t k = 0; k < n; k++)
        cuts[k] = k;
    check(i, cuts, n, "byte by byte");
    free(cuts);
}

static void
scan_row(int i, const size_t *cuts, size_t ncuts, const char *how)
{
    check_scan(&cases[i], cuts, ncuts, how);
}

START_TEST(test_whole)
{
    fed_whole(scan_row, _i);
}
END_TEST

START_TEST(test_two_pieces_at_every_offset)
{
    fed_in_two(scan_row, _i, strlen(cases[_i].body));
}
END_TEST

START_TEST(test_byte_by_byte)
{
    fed_byte_by_byte(scan_row, _i, strlen(cases[_i].body));
}
END_TEST

/* Feed body[0..n) in pieces of 'step' bytes to a scan limited to
 * 'limit'; the prompt count or NONE. */
static int64_t
scan_limit(size_t limit, int status, const char *ctype, const char *body,
           size_t n, size_t step)
{
    struct usage_scan u;
    int64_t prompt = NONE, completion;

    usage_scan_init(&u, limit);
    usage_scan_head(&u, status, ctype);
    for (size_t i = 0; i < n; i += step)
        usage_scan_feed(&u, body + i, n - i < step ? n - i : step);
    if (!usage_scan_end(&u, &prompt, &completion))
        prompt = NONE;
    usage_scan_release(&u);
    return prompt;
}

static int64_t
scan(int status, const char *ctype, const char *body, size_t n, size_t step)
{
    return scan_limit(LIMIT, status, ctype, body, n, step);
}

/* Make 'b' 'before', 'npad' bytes of 'a's, then 'after': a big input. */
static void
padded(struct buf *b, const char *before, size_t npad, const char *after)
{
    buf_reset(b);
    ck_assert_int_eq(buf_append_str(b, before), 0);
    for (size_t i = 0; i < npad; i++)
        ck_assert_int_eq(buf_append(b, "a", 1), 0);
    ck_assert_int_eq(buf_append_str(b, after), 0);
}

START_TEST(test_json_past_max_body_is_not_billed)
{
    static const char head[] = "{\"usage\":{\"prompt_tokens\":2},\"pad\":\"";
    struct buf big;

    buf_init(&big, 4 * LIMIT);
    padded(&big, "{\"pad\":\"", LIMIT,
           "\",\"usage\":{\"prompt_tokens\":1}}");
    ck_assert_int_eq(scan(200, "application/json", buf_ptr(&big),
                          buf_len(&big), 65536), NONE);
    /* A body of exactly LIMIT bytes is read. */
    padded(&big, head, LIMIT - strlen(head) - strlen("\"}"), "\"}");
    ck_assert_uint_eq(buf_len(&big), LIMIT);
    ck_assert_int_eq(scan(200, "application/json", buf_ptr(&big),
                          buf_len(&big), 65536), 2);
    buf_release(&big);
}
END_TEST

START_TEST(test_sse_line_past_max_line_is_skipped)
{
    struct buf big;

    buf_init(&big, 4 * LIMIT);
    padded(&big, "data: {\"usage\":{\"prompt_tokens\":5},\"pad\":\"",
           LIMIT, "\"}\n");
    ck_assert_int_eq(scan(200, "text/event-stream", buf_ptr(&big),
                          buf_len(&big), 1000), NONE);
    /* ... and the next line is read again. */
    ck_assert_int_eq(buf_append_str(&big, "data: {\"usage\":{\"prompt_tokens"
                                    "\":6}}\n"), 0);
    ck_assert_int_eq(scan(200, "text/event-stream", buf_ptr(&big),
                          buf_len(&big), 1000), 6);
    buf_release(&big);
}
END_TEST

/* The limit follows max_request_body, with room for the answer. */
START_TEST(test_the_limit_follows_the_largest_request)
{
    ck_assert_uint_eq(usage_limit(0), USAGE_ANSWER_ROOM);
    ck_assert_uint_eq(usage_limit(16u << 20), (16u << 20) + USAGE_ANSWER_ROOM);
    ck_assert_uint_eq(usage_limit(UINT64_MAX), SIZE_MAX);
}
END_TEST

/*
 * A Responses API stream's last event echoes the request's instructions:
 * a client that pads them past 1 MiB must still be billed (a review
 * found that it was not, with a fixed 1 MiB bound).
 */
START_TEST(test_a_padded_responses_event_is_billed)
{
    size_t limit = usage_limit(16u << 20), npad = 3u << 20;
    char *pad = malloc(npad);
    struct buf big;

    ck_assert_ptr_nonnull(pad);
    memset(pad, 'a', npad);         /* one append: fast under TSan too */
    buf_init(&big, 8u << 20);
    ck_assert_int_eq(buf_append_str(&big, "event: response.completed\n"
                                    "data: {\"type\":\"response.completed"
                                    "\",\"response\":{\"instructions\":\""),
                     0);
    ck_assert_int_eq(buf_append(&big, pad, npad), 0);
    ck_assert_int_eq(buf_append_str(&big, "\",\"usage\":{\"input_tokens\""
                                    ":7,\"output_tokens\":3}}}\n\n"), 0);
    ck_assert_int_eq(scan_limit(limit, 200, "text/event-stream",
                                buf_ptr(&big), buf_len(&big), 65536), 7);
    /* With the old fixed bound it went unbilled. */
    ck_assert_int_eq(scan_limit(LIMIT, 200, "text/event-stream",
                                buf_ptr(&big), buf_len(&big), 65536), NONE);
    buf_release(&big);
    free(pad);
}
END_TEST

/* What the response cache may keep: a whole answer without error. */
START_TEST(test_clean)
{
    static const char *const ok = "data: {\"choices\":[]}\n\n"
                                  "data: [DONE]\n\n";
    static const struct {
        const char *body;
        int clean;
    } clean_cases[] = {
        { "data: {\"choices\":[]}\n\ndata: [DONE]\r\n\r\n", 1 },
        { "data: {\"choices\":[]}\n\n", 0 },
        { "data: {\"error\": {\"message\":\"x\"}}\n\ndata: [DONE]\n\n",
          0 },
        { "data: { \"object\" : \"error\", \"message\":\"x\"}\n\n"
          "data: [DONE]\n\n", 0 },
        { "data: {\"text\":\"\\\"error\\\"\"}\n\ndata: [DONE]\n\n", 1 },
        { "data: [DONE] and more\n\n", 0 },
    };
    struct usage_scan u;

    for (size_t i = 0; i < GW_ARRAY_LEN(clean_cases); i++) {
        usage_scan_init(&u, LIMIT);
        usage_scan_head(&u, 200, "text/event-stream");
        usage_scan_feed(&u, clean_cases[i].body, strlen(clean_cases[i].body));
        ck_assert_msg(usage_scan_clean(&u) == clean_cases[i].clean, "%zu: %s", i,
                      clean_cases[i].body);
        usage_scan_release(&u);
    }
    usage_scan_init(&u, LIMIT);
    usage_scan_head(&u, 500, "text/event-stream");
    usage_scan_feed(&u, ok, strlen(ok));
    ck_assert_int_eq(usage_scan_clean(&u), 0);      /* not 2xx */
    usage_scan_head(&u, 200, "application/json");
    ck_assert_int_eq(usage_scan_clean(&u), 1);      /* a whole body */
    usage_scan_release(&u);
}
END_TEST

/*
 * A retried call's scan sees a second head: what the first attempt's
 * bytes said is forgotten (usage_scan_head() starts over).
 */
START_TEST(test_a_new_head_starts_over)
{
    static const char json[] = "{\"usage\":{\"prompt_tokens\":3,"
                               "\"completion_tokens\":2}}";
    static const char event[] = "data: {\"usage\":{\"prompt_tokens\":4}}\n";
    struct usage_scan u;
    int64_t prompt, completion;

    /* A billed first attempt, then a 503: nothing to bill. */
    usage_scan_init(&u, LIMIT);
    usage_scan_head(&u, 200, "text/event-stream");
    usage_scan_feed(&u, event, strlen(event));
    usage_scan_head(&u, 503, "application/json");
    usage_scan_feed(&u, json, strlen(json));
    ck_assert_int_eq(usage_scan_end(&u, &prompt, &completion), 0);

    /* Half a JSON body, then a stream: the half is not its first line. */
    usage_scan_head(&u, 200, "application/json");
    usage_scan_feed(&u, json, 10);
    usage_scan_head(&u, 200, "text/event-stream");
    usage_scan_feed(&u, event, strlen(event));
    ck_assert_int_eq(usage_scan_end(&u, &prompt, &completion), 1);
    ck_assert_int_eq(prompt, 4);
    ck_assert_int_eq(completion, 0);
    usage_scan_release(&u);
}
END_TEST

/* A chat request with an image by URL: 137 bytes for what a vision
 * model reads as thousands of prompt tokens. */
#define IMAGE_REQUEST "{\"model\":\"m\",\"stream\":true,\"messages\":" \
    "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"," \
    "\"image_url\":{\"url\":\"https://example.com/a.png\"}}]}]}"

/*
 * The charge (usage.h): the usage when there is one, else the count:
 * request bytes / 4, rounded up, plus the events that carry text (or a
 * JSON body's bytes / 4).  A table: (status, type, body, request
 * bytes, charge, counted, note); each fed whole and byte by byte.
 */
static const struct charge_case {
    int status;
    const char *ctype;
    const char *body;
    size_t request_bytes;
    uint64_t charge;
    int counted;
    const char *note;
} charges[] = {
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\","
      "\"content\":\"\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\": \" world\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
      "data: [DONE]\n\n", 41, 11 + 2, 1,
      "chat without usage: the role and finish events carry no text" },
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
      "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
      "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}"
      "\r\n\r\ndata: [DONE]\r\n\r\n", 8, 2 + 2, 1,
      "completions, CRLF lines" },
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":"
      "{\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n"
      "data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"text\\\": "
      "\\\"x\\\"\"}}]}\n\n", 0, 4, 1,
      "tool arguments, reasoning, a Responses delta, quoted keys: 1 each" },
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"delta\":{\"refusal\" :\t\"no\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n"
      "data: {\"note\":\"content\"}\n\n"
      "data: \"text\"\n\n"
      "data: [DONE]\n\n", 0, 1, 1,
      "a refusal with blanks: 1; an empty text, a key's name as a value and "
      "a line ending in a quote: none" },
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,"
      "\"completion_tokens\":7}}\n\ndata: [DONE]\n\n", 1000, 37, 0,
      "include_usage: the usage, not the count" },
    { 200, "application/json",
      "{\"choices\":[{\"message\":{\"content\":\"Hi\"}}],\"usage\":"
      "{\"prompt_tokens\":5,\"completion_tokens\":1}}", 400, 6, 0,
      "a JSON body's usage" },
    { 200, "application/json", "{\"text\":\"one two three\"}", 5,
      2 + 6, 1, "a JSON body without usage: its 24 bytes / 4" },
    { 503, "application/json", "{\"error\":{\"message\":\"busy\"}}", 400,
      0, 0, "not 2xx: nothing" },
    { 200, "text/event-stream",
      "data: {\"choices\":[{\"delta\":{\"content\":\"A cat\"}}]}\n\n"
      "data: [DONE]\n\n", sizeof(IMAGE_REQUEST) - 1,
      35 + 1, 1,
      "an image by URL: counted from its bytes, far below the truth "
      "(documented: the count is an estimate a client can push low)" },
};

/* Scan charges[i].body in pieces of 'step' bytes (0: whole). */
static void
check_charge(const struct charge_case *c, size_t step)
{
    struct usage_scan u;
    size_t n = strlen(c->body);
    int64_t prompt, completion;
    uint64_t got;
    int counted = -1;

    usage_scan_init(&u, LIMIT);
    usage_scan_head(&u, c->status, c->ctype);
    for (size_t at = 0; at < n; at += step == 0 ? n : step) {
        size_t len = step == 0 || n - at < step ? n - at : step;

        feed_guarded(&u, c->body + at, len);
    }
    (void)usage_scan_end(&u, &prompt, &completion);
    got = usage_scan_charge(&u, c->request_bytes, &counted);
    usage_scan_release(&u);
    ck_assert_msg(got == c->charge && counted == c->counted,
                  "%s (step %zu): %llu counted %d, want %llu counted %d",
                  c->note, step, (unsigned long long)got, counted,
                  (unsigned long long)c->charge, c->counted);
}

START_TEST(test_charge)
{
    check_charge(&charges[_i], 0);
    check_charge(&charges[_i], 1);
    check_charge(&charges[_i], 7);
}
END_TEST

/* A stream cut short is charged what came before the cut; a new head
 * (a retry's) starts the count over. */
START_TEST(test_charge_of_a_cut_stream_and_a_retry)
{
    static const char ev[] = "data: {\"choices\":[{\"text\":\"w\"}]}\n\n";
    struct usage_scan u;
    int counted;

    usage_scan_init(&u, LIMIT);
    usage_scan_head(&u, 200, "text/event-stream");
    usage_scan_feed(&u, ev, strlen(ev));
    usage_scan_head(&u, 200, "text/event-stream");
    usage_scan_feed(&u, ev, strlen(ev));
    usage_scan_feed(&u, ev, strlen(ev));
    usage_scan_feed(&u, ev, 12);        /* cut mid-event: not counted */
    ck_assert_uint_eq(usage_scan_charge(&u, 4, &counted), 1 + 2);
    ck_assert_int_eq(counted, 1);
    usage_scan_release(&u);
}
END_TEST

/* ---- asking for the usage, and cutting the usage event out ---- */

/*
 * usage_ask() and usage_asked() (usage.h): a table of (request body,
 * the body sent upstream or NULL for "left alone", whether the client
 * asked, note).  Each body ends at a guard page; the JSON given is
 * parsed from the same bytes, as proxy.c's is.
 */
#define ASKED 1, "include_usage true: asked already, the client's words"

static const struct ask_case {
    const char *body;
    const char *want;
    int asked;
    const char *note;
} asks[] = {
    { "{\"model\":\"m\",\"stream\":true}",
      "{\"stream_options\":{\"include_usage\":true},\"model\":\"m\","
      "\"stream\":true}", 0, "a stream: asked right after the '{'" },
    { " \r\n\t{\"stream\":true}",
      " \r\n\t{\"stream_options\":{\"include_usage\":true},\"stream\":true}",
      0, "whitespace before the '{' is kept, the '{' found" },
    { "{ \"stream\" : true , \"temperature\":0.10, \"seed\":1e2 }",
      "{\"stream_options\":{\"include_usage\":true}, \"stream\" : true , "
      "\"temperature\":0.10, \"seed\":1e2 }", 0,
      "the rest byte for byte: numbers are never re-serialised" },
    { "{\"stre\\u0061m\":true}",
      "{\"stream_options\":{\"include_usage\":true},\"stre\\u0061m\":true}",
      0, "an escaped key is the key: the upstream reads it so too" },
    { "{}", NULL, 0, "{} is not a stream" },
    { "{\"stream\":\"true\"}", NULL, 0, "the string \"true\" is not true" },
    { "{\"stream\":1}", NULL, 0, "1 is not true" },
    { "{\"stream\":false}", NULL, 0, "not a stream" },
    { "{\"stream\":null}", NULL, 0, "null is not true" },
    { "{\"messages\":[{\"stream\":true}]}", NULL, 0,
      "a nested \"stream\" does not count" },
    { "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL,
      ASKED },
    { "{\"stream_options\":{\"include_usage\":true,"
      "\"continuous_usage_stats\":true}}", NULL, ASKED },
    { "{\"stream\":true,\"stream_options\":{\"include_usage\":false}}", NULL,
      0, "refused: the client's choice" },
    { "{\"stream\":true,\"stream_options\":{\"include_usage\":\"true\"}}",
      NULL, 0, "stream_options in any form: left alone, and not asked" },
    { "{\"stream\":true,\"stream_options\":{\"include_usage\":1}}", NULL, 0,
      "1 is not true" },
    { "{\"stream\":true,\"stream_options\":{}}", NULL, 0, "{}" },
    { "{\"stream\":true,\"stream_options\":null}", NULL, 0, "null" },
    { "{\"stream\":true,\"stream_options\":true}", NULL, 0, "true" },
    { "{\"stream\":true,\"stream\\u005foptions\":1}", NULL, 0,
      "stream_options escaped is stream_options" },
    { "{\"include_usage\":true}", NULL, 0, "not in stream_options" },
    { "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\","
      "\"stream_options\":{\"include_usage\":true}}]}",
      "{\"stream_options\":{\"include_usage\":true},\"stream\":true,"
      "\"messages\":[{\"role\":\"user\",\"content\":\"x\","
      "\"stream_options\":{\"include_usage\":true}}]}", 0,
      "a nested stream_options does not count: only a top-level member" },
};

START_TEST(test_ask)
{
    const struct ask_case *c = &asks[_i];
    size_t n = strlen(c->body);
    char *p = guarded_copy(c->body, n);
    json_t *body = NULL, *sent = NULL;
    struct buf out;
    char err[96];
    int rc;

    ck_assert_msg(jsonx_parse_object(p, n, JSONX_MAX_DEPTH, &body, err,
                                     sizeof(err)) == 0, "%s: %s", c->note,
                  err);
    buf_init(&out, n + sizeof(USAGE_ASK));
    rc = usage_ask(p, n, body, &out);
    if (c->want == NULL) {
        ck_assert_msg(rc == 0 && buf_len(&out) == 0, "%s: rc %d, %s",
                      c->note, rc, buf_ptr(&out));
    } else {
        ck_assert_msg(rc == 1 && strcmp(buf_ptr(&out), c->want) == 0,
                      "%s: rc %d\n%s\nwant\n%s", c->note, rc, buf_ptr(&out),
                      c->want);
        /* What is sent asks, and asks once: it is left alone again. */
        ck_assert_int_eq(jsonx_parse_object(buf_ptr(&out), buf_len(&out),
                                            JSONX_MAX_DEPTH, &sent, err,
                                            sizeof(err)), 0);
        ck_assert_int_eq(usage_asked(sent), 1);
        ck_assert_int_eq(usage_ask(buf_ptr(&out), buf_len(&out), sent,
                                   &out), 0);
        json_decref(sent);
    }
    ck_assert_msg(usage_asked(body) == c->asked, "%s: asked", c->note);
    ck_assert_int_eq(usage_asked(NULL), 0);
    json_decref(body);
    buf_release(&out);
    guarded_free(p, n);
}
END_TEST

/* Past the buffer's limit, or out of memory: the error, never 1. */
START_TEST(test_ask_errors)
{
    static const char b[] = "{\"stream\":true}";
    json_t *body = json_pack("{s:b}", "stream", 1);
    struct buf out;

    buf_init(&out, sizeof(b) + sizeof(USAGE_ASK) - 3);
    ck_assert_int_eq(usage_ask(b, sizeof(b) - 1, body, &out), GW_ETOOBIG);
    buf_release(&out);
    buf_init(&out, SIZE_MAX);
    alloc_fail_after(1, 0);
    ck_assert_int_eq(usage_ask(b, sizeof(b) - 1, body, &out), GW_ENOMEM);
    alloc_fail_after(0, 0);
    buf_release(&out);
    json_decref(body);
}
END_TEST

/* vLLM's last events with include_usage, chat and completions. */
#define USAGE_EV "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\"," \
    "\"choices\":[],\"usage\":{\"prompt_tokens\":7,"                      \
    "\"completion_tokens\":3,\"total_tokens\":10}}\n\n"
#define USAGE_EV_CRLF "data: {\"choices\": [ ], \"usage\": "            \
    "{\"prompt_tokens\":7}}\r\n\r\n"
#define ROLE_EV "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
#define TEXT_EV "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
#define DONE_EV "data: [DONE]\n\n"

/*
 * The split (struct usage_split): a table of (stream, its usage events
 * joined, note).  Fed whole, in two pieces cut at every offset, and
 * byte by byte, each piece ending at a guard page: the pieces joined
 * are the stream; the flagged ones are exactly the usage events, each
 * alone; and after each feed every event that has ended was given on,
 * so only the start of one that has not is ever held back.
 */
static const struct split_case {
    const char *stream;
    const char *usage;          /* the flagged pieces, joined */
    const char *note;
} splits[] = {
    { ROLE_EV TEXT_EV TEXT_EV USAGE_EV DONE_EV, USAGE_EV,
      "vLLM chat with include_usage: the usage event alone" },
    { "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n" USAGE_EV_CRLF
      "data: [DONE]\r\n\r\n", USAGE_EV_CRLF, "CRLF lines" },
    { ROLE_EV TEXT_EV DONE_EV, "", "no usage event: nothing flagged" },
    { USAGE_EV, USAGE_EV, "the usage event alone in the stream" },
    { USAGE_EV USAGE_EV DONE_EV, USAGE_EV USAGE_EV, "two: each alone" },
    { "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":"
      "{\"prompt_tokens\":1}}\n\n" DONE_EV, "",
      "usage with a choice (continuous_usage_stats): never cut" },
    { "data: {\"choices\":[],\"usage\":null}\n\n" DONE_EV, "",
      "usage null: not a usage event" },
    { "data: {\"choices\":[],\"x\":\"\\\"usage\\\": {\"}\n\n" DONE_EV, "",
      "text that quotes \"usage\": { is text" },
    { "event: usage\ndata: {\"choices\":[],\"usage\":{}}\n\n" DONE_EV, "",
      "two lines: not vLLM's usage event" },
    { "data: {\"usage\":{\"prompt_tokens\":1}}\n\n" DONE_EV, "",
      "no \"choices\": [] (a Responses or JSON shape): not cut" },
    { ROLE_EV "data: [DONE]", "",
      "the last event never ends: given at the end, as it is" },
    { "\n\n" USAGE_EV "\r\n" DONE_EV, USAGE_EV,
      "stray blank lines go with the runs" },
};

/* What usage_piece_fn gave: everything, the flagged pieces, counts. */
struct got {
    struct buf all;
    struct buf flagged;
    size_t pieces;
    int fail;                   /* returned by the next piece */
};

static int
collect(void *arg, const char *p, size_t n, int usage)
{
    struct got *g = arg;

    ck_assert_uint_gt(n, 0);
    ck_assert_int_eq(buf_append(&g->all, p, n), 0);
    if (usage)
        ck_assert_int_eq(buf_append(&g->flagged, p, n), 0);
    g->pieces++;
    return g->fail;
}

static void
got_init(struct got *g)
{
    memset(g, 0, sizeof(*g));
    buf_init(&g->all, SIZE_MAX);
    buf_init(&g->flagged, SIZE_MAX);
}

static void
got_release(struct got *g)
{
    buf_release(&g->all);
    buf_release(&g->flagged);
}

/*
 * Where the last event that ends in s[0..n) ends (0: none): after the
 * '\n' of a blank line ("" or "\r"; the stream starts a line).
 */
static size_t
last_event_end(const char *s, size_t n)
{
    size_t end = 0;

    for (size_t i = 0; i < n; i++) {
        size_t start = i > 0 && s[i - 1] == '\r' ? i - 1 : i;

        if (s[i] == '\n' && (start == 0 || s[start - 1] == '\n'))
            end = i + 1;
    }
    return end;
}

/* Split c->stream fed in the pieces that start at each of 'cuts'. */
static void
check_split(const struct split_case *c, const size_t *cuts, size_t ncuts,
            const char *how)
{
    struct usage_split s;
    struct got g;
    size_t n = strlen(c->stream);

    got_init(&g);
    usage_split_init(&s);
    for (size_t i = 0; i < ncuts; i++) {
        size_t end = i + 1 < ncuts ? cuts[i + 1] : n;
        char *p = guarded_copy(c->stream + cuts[i], end - cuts[i]);

        ck_assert_int_eq(usage_split_feed(&s, p, end - cuts[i], collect,
                                          &g), 0);
        guarded_free(p, end - cuts[i]);
        ck_assert_msg(buf_len(&g.all) == last_event_end(c->stream, end),
                      "%s (%s): %zu given after %zu fed", c->note, how,
                      buf_len(&g.all), end);
    }
    ck_assert_int_eq(usage_split_end(&s, collect, &g), 0);
    usage_split_release(&s);
    ck_assert_msg(buf_len(&g.all) == n
                  && memcmp(buf_ptr(&g.all), c->stream, n) == 0,
                  "%s (%s): the pieces are not the stream", c->note, how);
    ck_assert_msg(strcmp(buf_ptr(&g.flagged), c->usage) == 0,
                  "%s (%s): flagged\n%s\nwant\n%s", c->note, how,
                  buf_ptr(&g.flagged), c->usage);
    got_release(&g);
}

static void
split_row(int i, const size_t *cuts, size_t ncuts, const char *how)
{
    check_split(&splits[i], cuts, ncuts, how);
}

START_TEST(test_split_whole)
{
    fed_whole(split_row, _i);
}
END_TEST

START_TEST(test_split_two_pieces_at_every_offset)
{
    fed_in_two(split_row, _i, strlen(splits[_i].stream));
}
END_TEST

START_TEST(test_split_byte_by_byte)
{
    fed_byte_by_byte(split_row, _i, strlen(splits[_i].stream));
}
END_TEST

/* A whole vLLM stream in one read is three pieces: the usage event
 * alone between the runs before and after it. */
START_TEST(test_split_runs)
{
    static const char stream[] = ROLE_EV TEXT_EV USAGE_EV DONE_EV;
    struct usage_split s;
    struct got g;

    got_init(&g);
    usage_split_init(&s);
    ck_assert_int_eq(usage_split_feed(&s, GUARDED(stream), collect, &g), 0);
    ck_assert_uint_eq(g.pieces, 3);
    ck_assert_int_eq(usage_split_end(&s, collect, &g), 0);
    ck_assert_uint_eq(g.pieces, 3);
    usage_split_release(&s);
    got_release(&g);
}
END_TEST

/*
 * Memory is bounded: an event past USAGE_SPLIT_MAX (one huge event, fed
 * 1 KiB at a time) is given on as it comes, never more than the bound
 * held, and the cut resumes after it: the usage event that follows is
 * still flagged alone.  An upstream that never ends an event is given
 * on whole, holding no more.
 */
START_TEST(test_split_bound)
{
    struct usage_split s;
    struct buf big;
    struct got g;
    size_t step = 1024, fed;

    buf_init(&big, SIZE_MAX);
    padded(&big, "data: {\"choices\":[{\"delta\":{\"content\":\"",
           4 * USAGE_SPLIT_MAX, "\"}}]}\n\n" USAGE_EV DONE_EV);
    got_init(&g);
    usage_split_init(&s);
    for (fed = 0; fed < buf_len(&big); fed += step) {
        size_t len = buf_len(&big) - fed < step ? buf_len(&big) - fed : step;

        ck_assert_int_eq(usage_split_feed(&s, buf_ptr(&big) + fed, len,
                                          collect, &g), 0);
        ck_assert_uint_le(buf_len(&s.held), USAGE_SPLIT_MAX);
        ck_assert_uint_ge(buf_len(&g.all) + USAGE_SPLIT_MAX, fed + len);
    }
    ck_assert_int_eq(usage_split_end(&s, collect, &g), 0);
    ck_assert_uint_eq(buf_len(&g.all), buf_len(&big));
    ck_assert_int_eq(memcmp(buf_ptr(&g.all), buf_ptr(&big), buf_len(&big)),
                     0);
    ck_assert_str_eq(buf_ptr(&g.flagged), USAGE_EV);
    usage_split_release(&s);
    got_release(&g);

    /* No blank line ever: given on, held at most the bound. */
    padded(&big, "data: ", 4 * USAGE_SPLIT_MAX, "");
    got_init(&g);
    usage_split_init(&s);
    for (fed = 0; fed < buf_len(&big); fed += step) {
        size_t len = buf_len(&big) - fed < step ? buf_len(&big) - fed : step;

        ck_assert_int_eq(usage_split_feed(&s, buf_ptr(&big) + fed, len,
                                          collect, &g), 0);
        ck_assert_uint_le(buf_len(&s.held), USAGE_SPLIT_MAX);
    }
    ck_assert_uint_ge(buf_len(&g.all) + USAGE_SPLIT_MAX, buf_len(&big));
    ck_assert_int_eq(usage_split_end(&s, collect, &g), 0);
    ck_assert_uint_eq(buf_len(&g.all), buf_len(&big));
    ck_assert_uint_eq(buf_len(&g.flagged), 0);
    usage_split_release(&s);
    got_release(&g);
    buf_release(&big);
}
END_TEST

/* A piece refused (the flight out of memory): the feed says so. */
START_TEST(test_split_piece_error)
{
    static const char stream[] = TEXT_EV USAGE_EV;
    struct usage_split s;
    struct got g;

    got_init(&g);
    g.fail = GW_ENOMEM;
    usage_split_init(&s);
    ck_assert_int_eq(usage_split_feed(&s, GUARDED(stream), collect, &g),
                     GW_ENOMEM);
    ck_assert_uint_eq(g.pieces, 1);
    usage_split_release(&s);
    got_release(&g);
}
END_TEST

static Suite *
usage_suite(void)
{
    Suite *s = suite_create("usage");
    TCase *tc = tcase("table");

    tcase_add_loop_test(tc, test_whole, 0, (int)GW_ARRAY_LEN(cases));
    tcase_add_loop_test(tc, test_two_pieces_at_every_offset, 0,
                        (int)GW_ARRAY_LEN(cases));
    tcase_add_loop_test(tc, test_byte_by_byte, 0, (int)GW_ARRAY_LEN(cases));
    suite_add_tcase(s, tc);

    tc = tcase("bounds");
    tcase_add_test(tc, test_json_past_max_body_is_not_billed);
    tcase_add_test(tc, test_sse_line_past_max_line_is_skipped);
    tcase_add_test(tc, test_the_limit_follows_the_largest_request);
    tcase_add_test(tc, test_a_padded_responses_event_is_billed);
    suite_add_tcase(s, tc);

    tc = tcase("reuse");
    tcase_add_test(tc, test_a_new_head_starts_over);
    tcase_add_test(tc, test_clean);
    suite_add_tcase(s, tc);

    tc = tcase("charge");
    tcase_add_loop_test(tc, test_charge, 0, (int)GW_ARRAY_LEN(charges));
    tcase_add_test(tc, test_charge_of_a_cut_stream_and_a_retry);
    suite_add_tcase(s, tc);

    tc = tcase("ask");
    tcase_add_loop_test(tc, test_ask, 0, (int)GW_ARRAY_LEN(asks));
    tcase_add_test(tc, test_ask_errors);
    suite_add_tcase(s, tc);

    tc = tcase("split");
    tcase_add_checked_fixture(tc, arena_setup, arena_teardown);
    tcase_add_loop_test(tc, test_split_whole, 0, (int)GW_ARRAY_LEN(splits));
    tcase_add_loop_test(tc, test_split_two_pieces_at_every_offset, 0,
                        (int)GW_ARRAY_LEN(splits));
    tcase_add_loop_test(tc, test_split_byte_by_byte, 0,
                        (int)GW_ARRAY_LEN(splits));
    tcase_add_test(tc, test_split_runs);
    tcase_add_test(tc, test_split_bound);
    tcase_add_test(tc, test_split_piece_error);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(usage_suite()));
}
