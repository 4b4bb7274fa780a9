/* SPDX-License-Identifier: MIT */
/*
 * http_chunked.c - the incremental chunked-body decoder (RFC 9112 7.1;
 * API in http_chunked.h).
 *
 * Design: unlike the request head parser (http.c), which rescans a
 * bounded head from its first byte, this is a byte-at-a-time state
 * machine (except for chunk data, which is copied in bulk), because a
 * body is unbounded in length and must not be rescanned.  Its character
 * classes are http.h's, so a chunk extension or a trailer field is held
 * to the same grammar as a header field.
 */
#include "http_chunked.h"

#include <stdint.h>

#include "http.h"

/* Line and section bounds of the chunked framing (not the data). */
#define CHUNK_LINE_MAX 4096         /* chunk-size, extensions and CRLF */
#define TRAILER_MAX 8192            /* whole trailer section */

/*
 * Chunked decoder states (RFC 9112 7.1):
 *
 *   chunk      = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
 *   chunk-ext  = *( BWS ";" BWS chunk-ext-name
 *                   [ BWS "=" BWS chunk-ext-val ] )
 *   last-chunk = 1*("0") [ chunk-ext ] CRLF
 *   then trailer-section CRLF
 *
 * BWS is allowed only before ";" and "=" and after them, never before the
 * CRLF: "5 \r\n" is refused, as the grammar says.
 */
enum {
    CH_SIZE_START,          /* first HEXDIG of chunk-size */
    CH_SIZE,                /* more HEXDIG, or what follows the size */
    CH_EXT,                 /* after size or quoted value: ";", BWS, CR */
    CH_EXT_BWS,             /* BWS that must lead to ";" */
    CH_EXT_NAME_START,      /* BWS, then the first tchar of a name */
    CH_EXT_NAME,
    CH_EXT_NAME_BWS,        /* BWS that must lead to "=" or ";" */
    CH_EXT_VALUE_START,     /* BWS, then a token or a quoted-string */
    CH_EXT_TOKEN,
    CH_EXT_QUOTED,
    CH_EXT_QUOTED_PAIR,     /* the byte after a backslash */
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER,             /* start of a trailer line, or the final CRLF */
    CH_TRAILER_NAME,
    CH_TRAILER_VALUE,
    CH_TRAILER_LF,
    CH_END_LF,
    CH_DONE,
};

void
http_chunked_init(struct http_chunked *d)
{
    d->state = CH_SIZE_START;
    d->left = 0;
    d->line_len = 0;
}

static unsigned
hex_value(unsigned char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
}

/*
 * Room left in 'out' before its limit, counting the reset buf_reserve()
 * does when every byte has been consumed.
 */
static size_t
buf_room(const struct buf *out)
{
    if (out->off == out->len)
        return out->limit;
    return out->limit - out->len;
}

/*
 * One framing byte (anything but chunk data).  Returns 0 to go on, 1 when
 * the message is complete, GW_EPARSE or GW_ETOOBIG.
 */
