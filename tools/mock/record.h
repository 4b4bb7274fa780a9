/* SPDX-License-Identifier: MIT */
/*
 * record.h - what mock_upstream remembers of the /v1 requests it gets,
 * for tests to read back: the last one's fields (GET /stats'
 * last_headers) and the ring of request heads behind GET /recorded.
 *
 * Both live in 'st' under st.mu; each entry is rendered before the lock
 * is taken.
 */
#ifndef INFERGW_TOOLS_MOCK_RECORD_H
#define INFERGW_TOOLS_MOCK_RECORD_H

#include <stddef.h>

struct http_request;
struct rec_entry;
struct req;

/*
 * Remember the fields of a /v1 request for /stats, names lower-cased.
 * Repeated fields are joined with ", " (RFC 9110 section 5.3).  Bytes
 * that are not UTF-8 (obs-text) become '?', as lossy_string() says.
 */
void record_headers(const struct http_request *r);

/*
 * Remember the body p[0..n) of a /v1 POST for /stats' last_body: its
 * first MOCK_BODY_KEPT bytes, as a string ('?' for the bytes of one that
 * is not UTF-8, as lossy_string() says), so that a test sees what the
 * upstream was sent.  Out of memory keeps the previous one.
 */
void record_body(const char *p, size_t n);

/*
 * Record the head of a /v1 request for /recorded: method, target and
 * every field as received, names in their original case, in wire order,
 * repeats kept, values with '?' for bytes that cannot be UTF-8
 * (lossy_string()).  The entry is rendered here, before taking the lock.
 * Past MOCK_REC_MAX entries or MOCK_REC_BYTES of text the oldest are
 * dropped; a head that cannot be rendered (out of memory) counts as
 * dropped too, so "dropped": 0 means the list is complete.
 */
void record_request(const struct http_request *r);

/*
 * GET /recorded: {"requests":[entry, ...],"dropped":N}, the recorded
 * request heads oldest first.  The entries are already JSON text, so the
 * answer is built by copying them, under the lock, into a buffer of its
 * own (up to MOCK_REC_BYTES: more than c->out may hold), which is sent
 * after the lock is dropped.  That holds the lock for one memcpy() of
 * the record: well under a millisecond for a test's few hundred requests,
 * tens of milliseconds for a full 64 MiB one.  Sharing refcounted
 * entries across threads would avoid the copy; it was not worth its
 * subtlety in a mock.
 */
void record_answer(struct req *q);

/*
 * Free the 'count' entries of 'ring' (of MOCK_REC_MAX) from index
 * 'head', then the ring; NULL is fine.  For a ring no longer in 'st'.
 */
void record_free(struct rec_entry *ring, size_t head, size_t count);

#endif
