/* SPDX-License-Identifier: MIT */
/*
 * relay_floor.c - the least work a thread-per-connection, blocking
 * HTTP/1.1 proxy can do: a yardstick for tools/bench_proxy.sh, not a
 * proxy for use.
 *
 *   relay_floor -l 127.0.0.1:0 -u 127.0.0.1:PORT
 *       [-r HOST:PORT -- COMMAND ARG...]
 *   relay_floor -l 127.0.0.1:0 -a FILE
 *   relay_floor -l 127.0.0.1:0 -c URL [-H LINE]... [-j]
 *
 * prints "relay_floor listening port=N" and serves until killed.  Every
 * client connection gets a thread with its own keep-alive connection to
 * the upstream.  Per request the thread reads the request (head up to
 * the blank line, body by Content-Length), writes it upstream unchanged,
 * reads the response the same way and writes it back: four system calls
 * and two waits, on blocking sockets.  A chunked response (a stream) is
 * passed on as it arrives, one read and one write per piece, until its
 * last chunk: the least a thread-per-stream relay does per chunk
 * (tools/bench_stream_cost.sh).  Nothing else: no routing, no parsing
 * beyond the end of the head, Content-Length and a chunked
 * Transfer-Encoding, no JSON, no limits, no timeouts, no logs; any
 * surprise closes the connection.
 *
 * With -r, every request also makes one blocking Redis round trip: the
 * least a thread-per-connection gateway with a limit shared through
 * Redis does per request (tools/bench_cluster.py, issue 28).  COMMAND
 * and its arguments, after "--", are sent as they are (bench_cluster
 * passes the EVALSHA of infergw's admission script), after the client's
 * request is read and before it is written upstream; the reply is only
 * checked for being no error, then freed.  Each connection thread opens
 * its own hiredis connection to HOST:PORT (TCP_NODELAY, hiredis's
 * default; a path instead, "-r /run/redis.sock", is a unix socket) when
 * it starts, and keeps it for its life: no pool to wait for, no lock, no
 * deadline, no script fallback.  infergw instead shares a bounded pool
 * of connections (8 by default, as issue 28 wants: a Redis must not see
 * one connection per client) and waits for Redis against a deadline, so
 * this is less than infergw can do, never more.  An error reply or a
 * lost or refused Redis connection closes the client's connection.
 *
 * With -a, there is no upstream: every request is answered with the
 * bytes of FILE (a whole response, head and body, as a cache would keep
 * it), in one write.  The least a thread-per-connection cache does per
 * hit (tools/bench_cache.sh, issue 30): read the request, write the
 * answer, wait for the next; no key, no lookup, no lock, no framing.
 *
 * With -c, the upstream is reached through libcurl, as the design card
 * has the gateway reach it: every connection thread keeps one easy
 * handle, set once (URL, Content-Type, no Expect, each -H LINE, HTTP/1.1,
 * TCP_NODELAY, the callbacks), and per request only points it at the
 * body and calls
 * curl_easy_perform() on the handle's kept connection.  (libcurl 7.88
 * spends some 3.8k instructions per request on each header line, so the
 * benchmarks pass infergw's own lines with -H: the floor of the same
 * request on the wire.)  With -j, each request's body is also parsed
 * with jansson, the design card's JSON library, as strictly as infergw
 * asks it (duplicate keys refused; an object), and the tree freed after
 * the answer: the least a gateway on the card does that must refuse a
 * body that is not JSON; one that is not closes the connection.  A JSON
 * answer is
 * gathered and written back with its Content-Length in one writev; an
 * answer whose Content-Type is text/event-stream is passed on as libcurl
 * hands it over, each piece one chunk of a chunked reply, one writev per
 * piece.  The least a thread-per-connection gateway on libcurl does
 * (tools/profile_request.sh, issue 31): no reset, no per-request
 * options beyond the body, no header parsing of our own, no share
 * handle.  Every request is POSTed to URL, whatever its own line says;
 * any failure closes the client's connection.
 *
 * Why: infergw's design card fixes the model (one blocking thread per
 * client, libcurl upstream).  This program measures what that model can
 * reach on a machine before any of infergw's own work, so that the
 * benchmark can tell the model's cost from the gateway's.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/uio.h>

#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#include "net.h"
#include "util.h"

#define FLOOR_BUF 65536

struct side {
    int fd;
    char buf[FLOOR_BUF];
    size_t len;                 /* bytes in buf */
};

