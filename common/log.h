/* SPDX-License-Identifier: MIT */
/*
 * log.h - one-line logging with a per-thread request id, as key=value
 * text or as JSON.
 *
 * Every line is written with a single write() so lines from concurrent
 * threads never interleave.  In the kv format (the default):
 *
 *   ts=2026-11-29T10:33:35.123Z level=info req=9f2c01ab \
 *       coalesce: leader key=a4f1c2d07b9e
 *
 * In the json format every line, whoever writes it, is one JSON object
 * with "ts", "level", "req" and "msg" (the message text as the kv line
 * has it after "req=..."), and "err" when log_errno() gave one:
 *
 *   {"ts":"2026-11-29T10:33:35.123Z","level":"info","req":"9f2c01ab",
 *    "msg":"coalesce: leader key=a4f1c2d07b9e"}
 *
 * A structured event (log_fields(), the access line) has its fields as
 * members of their own, numbers as JSON numbers.  Strings are escaped
 * (RFC 8259 section 7), and bytes that are not UTF-8 become U+FFFD, so
 * no value a client sent can break the object or the line.  A line too
 * long for its buffer (2 KiB in kv, 4 KiB in json) is cut, a json
 * object still closed.
 *
 * The logger is the one mutable global in common/: configure it in main()
 * before any thread starts (log_set_level, log_set_format; tests also
 * log_set_fd);
 * afterwards only the level and the format change (a reload), atomically.
 * The request id is thread-local: a connection thread sets it per request
 * with log_set_request_id().
 */
#ifndef INFERGW_COMMON_LOG_H
#define INFERGW_COMMON_LOG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util.h"

enum gw_log_level {
    GW_LOG_ERROR = 0,
    GW_LOG_WARN = 1,
    GW_LOG_INFO = 2,
    GW_LOG_DEBUG = 3,
};

enum gw_log_format {
    GW_LOG_FORMAT_KV = 0,       /* key=value text */
    GW_LOG_FORMAT_JSON = 1,     /* one JSON object per line */
};

/* Set at start-up and by a reload while other threads log: atomic. */
extern _Atomic int gw_log_level_cur;

/* Parse "error", "warn", "info" or "debug"; -1 if unknown. */
int log_level_parse(const char *s);

void log_set_level(int level);

/* Parse "kv" or "json" (enum gw_log_format); -1 if unknown. */
int log_format_parse(const char *s);

/* Every line from now on, every thread's (atomic). */
void log_set_format(int format);

/* Set this thread's request id (copied, at most 64 bytes); NULL clears it. */
void log_set_request_id(const char *id);

void log_write(int level, int err, const char *fmt, ...) GW_PRINTF(3, 4);

/*
 * One field of a structured event (log_fields()).  Build them with the
 * functions below; 'key' is a constant identifier (letters, digits, '_'),
 * none of "ts", "level", "req" or "msg".
 */
enum log_field_type {
    LOG_FIELD_STR,              /* s[0..len); s NULL: absent */
    LOG_FIELD_INT,              /* i */
    LOG_FIELD_OPT_INT,          /* i; negative: absent */
};

struct log_field {
    const char *key;
    enum log_field_type type;
    const char *s;              /* borrowed */
    size_t len;
    long long i;
};

/* A string (NULL: absent), a view of one, a number, a number or absent. */
static inline struct log_field
log_str(const char *key, const char *v)
{
    return (struct log_field){ key, LOG_FIELD_STR, v,
                               v != NULL ? strlen(v) : 0, 0 };
}

static inline struct log_field
log_strn(const char *key, const char *v, size_t n)
{
    return (struct log_field){ key, LOG_FIELD_STR, v, n, 0 };
}

static inline struct log_field
log_int(const char *key, long long v)
{
    return (struct log_field){ key, LOG_FIELD_INT, NULL, 0, v };
}

static inline struct log_field
log_opt_int(const char *key, long long v)
{
    return (struct log_field){ key, LOG_FIELD_OPT_INT, NULL, 0, v };
}

/*
 * Log event 'event' (a constant word, such as "access") with its fields
 * at 'level', if the level is on.  kv: "EVENT key=value ..." after the
 * line's ts, level and req; an absent value is "-", a string that is
 * empty or holds a blank, '"', '\\' or a byte outside printable ASCII is
 * quoted, with \" \\ and \xNN inside.  json: "msg" is EVENT and each
 * field a member: a string, a number, or null when absent.  Borrows
 * everything.
 */
void log_fields(int level, const char *event, const struct log_field *f,
                size_t n);

/*
 * A failure that repeats in the background, such as a probe or a scrape
 * of an upstream that is down (STYLE.md section 7), logged the way nginx
 * and HAProxy log one: a line when it starts, then at most one line per
 * 'every_ms' with a count, and a line when it ends with the count and
 * how long it lasted.  A beat that fails ten times a second then writes
 * a few lines a minute, not six hundred.
 *
 *   WHAT failing WHY
 *   WHAT still failing failures=57 new=50 for_ms=10012 WHY
 *   WHAT recovered failures=123 for_ms=25030
 *
 * 'failures' counts from the start, 'new' since the line before.  Every
 * line is at the tracker's level, the end too, so that a log filtered
 * at that level shows both ends of each failure.  Times are the
 * caller's (gw_now_ms()), so a test can drive it on a fake clock.
 *
 * Not thread-safe: one tracker belongs to one thread (a beat's upstream
 * thread, say), or to callers that hold a lock around it.
 */
struct log_repeat {
    int level;                  /* of every line */
    int64_t every_ms;           /* the least time between two lines */
    int64_t since_ms;           /* when the failure started */
    int64_t said_ms;            /* when its last line went out */
    uint64_t failures;          /* since it started; 0: not failing */
    uint64_t unsaid;            /* ... since its last line */
};

/* Not failing; lines at 'level', at most one per 'every_ms' (>= 0). */
void log_repeat_init(struct log_repeat *r, int level, int64_t every_ms);

/*
 * One more failure at 'now_ms' of what 'what' names ("health: upstream
 * u0 GET /health"); 'why' says what this one was (key=value text, "" for
 * nothing).  Logs the start line, a summary once every_ms has passed
 * since the last line, or nothing.  Borrows both strings.
 */
void log_repeat_fail(struct log_repeat *r, int64_t now_ms, const char *what,
                     const char *why);

/* A success at 'now_ms': the end line if it was failing, else nothing. */
void log_repeat_ok(struct log_repeat *r, int64_t now_ms, const char *what);

#define GW_LOG_LEVEL() \
    atomic_load_explicit(&gw_log_level_cur, memory_order_relaxed)

/* The level is checked before the arguments are formatted (redis). */
#define log_msg(level, ...)                                     \
    do {                                                        \
        if ((level) <= GW_LOG_LEVEL())                          \
            log_write((level), 0, __VA_ARGS__);                 \
    } while (0)

/* Appends err=<strerror(err)> ; pass the saved errno explicitly (nginx). */
#define log_errno(level, err, ...)                              \
    do {                                                        \
        if ((level) <= GW_LOG_LEVEL())                          \
            log_write((level), (err), __VA_ARGS__);             \
    } while (0)

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* Where lines go (default 2, stderr).  Borrowed: the caller keeps it open. */
void log_set_fd(int fd);
#endif

#endif
