/* SPDX-License-Identifier: MIT */
/*
 * buf.h - a growable byte buffer with a hard size limit (curl's dynbuf).
 *
 * The bytes live in data[off .. len).  'off' lets a parser consume from the
 * front without moving memory; buf_compact() moves the unread bytes to the
 * front and invalidates every view into the buffer.  The buffer always keeps
 * a NUL after data[len] so its content can be used as a C string.
 *
 * Growing past 'limit' fails with GW_ETOOBIG and leaves the buffer as it
 * was.  A struct buf is not locked: one owner at a time.
 */
#ifndef INFERGW_COMMON_BUF_H
#define INFERGW_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct buf {
    char *data;         /* owned; NULL until the first append */
    size_t off;         /* first unread byte */
    size_t len;         /* end of the bytes */
    size_t cap;         /* allocated size (includes the NUL slot) */
    size_t limit;       /* hard limit on len */
};

/* Prepare caller-provided storage; nothing is allocated yet. */
void buf_init(struct buf *b, size_t limit);

/* Free the contents (not the struct). */
void buf_release(struct buf *b);

/* Empty the buffer, keep its memory. */
void buf_reset(struct buf *b);

/* Unread bytes: data + off, length buf_len(). */
static inline const char *buf_ptr(const struct buf *b)
{
    return b->data != NULL ? b->data + b->off : "";
}

static inline size_t buf_len(const struct buf *b)
{
    return b->len - b->off;
}

/* Append; GW_ENOMEM or GW_ETOOBIG leave the buffer unchanged. */
int buf_append(struct buf *b, const void *p, size_t n);
int buf_append_str(struct buf *b, const char *s);
int buf_append_u64(struct buf *b, uint64_t v);     /* in decimal */
int buf_printf(struct buf *b, const char *fmt, ...) GW_PRINTF(2, 3);
int buf_vprintf(struct buf *b, const char *fmt, va_list ap) GW_PRINTF(2, 0);

/*
 * Make room for at least 'n' more bytes; OUT *out: where to write.  May move
 * the data (any append may), so views into the buffer do not survive it.  After
 * writing k <= n bytes call buf_commit(b, k).  Lets read() fill the buffer
 * without a bounce copy.
 */
int buf_reserve(struct buf *b, size_t n, char **out);
void buf_commit(struct buf *b, size_t n);

/* Mark the first 'n' unread bytes as consumed (n <= buf_len()). */
void buf_consume(struct buf *b, size_t n);

/* Move unread bytes to the front; invalidates pointers into the buffer. */
void buf_compact(struct buf *b);

/*
 * Hand the bytes to the caller as a NUL-terminated string (OUT *len is its
 * length) and leave the buffer empty.  Returns an owned pointer to free with
 * gw_free(), or NULL for an empty buffer that never allocated.
 */
char *buf_take(struct buf *b, size_t *len);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* Allocate and init; NULL on allocation failure. */
struct buf *buf_new(size_t limit);

/* Release and free; NULL-safe. */
void buf_free(struct buf *b);
#endif

#endif