/*
 * -r's round trip, set up by main() before the first thread and never
 * changed after: every thread reads it without a lock.
 */
struct admission {
    char host[256];             /* NUL-terminated; a unix socket's path */
    int port;                   /* 0: 'host' is a unix socket */
    int argc;
    const char **argv;          /* the command, main()'s argv */
    size_t *argvlen;            /* strlen() of each, measured once */
};

/* -a's answer, read by main() before the first thread; never changed. */
struct answer {
    char *p;
    size_t len;
};

/*
 * -c's per-thread libcurl state.  The handle and its header list live as
 * long as the client's connection; 'ans' gathers a JSON answer.
 */
struct via_curl {
    CURL *e;
    struct curl_slist *hdrs;
    int client;
    int check_json;             /* -j */
    int streaming;              /* this answer: a chunked reply begun */
    int failed;                 /* a write to the client failed */
    char *ans;
    size_t len, cap;
};

struct job {
    int client;
    const char *curl_url;               /* -c; else NULL */
    const struct curl_slist *curl_lines;    /* -c's -H lines; may be NULL */
    int check_json;                     /* -c's -j */
    struct sockaddr_storage up;
    socklen_t up_len;
    const struct admission *adm;        /* NULL without -r */
    const struct answer *ans;           /* -a: no upstream; else NULL */
};

/* The message length (head + Content-Length body) once the head is in. */
static size_t
message_len(const char *p, size_t n)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    const char *cl;
    size_t head;

    if (end == NULL)
        return 0;
    head = (size_t)(end - p) + 4;
    cl = memmem(p, head, "\r\nContent-Length:", 17);
    if (cl == NULL)
        cl = memmem(p, head, "\r\ncontent-length:", 17);
    return head + (cl != NULL ? strtoul(cl + 17, NULL, 10) : 0);
}

/* Read one whole message into s->buf; 0 at EOF or on error. */
static size_t
read_message(struct side *s)
{
    size_t want = 0;
    ssize_t r;

    for (;;) {
        if (want == 0)
            want = message_len(s->buf, s->len);
        if (want > 0 && s->len >= want)
            return want;
        if (s->len == sizeof(s->buf))
            return 0;
        r = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
        if (r <= 0)
            return 0;
        s->len += (size_t)r;
    }
}

static int
write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write the first 'n' bytes of from->buf to 'to'; keep any after them. */
static int
pass_on(struct side *from, size_t n, int to)
{
    if (write_all(to, from->buf, n) != 0)
        return -1;
    memmove(from->buf, from->buf + n, from->len - n);
    from->len -= n;
    return 0;
}

/* Pass one message from 'from' to 'to'. */
static int
relay_one(struct side *from, int to)
{
    size_t n = read_message(from);

    return n == 0 ? -1 : pass_on(from, n, to);
}

/* A new blocking connection to a's Redis, or NULL or one with ->err set. */
static redisContext *
redis_open(const struct admission *a)
{
    return a->port != 0 ? redisConnect(a->host, a->port)
                        : redisConnectUnix(a->host);
}

/*
 * One blocking round trip of a's command on 'redis': 0, or -1 on an
 * error reply or a failed connection (which hiredis leaves unusable, so
 * the caller closes).  hiredis formats the command anew each time, as
 * infergw does its own.
 */
