/* SPDX-License-Identifier: MIT */
/*
 * jsonx.h - JSON helpers over jansson: bounded parsing of request bodies,
 * OpenAI-shaped error bodies.
 */
#ifndef INFERGW_COMMON_JSONX_H
#define INFERGW_COMMON_JSONX_H

#include <stddef.h>

#include <jansson.h>

#include "buf.h"

#define JSONX_MAX_DEPTH 64

/*
 * Parse p[0..len) as a JSON object nested at most 'max_depth' deep, with
 * duplicate keys refused.  The depth is checked by a scan before jansson
 * sees the bytes, so a hostile "[[[[..." costs no recursion.
 * OUT *out: a new reference (json_decref) on success.
 * Returns 0 or GW_EPARSE with a one-line reason in 'err' ("body is not
 * valid JSON: ... at line 1 column 7", "body must be a JSON object",
 * "body nests deeper than 64 levels").
 */
int jsonx_parse_object(const char *p, size_t len, int max_depth,
                       json_t **out, char *err, size_t errlen);

/*
 * The member named 'key' (plain ASCII, no escapes) at the top level of the
 * JSON object in p[0..len), found without building the document: a
 * response's "usage" is a few dozen bytes at the end of what may be
 * kilobytes of text.  OUT *vp, *vn: the value's raw JSON text (the
 * first, if the key is there twice).  Returns 1 found, 0 not a member,
 * -1 when the scan cannot tell (not one whole object: a string or
 * bracket not closed, bytes after its end; a key written with an
 * escape, which might spell 'key'): then the caller parses the whole
 * text instead.  The whole text is scanned either way, so that a member
 * of an object cut short is never found.
 * The scan checks the structure (strings, brackets, ':' and ','), not the
 * grammar of every value: whoever uses the value parses it
 * (jsonx_parse_object()), as strictly as ever.
 */
int jsonx_member(const char *p, size_t len, const char *key,
                 const char **vp, size_t *vn);

/*
 * Append an OpenAI error body to 'b':
 *   {"error":{"message":M,"type":T,"param":P|null,"code":C|null}}
 * 'param' and 'code' may be NULL.  Strings are JSON-escaped.
 * Returns 0, GW_ENOMEM or GW_ETOOBIG.
 */
int jsonx_error_body(struct buf *b, const char *message, const char *type,
                     const char *param, const char *code);

#endif
