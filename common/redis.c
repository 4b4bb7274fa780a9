/* SPDX-License-Identifier: MIT */
/*
 * redis.c - the pool and round trips with a deadline (redis.h); the URLs
 * are redis_url.c.
 *
 * Design: hiredis is used for what it is good at, the protocol: it
 * formats commands into its output buffer (redisAppendCommandArgv()),
 * and its reader turns bytes into replies (redisGetReplyFromReader()).
 * The socket is non-blocking once connected (REDIS_BLOCK cleared, which
 * is how hiredis 0.14 tells redisBufferRead() and redisBufferWrite() to
 * return on EAGAIN), and every wait is our poll() on the deadline.
 *
 * Locking: 'lock' guards 'slot[].state', 'idle' and 'nidle'; 'cv' is
 * signalled when a connection is put back or closed (a waiter in
 * redis_pool_take() looks again).  A slot's 'ctx' belongs to whoever
 * moved it out of IDLE (a taker, or the filling thread) until it moves
 * back, so it is used without the lock.
 */
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <mbedtls/platform_util.h>
#include <mbedtls/sha1.h>

#include "alloc.h"
#include "util.h"

/* ---- scripts ---- */

void
redis_script_init(struct redis_script *s, const char *src)
{
    unsigned char d[20];

    s->src = src;
    mbedtls_sha1_ret((const unsigned char *)src, strlen(src), d);
    gw_hex(d, sizeof(d), s->sha1);
}

/* ---- connections ---- */

enum slot_state { SLOT_EMPTY, SLOT_FILLING, SLOT_IDLE, SLOT_TAKEN };

/*
 * A connection, in its slot.  'known' lists the scripts this connection
 * has sent whole (EVAL), so that Redis has them cached; only those go by
 * EVALSHA.  A script's first use on a connection is an EVAL in its place
 * in the round trip, so the commands after it see its effects.
 */
struct redis_conn {
    redisContext *ctx;              /* NULL when the slot is empty */
    enum slot_state state;          /* (L) */
    int broken;                     /* its owner's: a round trip failed */
    const struct redis_script *known[REDIS_SCRIPTS_MAX];
    size_t nknown;
    struct redis_reply_budget budget;   /* ctx's reader's privdata */
};

/* ---- the reply budget ---- */

/*
 * Charge 'elements' objects and 'bytes' string bytes to the reply that
 * 'task' belongs to; a task without a parent starts a new reply.  0 when
 * it fits.
 */
static int
charge(const redisReadTask *task, size_t elements, size_t bytes)
{
    struct redis_reply_budget *b = task->privdata;

    if (task->parent == NULL) {
        b->elements = 0;
        b->bytes = 0;
        b->over = 0;
    }
    if (elements > REDIS_REPLY_ELEMENTS_MAX - b->elements
        || bytes > REDIS_REPLY_BYTES_MAX - b->bytes) {
        b->over = 1;
        return -1;
    }
    b->elements += elements;
    b->bytes += bytes;
    return 0;
}

static void *
bounded_string(const redisReadTask *task, char *str, size_t len)
{
    const struct redis_reply_budget *b = task->privdata;

    return charge(task, 1, len) == 0 ? b->fn->createString(task, str, len)
           : NULL;
}

static void *
bounded_array(const redisReadTask *task, int elements)
{
    const struct redis_reply_budget *b = task->privdata;

    /* Before hiredis callocs the slots, not after. */
    return charge(task, 1 + (size_t)(elements > 0 ? elements : 0), 0) == 0
           ? b->fn->createArray(task, elements) : NULL;
}

static void *
bounded_integer(const redisReadTask *task, long long value)
{
    const struct redis_reply_budget *b = task->privdata;

    return charge(task, 1, 0) == 0 ? b->fn->createInteger(task, value)
           : NULL;
}

static void *
bounded_nil(const redisReadTask *task)
{
    const struct redis_reply_budget *b = task->privdata;

    return charge(task, 1, 0) == 0 ? b->fn->createNil(task) : NULL;
}

static void
bounded_free(void *reply)
{
    freeReplyObject(reply);
}

static redisReplyObjectFunctions bounded_fn = {
    bounded_string, bounded_array, bounded_integer, bounded_nil,
    bounded_free,
};

