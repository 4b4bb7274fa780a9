/* SPDX-License-Identifier: MIT */
/*
 * jsonx.c - bounded JSON parsing of request bodies and OpenAI-shaped error
 * bodies.
 *
 * Design: jansson's parser recurses once per nesting level and only stops
 * at 2048 levels, so a body of "[[[[..." would cost deep recursion before
 * it is refused.  depth_ok() walks the bytes once, iteratively, counting
 * brackets outside strings (a '[' inside "..." or after a backslash is
 * text, not nesting), and only a body within the bound reaches jansson.
 * The scan does not validate anything else: jansson remains the judge of
 * what is JSON.
 *
 * Error bodies are written by hand rather than with json_dumps() for two
 * reasons: the output must be byte-exact and compact, and the message may
 * carry bytes from a client (jansson's "near '...'" quotes the input) that
 * are not valid UTF-8, which json_string() would refuse.  Invalid bytes
 * become U+FFFD so the body is always valid JSON.
 */
#include "jsonx.h"

#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "util.h"

/* ---- a member, found by a scan ---- */

static size_t
skip_blank(const char *p, size_t len, size_t i)
{
    while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n'
                       || p[i] == '\r'))
        i++;
    return i;
}

/*
 * Past the string whose '"' is at p[i]; 0 when it does not end.  Quote to
 * quote with memchr(), so a long string (a prompt, an answer's text)
 * costs little a byte: a quote ends the string unless an odd run of '\\'
 * comes right before it.  That is exact for JSON, whose only escape of a
 * quote is \" and whose escape sequences hold no quote or backslash of
 * their own (a run of 2k backslashes is k escaped backslashes).
 */
static size_t
string_end(const char *p, size_t len, size_t i)
{
    const char *q, *b;

    for (i++; i < len; i = (size_t)(q - p) + 1) {
        q = memchr(p + i, '"', len - i);
        if (q == NULL)
            return 0;
        for (b = q; b > p + i && b[-1] == '\\'; b--)
            ;
        if (((q - b) & 1) == 0)
            return (size_t)(q - p) + 1;
    }
    return 0;
}

/* Past the key string whose '"' is at p[i]; OUT *escaped: it has a
 * '\\' (a second look, over a key only: values need string_end()).
 * 0 when it does not end. */
static size_t
skip_string(const char *p, size_t len, size_t i, int *escaped)
{
    size_t end = string_end(p, len, i);

    *escaped = end != 0 && memchr(p + i + 1, '\\', end - i - 2) != NULL;
    return end;
}

/* Past the value that starts at p[i] (no blank before it); 0 when it
 * does not end (a string or a bracket left open, or nothing there). */
static size_t
skip_value(const char *p, size_t len, size_t i)
{
    size_t depth = 0;

    if (i >= len)
        return 0;
    if (p[i] == '"')
        return string_end(p, len, i);
    if (p[i] != '{' && p[i] != '[') {
        size_t start = i;

        while (i < len && strchr(",}] \t\r\n", p[i]) == NULL)
            i++;
        return i > start ? i : 0;
    }
    while (i < len) {
        char c = p[i];

        if (c == '"') {
            i = string_end(p, len, i);
            if (i == 0)
                return 0;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0)
                return i + 1;
        }
        i++;
    }
    return 0;
}

int
jsonx_member(const char *p, size_t len, const char *key, const char **vp,
             size_t *vn)
{
    size_t klen = strlen(key), i = skip_blank(p, len, 0), k, v;
    int escaped, match, found = 0;

    if (i >= len || p[i] != '{')
        return -1;
    i = skip_blank(p, len, i + 1);
    if (i < len && p[i] == '}')
        return skip_blank(p, len, i + 1) == len ? 0 : -1;
    for (;;) {
        if (i >= len || p[i] != '"')
            return -1;
        k = i + 1;
        i = skip_string(p, len, i, &escaped);
        if (i == 0 || escaped)
            return -1;
        match = i - 1 - k == klen && memcmp(p + k, key, klen) == 0;
        i = skip_blank(p, len, i);
        if (i >= len || p[i] != ':')
            return -1;
        v = skip_blank(p, len, i + 1);
        i = skip_value(p, len, v);
        if (i == 0)
            return -1;
        if (match && !found) {
            *vp = p + v;
            *vn = i - v;
            found = 1;
        }
        i = skip_blank(p, len, i);
        if (i < len && p[i] == '}')     /* the end, and nothing after it */
            return skip_blank(p, len, i + 1) == len ? found : -1;
        if (i >= len || p[i] != ',')
            return -1;
        i = skip_blank(p, len, i + 1);
    }
}

/* ---- bounded parsing ---- */

