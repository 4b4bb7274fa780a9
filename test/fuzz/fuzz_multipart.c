/* SPDX-License-Identifier: MIT */
/*
 * fuzz_multipart.c - libFuzzer target for common/multipart.c: the
 * boundary of a Content-Type, and the form field found in a body.
 *
 * An input is a Content-Type value, a '\n', then the body (so corpus
 * files stay readable); an input without '\n' is tried as both.  Every
 * piece is an exact-size heap copy, so AddressSanitizer catches a read
 * one byte past it.
 *
 * Besides crashes and sanitizer reports, the target aborts when one of
 * these properties fails:
 *   boundary  a success gives 1..70 bytes of RFC 2046's bchars, not
 *             ending in a space, NUL-terminated; a failure gives a reason
 *             and no boundary.
 *   find      a success gives a view inside the body with no delimiter
 *             in it, and a failure no view; a failure other than
 *             GW_ENOTFOUND gives a reason; a second field name reads the
 *             same body to the same verdict about its soundness.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "multipart.h"
#include "util.h"

static int
bchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
           || (c >= 'A' && c <= 'Z') || c == ' '
           || (c != '\0' && strchr("'()+_,-./:=?", c) != NULL);
}

static void
fuzz_find(const char *body, size_t n, const char *b, size_t b_len)
{
    char *p = dup_exact(body, n);
    char delim[4 + MULTIPART_MAX_BOUNDARY];
    const char *v = NULL, *why = NULL, *v2, *why2 = NULL;
    size_t vlen = 0, vlen2;
    int rc, rc2;

    rc = multipart_find(p, n, b, b_len, "model", &v, &vlen, &why);
    REQUIRE(rc == 0 || rc == GW_ENOTFOUND || rc == GW_EPARSE);
    if (rc == 0) {
        REQUIRE(v >= p && vlen <= n && (size_t)(v - p) <= n - vlen);
        memcpy(delim, "\r\n--", 4);
        memcpy(delim + 4, b, b_len);
        REQUIRE(memmem(v, vlen, delim, 4 + b_len) == NULL);
    } else {
        REQUIRE(v == NULL && vlen == 0);
        REQUIRE(rc != GW_EPARSE || (why != NULL && why[0] != '\0'));
    }
    /* Soundness does not depend on the name asked for, but for the one
     * way a name matters: the field twice. */
    rc2 = multipart_find(p, n, b, b_len, "file", &v2, &vlen2, &why2);
    if (rc == GW_EPARSE && strcmp(why, "the form has the field twice") != 0)
        REQUIRE(rc2 == GW_EPARSE);
    if (rc != GW_EPARSE)
        REQUIRE(rc2 != GW_EPARSE
                || strcmp(why2, "the form has the field twice") == 0);
    free(p);
}

static void
fuzz_boundary(const char *ct, size_t n, const char *body, size_t body_len)
{
    char *p = dup_exact(ct, n);
    char out[MULTIPART_MAX_BOUNDARY + 1];
    const char *why = NULL;
    size_t len = 99, i;
    int rc = multipart_boundary(p, n, out, &len, &why);

    free(p);
    if (rc != 0) {
        REQUIRE(rc == GW_EPARSE && why != NULL && why[0] != '\0');
        REQUIRE(len == 0 && out[0] == '\0');
        /* The body alone, with a boundary of its own. */
        fuzz_find(body, body_len, "XyZ", 3);
        return;
    }
    REQUIRE(len >= 1 && len <= MULTIPART_MAX_BOUNDARY && out[len] == '\0');
    REQUIRE(out[len - 1] != ' ');
    for (i = 0; i < len; i++)
        REQUIRE(bchar((unsigned char)out[i]));
    fuzz_find(body, body_len, out, len);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    const char *nl = memchr(p, '\n', size);

    if (nl == NULL) {
        fuzz_boundary(p, size, p, size);
        return 0;
    }
    fuzz_boundary(p, (size_t)(nl - p), nl + 1, size - (size_t)(nl - p) - 1);
    return 0;
}
