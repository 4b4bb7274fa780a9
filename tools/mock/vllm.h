/* SPDX-License-Identifier: MIT */
/*
 * vllm.h - mock_upstream's vLLM routes but the completions: embeddings,
 * the Responses API, tokenize and detokenize, rerank, score, pooling,
 * audio transcriptions and translations, and the probes GET /v1/models
 * and GET /health.
 *
 * Each answers the request 'q' whose body post.c has read (the probes:
 * whose head conn.c has read), in the shape vLLM answers it; errors are
 * answered too.  Only the Responses API's store, /health's status and a
 * mock_gate's wait (wait.c) take st.mu.
 */
#ifndef INFERGW_TOOLS_MOCK_VLLM_H
#define INFERGW_TOOLS_MOCK_VLLM_H

struct req;

/*
 * /v1/embeddings: one vector per string when "input" is an array of
 * strings, else one vector for the whole input.
 */
void vllm_embeddings(struct req *q);

/*
 * POST /v1/responses: the text of a completion (max_output_tokens caps
 * it) as a response object, streamed or not; with store (the default)
 * its id is kept, and a previous_response_id that was not stored is a
 * 404, as vLLM answers it.
 */
void vllm_responses(struct req *q);

/* POST /tokenize: one token per word of the prompt (or messages). */
void vllm_tokenize(struct req *q);

/* POST /detokenize: a word per token id ("tokens", an array of them). */
void vllm_detokenize(struct req *q);

/*
 * POST /v1/rerank (/rerank, /v2/rerank): "query" and "documents"; the
 * results by relevance, highest first, "top_n" of them; usage as vLLM's
 * RerankUsage, total_tokens alone.
 */
void vllm_rerank(struct req *q);

/*
 * POST /v1/score (/score): "text_1" against "text_2", a text or an array
 * of them (one score per pair).
 */
void vllm_score(struct req *q);

/* POST /pooling: the pooled hidden state of "input", as an embedding. */
void vllm_pooling(struct req *q);

/*
 * POST /v1/audio/transcriptions and /translations: the text of a
 * completion; {"text":...,"usage":{"type":"duration","seconds":S}} (vLLM's
 * TranscriptionResponse), response_format "text" as text/plain, or with
 * stream a chunk stream like a completion's (stream_include_usage for
 * its usage chunk).
 */
void vllm_audio(struct req *q);

/*
 * GET /v1/models: the -m models, then the LoRA adapters served, each
 * with the first -m model as its parent, in vLLM's shape.
 */
void vllm_models(struct req *q);

/*
 * POST /v1/load_lora_adapter {"lora_name": N, "lora_path": P}: serve
 * adapter N from now on (GET /v1/models lists it), as vLLM does with
 * VLLM_ALLOW_RUNTIME_LORA_UPDATING; it is loaded into a GPU slot when a
 * request first uses it.  vLLM's answers: 200 "Success: LoRA adapter
 * 'N' added successfully.", a 400 when either is missing or N is served
 * already.
 */
void vllm_load_lora(struct req *q);

/*
 * POST /v1/unload_lora_adapter {"lora_name": N}: serve N no more; 404
 * when it is not served.
 */
void vllm_unload_lora(struct req *q);

/* GET /health: 200 with an empty body as vLLM's, or /control's status. */
void vllm_health(struct req *q);

#endif
