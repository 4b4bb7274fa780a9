/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - malloc wrappers, with a failure countdown in test builds.
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef INFERGW_UNIT_TEST
/* The only mutable process-wide state of common/ but the logger's, and
 * only in test builds (alloc.h). */
static _Atomic long fail_countdown;     /* 0 = off */
static _Atomic int fail_sticky;
static _Atomic long fail_count;

static int
should_fail(void)
{
    long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);

    if (n == 0)
        return 0;
    if (n == 1) {
        if (!atomic_load(&fail_sticky))
            atomic_store(&fail_countdown, 0);
        atomic_fetch_add(&fail_count, 1);
        return 1;
    }
    atomic_fetch_sub(&fail_countdown, 1);
    return 0;
}

void
alloc_fail_after(long n, int sticky)
{
    atomic_store(&fail_sticky, sticky);
    atomic_store(&fail_count, 0);
    atomic_store(&fail_countdown, n);
}

long
alloc_failures(void)
{
    return atomic_load(&fail_count);
}
#else
static int
should_fail(void)
{
    return 0;
}
#endif

void *
gw_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    return malloc(n == 0 ? 1 : n);
}

void *
gw_calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(count == 0 ? 1 : count, size == 0 ? 1 : size);
}

void *
gw_realloc(void *p, size_t n)
{
    if (should_fail())
        return NULL;
    return realloc(p, n == 0 ? 1 : n);
}

char *
gw_strndup(const char *s, size_t n)
{
    char *d;

    n = strnlen(s, n);          /* like strndup(): never read past a NUL */
    if (n == SIZE_MAX)
        return NULL;
    d = gw_malloc(n + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *
gw_strdup(const char *s)
{
    return gw_strndup(s, strlen(s));
}

void
gw_free(void *p)
{
    free(p);
}

void
gw_wipe_free(void *p, size_t n)
{
    if (p != NULL)
        explicit_bzero(p, n);
    gw_free(p);
}

void
gw_wipe_free_str(char *s)
{
    if (s != NULL)
        gw_wipe_free(s, strlen(s));
}
