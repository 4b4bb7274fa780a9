/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - what every libFuzzer target in test/fuzz/ shares (header-only:
 * each target is one translation unit, built with libFuzzer or with
 * replay.c).
 */
#ifndef INFERGW_TEST_FUZZ_H
#define INFERGW_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Not assert(): the checks must hold in NDEBUG builds too. */
#define REQUIRE(cond)                                           \
    do {                                                        \
        if (!(cond))                                            \
            abort();                                            \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * An exact-size heap copy of p[0..n) (never NULL; free() it), so that
 * AddressSanitizer catches a read one byte past a piece of input.
 */
static inline char *
dup_exact(const char *p, size_t n)
{
    char *q = malloc(n > 0 ? n : 1);

    REQUIRE(q != NULL);
    if (n > 0)
        memcpy(q, p, n);
    return q;
}

/*
 * Does p[0..n) hold an array header ('*') of 10,000 elements or more?
 * hiredis 0.14 allocates an array's slots before its elements arrive,
 * so such a header only measures malloc: the Redis reply targets skip
 * those inputs.
 */
static inline int
fuzz_huge_redis_array(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t d = 0;

        if (p[i] != '*')
            continue;
        while (i + 1 + d < n && p[i + 1 + d] >= '0' && p[i + 1 + d] <= '9')
            d++;
        if (d >= 5)
            return 1;
    }
    return 0;
}

#endif
