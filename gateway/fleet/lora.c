/* SPDX-License-Identifier: MIT */
/*
 * lora.c - an upstream's LoRA adapters and what they make of a call for
 * one (lora.h).
 *
 * Design: a few dozen adapters per upstream at most (a batch holds
 * max_lora of them), so a lookup is a walk of an array of hashes, under
 * the pool's lock, for the upstreams a call may go to.
 */
#include "fleet/lora.h"

#include <string.h>

#include "alloc.h"
#include "buf.h"
#include "prom_read.h"
#include "util.h"

enum { L_MAX, L_RUNNING, L_WAITING, NUM_LABELS };

uint64_t
lora_hash(const char *name)
{
    return gw_mix64(gw_fnv1a64(GW_FNV1A64_OFFSET, name, strlen(name)));
}

void
lora_report_release(struct lora_report *r)
{
    if (r == NULL)
        return;
    gw_free(r->names);
    memset(r, 0, sizeof(*r));
}

const char *
lora_report_name(const struct lora_report *r, size_t i)
{
    const char *p = r->names;

    while (i-- > 0)
        p += strlen(p) + 1;
    return p;
}

/*
 * The names of the label value v[0..n) (as written: \\, \" and \n
 * escaped; prom_read.h checked that) into 'r' and 'names': each
 * comma-separated piece, unescaped, is kept unless it breaks a bound
 * (lora.h), and then counted in r->dropped; an empty piece is no name.
 * OUT *kept: how many were kept.  Returns 0 or a buf error.
 */
static int
split_names(struct lora_report *r, struct buf *names, const char *v,
            size_t n, size_t *kept)
{
    char name[LORA_NAME_MAX + 1];
    size_t len = 0, i;
    int bad = 0, rc = 0;
    char c;

    *kept = 0;
    for (i = 0; i <= n && rc == 0; i++) {
        if (i == n || v[i] == ',') {
            if (len == 0 && !bad)
                continue;                   /* "" or ",,": no name */
            if (bad || *kept == LORA_MAX_ADAPTERS) {
                r->dropped++;
            } else {
                name[len] = '\0';
                r->hash[r->num_running + r->num_waiting + *kept] =
                    lora_hash(name);
                rc = buf_append(names, name, len + 1);
                (*kept)++;
            }
            len = 0;
            bad = 0;
            continue;
        }
        c = v[i];
        if (c == '\\' && i + 1 < n) {
            c = v[++i] == 'n' ? '\n' : v[i];
        }
        if ((unsigned char)c < 0x20 || len == LORA_NAME_MAX)
            bad = 1;
        else if (!bad)
            name[len++] = c;
    }
    return rc;
}

int
lora_report_read(const char *text, size_t len, struct lora_report *out)
{
    struct prom_read_label labels[NUM_LABELS] = {
        [L_MAX] = { .name = "max_lora" },
        [L_RUNNING] = { .name = "running_lora_adapters" },
        [L_WAITING] = { .name = "waiting_lora_adapters" },
    };
    struct prom_read_latest want = {
        .name = "vllm:lora_requests_info", .labels = labels,
        .num_labels = NUM_LABELS,
    };
    struct buf names;
    size_t kept, nl;
    int rc = GW_EPARSE;

    memset(out, 0, sizeof(*out));
    /* Each name a NUL more than its bytes, which the bounds cap. */
    buf_init(&names, 2 * LORA_MAX_ADAPTERS * (LORA_NAME_MAX + 1));
    if (prom_read_latest(text, len, &want) != 0)
        goto out;
    if (want.samples == 0) {
        rc = GW_ENOTFOUND;
        goto out;
    }
    for (size_t i = 0; i < NUM_LABELS; i++)
        if (labels[i].value == NULL)
            goto out;
    if (gw_parse_uint(labels[L_MAX].value, labels[L_MAX].len, LORA_MAX_LORA,
                      &out->max_lora) != 0)
        goto out;
    rc = split_names(out, &names, labels[L_RUNNING].value,
                     labels[L_RUNNING].len, &kept);
    out->num_running = kept;
    if (rc == 0)
        rc = split_names(out, &names, labels[L_WAITING].value,
                         labels[L_WAITING].len, &kept);
    out->num_waiting = kept;
    if (rc != 0) {
        rc = GW_ENOMEM;         /* the bounds fit the buffer's limit */
        goto out;
    }
    out->names = buf_take(&names, &nl);
    rc = 0;

out:
    buf_release(&names);
    if (rc != 0)
        lora_report_release(out);
    return rc;
}

/*
 * Adapter 'h' was used there now: to the front of the slots' list,
 * which keeps max_lora of them (at most LORA_SLOTS_MAX), as vLLM's LRU
 * keeps its GPU slots.
 */
