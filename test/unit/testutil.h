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

#endif
