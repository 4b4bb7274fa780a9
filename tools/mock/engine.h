/* SPDX-License-Identifier: MIT */
/*
 * engine.h - the vLLM-like engine behind mock_upstream's engine mode (-e):
 * continuous batching over a FIFO, step times that grow with the batch,
 * prefill paid for uncached prompt tokens, a prefix cache by blocks, KV
 * usage, and vLLM's /metrics text.  docs/MOCK_UPSTREAM.md "Engine mode"
 * is its specification; this header is its API.
 *
 * Design: one engine per process and one scheduler thread in it
 * (engine_start() makes it, engine_stop() ends it).  A connection thread
 * submits a sequence (engine_submit()) and then waits on the sequence's
 * descriptor (engine_seq_fd()), in the same poll() that watches its
 * client socket for a hang-up, so a client that goes away is noticed at
 * once and its sequence taken out (engine_seq_free()) wherever it is.
 * The scheduler steps: it admits waiting sequences in FIFO order while a
 * running slot and their KV blocks are free, sleeps the step's time
 * (step + per-sequence time x running + the admitted ones' prefill), then
 * gives every running sequence one token, wakes its waiter, and retires
 * the sequences that reached their max_tokens.  With the same arrivals
 * the same steps happen: nothing in it is random.
 *
 * Ownership: the engine owns its cache and copies its parameters.  A
 * sequence is owned by the thread that submitted it, which must free it
 * with engine_seq_free() (which also takes it out of the engine); the
 * engine only links it into its lists meanwhile.
 *
 * Locking: one mutex per engine guards the lists, every sequence's state
 * and token count, the cache and the counters.  Every function here takes
 * it itself, and nothing outside the engine is called while it is held,
 * so it is always the innermost lock: a caller may hold its own or not.
 * It is never held across socket I/O or logging.  The scheduler writes a
 * sequence's eventfd under it, so that no descriptor is written after its
 * sequence was freed and the number reused.
 */
#ifndef INFERGW_TOOLS_MOCK_ENGINE_H
#define INFERGW_TOOLS_MOCK_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "lora.h"

#define ENGINE_BYTES_PER_TOKEN 4    /* a prompt is ceil(bytes / 4) tokens */
#define ENGINE_MAX_TOKENS 4096      /* output tokens of one request, at most */

/*
 * The model's parameters (docs/MOCK_UPSTREAM.md "Engine mode" has each
 * one's default and range, and its -E key).  Times in nanoseconds.
 */
struct engine_params {
    long max_running;               /* sequences in the batch, at most */
    int64_t step_ns;                /* a step's fixed time */
    int64_t step_per_seq_ns;        /* ... plus this per running sequence */
    int64_t prefill_ns_per_token;   /* ... plus this per uncached prompt
                                       token of those admitted in it */
    long kv_blocks;                 /* KV cache size, and prefix cache size */
    long block_tokens;              /* tokens per block */
    long default_max_tokens;        /* output tokens without max_tokens */
    long max_loras;                 /* LoRA adapters in a batch (GPU slots);
                                       0: LoRA off (--max-loras) */
    int64_t lora_load_ns;           /* loading one into a slot
                                       (--lora-load-ms) */
};

/* Fill 'p' with the defaults. */
void engine_params_init(struct engine_params *p);

/*
 * Apply "KEY=VALUE[,KEY=VALUE...]" (the -E argument) over 'p'.  Modifies
 * 'list' (it is split in place).  An unknown key, a value that is not a
 * number in the key's range or an empty item is refused: GW_EINVAL with a
 * message for the user in err[0..errlen); 'p' may then be half updated.
 * Returns 0 or GW_EINVAL.
 */
int engine_params_parse(struct engine_params *p, char *list, char *err,
                        size_t errlen);

struct engine;
struct engine_seq;

/*
 * A new engine with a copy of 'p' (valid: engine_params_parse()'s
 * ranges), its prefix cache empty, no thread yet.  NULL when out of
 * memory.  It is never freed (engine_stop()).
 */
struct engine *engine_new(const struct engine_params *p);

/* Start the scheduler thread.  0, or GW_EIO (logged). */
int engine_start(struct engine *e);

/*
 * Stop the scheduler: sets stopping under the lock, wakes it, joins it
 * (within 2 ms: the end of a step is slept without the lock, the rest
 * waited on the condition variable).  Sequences still submitted stay
 * where they are and get no more tokens; their owners may still free
 * them.  NULL-safe.  There is no engine_free(): connection threads may
 * still hold sequences when the process ends, so the engine lives until
 * then.
 */
void engine_stop(struct engine *e);