GW_TESTABLE void
redis_reader_bound(redisReader *r, struct redis_reply_budget *b)
{
    /* hiredis 0.14 copies the reader's privdata into every task. */
    if (r->fn != &bounded_fn)
        b->fn = r->fn;
    b->elements = b->bytes = 0;
    b->over = 0;
    r->fn = &bounded_fn;
    r->privdata = b;
}

struct redis_pool {
    struct redis_url url;           /* immutable; password wiped at free */
    char password[REDIS_URL_PASSWORD_MAX + 1];  /* the one AUTH sends */
    size_t cap;
    struct gw_mutex lock;
    pthread_cond_t cv;
    struct redis_conn *slot;        /* [cap] */
    struct redis_conn **idle;       /* (L) [cap], a LIFO of nidle */
    size_t nidle;                   /* (L) */
};

/*
 * Wait for 'events' on 'fd' until 'deadline_ms'.  Returns 0 (ready, or
 * an error the next read or write reports), GW_ETIMEDOUT or GW_EIO.
 */
static int
wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct pollfd pfd = { fd, events, 0 };
    int left, n;

    for (;;) {
        left = gw_ms_left(deadline_ms);
        if (left <= 0)
            return GW_ETIMEDOUT;
        n = poll(&pfd, 1, left);
        if (n > 0)
            return 0;
        if (n == 0)
            return GW_ETIMEDOUT;
        if (errno != EINTR)
            return GW_EIO;
    }
}

/* Write hiredis's output buffer out by the deadline. */
static int
flush_out(redisContext *ctx, int64_t deadline_ms)
{
    int done = 0, rc;

    for (;;) {
        if (redisBufferWrite(ctx, &done) != REDIS_OK)
            return GW_EIO;
        if (done)
            return 0;
        rc = wait_fd(ctx->fd, POLLOUT, deadline_ms);
        if (rc != 0)
            return rc;
    }
}

/* The next reply, reading as needed by the deadline.  OUT *out. */
static int
read_reply(redisContext *ctx, redisReply **out, int64_t deadline_ms)
{
    void *r = NULL;
    int rc;

    *out = NULL;
    for (;;) {
        if (redisGetReplyFromReader(ctx, &r) != REDIS_OK) {
            const struct redis_reply_budget *b = ctx->reader->privdata;

            if (b != NULL && b->over)
                return GW_ETOOBIG;
            return ctx->err == REDIS_ERR_OOM ? GW_ENOMEM : GW_EPARSE;
        }
        if (r != NULL) {
            *out = r;
            return 0;
        }
        if (ctx->reader->len - ctx->reader->pos > REDIS_REPLY_MAX)
            return GW_ETOOBIG;
        rc = wait_fd(ctx->fd, POLLIN, deadline_ms);
        if (rc != 0)
            return rc;
        if (redisBufferRead(ctx) != REDIS_OK)
            return ctx->err == REDIS_ERR_OOM ? GW_ENOMEM : GW_EIO;
    }
}

/* Has 'c' sent script 's' whole already? */
static int
knows(const struct redis_conn *c, const struct redis_script *s)
{
    for (size_t i = 0; i < c->nknown; i++)
        if (c->known[i] == s)
            return 1;
    return 0;
}

/* Append command 'c' to the output buffer, a script as EVAL when 'eval'. */
static int
append_cmd(redisContext *ctx, const struct redis_cmd *c, int eval)
{
    const char *argv[REDIS_ARGS_MAX + 3];
    size_t len[REDIS_ARGS_MAX + 3];
    char nkeys[16];
    int argc = 0;

    if (c->argc < 0 || c->argc > REDIS_ARGS_MAX
        || (c->script != NULL && (c->nkeys < 0 || c->nkeys > c->argc))
        || (c->script == NULL && c->argc == 0))
        return GW_EINVAL;
    if (c->script != NULL) {
        snprintf(nkeys, sizeof(nkeys), "%d", c->nkeys);
        argv[argc] = eval ? "EVAL" : "EVALSHA";
        len[argc++] = eval ? 4 : 7;
        argv[argc] = eval ? c->script->src : c->script->sha1;
        len[argc] = strlen(argv[argc]);
        argc++;
        argv[argc] = nkeys;
        len[argc++] = strlen(nkeys);
    }
    for (int i = 0; i < c->argc; i++) {
        argv[argc] = c->argv[i];
        len[argc++] = c->argvlen != NULL ? c->argvlen[i] : strlen(c->argv[i]);
    }
    return redisAppendCommandArgv(ctx, argc, argv, len) == REDIS_OK
           ? 0 : GW_ENOMEM;
}

