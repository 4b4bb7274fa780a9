/* SPDX-License-Identifier: MIT */
/*
 * redis.h - a small Redis client over hiredis: URLs, a bounded pool of
 * connections shared by every thread, and pipelined round trips with a
 * deadline, scripts by EVALSHA with EVAL when Redis does not know them.
 * It knows nothing of the gateway (gateway/base/cluster.h is what the
 * gateway makes of it).
 *
 * Design: hiredis 0.14 (Debian 12) parses the protocol and builds the
 * replies; this file does the I/O itself, on a non-blocking socket, in
 * one poll() per wait against the caller's deadline, because hiredis's
 * own blocking mode applies its timeout to each read() and so may wait
 * several times as long.  A connection whose round trip failed half way
 * (a deadline, an I/O error) is closed, never reused: a late reply must
 * never reach the next caller as the answer to its command (the rule
 * keepalive.h keeps for upstream connections).
 *
 * The pool holds at most 'connections' connections.  Only one thread
 * connects (redis_pool_fill(), the owner's beat); a caller that takes a
 * connection never connects on its own thread: with none connected it
 * fails at once (GW_EUNAVAIL), with all of them busy it waits for one
 * until its deadline (then GW_EBUSY).  So a Redis that is down costs a request nothing,
 * and a slow one costs it at most its deadline.
 *
 * Locking: the pool's mutex guards its slots and idle list; it is never
 * held across I/O, and no other lock is taken under it.  A connection
 * taken from the pool belongs to the taking thread until it is put back.
 */
#ifndef INFERGW_COMMON_REDIS_H
#define INFERGW_COMMON_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#define REDIS_URL_HOST_MAX 255      /* a host name, or a socket's path */
#define REDIS_URL_USER_MAX 128
#define REDIS_URL_PASSWORD_MAX 512
#define REDIS_URL_DB_MAX 1000000
#define REDIS_POOL_MAX 256          /* connections in one pool */
#define REDIS_PIPELINE_MAX 64       /* commands in one round trip */
#define REDIS_ARGS_MAX 64           /* arguments of one command */
#define REDIS_SCRIPTS_MAX 16        /* scripts a connection remembers */
/* The most of a reply kept unparsed: past it the connection is closed
 * (GW_ETOOBIG), so a confused server cannot make a reader buffer without
 * bound. */
#define REDIS_REPLY_MAX (4u << 20)
/* The most objects one reply may build (arrays count their declared
 * elements, every object counts one), and the most string bytes: hiredis
 * allocates an array's slots when its header arrives, so "*100000000"
 * alone would cost 800 MB before a single element came. */
#define REDIS_REPLY_ELEMENTS_MAX 65536
#define REDIS_REPLY_BYTES_MAX REDIS_REPLY_MAX

/*
 * Where Redis is and who we are to it: "redis://[user[:password]@]host
 * [:port][/db]" or "unix:/path[?db=N&user=U]" (a path has no other room
 * for them; a socket's password comes from elsewhere: the pool's
 * 'password').  The user and password may hold %XX escapes (a password
 * with '@' or ':').  A user without a password parses: its password is
 * the pool's (the caller refuses a user with neither).
 */
struct redis_url {
    int unix_socket;                    /* 1: 'host' is a socket's path */
    char host[REDIS_URL_HOST_MAX + 1];  /* a name, an IPv4 address, or an
                                           IPv6 one without brackets */
    int port;                           /* 6379 unless given */
    char user[REDIS_URL_USER_MAX + 1];  /* "" = the default user */
    char password[REDIS_URL_PASSWORD_MAX + 1];  /* "" = no AUTH; wiped by
                                                   redis_url_wipe() */
    long db;                            /* SELECT'ed when not 0 */
};

/*
 * Parse 's' into *out.  Refused (GW_EINVAL, *out wiped): another scheme,
 * no host, a port outside 1..65535, a db outside 0..REDIS_URL_DB_MAX, an
 * empty user or password ("redis://:@h", "redis://u:@h"), a bad %XX, a
 * blank or control byte, a query (but a socket's db and user) or a
 * fragment, a relative or too long socket path.  Borrows 's'.
 */