static int
round_trip(redisContext *redis, const struct admission *a)
{
    redisReply *reply = redisCommandArgv(redis, a->argc, a->argv, a->argvlen);
    int ok = reply != NULL && reply->type != REDIS_REPLY_ERROR;

    freeReplyObject(reply);             /* NULL-safe */
    return ok ? 0 : -1;
}

/*
 * Pass one request from the client 'c' upstream to 'to', with a's round
 * trip between reading it and writing it when 'redis' is not NULL.
 */
static int
relay_request(struct side *c, int to, redisContext *redis,
              const struct admission *a)
{
    size_t n = read_message(c);

    if (n == 0 || (redis != NULL && round_trip(redis, a) != 0))
        return -1;
    return pass_on(c, n, to);
}

/* Does the head p[0..n) say "Transfer-Encoding: chunked"? */
static int
is_chunked(const char *p, size_t n)
{
    return memmem(p, n, "\r\nTransfer-Encoding: chunked", 28) != NULL
           || memmem(p, n, "\r\ntransfer-encoding: chunked", 28) != NULL;
}

/*
 * Pass the response from 'u' to 'to': a whole message, or a chunked one
 * piece by piece as it comes, until the bytes so far end with the last
 * chunk "0\r\n\r\n" (a yardstick's shortcut: no trailers, no parse).
 */
static int
relay_response(struct side *u, int to)
{
    char tail[5] = { 0 };
    const char *end;
    size_t k;
    ssize_t r;

    while ((end = memmem(u->buf, u->len, "\r\n\r\n", 4)) == NULL) {
        if (u->len == sizeof(u->buf))
            return -1;
        r = read(u->fd, u->buf + u->len, sizeof(u->buf) - u->len);
        if (r <= 0)
            return -1;
        u->len += (size_t)r;
    }
    if (!is_chunked(u->buf, (size_t)(end - u->buf) + 4))
        return relay_one(u, to);
    for (;;) {
        if (write_all(to, u->buf, u->len) != 0)
            return -1;
        if (u->len >= sizeof(tail)) {
            memcpy(tail, u->buf + u->len - sizeof(tail), sizeof(tail));
        } else {
            k = sizeof(tail) - u->len;
            memmove(tail, tail + u->len, k);
            memcpy(tail + k, u->buf, u->len);
        }
        u->len = 0;
        if (memcmp(tail, "0\r\n\r\n", 5) == 0)
            return 0;
        r = read(u->fd, u->buf, sizeof(u->buf));
        if (r <= 0)
            return -1;
        u->len = (size_t)r;
    }
}

/* -a: answer every request of client 'c' with 'a', until it leaves. */
static void
answer_all(struct side *c, const struct answer *a)
{
    size_t n;

    while ((n = read_message(c)) != 0
           && write_all(c->fd, a->p, a->len) == 0) {
        memmove(c->buf, c->buf + n, c->len - n);
        c->len -= n;
    }
}

