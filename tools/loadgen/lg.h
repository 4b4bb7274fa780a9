/* SPDX-License-Identifier: MIT */
/*
 * lg.h - what loadgen's files share, and private to them: the limits
 * more than one file needs, the options, the clients, the records of
 * their requests and the run's state.  Only tools/loadgen.c and
 * tools/loadgen/ include it.
 *
 * Locking: none.  loadgen is one thread (client.c's file comment says
 * why); 'opt' is set by main() before the run starts and read-only
 * afterwards, and 'run' is the run's state.
 */
#ifndef INFERGW_TOOLS_LOADGEN_LG_H
#define INFERGW_TOOLS_LOADGEN_LG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "buf.h"
#include "http_chunked.h"

#define LG_MAX_HEADERS 16
#define LG_READ_SIZE 65536          /* one read() per wakeup, at most */
#define LG_HEAD_LIMIT (64 * 1024)   /* response head, status to blank line */

enum client_state {
    CS_NEW = 0,                 /* no socket yet */
    CS_CONNECTING,
    CS_IDLE,                    /* connected, waiting for the release */
    CS_SENDING,                 /* request partly written */
    CS_READING,
    CS_DONE,                    /* finished for good (or failed) */
};

enum role {
    ROLE_NONE = 0,              /* no X-Infergw-Coalesce header */
    ROLE_LEADER,
    ROLE_FOLLOWER,
    ROLE_BYPASS,
    ROLE_OTHER,
    ROLE_COUNT,
};

enum lg_error {
    LE_NONE = 0,
    LE_CONNECT,                 /* connect failed or timed out */
    LE_WRITE,                   /* the request could not be written */
    LE_RESET,                   /* connection reset or read error */
    LE_EOF,                     /* closed before the response ended */
    LE_PARSE,                   /* malformed response */
    LE_TIMEOUT,                 /* -t passed before the response ended */
    LE_REFUSED,                 /* answered or closed before the release */
    LE_COUNT,
};

/* One request's outcome; times in microseconds, -1 when not reached. */
struct record {
    uint32_t client;
    int16_t status;             /* 0 when no status line arrived */
    uint8_t role;               /* enum role */
    uint8_t err;                /* enum lg_error */
    int64_t send_us;            /* first byte written, from the release */
    int64_t ttfb_us;            /* first body byte, see client.c */
    int64_t arrival_us;         /* the same byte reaching the socket */
    int64_t done_us;            /* response complete */
    uint64_t hash;              /* FNV-1a 64 of the de-chunked body */
    uint64_t bytes;             /* de-chunked body length */
};

/*
 * One client connection.  'head' holds the response head until it is
 * complete and is released right after, so idle clients own no memory
 * beyond this struct.
 */
struct client {
    int fd;
    enum client_state state;
    size_t sent;                /* request bytes written so far */
    int64_t t_send;             /* gw_now_us() of the first request byte */
    int64_t t_first;            /* first body byte, -1 */
    int64_t t_arrival;          /* its kernel receive time, -1 */
    struct buf head;
    int head_done;
    int status;
    enum role role;
    int chunked;
    int64_t left;               /* Content-Length bytes to come; -1: none */
    int until_close;            /* body delimited by the connection close */
    int keep_alive;
    struct http_chunked dec;
    uint64_t hash;
    uint64_t bytes;
};

/* Command line; set in main() and read-only afterwards. */
struct lg_options {
    long clients;
    const char *url;
    const char *body_arg;
    const char *headers[LG_MAX_HEADERS];
    size_t num_headers;
    long timeout_s;
    const char *out_path;
    double loop_s;              /* 0: fan-out */
    const char *ready_url;
    long settle_ms;
};

extern struct lg_options opt;

/* The run's state; one thread, so no locks. */
struct lg_run {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct buf request;         /* the whole request, written to every fd */
    struct client *clients;
    size_t nclients;
    int ep;
    int64_t t0;                 /* the release instant (gw_now_us) */
    int64_t real_minus_mono;    /* CLOCK_REALTIME - gw_now_us(), in us */
    int64_t loop_end;           /* closed loop: no new request after it */
    int64_t deadline;           /* -t: the run ends here regardless */
    size_t active;              /* clients not yet CS_DONE */
    size_t pending_connects;
    size_t next_connect;        /* first client still CS_NEW */
    struct record *recs;
    size_t nrecs, caprecs;
    struct buf scratch;         /* de-chunked bytes of one read, hashed */
    int64_t connect_us;         /* how long the connect phase took */
    int64_t ready_us;           /* waiting for --ready and the settle */
    int64_t spread_us;          /* release to the last request written */
    int oom;
};

extern struct lg_run run;

#endif
