/* SPDX-License-Identifier: MIT */
/*
 * health.h - the active side of upstream health: a thread per upstream
 * (beat.h) that, every health_interval, asks it GET /health (vLLM's) and,
 * on the same beat, GET /v1/models.
 *
 * A probe is judged like a call (pool.h): a failing one counts as a
 * failure, a passing one closes a half-open upstream (in HALF_OPEN a
 * probe is the one trial let through).  Its verdict alone, the last
 * one, also says whether the upstream can take a call for /readyz
 * (pool_ready()): from the first failed probe, not the eject_after-th,
 * and not before a first one has passed.  /v1/models answers feed the
 * model routing of upstreams without a models list and the /v1/models
 * union.  With health_interval = 0 there are no /health probes; the
 * models are still asked every HEALTH_MODELS_ONLY_MS.
 *
 * Each probe is bounded by HEALTH_PROBE_MAX_MS; a hung upstream delays
 * only its own beat (the next then starts at once), never another's.
 *
 * A failing probe (no answer, a bad status, a /v1/models answer that is
 * no model list) is logged as a repeating failure (log.h), each of the
 * two probes of each upstream its own: a line when it starts, at most
 * one per log_repeat_interval with a count, and one when it ends.
 */
#ifndef INFERGW_GATEWAY_FLEET_HEALTH_H
#define INFERGW_GATEWAY_FLEET_HEALTH_H

struct gw_config;
struct pool;
struct upstream;
struct health;

#define HEALTH_MODELS_ONLY_MS 30000
#define HEALTH_PROBE_MAX_MS 5000
#define HEALTH_MODELS_MAX_BYTES (1 << 20)
#define HEALTH_MODELS_MAX 256           /* entries kept per upstream */
#define HEALTH_MODEL_MAX_BYTES 4096     /* one entry's JSON, else dropped */

/*
 * Start the threads; the first beat runs at once.  Borrows everything
 * (it must outlive health_free()).  NULL on failure (logged).
 */
struct health *health_start(const struct gw_config *cfg, struct pool *pool,
                            struct upstream *up);

/* Stop the threads (a probe under way is cut) and free.  NULL-safe. */
void health_free(struct health *h);

#endif