/* -c: writev all of iov[0..n) to fd; 0, or -1 on failure. */
static int
writev_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);

        if (w <= 0)
            return -1;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static const char stream_head[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

/* -c's CURLOPT_WRITEFUNCTION: pass a stream's piece on, or gather. */
static size_t
curl_piece(char *p, size_t size, size_t n, void *arg)
{
    struct via_curl *v = arg;
    const char *type = NULL;
    char line[24];
    struct iovec iov[4];
    int k = 0;

    n *= size;
    if (!v->streaming && v->len == 0) {
        curl_easy_getinfo(v->e, CURLINFO_CONTENT_TYPE, &type);
        if (type != NULL && strncmp(type, "text/event-stream", 17) == 0) {
            v->streaming = 1;
            iov[k++] = (struct iovec){ (char *)stream_head,
                                       sizeof(stream_head) - 1 };
        }
    }
    if (!v->streaming) {
        if (v->len + n > v->cap) {
            size_t cap = (v->len + n) * 2;
            char *q = realloc(v->ans, cap);

            if (q == NULL)
                return 0;
            v->ans = q;
            v->cap = cap;
        }
        memcpy(v->ans + v->len, p, n);
        v->len += n;
        return n;
    }
    iov[k++] = (struct iovec){ line, (size_t)snprintf(line, sizeof(line),
                                                      "%zx\r\n", n) };
    iov[k++] = (struct iovec){ p, n };
    iov[k++] = (struct iovec){ (char *)"\r\n", 2 };
    if (writev_all(v->client, iov, k) != 0) {
        v->failed = 1;
        return 0;
    }
    return n;
}

/* -c: POST body[0..len) through v's handle and write the answer back. */
static int
relay_via_curl(struct via_curl *v, const char *body, size_t len)
{
    char line[96];
    struct iovec iov[2];
    long status = 0;

    if (curl_easy_setopt(v->e, CURLOPT_POSTFIELDSIZE, (long)len)
            != CURLE_OK
        || curl_easy_setopt(v->e, CURLOPT_POSTFIELDS, body)
            != CURLE_OK
        || curl_easy_perform(v->e) != CURLE_OK || v->failed)
        return -1;
    if (v->streaming)
        return write_all(v->client, "0\r\n\r\n", 5);
    curl_easy_getinfo(v->e, CURLINFO_RESPONSE_CODE, &status);
    iov[0] = (struct iovec){ line, (size_t)snprintf(line, sizeof(line),
        "HTTP/1.1 %ld OK\r\nContent-Type: application/json\r\n"
        "Content-Length: %zu\r\n\r\n", status, v->len) };
    iov[1] = (struct iovec){ v->ans, v->len };
    return writev_all(v->client, iov, 2);
}

/* -c: one request of 'c' (n bytes in c->buf) through v's handle. */
static int
curl_one(struct via_curl *v, struct side *c, size_t n)
{
    const char *end = memmem(c->buf, n, "\r\n\r\n", 4);
    size_t head = (size_t)(end - c->buf) + 4;
    json_t *root = NULL;
    int rc;

    v->streaming = 0;
    v->len = 0;
    if (v->check_json) {
        root = json_loadb(c->buf + head, n - head, JSON_REJECT_DUPLICATES,
                          NULL);
        if (!json_is_object(root)) {
            json_decref(root);          /* NULL-safe */
            return -1;
        }
    }
    rc = relay_via_curl(v, c->buf + head, n - head);
    json_decref(root);
    return rc;
}

/* -c: relay every request of client 'c' through libcurl to 'url', with
 * the header lines 'more' beside Content-Type and Expect; 'check_json':
 * -j. */
static void
curl_all(struct side *c, const char *url, const struct curl_slist *more,
         int check_json)
{
    struct via_curl v = { .client = c->fd, .check_json = check_json };
    size_t n;

    v.e = curl_easy_init();
    v.hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (v.hdrs != NULL)
        v.hdrs = curl_slist_append(v.hdrs, "Expect:");
    for (; more != NULL && v.hdrs != NULL; more = more->next)
        v.hdrs = curl_slist_append(v.hdrs, more->data);
    if (v.e == NULL || v.hdrs == NULL
        || curl_easy_setopt(v.e, CURLOPT_URL, url) != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_NOSIGNAL, 1L) != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_TCP_NODELAY, 1L) != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_HTTP_VERSION,
                            (long)CURL_HTTP_VERSION_1_1) != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_HTTPHEADER, v.hdrs) != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_WRITEFUNCTION, curl_piece)
            != CURLE_OK
        || curl_easy_setopt(v.e, CURLOPT_WRITEDATA, &v) != CURLE_OK)
        goto out;
    while ((n = read_message(c)) != 0 && curl_one(&v, c, n) == 0) {
        memmove(c->buf, c->buf + n, c->len - n);
        c->len -= n;
    }
out:
    curl_easy_cleanup(v.e);             /* NULL-safe */
    curl_slist_free_all(v.hdrs);
    free(v.ans);
}

