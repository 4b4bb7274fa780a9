/* SPDX-License-Identifier: MIT */
/*
 * util.c - error strings, monotonic clocks and small string helpers.
 */
#include "util.h"

#include <limits.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <time.h>

const char *
gw_strerror(int rc)
{
    switch (rc) {
    case 0:             return "success";
    case GW_EAGAIN:     return "need more input";
    case GW_ENOMEM:     return "out of memory";
    case GW_EIO:        return "I/O error";
    case GW_EPARSE:     return "malformed input";
    case GW_ETOOBIG:    return "too large";
    case GW_ETIMEDOUT:  return "timed out";
    case GW_EUPSTREAM:  return "upstream error";
    case GW_ECLOSED:    return "connection closed";
    case GW_EINVAL:     return "invalid value";
    case GW_EABORTED:   return "aborted";
    case GW_ESTOPPING:  return "stopping";
    case GW_ENOTFOUND:  return "not found";
    case GW_EUNAVAIL:   return "unavailable";
    case GW_ESHED:      return "shed";
    case GW_EBUSY:      return "busy";
    default:            return "unknown error";
    }
}

int64_t
gw_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
gw_now_ms(void)
{
    return gw_now_us() / 1000;
}

int64_t
gw_wall_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;  /* tv_nsec >= 0: already the floor */
}

int64_t
gw_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int
gw_ms_left(int64_t deadline_ms)
{
    int64_t left;

    if (deadline_ms < 0)
        return -1;
    left = deadline_ms - gw_now_ms();
    if (left < 0)
        return 0;
    if (left > INT_MAX)
        return INT_MAX;
    return (int)left;
}

int
gw_log_path_len(const char *target)
{
    return (int)strcspn(target, "?");
}

int
gw_strieq(const char *p, size_t n, const char *s)
{
    size_t i;

    for (i = 0; i < n; i++) {
        unsigned char a = (unsigned char)p[i], b = (unsigned char)s[i];

        if (b == '\0')
            return 0;
        if (a >= 'A' && a <= 'Z')
            a = (unsigned char)(a - 'A' + 'a');
        if (b >= 'A' && b <= 'Z')
            b = (unsigned char)(b - 'A' + 'a');
        if (a != b)
            return 0;
    }
    return s[n] == '\0';
}

int
gw_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return GW_EINVAL;
    *out = v;
    return 0;
}

/* n / d rounded up, for d > 0, with no overflow for any n (util.h). */
static uint64_t
div_ceil(uint64_t n, uint64_t d)
{
    return n / d + (n % d != 0);
}

uint64_t
gw_ms_to_s_ceil(uint64_t ms)
{
    return div_ceil(ms, 1000);
}

uint64_t
gw_us_to_s_ceil(uint64_t us)
{
    return div_ceil(us, 1000 * 1000);
}

uint64_t
gw_us_to_ms_ceil(uint64_t us)
{
    return div_ceil(us, 1000);
}

int
gw_parse_uint(const char *p, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    size_t i;

    if (n == 0)
        return GW_EPARSE;
    for (i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)p[i] - '0';  /* wraps below */

        if (d > 9)
            return GW_EPARSE;
        if (d > max || v > (max - d) / 10)      /* v * 10 + d > max */
            return GW_ETOOBIG;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int
gw_add_overflows(size_t a, size_t b, size_t *out)
{
    if (a > SIZE_MAX - b)
        return 1;
    *out = a + b;
    return 0;
}

uint64_t
gw_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    size_t i;

    for (i = 0; i < n; i++) {
        h ^= s[i];
        h *= UINT64_C(0x100000001b3);      /* the 64-bit FNV prime */
    }
    return h;
}

uint64_t
gw_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

size_t
gw_fmt_u64(uint64_t v, char out[GW_U64_DIGITS])
{
    char rev[GW_U64_DIGITS];
    size_t k = 0, n = 0;

    do {
        rev[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (k > 0)
        out[n++] = rev[--k];
    return n;
}

void
gw_hex(const unsigned char *p, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[p[i] >> 4];
        out[2 * i + 1] = hex[p[i] & 15];
    }
    out[2 * n] = '\0';
}

void
gw_random_hex(char *out, size_t n)
{
    static _Thread_local uint64_t state;
    static const char hex[] = "0123456789abcdef";
    size_t i;

    if (state == 0) {
        state = (uint64_t)gw_now_us() ^ ((uint64_t)(uintptr_t)&state << 16)
                ^ (uint64_t)pthread_self();
        if (state == 0)
            state = 0x9e3779b97f4a7c15ULL;
    }
    for (i = 0; i < n; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out[i] = hex[state & 15];
    }
    out[n] = '\0';
}

static void
check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "infergw: %s failed: error %d\n", what, rc);
        abort();
    }
}

void
gw_mutex_init(struct gw_mutex *mx)
{
    check(pthread_mutex_init(&mx->m, NULL), "pthread_mutex_init");
    atomic_init(&mx->owner, 0);
    atomic_init(&mx->held, 0);
}

void
gw_mutex_destroy(struct gw_mutex *mx)
{
    check(pthread_mutex_destroy(&mx->m), "pthread_mutex_destroy");
}

static void
mark_held(struct gw_mutex *mx)
{
    atomic_store_explicit(&mx->owner, (unsigned long)pthread_self(),
                          memory_order_relaxed);
    atomic_store_explicit(&mx->held, 1, memory_order_relaxed);
}

static void
mark_free(struct gw_mutex *mx)
{
    atomic_store_explicit(&mx->held, 0, memory_order_relaxed);
}

void
gw_mutex_lock(struct gw_mutex *mx)
{
    check(pthread_mutex_lock(&mx->m), "pthread_mutex_lock");
    mark_held(mx);
}

void
gw_mutex_unlock(struct gw_mutex *mx)
{
    mark_free(mx);
    check(pthread_mutex_unlock(&mx->m), "pthread_mutex_unlock");
}

int
gw_mutex_held(struct gw_mutex *mx)
{
    return atomic_load_explicit(&mx->held, memory_order_relaxed)
           && atomic_load_explicit(&mx->owner, memory_order_relaxed)
              == (unsigned long)pthread_self();
}

void
gw_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;

    check(pthread_condattr_init(&a), "pthread_condattr_init");
    check(pthread_condattr_setclock(&a, CLOCK_MONOTONIC),
          "pthread_condattr_setclock");
    check(pthread_cond_init(cv, &a), "pthread_cond_init");
    pthread_condattr_destroy(&a);
}

void
gw_cond_wait(pthread_cond_t *cv, struct gw_mutex *mx)
{
    mark_free(mx);
    check(pthread_cond_wait(cv, &mx->m), "pthread_cond_wait");
    mark_held(mx);
}

int
gw_cond_timedwait(pthread_cond_t *cv, struct gw_mutex *mx,
                  int64_t deadline_ms)
{
    struct timespec ts;
    int rc;

    ts.tv_sec = (time_t)(deadline_ms / 1000);
    ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000;
    mark_free(mx);
    rc = pthread_cond_timedwait(cv, &mx->m, &ts);
    mark_held(mx);
    if (rc == ETIMEDOUT)
        return GW_ETIMEDOUT;
    check(rc, "pthread_cond_timedwait");
    return 0;
}