/*
 * Queue a request: the prompt text p[0..n) (borrowed; only hashed here)
 * and its output length 'max_tokens' (1..ENGINE_MAX_TOKENS).  The prompt
 * is max(1, ceil(n / ENGINE_BYTES_PER_TOKEN)) tokens.  'stream' non-zero:
 * the sequence's descriptor is woken at every token, else only when it
 * has all of them.  'model' (borrowed; may be NULL): the request's; a
 * LoRA adapter the engine serves runs the sequence with that adapter
 * (lora.h), any other name on the base model.
 * OUT *out: the sequence, owned by the caller (engine_seq_free()).
 * Returns 0, GW_ETOOBIG (prompt and output need more blocks than the
 * whole KV cache: it could never run), GW_ENOMEM, GW_EIO (no eventfd;
 * logged) or GW_ESTOPPING.
 */
int engine_submit(struct engine *e, const char *p, size_t n, long max_tokens,
                  int stream, const char *model, struct engine_seq **out);

/* The sequence's prompt tokens; constant after engine_submit(). */
long engine_seq_prompt_tokens(const struct engine_seq *s);

/*
 * The descriptor to poll() for POLLIN: readable once the sequence has
 * tokens that engine_seq_tokens() has not reported yet.  Borrowed: it
 * lives as long as the sequence.
 */
int engine_seq_fd(const struct engine_seq *s);

/*
 * The tokens the sequence has been given so far (0..max_tokens); clears
 * the descriptor's readiness first, so that a poll() after this call
 * wakes only for tokens given after it.
 */
long engine_seq_tokens(struct engine *e, struct engine_seq *s);

/*
 * Take the sequence out of the engine, waiting or running (its slot and
 * blocks are free for the next step's admission), and free it.  NULL-safe.
 */
void engine_seq_free(struct engine *e, struct engine_seq *s);

/* What GET /metrics shows, copied at one instant. */
struct engine_stats {
    uint64_t running;               /* sequences in the batch */
    uint64_t waiting;               /* sequences in the FIFO */
    double kv_usage;                /* running's blocks / kv_blocks, 0..1 */
    uint64_t prefix_queries;        /* prompt tokens looked up */
    uint64_t prefix_hits;           /* ... found cached */
    uint64_t prompt_tokens;         /* prompt tokens admitted */
    uint64_t generation_tokens;     /* tokens generated */
    uint64_t lora_loads;            /* adapters loaded into a GPU slot */
    double created;                 /* Unix time the counters started */
};

/* OUT *s: the engine's numbers now. */
void engine_snapshot(struct engine *e, struct engine_stats *s);

/* Empty the prefix cache and zero the counters (the gauges stay). */
void engine_reset(struct engine *e);

/* Which names GET /metrics uses for the KV and prefix cache series. */
enum engine_names {
    ENGINE_NAMES_CURRENT,   /* vllm:kv_cache_usage_perc, prefix_cache_* */
    ENGINE_NAMES_OLD,       /* vllm:gpu_cache_usage_perc, gpu_prefix_* */
};

/*
 * Append the label value 's' (borrowed) to 'out', escaped as
 * prometheus_client escapes one (\\, \" and newline).  Returns 0 or the
 * buf_* error.
 */
int engine_label_value(struct buf *out, const char *s);

/*
 * Append 's' to 'out' as vLLM's /metrics does (prometheus_client's text
 * format 0.0.4): each series with labels engine="0" and model_name=
 * 'model' (borrowed; escaped here), values as Python floats ("2.0"), a
 * _created gauge beside each counter.  Takes no lock.  Returns 0, or the
 * buf_* error (GW_ENOMEM, GW_ETOOBIG).
 */
int engine_metrics(struct buf *out, const struct engine_stats *s,
                   const char *model, enum engine_names names);

/* ---- LoRA adapters (lora.h), each call under the engine's lock ---- */

/*
 * Serve adapter 'name' (lora_name_ok()), found at 'path' (NULL: one made
 * of the name).  Returns its id, GW_EINVAL (LoRA off, or served already)
 * or GW_ETOOBIG (LORA_MAX registered).
 */
int engine_lora_add(struct engine *e, const char *name, const char *path);

/* Serve 'name' no more (lora_remove()).  0 or GW_ENOTFOUND. */
int engine_lora_remove(struct engine *e, const char *name);

/* An adapter as GET /v1/models and GET /stats show it: a copy. */
struct engine_lora_card {
    char name[LORA_NAME_MAX + 1];
    char path[LORA_PATH_MAX + 1];
    int served;
    int resident;                   /* in a GPU slot now */
    uint64_t used;                  /* its last admission (LRU order) */
};

/*
 * Copy every adapter ever registered into out[0..max) in the order they
 * were (max LORA_MAX gets them all).  Returns how many were copied.
 */
size_t engine_lora_cards(struct engine *e, struct engine_lora_card *out,
                         size_t max);

/*
 * With LoRA on, append vllm:lora_requests_info as vLLM's /metrics has
 * it: the gauge is set to the time now for the label set of the
 * adapters running and waiting now (as vLLM sets it at every step), and
 * every label set it had before is written too, each with the time it
 * was last set (lora.h).  Nothing without LoRA.  Returns 0 or the buf_*
 * error (GW_ENOMEM, GW_ETOOBIG).
 */
int engine_lora_metrics(struct engine *e, struct buf *out);

#endif