void
redis_replies_free(redisReply **replies, size_t n)
{
    if (replies == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        if (replies[i] != NULL)
            freeReplyObject(replies[i]);
        replies[i] = NULL;
    }
}

GW_TESTABLE int
redis_reply_is_error(const redisReply *r, const char *code)
{
    size_t n = strlen(code);

    return r != NULL && r->type == REDIS_REPLY_ERROR && r->str != NULL
           && r->len >= n && memcmp(r->str, code, n) == 0
           && (r->len == n || r->str[n] == ' ');
}

/*
 * The round trip of redis_pipeline() on 'c': each script by EVALSHA if
 * the connection sent it before, else by EVAL; then, in a second round
 * trip, by EVAL each one Redis answered NOSCRIPT (its cache was flushed:
 * SCRIPT FLUSH; a restart closes the connection).  Only in that second
 * case does a script run after the commands that follow it.
 */
static int
round_trip(struct redis_conn *c, const struct redis_cmd *cmds, size_t n,
           redisReply **replies, int64_t deadline_ms)
{
    size_t again[REDIS_PIPELINE_MAX], nagain = 0;
    int eval[REDIS_PIPELINE_MAX];
    int rc;

    for (size_t i = 0; i < n; i++) {
        eval[i] = cmds[i].script != NULL && !knows(c, cmds[i].script);
        rc = append_cmd(c->ctx, &cmds[i], eval[i]);
        if (rc != 0)
            return rc;
    }
    rc = flush_out(c->ctx, deadline_ms);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = read_reply(c->ctx, &replies[i], deadline_ms);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].script == NULL)
            continue;
        if (!eval[i] && redis_reply_is_error(replies[i], "NOSCRIPT"))
            again[nagain++] = i;
        else if (eval[i] && !knows(c, cmds[i].script)
                 && c->nknown < REDIS_SCRIPTS_MAX)
            c->known[c->nknown++] = cmds[i].script;
    }
    if (nagain == 0)
        return 0;
    for (size_t k = 0; k < nagain; k++) {
        freeReplyObject(replies[again[k]]);
        replies[again[k]] = NULL;
        rc = append_cmd(c->ctx, &cmds[again[k]], 1);
        if (rc != 0)
            return rc;
    }
    rc = flush_out(c->ctx, deadline_ms);
    for (size_t k = 0; rc == 0 && k < nagain; k++)
        rc = read_reply(c->ctx, &replies[again[k]], deadline_ms);
    return rc;
}

/*
 * Does hiredis's reader hold bytes past the replies we took: the start
 * of another reply, or whole ones nobody asked for?  They would answer
 * the next caller's command (poll() in quiet() cannot see them: they
 * left the socket already), so such a connection is never reused.
 */
static int
leftover(const redisContext *ctx)
{
    return ctx->reader->pos < ctx->reader->len || ctx->reader->ridx != -1;
}

GW_TESTABLE int
redis_pipeline(struct redis_conn *c, const struct redis_cmd *cmds, size_t n,
               redisReply **replies, int64_t deadline_ms)
{
    int rc = GW_EINVAL;

    for (size_t i = 0; i < n && i < REDIS_PIPELINE_MAX; i++)
        replies[i] = NULL;
    if (n == 0 || n > REDIS_PIPELINE_MAX)
        goto out;
    rc = round_trip(c, cmds, n, replies, deadline_ms);
    /* Our n replies came in order, so they are ours; what follows is
     * not, and the connection goes with it. */
    if (rc == 0 && leftover(c->ctx))
        c->broken = 1;

out:
    if (rc != 0) {
        if (n <= REDIS_PIPELINE_MAX)
            redis_replies_free(replies, n);
        c->broken = 1;
    }
    return rc;
}

/*
 * AUTH [user] password, formatted in our own buffer, written straight to
 * the socket and wiped: hiredis frees its output buffer without wiping
 * it, so the password never goes through it.  (What stays out of our
 * reach: the kernel's socket buffers, and the pool's copy, wiped at
 * redis_pool_free().)  User and password hold no NUL or CR/LF: the URL
 * parser and the file reader refuse control bytes.
 */
