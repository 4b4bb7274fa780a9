/* SPDX-License-Identifier: MIT */
/*
 * usage.h - the token usage in an upstream response, read from the bytes
 * as they pass to the clients.
 *
 * OpenAI-style servers (vLLM) say what a call cost in a "usage" object:
 *  - a JSON body (not streamed) has it at the top level;
 *  - a stream has it in one "data:" event near the end when the request
 *    asked for it (stream_options.include_usage); the other events carry
 *    "usage": null, or running totals (continuous_usage_stats), so the
 *    last usage object seen wins;
 *  - a Responses API stream (POST /v1/responses) has it in the "response"
 *    object of its last event, response.completed (or .incomplete).
 * The counts are {"prompt_tokens": N, "completion_tokens": M} (an
 * embedding's has no completion_tokens: 0), the Responses API's
 * {"input_tokens": N, "output_tokens": M}, or a rerank's
 * {"total_tokens": N}, all input.  A usage with none of them (an audio
 * transcription's duration) is not billed.
 *
 * Only 2xx responses are read.  Memory is bounded by the scan's
 * 'limit': a JSON body is kept up to it (a larger one is not billed), and
 * of a stream only a line that did not arrive whole, up to as much: a
 * response.completed event carries the whole response, its text
 * included, and echoes the request's instructions, tools and metadata.
 * So the limit is usage_limit(): the largest request body the gateway
 * takes plus room for the answer, and a client cannot pad a request to
 * push its usage past what is read.  Lines that
 * cannot hold a usage object ("usage": then '{') are never parsed, so a
 * stream costs one memmem() per line.
 *
 * The charge (tenant.h's token limits) is the usage when there is one.
 * Without (a stream that did not ask for stream_options.include_usage,
 * from an upstream that adds none), the call is counted instead, as an
 * estimate: the prompt as the request's bytes / 4 (rounded up; about
 * what a BPE tokenizer makes of English text and JSON), and the
 * completion as one token per event that carries text ("data:" with a
 * non-empty "content", "text", "delta", "arguments", "reasoning_content"
 * or "refusal" string: vLLM sends about one token per event), or, for a
 * JSON body, its bytes / 4.  So a stream costs one more memmem() per
 * line and key.  The count can be far below the truth, and the client
 * chooses it by not asking for usage: an image, video or audio part
 * given by URL is ~100 bytes for thousands of prompt tokens, tokens
 * that decode to no text (split UTF-8) add no event, and an engine
 * that sends several tokens per event is counted one per event
 * (docs/CONFIGURATION.md: make the upstream always send usage).
 *
 * A coalesced stream always has a usage (proxy.c): the leader asks the
 * upstream for it (usage_ask()) when its client did not, so that every
 * follower is billed what it saved, and the flight cuts the usage event
 * out of the stream (struct usage_split), so that only the clients that
 * asked for it are sent it (fanout.h).
 *
 * A struct usage_scan or usage_split belongs to one transfer's thread;
 * no locking.
 */
#ifndef INFERGW_GATEWAY_COALESCE_USAGE_H
#define INFERGW_GATEWAY_COALESCE_USAGE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"

/* Room for what an answer adds to the request it may echo. */
#define USAGE_ANSWER_ROOM (8u << 20)

enum usage_mode {
    USAGE_OFF = 0,              /* not 2xx, or no head yet */
    USAGE_JSON,
    USAGE_SSE,
};

struct usage_scan {
    enum usage_mode mode;
    int headed;                 /* a response head came */
    struct buf pending;         /* JSON: the body so far; SSE: the
                                   unfinished line */
    size_t limit;               /* the most kept of a body or a line */
    int overflow;               /* JSON: the body is past 'limit'; SSE:
                                   this line is */
    int64_t prompt, completion; /* -1 until a usage object was read */
    uint64_t events;            /* SSE: events that carry text */
    uint64_t bytes;             /* the body's bytes, all of them */
    int done;                   /* SSE: "data: [DONE]" came */
    int error;                  /* SSE: an error event came */
};

/*
 * The limit for a gateway that takes request bodies up to
 * 'max_request_body': that plus USAGE_ANSWER_ROOM.
 */
size_t usage_limit(uint64_t max_request_body);

/* Ready to scan one response, keeping at most 'limit' bytes. */
void usage_scan_init(struct usage_scan *u, size_t limit);

/* The response head: what to look for (text/event-stream or JSON). */
void usage_scan_head(struct usage_scan *u, int status,
                     const char *content_type);

/* A piece of the body, as it passes. */
void usage_scan_feed(struct usage_scan *u, const char *p, size_t n);

