/*
 * alloc.h - the allocator every module uses, with fault injection for tests.
 *
 * gw_malloc() and friends behave like their libc namesakes.  A test can make
 * the Nth allocation from now fail (SQLite's fault simulation) to drive
 * every GW_ENOMEM path; in production the counter is off and the only cost
 * is one relaxed atomic load.
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
 * Make the 'n'th allocation from now fail (1 = the next one), and every one
 * after it while 'sticky' is set.  n = 0 turns injection off.  Counts across
 * all threads; meant for single-threaded unit tests.
 */
void alloc_fail_after(long n, int sticky);

/* Number of allocations that injection has failed since it was armed. */
long alloc_failures(void);

#endif