static int
send_auth(const struct redis_pool *p, redisContext *ctx, int64_t deadline_ms)
{
    char buf[64 + REDIS_URL_USER_MAX + REDIS_URL_PASSWORD_MAX];
    size_t ulen = strlen(p->url.user), plen = strlen(p->password);
    size_t off = 0, len;
    int rc = 0;

    if (ulen > 0)
        len = (size_t)snprintf(buf, sizeof(buf), "*3\r\n$4\r\nAUTH\r\n"
                               "$%zu\r\n%s\r\n$%zu\r\n%s\r\n", ulen,
                               p->url.user, plen, p->password);
    else
        len = (size_t)snprintf(buf, sizeof(buf), "*2\r\n$4\r\nAUTH\r\n"
                               "$%zu\r\n%s\r\n", plen, p->password);
    while (rc == 0 && off < len) {
        /* MSG_NOSIGNAL: a peer gone is GW_EIO here, not a SIGPIPE. */
        ssize_t w = send(ctx->fd, buf + off, len - off, MSG_NOSIGNAL);

        if (w > 0)
            off += (size_t)w;
        else if (w == -1 && (errno == EAGAIN || errno == EINTR))
            rc = wait_fd(ctx->fd, POLLOUT, deadline_ms);
        else
            rc = GW_EIO;
    }
    mbedtls_platform_zeroize(buf, sizeof(buf));
    return rc;
}

/*
 * The text of hello reply 'r' (an error) for err[]: AUTH's is cut to
 * its code word (WRONGPASS, NOAUTH, ERR), because a proxy in the way
 * may echo its arguments ("ERR unknown command 'AUTH', with args
 * beginning with: 'app' 'secret'"); the others' whole, up to 200 bytes.
 */
static int
error_text_len(const redisReply *r, int is_auth)
{
    size_t n = 0;

    if (!is_auth)
        return (int)(r->len > 200 ? 200 : r->len);
    while (n < r->len && n < 32 && r->str[n] != ' ')
        n++;
    return (int)n;
}

/*
 * The hello of a new connection, in one round trip: AUTH when there is a
 * password (send_auth()), SELECT when the db is not 0, and PING, so that
 * a server that accepts connections but does not answer (stopped,
 * overloaded) is not taken for a live one.
 */
static int
hello(struct redis_pool *p, redisContext *ctx, int64_t deadline_ms,
      char *err, size_t errlen)
{
    char db[24];
    const char *select[2] = { "SELECT", db };
    const char *ping[1] = { "PING" };
    struct redis_cmd cmds[3];
    const char *what[3];
    redisReply *r[3] = { NULL, NULL, NULL };
    size_t n = 0, nauth = 0;
    int rc = 0;

    if (p->password[0] != '\0') {
        rc = send_auth(p, ctx, deadline_ms);
        what[n++] = "AUTH";         /* its reply comes first */
        nauth = 1;
    }
    if (p->url.db != 0) {
        snprintf(db, sizeof(db), "%ld", p->url.db);
        cmds[n] = (struct redis_cmd){ NULL, 0, 2, select, NULL };
        what[n++] = "SELECT";
    }
    cmds[n] = (struct redis_cmd){ NULL, 0, 1, ping, NULL };
    what[n++] = "PING";
    for (size_t i = nauth; rc == 0 && i < n; i++)
        rc = append_cmd(ctx, &cmds[i], 0);
    if (rc == 0)
        rc = flush_out(ctx, deadline_ms);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = read_reply(ctx, &r[i], deadline_ms);
    if (rc != 0) {
        snprintf(err, errlen, "%s", ctx->err != 0 ? ctx->errstr
                 : gw_strerror(rc));
        goto out;
    }
    if (leftover(ctx)) {
        snprintf(err, errlen, "hello: more replies than commands");
        rc = GW_EPARSE;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (r[i]->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "%s: %.*s", what[i],
                     error_text_len(r[i], i < nauth), r[i]->str);
            rc = GW_EUPSTREAM;
            goto out;
        }
    }

out:
    /* An echo of the password may sit in the replies and in the bytes
     * the reader has consumed: wiped before hiredis frees them. */
    for (size_t i = 0; i < n; i++)
        if (r[i] != NULL && r[i]->str != NULL)
            mbedtls_platform_zeroize(r[i]->str, r[i]->len);
    if (ctx->reader->buf != NULL)
        mbedtls_platform_zeroize(ctx->reader->buf, ctx->reader->pos);
    redis_replies_free(r, n);
    return rc;
}

