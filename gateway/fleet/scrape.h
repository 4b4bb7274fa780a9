/* SPDX-License-Identifier: MIT */
/*
 * scrape.h - the load beat: every load_interval, each upstream's
 * GET /metrics (vLLM's Prometheus text), read for its engine's queue,
 * batch and KV cache usage (engine.h) and handed to the pool.
 *
 * One thread per upstream, so a slow or hung upstream delays only its
 * own scrapes; each is bounded by load_timeout.  What it reads, summed
 * over the engine's models (the model_name label):
 *
 *   vllm:num_requests_waiting, vllm:num_requests_running (both needed),
 *   vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc (older vLLM);
 *   and, with the load, vllm:lora_requests_info: the LoRA adapters its
 *   running and waiting requests use (lora.h; pool_set_lora()), logged
 *   when it starts having them, stops, or has a malformed gauge.
 *
 * An upstream that does not answer 200 with the first two has no engine
 * load: the pool balances on its open calls (pool_set_load(NULL)).  That
 * is logged when it starts and when it ends, so once for a server that
 * has no such metrics.  A scrape that gets no answer at all, or a 5xx,
 * failed besides: that is logged as a repeating failure (log.h), once
 * when it starts, summed up every log_repeat_interval, and when it ends.
 * Scrapes are not calls: they are not counted in the upstream's calls
 * and do not bear on its health.
 */
#ifndef INFERGW_GATEWAY_FLEET_SCRAPE_H
#define INFERGW_GATEWAY_FLEET_SCRAPE_H

struct gw_config;
struct pool;
struct upstream;
struct scrape;

/* The largest GET /metrics answer read (vLLM's is some 100 KiB). */
#define SCRAPE_MAX_BYTES (4 << 20)

/*
 * Start a thread per upstream; the first scrape runs at once.  Borrows
 * everything (it must outlive scrape_free()).  With load_interval 0 it
 * starts none.  NULL on failure (logged).
 */
struct scrape *scrape_start(const struct gw_config *cfg, struct pool *pool,
                            struct upstream *up);

/* Stop the threads (a scrape under way is cut) and free.  NULL-safe. */
void scrape_free(struct scrape *s);

#endif