int redis_url_parse(const char *s, struct redis_url *out);

/* Zero *u, its password first (mbedtls_platform_zeroize). */
void redis_url_wipe(struct redis_url *u);

/*
 * 'u' for a log line or a status page: the URL without its password
 * ("redis://user@host:port/db", "unix:/path?db=N&user=U"), cut to fit
 * out[0..n).
 */
void redis_url_show(const struct redis_url *u, char *out, size_t n);

/*
 * A Lua script, run by its SHA-1 (EVALSHA), sent whole (EVAL) the first
 * time a connection runs it, and again when Redis answers NOSCRIPT (its
 * script cache was flushed): the text crosses the network once per
 * connection, not once per call.  redis_script_init() computes the SHA-1
 * of 'src' (borrowed: a literal, it must outlive the script).  A
 * connection remembers REDIS_SCRIPTS_MAX scripts; past that, a script
 * goes by EVAL every time (correct, only bigger).
 */
struct redis_script {
    const char *src;
    char sha1[41];                      /* hex, NUL-terminated */
};

void redis_script_init(struct redis_script *s, const char *src);

/*
 * One command of a round trip: argv[0..argc) as binary-safe strings
 * (argvlen NULL: each is NUL-terminated).  With 'script' set, the
 * command is that script, and argv holds its keys (the first 'nkeys')
 * then its arguments: EVALSHA sha1 nkeys argv..., or EVAL.
 */
struct redis_cmd {
    const struct redis_script *script;  /* NULL: argv is the command */
    int nkeys;
    int argc;
    const char *const *argv;
    const size_t *argvlen;
};

/*
 * What one reply has cost so far (redis_reader_bound(), below: every
 * reader the pool makes is bound by one).  Reset at each
 * new reply; 'over' tells a refusal by the budget from a real out of
 * memory.
 */
struct redis_reply_budget {
    const redisReplyObjectFunctions *fn;    /* hiredis's own */
    size_t elements;
    size_t bytes;
    int over;
};

struct redis_pool;
struct redis_conn;

struct redis_pool_opts {
    const struct redis_url *url;        /* copied */
    const char *password;               /* NULL or "": the URL's; copied,
                                           wiped at redis_pool_free() */
    size_t connections;                 /* 1..REDIS_POOL_MAX */
};

/*
 * A pool for 'o' with no connection yet (redis_pool_fill() makes them).
 * NULL on a bad option or out of memory.
 */
struct redis_pool *redis_pool_new(const struct redis_pool_opts *o);

/*
 * Close every connection and free the pool.  Every connection taken
 * must have been put back.  NULL-safe.
 */
void redis_pool_free(struct redis_pool *p);

/*
 * Connect the pool's missing connections, one after another, each with
 * its hello (AUTH with the user and password, SELECT db, PING) in one
 * round trip, all by 'deadline_ms' (gw_now_ms() clock).  Called by one
 * thread only (a beat): it blocks for up to the deadline.  Stops at the
 * first failure, with hiredis's or Redis's reason in err[0..errlen)
 * ("AUTH: WRONGPASS": of AUTH's error only its code word, so that never
 * the password, even from a proxy that echoes its arguments).  Returns the connections now
 * connected (taken ones count), or a GW_E* code: GW_EIO (refused, reset,
 * a name that does not resolve), GW_ETIMEDOUT, GW_EUPSTREAM (Redis
 * answered the hello with an error), GW_ENOMEM.
 */
int redis_pool_fill(struct redis_pool *p, int64_t deadline_ms, char *err,
                    size_t errlen);

/*
 * Close the idle connections: the owner saw Redis fail, so the callers
 * that come next fail at once (GW_EUNAVAIL) instead of each spending its
 * deadline on a dead connection.  Taken ones are closed when put back
 * broken, or stay if their round trip went well.
 */
void redis_pool_drop_idle(struct redis_pool *p);

/* Connections connected now, idle or taken. */
size_t redis_pool_connected(struct redis_pool *p);