/* A new connection, hello said, non-blocking, its replies bounded by
 * 'budget' (the slot's).  OUT *out. */
static int
dial(struct redis_pool *p, struct redis_reply_budget *budget,
     int64_t deadline_ms, redisContext **out, char *err, size_t errlen)
{
    int left = gw_ms_left(deadline_ms);
    struct timeval tv = { left / 1000, (left % 1000) * 1000 };
    redisContext *ctx;
    int flags, rc = GW_EIO;

    *out = NULL;
    if (left <= 0) {
        snprintf(err, errlen, "connect: %s", gw_strerror(GW_ETIMEDOUT));
        return GW_ETIMEDOUT;
    }
    ctx = p->url.unix_socket ? redisConnectUnixWithTimeout(p->url.host, tv)
          : redisConnectWithTimeout(p->url.host, p->url.port, tv);
    if (ctx == NULL) {
        snprintf(err, errlen, "connect: out of memory");
        return GW_ENOMEM;
    }
    if (ctx->err != 0) {
        snprintf(err, errlen, "connect: %s", ctx->errstr);
        rc = strstr(ctx->errstr, "timed out") != NULL ? GW_ETIMEDOUT : GW_EIO;
        goto out;
    }
    flags = fcntl(ctx->fd, F_GETFL);
    if (flags == -1 || fcntl(ctx->fd, F_SETFL, flags | O_NONBLOCK) == -1) {
        snprintf(err, errlen, "fcntl: %s", strerror(errno));
        goto out;
    }
    ctx->flags &= ~REDIS_BLOCK;
    redis_reader_bound(ctx->reader, budget);
    rc = hello(p, ctx, deadline_ms, err, errlen);
    if (rc == 0) {
        *out = ctx;
        ctx = NULL;
    }

out:
    if (ctx != NULL)
        redisFree(ctx);
    return rc;
}

struct redis_pool *
redis_pool_new(const struct redis_pool_opts *o)
{
    struct redis_pool *p;

    if (o->connections == 0 || o->connections > REDIS_POOL_MAX)
        return NULL;
    p = gw_calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->slot = gw_calloc(o->connections, sizeof(*p->slot));
    p->idle = gw_calloc(o->connections, sizeof(*p->idle));
    if (p->slot == NULL || p->idle == NULL) {
        gw_free(p->slot);
        gw_free(p->idle);
        gw_free(p);
        return NULL;
    }
    p->url = *o->url;
    snprintf(p->password, sizeof(p->password), "%s",
             o->password != NULL && o->password[0] != '\0' ? o->password
             : o->url->password);
    p->cap = o->connections;
    gw_mutex_init(&p->lock);
    gw_cond_init(&p->cv);
    return p;
}

void
redis_pool_free(struct redis_pool *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->cap; i++) {
        /* A taken one here is a caller's bug: it would use freed memory. */
        if (p->slot[i].ctx != NULL)
            redisFree(p->slot[i].ctx);
    }
    pthread_cond_destroy(&p->cv);
    gw_mutex_destroy(&p->lock);
    redis_url_wipe(&p->url);
    mbedtls_platform_zeroize(p->password, sizeof(p->password));
    gw_free(p->slot);
    gw_free(p->idle);
    gw_free(p);
}

int
redis_pool_fill(struct redis_pool *p, int64_t deadline_ms, char *err,
                size_t errlen)
{
    size_t connected = 0;
    int rc = 0;

    if (errlen > 0)
        err[0] = '\0';
    for (size_t i = 0; i < p->cap && rc == 0; i++) {
        struct redis_conn *c = &p->slot[i];
        redisContext *ctx = NULL;

        gw_mutex_lock(&p->lock);
        if (c->state != SLOT_EMPTY) {
            gw_mutex_unlock(&p->lock);
            continue;
        }
        c->state = SLOT_FILLING;
        gw_mutex_unlock(&p->lock);
        rc = dial(p, &c->budget, deadline_ms, &ctx, err, errlen);
        gw_mutex_lock(&p->lock);
        if (rc == 0) {
            c->ctx = ctx;
            c->broken = 0;
            c->nknown = 0;
            c->state = SLOT_IDLE;
            p->idle[p->nidle++] = c;
            pthread_cond_signal(&p->cv);
        } else {
            c->state = SLOT_EMPTY;
        }
        gw_mutex_unlock(&p->lock);
    }
    gw_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->cap; i++)
        connected += p->slot[i].state == SLOT_IDLE
                     || p->slot[i].state == SLOT_TAKEN;
    gw_mutex_unlock(&p->lock);
    return rc != 0 ? rc : (int)connected;
}