static void *
serve(void *arg)
{
    struct job *j = arg;
    struct side *c = calloc(1, sizeof(*c));
    struct side *u = calloc(1, sizeof(*u));
    redisContext *redis = NULL;
    int one = 1;

    if (c == NULL || u == NULL)
        goto out;
    c->fd = j->client;
    if (j->ans != NULL) {
        answer_all(c, j->ans);
        goto out;
    }
    if (j->curl_url != NULL) {
        curl_all(c, j->curl_url, j->curl_lines, j->check_json);
        goto out;
    }
    if (j->adm != NULL) {
        redis = redis_open(j->adm);
        if (redis == NULL || redis->err)
            goto out;
    }
    u->fd = socket(j->up.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u->fd < 0
        || connect(u->fd, (struct sockaddr *)&j->up, j->up_len) != 0)
        goto out;
    setsockopt(u->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (relay_request(c, u->fd, redis, j->adm) == 0
           && relay_response(u, c->fd) == 0)
        ;
out:
    redisFree(redis);                   /* NULL-safe */
    if (u != NULL && u->fd > 0)
        close(u->fd);
    close(j->client);
    free(c);
    free(u);
    free(j);
    return NULL;
}

/*
 * -r's address 'where' (HOST:PORT, or a unix socket's path) and the
 * command argv[0..argc): a new admission, owned by the caller (kept for
 * the process's life), or NULL, said on stderr, when 'where' does not
 * parse or one round trip of the command fails.  Borrows 'where';
 * 'argv' must outlive the result.
 */
static struct admission *
admission_new(const char *where, int argc, char **argv)
{
    struct admission *a = calloc(1, sizeof(*a));
    redisContext *redis = NULL;
    redisReply *reply = NULL;
    const char *host;
    size_t host_len;

    if (a == NULL || argc < 1)
        goto fail;
    if (where[0] == '/') {
        host = where;
        host_len = strlen(where);
    } else if (net_parse_hostport(where, &host, &host_len, &a->port) != 0
               || host_len == 0 || a->port == 0) {
        fprintf(stderr, "relay_floor: -r %s: not HOST:PORT\n", where);
        goto fail;
    }
    if (host_len >= sizeof(a->host)) {
        fprintf(stderr, "relay_floor: -r %s: too long\n", where);
        goto fail;
    }
    memcpy(a->host, host, host_len);
    a->argc = argc;
    a->argv = (const char **)argv;
    a->argvlen = calloc((size_t)argc, sizeof(*a->argvlen));
    if (a->argvlen == NULL)
        goto fail;
    for (int i = 0; i < argc; i++)
        a->argvlen[i] = strlen(argv[i]);
    /* One round trip now, so that a Redis down or a script it does not
     * know is said once here, not by every client's connection closing. */
    redis = redis_open(a);
    if (redis == NULL || redis->err) {
        fprintf(stderr, "relay_floor: cannot reach Redis at %s: %s\n", where,
                redis != NULL ? redis->errstr : "out of memory");
        goto fail;
    }
    reply = redisCommandArgv(redis, a->argc, a->argv, a->argvlen);
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "relay_floor: %s: %s\n", argv[0],
                reply != NULL ? reply->str : redis->errstr);
        goto fail;
    }
    freeReplyObject(reply);
    redisFree(redis);
    return a;

fail:
    freeReplyObject(reply);             /* NULL-safe, as redisFree() */
    redisFree(redis);
    if (a != NULL)
        free(a->argvlen);
    free(a);
    return NULL;
}

/* -a's FILE, whole, or NULL (said on stderr). */
static struct answer *
answer_read(const char *path)
{
    struct answer *a = calloc(1, sizeof(*a));
    FILE *f = fopen(path, "rb");
    long n;

    if (a == NULL || f == NULL || fseek(f, 0, SEEK_END) != 0
        || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0
        || (a->p = malloc((size_t)n)) == NULL
        || fread(a->p, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "relay_floor: -a %s: cannot read it, or empty\n",
                path);
        if (f != NULL)
            fclose(f);
        if (a != NULL)
            free(a->p);
        free(a);
        return NULL;
    }
    fclose(f);
    a->len = (size_t)n;
    return a;
}

