/*
 * log.h - one-line key=value logging with a per-thread request id.
 *
 * Every line is written with a single write() so lines from concurrent
 * threads never interleave:
 *
 *   ts=2026-11-29T10:33:35.123Z level=info req=9f2c01ab \
 *       coalesce: leader key=a4f1c2d07b9e
 *
 * The logger is the one mutable global in common/: configure it in main()
 * before any thread starts (log_set_level, log_set_fd), and leave it alone
 * afterwards.  The request id is thread-local: a connection thread sets it
 * per request with log_set_request_id().
 */
#ifndef INFERGW_COMMON_LOG_H
#define INFERGW_COMMON_LOG_H

#include <stdatomic.h>

#include "util.h"

enum gw_log_level {
    GW_LOG_ERROR = 0,
    GW_LOG_WARN = 1,
    GW_LOG_INFO = 2,
    GW_LOG_DEBUG = 3,
};

/* Set at start-up and by a reload while other threads log: atomic. */
extern _Atomic int gw_log_level_cur;

/* Parse "error", "warn", "info" or "debug"; -1 if unknown. */
int log_level_parse(const char *s);

void log_set_level(int level);

/* Where lines go (default 2, stderr).  Borrowed: the caller keeps it open. */
void log_set_fd(int fd);

/* Set this thread's request id (copied, at most 64 bytes); NULL clears it. */
void log_set_request_id(const char *id);
const char *log_request_id(void);   /* "-" when none */

void log_write(int level, int err, const char *fmt, ...) GW_PRINTF(3, 4);

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

#endif