/* 1 if no bracket in p[0..len) nests deeper than max_depth. */
static int
depth_ok(const char *p, size_t len, int max_depth)
{
    int depth = 0;
    size_t i, end;

    for (i = 0; i < len; i++) {
        switch (p[i]) {
        case '"':
            end = string_end(p, len, i);
            if (end == 0)
                return 1;       /* not closed: jansson's to report */
            i = end - 1;
            break;
        case '[':
        case '{':
            if (++depth > max_depth)
                return 0;
            break;
        case ']':
        case '}':
            /* Unbalanced closers are jansson's to report. */
            if (depth > 0)
                depth--;
            break;
        default:
            break;
        }
    }
    return 1;
}

/*
 * Replace control bytes in a message with '?': jansson quotes the input
 * in its errors, and the message ends up in log lines and terminals.
 */
static void
scrub(char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f)
            *s = '?';
}

int
jsonx_parse_object(const char *p, size_t len, int max_depth, json_t **out,
                   char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = NULL;
    int rc = GW_EPARSE;

    *out = NULL;
    if (err == NULL)
        errlen = 0;             /* snprintf(NULL, 0, ...) is allowed */
    if (errlen > 0)
        err[0] = '\0';
    if (!depth_ok(p, len, max_depth)) {
        snprintf(err, errlen, "body nests deeper than %d levels", max_depth);
        goto out;
    }
    /* JSON_DECODE_ANY so that "[1]" or "42" is reported as "not an
     * object" rather than as a syntax error: it is valid JSON. */
    root = json_loadb(p, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                      &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "body is not valid JSON: %s at line %d "
                 "column %d", jerr.text, jerr.line, jerr.column);
        if (errlen > 0)
            scrub(err);
        goto out;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "body must be a JSON object");
        goto out;
    }
    *out = root;                /* the new reference moves to the caller */
    root = NULL;
    rc = 0;

out:
    json_decref(root);
    return rc;
}

/*
 * Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one
 * (overlong forms, surrogates and code points above U+10FFFF included,
 * per RFC 3629 section 4).
 */
static size_t
utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t need, i;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef)
        need = 2;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 3;
    else
        return 0;
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (n < need + 1)
        return 0;
    for (i = 1; i <= need; i++) {
        if (s[i] < lo || s[i] > hi)
            return 0;
        lo = 0x80;
        hi = 0xbf;
    }
    return need + 1;
}

/* Append 's' as a quoted JSON string (RFC 8259 section 7). */
static int
append_string(struct buf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), k;
    int rc;

    rc = buf_append(b, "\"", 1);
    while (rc == 0 && n > 0) {
        switch (*p) {
        case '"':  rc = buf_append(b, "\\\"", 2); k = 1; break;
        case '\\': rc = buf_append(b, "\\\\", 2); k = 1; break;
        case '\b': rc = buf_append(b, "\\b", 2); k = 1; break;
        case '\f': rc = buf_append(b, "\\f", 2); k = 1; break;
        case '\n': rc = buf_append(b, "\\n", 2); k = 1; break;
        case '\r': rc = buf_append(b, "\\r", 2); k = 1; break;
        case '\t': rc = buf_append(b, "\\t", 2); k = 1; break;
        default:
            k = utf8_len(p, n);
            if (*p < 0x20) {
                rc = buf_printf(b, "\\u%04x", *p);
            } else if (k == 0) {
                rc = buf_append_str(b, "\\ufffd");
                k = 1;
            } else {
                rc = buf_append(b, p, k);
            }
            break;
        }
        p += k;
        n -= k;
    }
    if (rc == 0)
        rc = buf_append(b, "\"", 1);
    return rc;
}

/* A string, or null for NULL. */
static int
append_string_or_null(struct buf *b, const char *s)
{
    return s != NULL ? append_string(b, s) : buf_append_str(b, "null");
}

int
jsonx_error_body(struct buf *b, const char *message, const char *type,
                 const char *param, const char *code)
{
    struct buf tmp;
    int rc;

    /* Built aside and appended in one go, so a failure leaves 'b' as it
     * was instead of holding half a body. */
    buf_init(&tmp, b->limit);
    rc = buf_append_str(&tmp, "{\"error\":{\"message\":");
    if (rc == 0)
        rc = append_string(&tmp, message);
    if (rc == 0)
        rc = buf_append_str(&tmp, ",\"type\":");
    if (rc == 0)
        rc = append_string(&tmp, type);
    if (rc == 0)
        rc = buf_append_str(&tmp, ",\"param\":");
    if (rc == 0)
        rc = append_string_or_null(&tmp, param);
    if (rc == 0)
        rc = buf_append_str(&tmp, ",\"code\":");
    if (rc == 0)
        rc = append_string_or_null(&tmp, code);
    if (rc == 0)
        rc = buf_append_str(&tmp, "}}");
    if (rc == 0)
        rc = buf_append(b, buf_ptr(&tmp), buf_len(&tmp));
    buf_release(&tmp);
    return rc;
}