/*
 * One round trip on a connection of 'p': cmds[0..n) written together,
 * their n replies read, all by 'deadline_ms'.  A script goes by EVALSHA
 * once its connection has sent it whole (EVAL, in its place), and by
 * EVAL again, in a second round trip by the same deadline, when Redis
 * answers NOSCRIPT (its cache was flushed); then, and only then, the
 * commands after it in cmds[] ran before it: put what must see a
 * script's effects inside the script.  On 0 replies[i] is an owned reply
 * for cmds[i] (a Redis error is a reply of type REDIS_REPLY_ERROR: the
 * caller looks); free with redis_replies_free().  On failure every
 * replies[i] is NULL: GW_EUNAVAIL (no connection: at once), GW_EBUSY
 * (every connection taken by other callers until the deadline: the pool
 * is too small, Redis is not known to be at fault), GW_ETIMEDOUT (no
 * answer by the deadline),
 * GW_EIO (reset, closed), GW_EPARSE (not the protocol), GW_ETOOBIG (a
 * reply past REDIS_REPLY_MAX unparsed, or past REDIS_REPLY_ELEMENTS_MAX
 * or REDIS_REPLY_BYTES_MAX), GW_EINVAL (n or an argc past its bound),
 * GW_ENOMEM.  A connection whose round trip failed is closed.
 */
int redis_pool_pipeline(struct redis_pool *p, const struct redis_cmd *cmds,
                        size_t n, redisReply **replies,
                        int64_t deadline_ms);

/* freeReplyObject() on replies[0..n), each set to NULL.  NULL-safe. */
void redis_replies_free(redisReply **replies, size_t n);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py): the pool's parts ---- */

/*
 * Take an idle connection for the caller's thread.  None connected:
 * GW_EUNAVAIL at once.  All taken: waits for one until 'deadline_ms',
 * then GW_EBUSY.  An idle connection that has something to read (the
 * server closed it, or sent what nobody asked for) is closed and the
 * next one tried.  OUT *out on 0; the caller puts it back.
 */
int redis_pool_take(struct redis_pool *p, int64_t deadline_ms,
                    struct redis_conn **out);

/* Put 'c' back: idle again, or closed if a round trip on it failed. */
void redis_pool_put(struct redis_pool *p, struct redis_conn *c);

/*
 * One round trip on 'c': cmds[0..n) written together, their n replies
 * read, all by 'deadline_ms'; a script that Redis answers NOSCRIPT is
 * sent again by EVAL, in a second round trip by the same deadline (then,
 * and only then, the commands after it in cmds[] ran before it: put what
 * must see a script's effects inside the script).  On 0
 * replies[i] is an owned reply for cmds[i] (a Redis error is a reply of
 * type REDIS_REPLY_ERROR: the caller looks); free with
 * redis_replies_free().  On failure every replies[i] is NULL and 'c' is
 * broken (redis_pool_put() closes it): GW_ETIMEDOUT, GW_EIO (reset,
 * closed), GW_EPARSE (not the protocol), GW_ETOOBIG (a reply past
 * REDIS_REPLY_MAX), GW_EINVAL (n or an argc past its bound), GW_ENOMEM.
 */
int redis_pipeline(struct redis_conn *c, const struct redis_cmd *cmds,
                   size_t n, redisReply **replies, int64_t deadline_ms);

/*
 * Make reader 'r' refuse a reply past REDIS_REPLY_ELEMENTS_MAX objects
 * or REDIS_REPLY_BYTES_MAX string bytes: the object function returns
 * NULL, so hiredis fails the read (REDIS_ERR_OOM) and frees what it
 * built, and b->over says why.  'b' is borrowed and must outlive 'r'
 * (it is r's privdata).  Every reader the pool makes is bound so; the
 * fuzzer binds its own the same way.
 */
void redis_reader_bound(redisReader *r, struct redis_reply_budget *b);

/*
 * Is 'r' an error reply whose text starts with 'code' ("NOSCRIPT",
 * "WRONGPASS")?
 */
int redis_reply_is_error(const redisReply *r, const char *code);
#endif


#endif