int
main(int argc, char **argv)
{
    const char *listen_addr = "127.0.0.1:0", *up_addr = NULL;
    const char *redis_addr = NULL, *answer_path = NULL, *curl_url = NULL;
    struct curl_slist *curl_lines = NULL, *more;
    int check_json = 0;
    struct admission *adm = NULL;
    struct answer *ans = NULL;
    struct sockaddr_storage up = { 0 };
    socklen_t up_len = sizeof(up);
    pthread_attr_t attr;
    uint16_t port;
    int lfd, opt, probe;

    while ((opt = getopt(argc, argv, "l:u:r:a:c:H:j")) != -1) {
        if (opt == 'l')
            listen_addr = optarg;
        else if (opt == 'a')
            answer_path = optarg;
        else if (opt == 'c')
            curl_url = optarg;
        else if (opt == 'j')
            check_json = 1;
        else if (opt == 'H' && (more = curl_slist_append(curl_lines, optarg))
                                   != NULL)
            curl_lines = more;
        else if (opt == 'u')
            up_addr = optarg;
        else if (opt == 'r')
            redis_addr = optarg;
        else
            goto usage;
    }
    /* The command, after "--", comes with -r and only with it; -a or -c
     * instead of an upstream, alone. */
    if ((curl_lines != NULL || check_json) && curl_url == NULL)
        goto usage;
    if (answer_path != NULL || curl_url != NULL) {
        if (up_addr != NULL || redis_addr != NULL || optind != argc
            || (answer_path != NULL && curl_url != NULL))
            goto usage;
    }
    if (curl_url != NULL) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return 1;
    } else if (answer_path != NULL) {
        ans = answer_read(answer_path);
        if (ans == NULL)
            return 1;
    } else if (up_addr == NULL || (redis_addr == NULL) != (optind == argc)) {
        goto usage;
    }
    if (redis_addr != NULL) {
        adm = admission_new(redis_addr, argc - optind, argv + optind);
        if (adm == NULL)
            return 1;
    }
    /* Resolve the upstream once, through common/net.c's parser. */
    if (ans == NULL && curl_url == NULL) {
        if (net_connect(up_addr, gw_now_ms() + 5000, &probe) != 0
            || getpeername(probe, (struct sockaddr *)&up, &up_len) != 0) {
            fprintf(stderr, "relay_floor: cannot reach %s\n", up_addr);
            return 1;
        }
        close(probe);
    }
    if (net_listen(listen_addr, 1024, &lfd, &port) != 0) {
        fprintf(stderr, "relay_floor: cannot listen on %s\n", listen_addr);
        return 1;
    }
    printf("relay_floor listening port=%u\n", (unsigned)port);
    fflush(stdout);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        struct job *j;
        pthread_t t;
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        int one = 1;

        if (cfd < 0) {
            if (errno == EAGAIN || errno == EINTR)
                net_wait(lfd, POLLIN, -1, -1);
            continue;
        }
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        j = calloc(1, sizeof(*j));
        if (j == NULL) {
            close(cfd);
            continue;
        }
        j->client = cfd;
        j->up = up;
        j->up_len = up_len;
        j->adm = adm;
        j->ans = ans;
        j->curl_url = curl_url;
        j->curl_lines = curl_lines;
        j->check_json = check_json;
        if (pthread_create(&t, &attr, serve, j) != 0) {
            close(cfd);
            free(j);
        }
    }

usage:
    fprintf(stderr, "usage: relay_floor [-l HOST:PORT] -u HOST:PORT "
                    "[-r HOST:PORT -- COMMAND [ARG...]]\n"
                    "       relay_floor [-l HOST:PORT] -a FILE\n"
                    "       relay_floor [-l HOST:PORT] -c URL [-H LINE]... [-j]\n");
    return 2;
}
