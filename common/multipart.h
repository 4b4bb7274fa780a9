/* SPDX-License-Identifier: MIT */
/*
 * multipart.h - a strict, bounded reader of multipart/form-data bodies
 * (RFC 7578 on RFC 2046 section 5.1), enough to find one form field:
 * the gateway routes an audio upload by its "model" field, and forwards
 * the body unchanged.
 *
 * Design: pure functions over a whole body already in memory (route.c
 * reads it, bounded by max_request_body), so nothing is incremental and
 * nothing allocates: what they return are (pointer, length) views into
 * the caller's bytes, or a copy into the caller's array.  The whole body
 * is walked, every part checked, even after the field is found: the
 * gateway and the upstream must split the body the same way, so whatever
 * the two could read differently is refused rather than guessed at.
 *
 * Refused (a reason in *why, a static string):
 *   Content-Type   not multipart/form-data (case-insensitive), parameter
 *                  syntax off (RFC 9110 section 8.3.1), no boundary or two
 *                  of them, a boundary of 0 or more than 70 characters,
 *                  outside RFC 2046's bchars, ending in a space, or a
 *                  quoted-pair in it (no bchar needs one).
 *   body           anything before the first boundary (a preamble: no
 *                  client sends one), blanks after a boundary (transport
 *                  padding: "MUST NOT" be sent), a boundary line followed
 *                  by anything but CRLF or the closing "--", anything after
 *                  the close but one CRLF, bare LF or bare CR in a part's
 *                  header lines, a header line that is not "name: value"
 *                  with a token name and field characters, a part without
 *                  exactly one Content-Disposition "form-data" with one
 *                  quoted or token name, a name with a quoted-pair or
 *                  name* (RFC 7578 section 4.2 wants plain names), any
 *                  Content-Transfer-Encoding (section 4.7: MUST NOT), more
 *                  than MULTIPART_MAX_PARTS parts, a part's header block
 *                  over MULTIPART_MAX_HEAD bytes, no closing boundary, and
 *                  two parts of the name asked for.
 *
 * Stateless; safe from any thread.
 */
#ifndef INFERGW_COMMON_MULTIPART_H
#define INFERGW_COMMON_MULTIPART_H

#include <stddef.h>

#define MULTIPART_MAX_BOUNDARY 70       /* RFC 2046 section 5.1.1 */
#define MULTIPART_MAX_PARTS 64
#define MULTIPART_MAX_HEAD 4096         /* one part's header lines */

/*
 * The boundary of the Content-Type value ct[0..n): copied, unquoted, into
 * out[] (MULTIPART_MAX_BOUNDARY + 1 bytes, NUL-terminated), its length in
 * *out_len.  Borrows 'ct'.  Returns 0, or GW_EPARSE with *why set.
 */
int multipart_boundary(const char *ct, size_t n, char *out, size_t *out_len,
                       const char **why);

/*
 * Walk the whole body p[0..n) split at 'boundary' (b_len bytes, as
 * multipart_boundary() gave it) and find the part named 'name'.
 * OUT *value, *value_len: its content, a view into 'p'.  Borrows all.
 * Returns 0; GW_ENOTFOUND when the body is sound but has no such part;
 * GW_EPARSE (including a bound passed, or 'name' twice) with *why set.
 */
int multipart_find(const char *p, size_t n, const char *boundary,
                   size_t b_len, const char *name, const char **value,
                   size_t *value_len, const char **why);

#endif