static void
touch(struct lora_load *l, uint64_t h)
{
    size_t cap = l->last.max_lora < LORA_SLOTS_MAX
                 ? (size_t)l->last.max_lora : LORA_SLOTS_MAX;
    size_t i;

    if (cap == 0)
        return;                         /* nothing known: kept as it was */
    for (i = 0; i < l->num_slots && l->slots[i] != h; i++)
        ;
    if (i == l->num_slots && l->num_slots < cap)
        l->num_slots++;                 /* a new one, and room for it */
    if (i == l->num_slots)
        i--;                            /* a new one in the last's place */
    memmove(&l->slots[1], &l->slots[0], i * sizeof(l->slots[0]));
    l->slots[0] = h;
    if (l->num_slots > cap)
        l->num_slots = cap;             /* max_lora went down */
}

void
lora_set(struct lora_load *l, struct lora_report *r,
         const struct engine_mark *sent, struct lora_report *old)
{
    size_t i, k = 0, n = l->num_sent;
    struct lora_sent was[LORA_SENT_MAX];

    *old = l->last;
    memset(&l->last, 0, sizeof(l->last));
    l->known = r != NULL;
    if (r != NULL) {
        l->last = *r;
        memset(r, 0, sizeof(*r));
        if (l->num_slots > l->last.max_lora)
            l->num_slots = (size_t)l->last.max_lora;    /* fewer slots */
    }
    /* Keep, oldest first, the calls sent after the scrape went out: the
     * engine had not seen them (those before it are in the report, or
     * ended).  A failed scrape ('sent' NULL) forgets none. */
    memcpy(was, l->sent, sizeof(was));
    for (i = 0; i < n; i++) {
        size_t at = (l->next_sent + LORA_SENT_MAX - n + i) % LORA_SENT_MAX;

        if (sent != NULL && was[at].call <= sent->started)
            continue;
        l->sent[k++] = was[at];
    }
    l->num_sent = k;
    l->next_sent = k % LORA_SENT_MAX;
    /* What runs is used now, what waits will be when admitted; and the
     * calls sent since came after the scrape saw either. */
    for (i = l->last.num_running + l->last.num_waiting; i-- > 0;)
        touch(l, l->last.hash[i]);
    for (i = 0; i < k; i++)
        touch(l, l->sent[i].hash);
}

/* Is 'h' among the report's names [from, to)? */
static int
listed(const struct lora_report *r, size_t from, size_t to, uint64_t h)
{
    for (size_t i = from; i < to; i++)
        if (r->hash[i] == h)
            return 1;
    return 0;
}

/* Was 'h' sent there since the scrape went out? */
static int
sent_since(const struct lora_load *l, uint64_t h)
{
    for (size_t i = 0; i < l->num_sent; i++)
        if (l->sent[i].hash == h)
            return 1;
    return 0;
}

int
lora_reported(const struct lora_load *l, uint64_t h)
{
    const struct lora_report *r = &l->last;

    return listed(r, 0, r->num_running + r->num_waiting, h);
}

/*
 * The adapters running there as far as the gateway knows: the report's,
 * and those sent since that it does not run (each once).
 */
static uint64_t
running_now(const struct lora_load *l)
{
    const struct lora_report *r = &l->last;
    uint64_t n = r->num_running;

    for (size_t i = 0; i < l->num_sent; i++) {
        uint64_t h = l->sent[i].hash;
        size_t k;

        if (listed(r, 0, r->num_running, h))
            continue;
        for (k = 0; k < i && l->sent[k].hash != h; k++)
            ;
        n += k == i;
    }
    return n;
}

/* Is 'h' on the list of its slots? */
static int
in_slots(const struct lora_load *l, uint64_t h)
{
    for (size_t i = 0; i < l->num_slots; i++)
        if (l->slots[i] == h)
            return 1;
    return 0;
}

enum lora_fit
lora_fit(const struct lora_load *l, int fresh, uint64_t h)
{
    if (!fresh || !l->known)
        return LORA_UNKNOWN;
    if (lora_reported(l, h) || sent_since(l, h) || in_slots(l, h))
        return LORA_RESIDENT;
    if (running_now(l) >= l->last.max_lora)
        return LORA_NEITHER;
    return l->num_slots < l->last.max_lora && l->num_slots < LORA_SLOTS_MAX
           ? LORA_FREE : LORA_ROOM;
}

void
lora_note_call(struct lora_load *l, int fresh, uint64_t h, uint64_t call)
{
    enum lora_fit fit = lora_fit(l, fresh, h);

    if (fit != LORA_UNKNOWN && fit != LORA_RESIDENT)
        l->loads++;
    if (l->known)
        touch(l, h);
    l->sent[l->next_sent].hash = h;
    l->sent[l->next_sent].call = call;
    l->next_sent = (l->next_sent + 1) % LORA_SENT_MAX;
    if (l->num_sent < LORA_SENT_MAX)
        l->num_sent++;
}
