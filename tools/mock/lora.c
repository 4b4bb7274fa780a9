/* SPDX-License-Identifier: MIT */
/*
 * lora.c - the engine's LoRA adapters (lora.h): the adapters served, the
 * GPU slots and their LRU, and the label sets of vllm:lora_requests_info.
 *
 * Design: a few hundred adapters at most, so every lookup is a walk of
 * the array; the engine calls these under its lock, a few times a step.
 */
#include "lora.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "engine.h"
#include "util.h"

int
lora_name_ok(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > LORA_NAME_MAX)
        return 0;
    for (; *name != '\0'; name++)
        if (*name < 0x20 || *name > 0x7e || *name == ',')
            return 0;
    return 1;
}

void
lora_init(struct lora *l, long max_loras, int64_t load_ns)
{
    memset(l, 0, sizeof(*l));
    l->max_loras = max_loras;
    l->load_ns = load_ns;
}

void
lora_release(struct lora *l)
{
    for (size_t i = 0; i < l->num_shown; i++)
        gw_free(l->shown[i].labels);
    l->num_shown = 0;
}

/* The entry of 'name', served or not; NULL when never registered. */
static struct lora_adapter *
entry(const struct lora *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->a[i].name, name) == 0)
            return (struct lora_adapter *)&l->a[i];
    return NULL;
}

int
lora_add(struct lora *l, const char *name, const char *path)
{
    struct lora_adapter *a = entry(l, name);

    assert(lora_name_ok(name));
    if (a != NULL && a->served)
        return GW_EINVAL;
    if (a == NULL) {
        if (l->n == LORA_MAX)
            return GW_ETOOBIG;
        a = &l->a[l->n++];
        snprintf(a->name, sizeof(a->name), "%s", name);
    }
    if (path != NULL)
        snprintf(a->path, sizeof(a->path), "%s", path);
    else
        snprintf(a->path, sizeof(a->path), "/adapters/%s", name);
    a->served = 1;
    return (int)(a - l->a) + 1;
}

int
lora_remove(struct lora *l, const char *name)
{
    struct lora_adapter *a = entry(l, name);

    if (a == NULL || !a->served)
        return GW_ENOTFOUND;
    a->served = 0;
    return 0;
}

int
lora_find(const struct lora *l, const char *name)
{
    const struct lora_adapter *a = entry(l, name);

    return a != NULL && a->served ? (int)(a - l->a) + 1 : 0;
}

int
lora_may_run(const struct lora *l, int id)
{
    assert(id >= 1 && (size_t)id <= l->n);
    return l->a[id - 1].running > 0 || l->running_adapters < l->max_loras;
}

int64_t
lora_start(struct lora *l, int id)
{
    struct lora_adapter *a = &l->a[id - 1], *victim = NULL;
    int64_t cost = 0;

    assert(lora_may_run(l, id));
    if (!a->resident) {
        if (l->resident == (size_t)l->max_loras) {
            for (size_t i = 0; i < l->n; i++) {
                struct lora_adapter *b = &l->a[i];

                if (b->resident && b->running == 0
                    && (victim == NULL || b->used < victim->used))
                    victim = b;
            }
            /* lora.h: fewer than max_loras adapters run, or the skip
             * kept this one out, so one slot holds an idle adapter. */
            assert(victim != NULL);
            victim->resident = 0;
            l->resident--;
        }
        a->resident = 1;
        l->resident++;
        l->loads++;
        cost = l->load_ns;
    }
    if (a->running++ == 0)
        l->running_adapters++;
    a->used = ++l->clock;
    return cost;
}

void
lora_stop(struct lora *l, int id)
{
    struct lora_adapter *a = &l->a[id - 1];

    assert(a->running > 0);
    if (--a->running == 0)
        l->running_adapters--;
}

/* "a,b,c": the names of ids[0..n), escaped as a label value. */
static int
put_names(struct buf *b, const struct lora *l, const int *ids, size_t n)
{
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (i > 0)
            rc = buf_append(b, ",", 1);
        if (rc == 0)
            rc = engine_label_value(b, l->a[ids[i] - 1].name);
    }
    return rc;
}

int
lora_show(struct lora *l, const int *running, size_t nr, const int *waiting,
          size_t nw, double now)
{
    struct buf b;
    char *labels;
    size_t i;
    int rc;

    /* prometheus_client writes the label names sorted. */
    buf_init(&b, 2 * LORA_MAX * (LORA_NAME_MAX + 2) + 128);
    rc = buf_printf(&b, "max_lora=\"%ld\",running_lora_adapters=\"",
                    l->max_loras);
    if (rc == 0)
        rc = put_names(&b, l, running, nr);
    if (rc == 0)
        rc = buf_append_str(&b, "\",waiting_lora_adapters=\"");
    if (rc == 0)
        rc = put_names(&b, l, waiting, nw);
    if (rc == 0)
        rc = buf_append(&b, "\"", 1);
    if (rc != 0)
        goto out;
    for (i = 0; i < l->num_shown; i++) {
        if (strcmp(l->shown[i].labels, buf_ptr(&b)) == 0) {
            l->shown[i].at = now;
            goto out;
        }
    }
    rc = GW_ENOMEM;
    labels = gw_strdup(buf_ptr(&b));
    if (labels == NULL)
        goto out;
    if (l->num_shown == LORA_SHOWN_MAX) {
        /* The one set longest ago goes (prometheus_client keeps all). */
        size_t old = 0;

        for (i = 1; i < l->num_shown; i++)
            if (l->shown[i].at < l->shown[old].at)
                old = i;
        gw_free(l->shown[old].labels);
        memmove(&l->shown[old], &l->shown[old + 1],
                (l->num_shown - old - 1) * sizeof(l->shown[0]));
        l->num_shown--;
    }
    l->shown[l->num_shown].labels = labels;
    l->shown[l->num_shown].at = now;
    l->num_shown++;
    rc = 0;

out:
    buf_release(&b);
    return rc;
}
