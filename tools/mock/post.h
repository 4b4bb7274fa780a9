/* SPDX-License-Identifier: MIT */
/*
 * post.h - a POST to one of mock_upstream's vLLM routes, from its body
 * to its answer.
 */
#ifndef INFERGW_TOOLS_MOCK_POST_H
#define INFERGW_TOOLS_MOCK_POST_H

struct req;

/*
 * Answer the POST 'q' whose body is in q->c->body: parse it (an upload's
 * form, else a JSON object), read its mock_* knobs and OpenAI parameters,
 * count its prompt prefix, then hold, delay, fail or answer as the knobs
 * and POST /control say (complete.c, vllm.c), in engine mode through the
 * engine.  Counts it in st's in_progress (and completing) meanwhile and
 * in aborted when the client went away.  Takes st.mu briefly, never
 * across I/O.  Sets q->json (owned by 'q': the caller frees it).
 */
void post_answer(struct req *q);

#endif
