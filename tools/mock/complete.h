/* SPDX-License-Identifier: MIT */
/*
 * complete.h - mock_upstream's completions (POST /v1/chat/completions and
 * /v1/completions): their text, streamed or whole, and the pieces of
 * them the other routes reuse (vllm.c: the Responses API and audio).
 *
 * The text of content chunk i is a word picked by a hash of the whole
 * request body and i, then mock_pad's filler, so identical bodies get
 * identical text, while the id and "created" are fresh per call as
 * vLLM's are (the gateway's coalescing is what makes clients of one
 * upstream call see the same bytes).  Nothing here takes st.mu but a
 * mock_gate's wait (wait.c).
 */
#ifndef INFERGW_TOOLS_MOCK_COMPLETE_H
#define INFERGW_TOOLS_MOCK_COMPLETE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"

struct req;

/*
 * A streamed completion: the role chunk (chat only: vLLM's completions
 * stream has none), the content chunks, the finish chunk, the usage chunk
 * when asked for, [DONE].  The faults die_mid_stream and stall_mid_stream
 * stop after two content chunks.
 */
void complete_stream(struct req *q);

/*
 * A non-streamed completion.  It waits as long as the stream would have
 * taken (chunks x delay, or in engine mode until the last token) before
 * answering, as vLLM does when it generates the whole answer first.  Its
 * text is the stream's content chunks joined, padding included; a body
 * that would pass MOCK_OUT_LIMIT (many chunks with a big mock_pad) is
 * answered with a 500 "response_too_big".
 */
void complete_answer(struct req *q);

/*
 * Send a complete JSON body p[0..n) as a 200, applying the non-stream
 * faults: die_mid_stream announces the full length, sends half and
 * closes; stall_mid_stream sends half and stalls; chunked_json sends
 * three chunks a little apart, so that they reach the client in separate
 * reads; chunked_json_die sends the first of them and closes (a body of
 * unknown length, cut).  Without a fault, a mock_gate sends it in pieces
 * as POST /gate opens it.
 */
void complete_json_body(struct req *q, const char *p, size_t n);

/* {"prompt_tokens":P,"total_tokens":T,"completion_tokens":C}, vLLM's order */
json_t *complete_usage_new(const struct req *q, long completion_tokens);

/*
 * Append the text of content chunk 'i' to 'b': its word and a space, then
 * q->pad filler bytes (mock_pad), the alphabet over and over from 'a'.
 * The filler is plain ASCII so that JSON carries it unescaped and a test
 * can predict every byte.  Returns 0, GW_ENOMEM or GW_ETOOBIG.
 */
int complete_chunk_text(const struct req *q, long i, struct buf *b);

/* The text of the first 'n' content chunks, joined, into 'text' (its
 * buf_ptr() NUL-terminated, as a buf always is once written to). */
int complete_joined_text(const struct req *q, long n, struct buf *text);

/*
 * die_mid_stream and stall_mid_stream, once a stream sent its first two
 * content chunks: 1 when the fault ended the stream here (cut short
 * without its last chunk, or stalled), else 0.
 */
int complete_fault_mid_stream(struct req *q);

/* The word of token id 'n' (of any number: it wraps). */
const char *complete_word(uint64_t n);

#endif
