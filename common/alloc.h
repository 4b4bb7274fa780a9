/* SPDX-License-Identifier: MIT */
/*
 * alloc.h - the allocator every module uses, with fault injection for tests.
 *
 * gw_malloc() and friends behave like their libc namesakes.  A test can make
 * the Nth allocation from now fail (SQLite's fault simulation) to drive
 * every GW_ENOMEM path.  The counter exists only in test builds
 * (INFERGW_UNIT_TEST: the unit tests and the fuzz targets); elsewhere the
 * wrappers are plain calls and common/ keeps no state for them.
 */
#ifndef INFERGW_COMMON_ALLOC_H
#define INFERGW_COMMON_ALLOC_H

#include <stddef.h>

void *gw_malloc(size_t n);
void *gw_calloc(size_t count, size_t size);   /* overflow-checked */
void *gw_realloc(void *p, size_t n);
char *gw_strdup(const char *s);
char *gw_strndup(const char *s, size_t n);    /* always NUL-terminates */
void gw_free(void *p);                        /* NULL-safe */

/*
 * Free memory that held a secret (an API key, TLS key material), wiped
 * first: its 'n' bytes for gw_wipe_free(), the strlen() bytes of 's' for
 * gw_wipe_free_str().  The wipe is explicit_bzero(), which the compiler
 * may not drop as a store to memory about to be freed (glibc; the
 * gateway's mbedtls_platform_zeroize() promises the same, and common/
 * links no mbedTLS).  NULL-safe.
 */
void gw_wipe_free(void *p, size_t n);
void gw_wipe_free_str(char *s);

#ifdef INFERGW_UNIT_TEST
/*
 * Make the 'n'th allocation from now fail (1 = the next one), and every one
 * after it while 'sticky' is set.  n = 0 turns injection off.  Counts across
 * all threads; meant for single-threaded unit tests.
 */
void alloc_fail_after(long n, int sticky);

/* Number of allocations that injection has failed since it was armed. */
long alloc_failures(void);
#endif

#endif
