/* SPDX-License-Identifier: MIT */
/*
 * testutil.h - helpers shared by the Check suites in test/unit/.
 *
 * Header-only (static functions), since each suite is one translation
 * unit linked into its own binary.
 */
#ifndef INFERGW_TEST_TESTUTIL_H
#define INFERGW_TEST_TESTUTIL_H

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Per test case, in seconds. */
#define TEST_TIMEOUT 10

/* A test case with the suites' common timeout. */
static inline TCase *
tcase(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_set_timeout(tc, TEST_TIMEOUT);
    return tc;
}

/*
 * The value of the sample line of Prometheus text 'text' that starts
 * with 'series' ("name{...} " or "name "), which must be there.
 */
static inline double
sample(const char *text, const char *series)
{
    char line[512];
    const char *p;

    snprintf(line, sizeof(line), "\n%s", series);
    p = strstr(text, line);
    ck_assert_msg(p != NULL, "no sample %s", series);
    return strtod(p + strlen(line), NULL);
}

/* Run every suite of 'sr' and free it: main()'s exit status. */
static inline int
test_run(SRunner *sr)
{
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/*
 * Copy s[0..n) so that it ends exactly at a PROT_NONE page: a read past
 * the end crashes the test instead of passing by luck.  Free with
 * guarded_free(p, n).
 */
static inline char *
guarded_copy(const char *s, size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t span = ((n + (size_t)page - 1) / (size_t)page + 1) * (size_t)page;
    char *map;

    map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    ck_assert_int_eq(mprotect(map + span - (size_t)page, (size_t)page,
                              PROT_NONE), 0);
    memcpy(map + span - (size_t)page - n, s, n);
    return map + span - (size_t)page - n;
}

static inline void
guarded_free(char *p, size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t span = ((n + (size_t)page - 1) / (size_t)page + 1) * (size_t)page;

    munmap(p + n + (size_t)page - span, span);
}

/*
 * A guard-page arena for parser tables, set up and torn down as a checked
 * fixture (tcase_add_checked_fixture(tc, arena_setup, arena_teardown)):
 * guarded(p, n) copies p[0..n) so that it ends right at a PROT_NONE page,
 * in one mapping that every copy of the test reuses, so a table may copy
 * each input many times (cut at every offset) at no cost.  A copy lasts
 * until the next one.  GUARDED(lit) is the copy of a string literal, as
 * (pointer, length): the literal may hold NUL bytes.
 */
#define ARENA_LEN (256 * 1024)

struct arena {
    char *map;
    size_t map_len;
    char *end;                  /* first byte of the PROT_NONE page */
};

/* The test's arena (each suite is one translation unit). */
static inline struct arena *
arena(void)
{
    static struct arena a;

    return &a;
}

static inline void
arena_setup(void)
{
    struct arena *a = arena();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    a->map_len = ARENA_LEN + page;
    a->map = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(a->map, MAP_FAILED);
    a->end = a->map + ARENA_LEN;
    ck_assert_int_eq(mprotect(a->end, page, PROT_NONE), 0);
}

static inline void
arena_teardown(void)
{
    munmap(arena()->map, arena()->map_len);
}

/* Copy p[0..n) so that it ends at the guard page; returns the copy. */
static inline const char *
guarded(const char *p, size_t n)
{
    char *end = arena()->end;

    ck_assert_uint_le(n, ARENA_LEN);
    if (n > 0)
        memmove(end - n, p, n);
    return end - n;
}

#define GUARDED(lit) guarded(lit, sizeof(lit) - 1), sizeof(lit) - 1

#endif
