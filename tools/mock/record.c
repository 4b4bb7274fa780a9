/* SPDX-License-Identifier: MIT */
/*
 * record.c - what mock_upstream remembers of the /v1 requests (record.h).
 *
 * Design: the request record behind GET /recorded keeps each /v1 request
 * head as JSON text rendered once, outside the lock, when the head
 * arrives; the answer is then a concatenation.  It is a ring that drops
 * its oldest entries past MOCK_REC_MAX of them or MOCK_REC_BYTES of
 * text: the most recent requests are the ones a test has just made.
 */
#include "record.h"

#include <inttypes.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "http.h"
#include "mock.h"
#include "send.h"

#define MOCK_REC_BYTES (64 * 1024 * 1024)   /* the entries' JSON text */
#define MOCK_REC_ENTRY (4 * MOCK_MAX_HEAD)  /* one entry's JSON text */
#define MOCK_BODY_KEPT (64 * 1024)          /* of the last body */

/* So the record's text, and the /recorded answer, stay under the cap. */
_Static_assert(MOCK_REC_ENTRY <= MOCK_REC_BYTES,
               "one /recorded entry may pass MOCK_REC_BYTES");

/*
 * A new JSON string holding p[0..n).  HTTP lets field values carry
 * obs-text (bytes 0x80-0xff, RFC 9110 section 5.5) but JSON strings must
 * be UTF-8, so when p[0..n) is not valid UTF-8 every byte >= 0x80 becomes
 * '?'.  Borrows 'p'.  Returns a new reference, or NULL (out of memory).
 */
static json_t *
lossy_string(const char *p, size_t n)
{
    json_t *s = json_stringn(p, n);
    char *copy;
    size_t i;

    if (s != NULL)
        return s;
    copy = gw_malloc(n + 1);
    if (copy == NULL)
        return NULL;
    for (i = 0; i < n; i++)
        copy[i] = (unsigned char)p[i] >= 0x80 ? '?' : p[i];
    s = json_stringn(copy, n);
    gw_free(copy);
    return s;
}

/* Put 'v' (stolen) in st's '*slot' under the lock; the old one goes. */
static void
keep_last(json_t **slot, json_t *v)
{
    json_t *old;

    mock_lock();
    old = *slot;
    *slot = v;
    mock_unlock();
    json_decref(old);
}

void
record_headers(const struct http_request *r)
{
    json_t *o = json_object();
    struct buf v;
    char *name = NULL;
    const json_t *prev;
    size_t i, k;
    int rc = o != NULL ? 0 : GW_ENOMEM;

    buf_init(&v, MOCK_MAX_HEAD);
    for (i = 0; rc == 0 && i < r->num_headers; i++) {
        const struct http_header *f = &r->headers[i];

        gw_free(name);
        name = gw_strndup(f->name, f->name_len);
        if (name == NULL) {
            rc = GW_ENOMEM;
            break;
        }
        for (k = 0; name[k] != '\0'; k++)
            if (name[k] >= 'A' && name[k] <= 'Z')
                name[k] = (char)(name[k] - 'A' + 'a');
        buf_reset(&v);
        prev = json_object_get(o, name);
        if (prev != NULL)
            rc = buf_printf(&v, "%s, ", json_string_value(prev));
        if (rc == 0)
            rc = buf_append(&v, f->value, f->value_len);
        if (rc != 0)
            break;
        if (json_object_set_new(o, name, lossy_string(buf_ptr(&v),
                                                      buf_len(&v))) != 0)
            rc = GW_ENOMEM;
    }
    gw_free(name);
    buf_release(&v);
    if (rc != 0) {
        json_decref(o);
        return;                 /* keep the previous ones; only a test aid */
    }
    keep_last(&st.last_headers, o);
}

void
record_body(const char *p, size_t n)
{
    json_t *s = lossy_string(p, n < MOCK_BODY_KEPT ? n : MOCK_BODY_KEPT);

    if (s != NULL)              /* else keep the previous one: a test aid */
        keep_last(&st.last_body, s);
}

void
record_request(const struct http_request *r)
{
    const struct http_header *f;
    json_t *fields = json_array(), *o;
    struct rec_entry *e;
    struct buf b;
    char *text = NULL;
    size_t i, len = 0;

    buf_init(&b, MOCK_REC_ENTRY);
    for (i = 0; fields != NULL && i < r->num_headers; i++) {
        f = &r->headers[i];
        /* "o" steals both strings, even when one is NULL and it fails. */
        if (json_array_append_new(fields, json_pack(
                "[o, o]", lossy_string(f->name, f->name_len),
                lossy_string(f->value, f->value_len))) != 0) {
            json_decref(fields);
            fields = NULL;
        }
    }
    o = json_pack("{s:o, s:o, s:o}",
                  "method", lossy_string(r->method, r->method_len),
                  "target", lossy_string(r->target, r->target_len),
                  "headers", fields);
    if (o != NULL && json_dump_callback(o, mock_dump_to_buf, &b,
                                        JSON_COMPACT) == 0)
        text = buf_take(&b, &len);
    json_decref(o);
    buf_release(&b);

    mock_lock();
    if (text == NULL) {
        st.rec_dropped++;
    } else {
        while (st.rec_count > 0 && (st.rec_count == MOCK_REC_MAX
                                    || st.rec_bytes + len > MOCK_REC_BYTES)) {
            e = &st.rec[st.rec_head];
            st.rec_bytes -= e->len;
            gw_free(e->json);
            e->json = NULL;
            st.rec_head = (st.rec_head + 1) % MOCK_REC_MAX;
            st.rec_count--;
            st.rec_dropped++;
        }
        e = &st.rec[(st.rec_head + st.rec_count) % MOCK_REC_MAX];
        e->json = text;
        e->len = len;
        st.rec_count++;
        st.rec_bytes += len;
    }
    mock_unlock();
}

void
record_answer(struct req *q)
{
    const struct rec_entry *e;
    struct buf b;
    char *p;
    uint64_t dropped;
    size_t i;
    int rc;

    buf_init(&b, MOCK_REC_BYTES + MOCK_REC_MAX + 64);
    mock_lock();
    /* One allocation: the entries, their commas and the framing. */
    rc = buf_reserve(&b, st.rec_bytes + st.rec_count + 64, &p);
    if (rc == 0)
        rc = buf_append_str(&b, "{\"requests\":[");
    for (i = 0; rc == 0 && i < st.rec_count; i++) {
        e = &st.rec[(st.rec_head + i) % MOCK_REC_MAX];
        if (i > 0)
            rc = buf_append(&b, ",", 1);
        if (rc == 0)
            rc = buf_append(&b, e->json, e->len);
    }
    dropped = st.rec_dropped;
    mock_unlock();
    if (rc == 0)
        rc = buf_printf(&b, "],\"dropped\":%" PRIu64 "}", dropped);
    if (rc != 0)
        send_error(q, 500, "mock: out of memory", NULL, "internal_error");
    else
        send_simple(q, 200, "application/json", buf_ptr(&b), buf_len(&b));
    buf_release(&b);
}

void
record_free(struct rec_entry *ring, size_t head, size_t count)
{
    size_t i;

    if (ring == NULL)
        return;
    for (i = 0; i < count; i++)
        gw_free(ring[(head + i) % MOCK_REC_MAX].json);
    gw_free(ring);
}
