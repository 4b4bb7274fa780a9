/* SPDX-License-Identifier: MIT */
/*
 * buf.c - bounded growable byte buffer.
 */
#include "buf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"

void
buf_init(struct buf *b, size_t limit)
{
    b->data = NULL;
    b->off = 0;
    b->len = 0;
    b->cap = 0;
    b->limit = limit;
}

void
buf_release(struct buf *b)
{
    gw_free(b->data);
    b->data = NULL;
    b->off = b->len = b->cap = 0;
}

#ifdef INFERGW_UNIT_TEST
struct buf *
buf_new(size_t limit)
{
    struct buf *b = gw_malloc(sizeof(*b));

    if (b != NULL)
        buf_init(b, limit);
    return b;
}
#endif

#ifdef INFERGW_UNIT_TEST
void
buf_free(struct buf *b)
{
    if (b == NULL)
        return;
    buf_release(b);
    gw_free(b);
}
#endif

void
buf_reset(struct buf *b)
{
    b->off = b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

int
buf_reserve(struct buf *b, size_t n, char **out)
{
    size_t need, cap;
    char *p;

    if (b->off > 0 && b->off == b->len) {
        b->off = b->len = 0;            /* all consumed: reuse from the start */
        b->data[0] = '\0';              /* keep the NUL after data[len] even
                                         * if this call fails below */
    }
    if (gw_add_overflows(b->len, n, &need) || need > b->limit
        || need == SIZE_MAX)
        return GW_ETOOBIG;
    if (need + 1 > b->cap) {
        /* double, but never past limit + 1 and never below what is needed */
        cap = b->cap > 0 ? b->cap : 64;
        cap = cap <= SIZE_MAX / 2 ? cap * 2 : SIZE_MAX;
        if (cap > b->limit && b->limit < SIZE_MAX)
            cap = b->limit + 1;
        if (cap < need + 1)
            cap = need + 1;
        p = gw_realloc(b->data, cap);
        if (p == NULL)
            return GW_ENOMEM;
        b->data = p;
        b->cap = cap;
    }
    *out = b->data + b->len;
    return 0;
}

void
buf_commit(struct buf *b, size_t n)
{
    b->len += n;
    b->data[b->len] = '\0';
}

int
buf_append(struct buf *b, const void *p, size_t n)
{
    char *dst;
    int rc;

    rc = buf_reserve(b, n, &dst);
    if (rc != 0)
        return rc;
    if (n > 0)
        memcpy(dst, p, n);
    buf_commit(b, n);
    return 0;
}

int
buf_append_str(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

int
buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    char *dst;
    int n, rc;

    /* Into the room there is first: most lines fit, and then the
     * format is run once, not once to measure and once to write. */
    if (b->data != NULL && !(b->off > 0 && b->off == b->len)
        && b->cap - b->len > 1) {
        size_t room = b->cap - b->len;      /* with the NUL's slot */

        va_copy(ap2, ap);
        n = vsnprintf(b->data + b->len, room, fmt, ap2);
        va_end(ap2);
        if (n < 0) {
            b->data[b->len] = '\0';
            return GW_EINVAL;
        }
        if ((size_t)n < room) {
            if (b->len + (size_t)n > b->limit) {
                b->data[b->len] = '\0';    /* as if never written */
                return GW_ETOOBIG;
            }
            b->len += (size_t)n;
            return 0;
        }
        b->data[b->len] = '\0';            /* too long: measured, redo */
    } else {
        va_copy(ap2, ap);
        n = vsnprintf(NULL, 0, fmt, ap2);
        va_end(ap2);
        if (n < 0)
            return GW_EINVAL;
    }
    rc = buf_reserve(b, (size_t)n, &dst);
    if (rc != 0)
        return rc;
    vsnprintf(dst, (size_t)n + 1, fmt, ap);
    buf_commit(b, (size_t)n);
    return 0;
}

int
buf_append_u64(struct buf *b, uint64_t v)
{
    char d[GW_U64_DIGITS];

    return buf_append(b, d, gw_fmt_u64(v, d));
}

int
buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void
buf_consume(struct buf *b, size_t n)
{
    /* Views into the consumed bytes stay valid: nothing moves here. */
    b->off += n;
}

void
buf_compact(struct buf *b)
{
    if (b->off == 0)
        return;
    memmove(b->data, b->data + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    b->data[b->len] = '\0';
}

char *
buf_take(struct buf *b, size_t *len)
{
    char *p;

    buf_compact(b);
    p = b->data;
    if (len != NULL)
        *len = b->len;
    b->data = NULL;
    b->off = b->len = b->cap = 0;
    return p;
}
