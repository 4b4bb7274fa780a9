/* SPDX-License-Identifier: MIT */
/*
 * lora.h - the LoRA adapters of mock_upstream's engine (vLLM's
 * --enable-lora --max-loras N): the adapters it serves, each a model of
 * GET /v1/models whose parent is the base model; the GPU's max_loras
 * slots, filled least recently used out; the cost of loading one; and
 * the label sets of vllm:lora_requests_info.  docs/MOCK_UPSTREAM.md
 * "LoRA adapters" is its specification.
 *
 * vLLM's rule, kept here: a step's batch holds sequences of at most
 * max_loras adapters.  A waiting sequence whose adapter is not among
 * the batch's while it already has max_loras of them is skipped, and
 * waits in its place in the FIFO (vLLM v1's scheduler: "scheduling
 * would exceed max_loras, skip").  An admitted sequence's adapter must
 * be in a GPU slot: if it is not, it is loaded there (the step that
 * admits it lasts load_ms more, the whole batch waits, as vLLM's model
 * runner loads before it runs the step) in the slot of the least
 * recently used adapter that no running sequence uses.  Such a slot
 * always exists: fewer than max_loras adapters run, or the skip above
 * kept the sequence out.
 *
 * Values only: no lock, no thread.  struct lora lives in the engine and
 * its lock guards it (engine.c); nothing here calls out of the mock.
 * An adapter keeps its id (its index + 1) for the life of the process:
 * an unloaded one is only no longer served, and one loaded again under
 * the same name takes its old id back, so a sequence's id never names
 * another adapter.
 */
#ifndef INFERGW_TOOLS_MOCK_LORA_H
#define INFERGW_TOOLS_MOCK_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define LORA_MAX 256                /* adapters ever registered */
#define LORA_NAME_MAX 128           /* bytes of an adapter's name */
#define LORA_PATH_MAX 256           /* bytes of its lora_path */
#define LORA_MAX_SLOTS 256          /* --max-loras at most */
#define LORA_SHOWN_MAX 64           /* label sets of the gauge kept */
#define LORA_DEFAULT_LOAD_MS 200    /* --lora-load-ms */

struct lora_adapter {
    char name[LORA_NAME_MAX + 1];
    char path[LORA_PATH_MAX + 1];   /* its lora_path (GET /v1/models root) */
    int served;                     /* registered and not unloaded */
    int resident;                   /* in a GPU slot */
    uint64_t used;                  /* LRU stamp: its last admission */
    long running;                   /* its sequences in the batch */
};

/* A label set vllm:lora_requests_info has shown, and when it was last
 * set (prometheus_client keeps every child a gauge ever had). */
struct lora_shown {
    char *labels;                   /* owned: max_lora="..",running_... */
    double at;                      /* Unix time */
};

struct lora {
    long max_loras;                 /* GPU slots; 0: LoRA off */
    int64_t load_ns;                /* the cost of loading one */
    struct lora_adapter a[LORA_MAX];
    size_t n;                       /* entries of a[] used */
    size_t resident;                /* adapters in a slot */
    long running_adapters;          /* adapters with running sequences */
    uint64_t clock;                 /* the LRU's */
    uint64_t loads;                 /* adapters loaded into a slot */
    struct lora_shown shown[LORA_SHOWN_MAX];    /* oldest first */
    size_t num_shown;
};

/*
 * Is 'name' one an adapter may have: 1 to LORA_NAME_MAX bytes of
 * printable ASCII but ',' (vLLM's gauge joins the names with commas)?
 */
int lora_name_ok(const char *name);

/* Set 'l' up empty: 'max_loras' slots, a load costing 'load_ns'. */
void lora_init(struct lora *l, long max_loras, int64_t load_ns);

/* Free what lora_init() and the gauge's label sets hold. */
void lora_release(struct lora *l);

/*
 * Serve the adapter 'name' (lora_name_ok()) found at 'path' (NULL: a
 * path made of the name), registered at start or at run time.  Returns
 * its id, GW_EINVAL when one of that name is served already, or
 * GW_ETOOBIG when LORA_MAX were ever registered.
 */
int lora_add(struct lora *l, const char *name, const char *path);

/*
 * Serve 'name' no more: it leaves GET /v1/models, and requests for it
 * run on the base model.  Its slot is kept until evicted (its running
 * sequences finish with it).  Returns 0 or GW_ENOTFOUND.
 */
int lora_remove(struct lora *l, const char *name);

/* The id of the served adapter 'name', or 0 (the base model). */
int lora_find(const struct lora *l, const char *name);

/* May a sequence of adapter 'id' (> 0) join the batch now? */
int lora_may_run(const struct lora *l, int id);

/*
 * A sequence of adapter 'id' joins the batch: load it if it is not in a
 * slot (evicting the least recently used one nothing runs).  Returns the
 * time that load adds to the step (0 when it was resident).
 */
int64_t lora_start(struct lora *l, int id);

/* A sequence of adapter 'id' leaves the batch. */
void lora_stop(struct lora *l, int id);

/*
 * Set the gauge now ('now': Unix time), as vLLM does at each step: the
 * label set of the adapters running[0..nr) and waiting[0..nw) (ids, in
 * the order of their first sequence, no repeats) gets the time 'now';
 * a label set not seen before is added, the oldest dropped past
 * LORA_SHOWN_MAX.  Returns 0 or GW_ENOMEM.
 */
int lora_show(struct lora *l, const int *running, size_t nr,
              const int *waiting, size_t nw, double now);

#endif