size_t
redis_pool_connected(struct redis_pool *p)
{
    size_t n = 0;

    gw_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->cap; i++)
        n += p->slot[i].state == SLOT_IDLE || p->slot[i].state == SLOT_TAKEN;
    gw_mutex_unlock(&p->lock);
    return n;
}

/* Close slot 'c' (not idle, not taken by anyone else). */
static void
close_slot(struct redis_pool *p, struct redis_conn *c)
{
    redisContext *ctx = c->ctx;

    gw_mutex_lock(&p->lock);
    c->ctx = NULL;
    c->state = SLOT_EMPTY;
    pthread_cond_broadcast(&p->cv);     /* a waiter may now have none */
    gw_mutex_unlock(&p->lock);
    redisFree(ctx);
}

void
redis_pool_drop_idle(struct redis_pool *p)
{
    redisContext *drop[REDIS_POOL_MAX];
    size_t n = 0;

    gw_mutex_lock(&p->lock);
    while (p->nidle > 0) {
        struct redis_conn *c = p->idle[--p->nidle];

        drop[n++] = c->ctx;
        c->ctx = NULL;
        c->state = SLOT_EMPTY;
    }
    pthread_cond_broadcast(&p->cv);
    gw_mutex_unlock(&p->lock);
    for (size_t i = 0; i < n; i++)
        redisFree(drop[i]);
}

/* Is an idle connection still quiet (nothing to read, not closed)? */
static int
quiet(const struct redis_conn *c)
{
    struct pollfd pfd = { c->ctx->fd, POLLIN, 0 };

    return poll(&pfd, 1, 0) == 0;
}

GW_TESTABLE int
redis_pool_take(struct redis_pool *p, int64_t deadline_ms,
                struct redis_conn **out)
{
    struct redis_conn *c;
    size_t taken;

    *out = NULL;
    for (;;) {
        gw_mutex_lock(&p->lock);
        for (;;) {
            if (p->nidle > 0)
                break;
            taken = 0;
            for (size_t i = 0; i < p->cap; i++)
                taken += p->slot[i].state == SLOT_TAKEN;
            if (taken == 0) {
                gw_mutex_unlock(&p->lock);
                return GW_EUNAVAIL;
            }
            /* Busy, not timed out: nothing says Redis is slow, only
             * that our own callers hold every connection. */
            if (gw_cond_timedwait(&p->cv, &p->lock, deadline_ms) != 0
                && p->nidle == 0) {
                gw_mutex_unlock(&p->lock);
                return GW_EBUSY;
            }
        }
        c = p->idle[--p->nidle];
        c->state = SLOT_TAKEN;
        gw_mutex_unlock(&p->lock);
        if (quiet(c)) {
            c->broken = 0;
            *out = c;
            return 0;
        }
        close_slot(p, c);
    }
}

GW_TESTABLE void
redis_pool_put(struct redis_pool *p, struct redis_conn *c)
{
    if (c == NULL)
        return;
    if (c->broken) {
        close_slot(p, c);
        return;
    }
    gw_mutex_lock(&p->lock);
    c->state = SLOT_IDLE;
    p->idle[p->nidle++] = c;
    pthread_cond_signal(&p->cv);
    gw_mutex_unlock(&p->lock);
}

int
redis_pool_pipeline(struct redis_pool *p, const struct redis_cmd *cmds,
                    size_t n, redisReply **replies, int64_t deadline_ms)
{
    struct redis_conn *c = NULL;
    int rc;

    for (size_t i = 0; i < n && i < REDIS_PIPELINE_MAX; i++)
        replies[i] = NULL;
    rc = redis_pool_take(p, deadline_ms, &c);
    if (rc != 0)
        return rc;
    rc = redis_pipeline(c, cmds, n, replies, deadline_ms);
    redis_pool_put(p, c);
    return rc;
}