/*
 * The body is complete: a JSON body is parsed now.  Returns 1 with
 * *prompt and *completion set when a usage object was found, else 0.
 */
int usage_scan_end(struct usage_scan *u, int64_t *prompt,
                   int64_t *completion);

/*
 * After a transfer that ended cleanly: is the body an answer whole and
 * without error, as the response cache keeps it (coalesce.h)?  A 2xx
 * JSON body, or a stream that ended with "data: [DONE]" and carried no
 * error event.  0 for anything else (not 2xx, no head).
 */
int usage_scan_clean(const struct usage_scan *u);

/*
 * What the call costs a tenant's token limits (tenant.h), after
 * usage_scan_end(): prompt + completion of the usage read, else the
 * count above, for a request of 'request_bytes'; 0 for a response that
 * was not 2xx (or had no head).  OUT *counted: 1 when it is the count.
 * Also for a body that did not end: what the upstream sent until then.
 */
uint64_t usage_scan_charge(const struct usage_scan *u, size_t request_bytes,
                           int *counted);

/*
 * The prompt of a request of 'request_bytes', counted as above (bytes /
 * 4, rounded up): what a call costs that reached the upstream but ended
 * before any response head because its clients left or time ran out
 * (proxy.c), since the upstream may have done the whole prefill.
 */
uint64_t usage_count_prompt(size_t request_bytes);

void usage_scan_release(struct usage_scan *u);

/* ---- asking for the usage of a stream, and cutting it out ---- */

/* What usage_ask() inserts, right after the body's opening '{'. */
#define USAGE_ASK "\"stream_options\":{\"include_usage\":true},"

/*
 * Did the client ask for a stream's usage event: does 'body' (a
 * request's JSON, borrowed; NULL: no) have a top-level "stream_options"
 * object whose "include_usage" is true?
 */
int usage_asked(const json_t *body);

/*
 * The body a coalesced request sends upstream: when 'body' (p[0..n)
 * parsed, borrowed) is an object with "stream": true at its top level
 * and no "stream_options" member at all, p with USAGE_ASK inserted
 * right after its opening '{' (the bytes are never re-serialised: that
 * would reformat numbers) is appended to 'out' (borrowed, initialised
 * by the caller), and 1 returned.  Else 0, 'out' untouched: a body
 * with "stream_options" in any form is the client's choice, and one
 * that does not stream has no usage event.  GW_ENOMEM (GW_ETOOBIG past
 * out's limit): 'out' may hold part of it.
 */
int usage_ask(const char *p, size_t n, const json_t *body, struct buf *out);

/*
 * Called for each piece usage_split_feed() cuts, in order: p[0..n)
 * (borrowed for the call), and whether it is a usage event alone
 * ('usage').  A non-zero return stops the feed and is returned by it.
 */
typedef int usage_piece_fn(void *arg, const char *p, size_t n, int usage);

/* The most usage_split holds back of an event that has not ended. */
#define USAGE_SPLIT_MAX (64u << 10)

/*
 * A stream's SSE events (an event ends at a blank line: "\n\n" or
 * "\r\n\r\n"), cut so that the usage event stands alone: each feed
 * gives every completed run of events as one piece, and a usage event
 * ("data:" and one line of JSON with a top-level "usage" object and
 * "choices": [], what vLLM sends last with include_usage) as a piece of
 * its own, flagged.  Only the bytes of an event that has not ended are
 * held back, so an upstream that sends an event per write (vLLM) is
 * passed on as soon as it came.  Memory is bounded: an event that grows
 * past USAGE_SPLIT_MAX before its end (one huge event, or an upstream
 * that never ends one) goes on as it is, unflagged, what was held first
 * and then each byte of it as it comes, and the cutting resumes after
 * its end.  The pieces, joined, are the bytes fed, in order.
 */
struct usage_split {
    struct buf held;            /* the event that has not ended yet */
    int blank;                  /* the line being read is blank so far */
    int passing;                /* in an event past the bound: passed on
                                   unheld until it ends */
};

void usage_split_init(struct usage_split *s);
void usage_split_release(struct usage_split *s);

/*
 * Cut p[0..n) (borrowed), giving each piece to piece(arg, ...).
 * Returns 0, or the first non-zero return of 'piece' (the rest of
 * p[0..n) is then dropped).
 */
int usage_split_feed(struct usage_split *s, const char *p, size_t n,
                     usage_piece_fn *piece, void *arg);

/* The stream ended: what is held back goes on, unflagged.  As above. */
int usage_split_end(struct usage_split *s, usage_piece_fn *piece,
                    void *arg);

#endif
