/* SPDX-License-Identifier: MIT */
/*
 * http_read.h - the blocking request reader shared by the gateway and the
 * mock upstream: one request head (parsed by http.h), then the body it
 * announces (a Content-Length, or chunked through http_chunked.h), over
 * a net.h stream, each within its deadline and into buffers the caller
 * bounds.
 */
#ifndef INFERGW_COMMON_HTTP_READ_H
#define INFERGW_COMMON_HTTP_READ_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "http.h"
#include "util.h"

struct net_stream;              /* net.h */

/*
 * Read one request head from the client's stream 's' (borrowed; see
 * net.h).
 *
 * 'in' holds bytes already read (a pipelined request) and receives new
 * ones; it is bounded by the caller.  When the head is complete it is
 * copied into 'head' (reset first) and consumed from 'in', and 'r' is
 * parsed from 'head': its views stay valid until 'head' changes, whatever
 * happens to 'in' later (reading the body may move 'in').
 *
 * Deadlines: until the first byte arrives the wait ends at 'idle_deadline'
 * (or when 'wake_fd' is readable: the process is draining); from the first
 * byte the whole head must arrive within 'header_timeout_ms' (or the wait
 * ends when 'stop_fd' is readable: the process is stopping).  Either
 * descriptor may be -1.
 * Returns 0; GW_ECLOSED (peer closed or reset before a complete head);
 * GW_ETIMEDOUT (r->error_status 408 if some bytes had arrived, 0 if none);
 * GW_EABORTED (drain while idle, or stop); GW_EPARSE / GW_ETOOBIG
 * (error_status set); GW_ENOMEM; GW_EIO.
 */
int http_read_head(struct net_stream *s, struct buf *in, struct buf *head,
                   size_t max_head, int64_t idle_deadline,
                   int header_timeout_ms, int wake_fd, int stop_fd,
                   struct http_request *r);

/*
 * Read the body 'r' announces into 'body' (reset first; its limit is the
 * largest body accepted), first from 'in', then from 's', until 'deadline'
 * or until 'wake_fd' (or -1) is readable while waiting.
 * Bytes after the body stay in 'in' for the next request.
 * Returns 0; GW_ETOOBIG (r->error_status 413); GW_EPARSE (bad chunked
 * framing, 400); GW_ETIMEDOUT (408); GW_EABORTED (wake_fd); GW_ECLOSED;
 * GW_ENOMEM; GW_EIO.
 * 'r' is not const only so that the error fields can be set.
 */
int http_read_body(struct net_stream *s, struct buf *in,
                   struct http_request *r, struct buf *body,
                   int64_t deadline, int wake_fd);

#endif