static int
chunked_step(struct http_chunked *d, unsigned char c, const struct buf *out)
{
    if (d->state < CH_DATA) {
        if (++d->line_len > CHUNK_LINE_MAX)
            return GW_EPARSE;       /* RFC 9112 7.1.1 lets us bound this */
    } else if (d->state >= CH_TRAILER) {
        /* line_len counts the whole trailer section there */
        if (++d->line_len > TRAILER_MAX)
            return GW_ETOOBIG;
    }

    switch (d->state) {
    case CH_SIZE_START:
        if (!http_is_hexdig(c))
            return GW_EPARSE;
        d->left = hex_value(c);
        d->state = CH_SIZE;
        return 0;
    case CH_SIZE:
        if (http_is_hexdig(c)) {
            if (d->left > UINT64_MAX >> 4)
                return GW_EPARSE;           /* chunk-size overflow */
            d->left = d->left << 4 | hex_value(c);
            return 0;
        }
        /* c ends the size and starts what follows it */
        /* FALLTHROUGH */
    case CH_EXT:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_BWS;
        else if (c == '\r')
            d->state = CH_SIZE_LF;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_BWS:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_NAME_START:
        if (http_is_tchar(c))
            d->state = CH_EXT_NAME;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_NAME:
        if (http_is_tchar(c))
            return 0;
        /* c ends the name */
        /* FALLTHROUGH */
    case CH_EXT_NAME_BWS:
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == '=')
            d->state = CH_EXT_VALUE_START;
        else if (c == '\r' && d->state == CH_EXT_NAME)
            d->state = CH_SIZE_LF;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_NAME_BWS;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_VALUE_START:
        if (c == '"')
            d->state = CH_EXT_QUOTED;
        else if (http_is_tchar(c))
            d->state = CH_EXT_TOKEN;
        else if (c != ' ' && c != '\t')
            return GW_EPARSE;
        return 0;
    case CH_EXT_TOKEN:
        if (http_is_tchar(c))
            return 0;
        if (c == ';')
            d->state = CH_EXT_NAME_START;
        else if (c == ' ' || c == '\t')
            d->state = CH_EXT_BWS;
        else if (c == '\r')
            d->state = CH_SIZE_LF;
        else
            return GW_EPARSE;
        return 0;
    case CH_EXT_QUOTED:
        if (c == '"')
            d->state = CH_EXT;
        else if (c == '\\')
            d->state = CH_EXT_QUOTED_PAIR;
        else if (!http_is_qdtext(c))
            return GW_EPARSE;
        return 0;
    case CH_EXT_QUOTED_PAIR:
        /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
        if (!http_is_field_char(c))
            return GW_EPARSE;
        d->state = CH_EXT_QUOTED;
        return 0;
    case CH_SIZE_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->line_len = 0;
        if (d->left == 0) {
            d->state = CH_TRAILER;
            return 0;
        }
        /* Refuse an oversized chunk before its data arrives. */
        if (d->left > buf_room(out))
            return GW_ETOOBIG;
        d->state = CH_DATA;
        return 0;
    case CH_DATA_CR:
        if (c != '\r')
            return GW_EPARSE;
        d->state = CH_DATA_LF;
        return 0;
    case CH_DATA_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_SIZE_START;
        return 0;
    case CH_TRAILER:
        /* Trailer fields follow the header field rules (RFC 9112 7.1.2). */
        if (c == '\r')
            d->state = CH_END_LF;
        else if (http_is_tchar(c))
            d->state = CH_TRAILER_NAME;
        else
            return GW_EPARSE;       /* obs-fold, empty name, bare LF, ... */
        return 0;
    case CH_TRAILER_NAME:
        if (c == ':')
            d->state = CH_TRAILER_VALUE;
        else if (!http_is_tchar(c))
            return GW_EPARSE;       /* including whitespace before ':' */
        return 0;
    case CH_TRAILER_VALUE:
        if (c == '\r')
            d->state = CH_TRAILER_LF;
        else if (!http_is_field_char(c))
            return GW_EPARSE;
        return 0;
    case CH_TRAILER_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_TRAILER;
        return 0;
    case CH_END_LF:
        if (c != '\n')
            return GW_EPARSE;
        d->state = CH_DONE;
        return 1;
    default:
        return GW_EPARSE;           /* CH_DATA and CH_DONE never get here */
    }
}

int
http_chunked_feed(struct http_chunked *d, const char *p, size_t len,
                  struct buf *out, size_t *consumed)
{
    const char *cur = p, *end = p + len;
    size_t n;
    int rc = 0;

    if (d->state == CH_DONE) {
        rc = 1;
        goto out;
    }
    while (cur < end) {
        if (d->state == CH_DATA) {
            n = (size_t)(end - cur);
            if (d->left < n)
                n = (size_t)d->left;
            rc = buf_append(out, cur, n);
            if (rc != 0)
                goto out;
            cur += n;
            d->left -= n;
            if (d->left == 0)
                d->state = CH_DATA_CR;
            continue;
        }
        rc = chunked_step(d, (unsigned char)*cur, out);
        if (rc < 0)
            goto out;
        cur++;
        if (rc == 1)
            goto out;           /* bytes after the message are not ours */
    }

out:
    *consumed = (size_t)(cur - p);
    return rc;
}
