/*
 * log.c - single-write log lines with timestamp, level and request id.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

_Atomic int gw_log_level_cur = GW_LOG_INFO;
static int log_fd = 2;
static _Thread_local char request_id[65];

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int
log_level_parse(const char *s)
{
    size_t i;

    for (i = 0; i < GW_ARRAY_LEN(level_names); i++)
        if (strcmp(s, level_names[i]) == 0)
            return (int)i;
    return -1;
}

void
log_set_level(int level)
{
    atomic_store_explicit(&gw_log_level_cur, level, memory_order_relaxed);
}

void
log_set_fd(int fd)
{
    log_fd = fd;
}

void
log_set_request_id(const char *id)
{
    if (id == NULL) {
        request_id[0] = '\0';
        return;
    }
    snprintf(request_id, sizeof(request_id), "%s", id);
}

const char *
log_request_id(void)
{
    return request_id[0] != '\0' ? request_id : "-";
}

void
log_write(int level, int err, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    size_t n;
    int k;

    if (level < 0 || level > GW_LOG_DEBUG)
        level = GW_LOG_ERROR;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    k = snprintf(line, sizeof(line),
                 "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s req=%s ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                 level_names[level], log_request_id());
    n = k > 0 ? (size_t)k : 0;
    va_start(ap, fmt);
    k = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (k > 0)
        n += (size_t)k;
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;           /* truncated: still one line */
    if (err != 0) {
        char ebuf[128];
        const char *es = ebuf;

        /* GNU strerror_r may return a static string instead of filling ebuf */
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
        es = strerror_r(err, ebuf, sizeof(ebuf));
#else
        if (strerror_r(err, ebuf, sizeof(ebuf)) != 0)
            snprintf(ebuf, sizeof(ebuf), "errno %d", err);
#endif
        k = snprintf(line + n, sizeof(line) - n, " err=\"%s\"", es);
        if (k > 0)
            n += (size_t)k;
        if (n > sizeof(line) - 2)
            n = sizeof(line) - 2;
    }
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';          /* one event, one line */
    line[n++] = '\n';
    while (write(log_fd, line, n) == -1 && errno == EINTR)
        ;
}
