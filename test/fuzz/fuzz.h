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

#endif
