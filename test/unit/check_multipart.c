/* SPDX-License-Identifier: MIT */
/*
 * check_multipart.c - unit tests for common/multipart.c: the boundary of
 * a multipart/form-data Content-Type, and the one form field the gateway
 * routes by, found in a body that must be sound from end to end.
 *
 * The cases are tables of (input, expected result, note); every input
 * ends at a guard page (testutil.h), so a read past its end crashes.  The
 * parser is not incremental (the body is whole in memory when it runs),
 * so instead of splits every proper prefix of each body is checked: it is
 * refused, or (only a body cut just before its last CRLF) read alike.
 */
#include <check.h>

#include <stdio.h>
#include <string.h>

#include "multipart.h"
#include "util.h"
#include "testutil.h"

/* ---- Content-Type ---------------------------------------------------- */

static const struct ct_case {
    const char *ct;
    const char *boundary;       /* NULL: refused */
    const char *note;
} ct_cases[] = {
    { "multipart/form-data; boundary=abc", "abc", "the usual" },
    { "Multipart/Form-Data;Boundary=abc", "abc",
      "type, subtype and parameter names are case-insensitive" },
    { "multipart/form-data; boundary=\"a b:c?\"", "a b:c?",
      "quoted, with bchars a token cannot hold" },
    { "multipart/form-data; charset=utf-8; boundary=----WebKitFormBoundary"
      "7MA4YWxkTrZu0gW", "----WebKitFormBoundary7MA4YWxkTrZu0gW",
      "another parameter first, a browser's boundary" },
    { "multipart/form-data;;  boundary=x ;", "x",
      "empty parameters are allowed (RFC 9110 5.6.6)" },
    { "multipart/form-data; boundary=0123456789012345678901234567890123456"
      "789012345678901234567890123456789",
      "0123456789012345678901234567890123456789012345678901234567890123456"
      "789", "70 characters, the most" },
    { "multipart/form-data; boundary=0123456789012345678901234567890123456"
      "7890123456789012345678901234567890", NULL, "71 characters" },
    { "multipart/form-data", NULL, "no boundary" },
    { "multipart/form-data; charset=utf-8", NULL,
      "parameters, but no boundary" },
    { "multipart/form-data; boundary=", NULL, "an empty boundary" },
    { "multipart/form-data; boundary=\"\"", NULL, "an empty quoted one" },
    { "multipart/form-data; boundary=a; boundary=b", NULL,
      "two boundaries: which one would the upstream take?" },
    { "multipart/form-data; boundary=a; BOUNDARY=a", NULL,
      "two, even alike and in other case" },
    { "multipart/form-data; boundary=\"ab \"", NULL,
      "a boundary ending in a space" },
    { "multipart/form-data; boundary=\"a\\bc\"", NULL,
      "a quoted-pair in the boundary" },
    { "multipart/form-data; boundary=a*b", NULL,
      "'*' is a tchar but no bchar" },
    { "multipart/form-data; boundary=\"a\x80\"", NULL, "obs-text" },
    { "multipart/form-data; boundary=\"abc", NULL, "an unclosed quote" },
    { "multipart/form-data; boundary", NULL, "a parameter without '='" },
    { "multipart/form-data boundary=abc", NULL, "no ';'" },
    { "multipart/form-data; boundary=abc junk", NULL,
      "something after the value" },
    { "multipart/mixed; boundary=abc", NULL, "not form-data" },
    { "application/json", NULL, "not multipart" },
    { "multipart", NULL, "no subtype" },
    { "multipart/", NULL, "an empty subtype" },
    { "", NULL, "empty" },
};

START_TEST(test_boundary)
{
    const struct ct_case *c = &ct_cases[_i];
    size_t n = strlen(c->ct), len = 99;
    char out[MULTIPART_MAX_BOUNDARY + 1];
    const char *why = NULL;
    char *g = guarded_copy(c->ct, n);
    int rc = multipart_boundary(g, n, out, &len, &why);

    guarded_free(g, n);
    if (c->boundary == NULL) {
        ck_assert_msg(rc == GW_EPARSE, "%s: rc %d, boundary '%s'", c->note,
                      rc, out);
        ck_assert_msg(why != NULL && why[0] != '\0', "%s: no reason",
                      c->note);
        ck_assert_msg(len == 0 && out[0] == '\0', "%s: output left",
                      c->note);
    } else {
        ck_assert_msg(rc == 0, "%s: rc %d (%s)", c->note, rc, why);
        ck_assert_msg(len == strlen(c->boundary)
                      && strcmp(out, c->boundary) == 0,
                      "%s: '%s', want '%s'", c->note, out, c->boundary);
    }
}
END_TEST

/* ---- bodies ------------------------------------------------------------ */

#define B "--XyZ"               /* the boundary line of boundary "XyZ" */
#define PART(name, value)                                               \
    B "\r\nContent-Disposition: form-data; name=\"" name "\"\r\n\r\n"   \
    value "\r\n"
#define FILE_PART                                                       \
    B "\r\nContent-Disposition: form-data; name=\"file\"; "             \
    "filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n"             \
    "RIFF--XyZ\x00\xff\r\n-\r\n--XyY\r\n"
#define END B "--\r\n"

#define OK 0
#define NOTFOUND GW_ENOTFOUND
#define BAD GW_EPARSE

static const struct body_case {
    const char *body;
    size_t len;                 /* 0: strlen(body) */
    int rc;
    const char *value;          /* when rc is OK */
    const char *note;
} body_cases[] = {
    { FILE_PART PART("model", "whisper-1") END,
      sizeof(FILE_PART PART("model", "whisper-1") END) - 1, OK, "whisper-1",
      "a file then the model, as the openai SDKs send them" },
    { PART("model", "m") FILE_PART END, sizeof(PART("model", "m") FILE_PART
      END) - 1, OK, "m",
      "the model first; the file holds a NUL, '--XyZ', CRLFs, '--XyY'" },
    { PART("model", "m\r\n--XyZz") END, 0, BAD, NULL,
      "the boundary inside a part (RFC 2046: it must not be)" },
    { PART("model", "m") B "--", 0, OK, "m", "no CRLF after the close" },
    { PART("model", "") END, 0, OK, "", "an empty value is a value" },
    { PART("model", "a\r\nb") END, 0, OK, "a\r\nb",
      "a CRLF inside a value" },
    { PART("modelx", "m") PART("Model", "m") END, 0, NOTFOUND, NULL,
      "names are compared exactly" },
    { B "\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n" END,
      0, OK, "m", "a token name" },
    { B "\r\ncontent-disposition:form-data;name=\"model\"  \r\n"
      "X-Other: 1\r\n\r\nm\r\n" END, 0, OK, "m",
      "field names any case, no blanks, other fields ignored" },
    { PART("file", "x") END, 0, NOTFOUND, NULL, "no model field" },
    { END, 0, NOTFOUND, NULL, "no part at all" },

    { PART("model", "a") PART("model", "b") END, 0, BAD, NULL,
      "the field twice: the upstream might take the other" },
    { "x\r\n" PART("model", "m") END, 0, BAD, NULL, "a preamble" },
    { "\r\n" PART("model", "m") END, 0, BAD, NULL, "a CRLF preamble" },
    { PART("model", "m") END "epilogue", 0, BAD, NULL, "an epilogue" },
    { PART("model", "m") B "-- \r\n", 0, BAD, NULL,
      "padding after the close" },
    { PART("model", "m") B, 0, BAD, NULL, "a boundary without its end" },
    { PART("model", "m"), 0, BAD, NULL, "no closing boundary" },
    { B " \r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
      END, 0, BAD, NULL, "transport padding after a boundary" },
    { B "z\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
      END, 0, BAD, NULL, "a longer boundary line" },
    { B "\nContent-Disposition: form-data; name=\"model\"\n\nm\n" END, 0,
      BAD, NULL, "bare LF" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\n\r\nm\r\n"
      END, 0, BAD, NULL, "a header line ending in a bare LF" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\r\r\nm\r\n"
      END, 0, BAD, NULL, "a bare CR in a header line" },
    { B "\r\nContent-Disposition : form-data; name=\"model\"\r\n\r\nm\r\n"
      END, 0, BAD, NULL, "a blank before the colon" },
    { B "\r\nContent-Disposition: form-data;\r\n name=\"model\"\r\n\r\n"
      "m\r\n" END, 0, BAD, NULL, "obs-fold" },
    { B "\r\n\r\nm\r\n" END, 0, BAD, NULL, "a part without headers" },
    { B "\r\nContent-Type: text/plain\r\n\r\nm\r\n" END, 0, BAD, NULL,
      "no Content-Disposition" },
    { B "\r\nContent-Disposition: attachment; name=\"model\"\r\n\r\nm\r\n"
      END, 0, BAD, NULL, "not form-data" },
    { B "\r\nContent-Disposition: form-data\r\n\r\nm\r\n" END, 0, BAD,
      NULL, "no name" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"; name=\"x\""
      "\r\n\r\nm\r\n" END, 0, BAD, NULL, "two names" },
    { B "\r\nContent-Disposition: form-data; name=\"mod\\el\"\r\n\r\nm\r\n"
      END, 0, BAD, NULL, "a quoted-pair in the name (\"model\" unescaped)" },
    { B "\r\nContent-Disposition: form-data; name*=utf-8''model\r\n\r\n"
      "m\r\n" END, 0, BAD, NULL, "name*" },
    { B "\r\nContent-Disposition: form-data; name=\"model\r\n\r\nm\r\n" END,
      0, BAD, NULL, "an unclosed quote" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\r\n"
      "Content-Disposition: form-data; name=\"x\"\r\n\r\nm\r\n" END, 0, BAD,
      NULL, "two Content-Disposition lines" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\r\n"
      "Content-Transfer-Encoding: base64\r\n\r\nbQ==\r\n" END, 0, BAD, NULL,
      "a Content-Transfer-Encoding" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\r\n"
      "X-Bad: a\x01z\r\n\r\nm\r\n" END, 0, BAD, NULL,
      "a control character in a header value" },
    { B "\r\nContent-Disposition: form-data; name=\"model\"\r\n", 0, BAD,
      NULL, "the headers never end" },
    { "", 0, BAD, NULL, "empty" },
    { "--Xy", 0, BAD, NULL, "less than a boundary" },
};

/* A header block of 'n' bytes, with the empty line: over the bound? */
static void
check_head_bound(size_t n, int want)
{
    static const char disp[] = "\r\nContent-Disposition: form-data; "
                               "name=\"model\"\r\nX-Pad: ";
    char body[MULTIPART_MAX_HEAD + 256], *g;
    const char *v, *why = NULL;
    size_t len = 0, vlen, pad = n - (sizeof(disp) - 1 - 2) - 4;
    int rc;

    /* disp (less its leading CRLF) + pad + CRLF CRLF is the block. */
    len += (size_t)snprintf(body, sizeof(body), "--XyZ%s", disp);
    memset(body + len, 'p', pad);
    len += pad;
    memcpy(body + len, "\r\n\r\nm\r\n--XyZ--", 14);
    len += 14;
    g = guarded_copy(body, len);
    rc = multipart_find(g, len, "XyZ", 3, "model", &v, &vlen, &why);
    guarded_free(g, len);
    ck_assert_msg(rc == want, "a %zu-byte header block: rc %d (%s)", n, rc,
                  why != NULL ? why : "");
}

static int
find_guarded(const char *body, size_t n, const char **value,
             size_t *value_len, const char **why, char **copy)
{
    *copy = guarded_copy(body, n);
    return multipart_find(*copy, n, "XyZ", 3, "model", value, value_len,
                          why);
}

START_TEST(test_body)
{
    const struct body_case *c = &body_cases[_i];
    size_t n = c->len != 0 ? c->len : strlen(c->body), vlen = 99;
    const char *v = "x", *why = NULL;
    char *g;
    int rc = find_guarded(c->body, n, &v, &vlen, &why, &g);

    ck_assert_msg(rc == c->rc, "%s: rc %d, want %d (%s)", c->note, rc, c->rc,
                  why != NULL ? why : "");
    if (rc == OK) {
        ck_assert_msg(v >= g && v + vlen <= g + n, "%s: view outside",
                      c->note);
        ck_assert_msg(vlen == strlen(c->value)
                      && memcmp(v, c->value, vlen) == 0,
                      "%s: '%.*s', want '%s'", c->note, (int)vlen, v,
                      c->value);
    } else {
        ck_assert_msg(v == NULL && vlen == 0, "%s: a value on failure",
                      c->note);
        ck_assert_msg(rc != BAD || (why != NULL && why[0] != '\0'),
                      "%s: no reason", c->note);
    }
    guarded_free(g, n);
}
END_TEST

/*
 * Every proper prefix of a body is refused, but for the one that cuts
 * only the CRLF after the close, which reads alike.
 */
START_TEST(test_body_prefixes)
{
    const struct body_case *c = &body_cases[_i];
    size_t n = c->len != 0 ? c->len : strlen(c->body), vlen;
    const char *v, *why;
    char *g;
    int rc, whole;

    if (c->rc == BAD)
        return;
    whole = c->rc;
    for (size_t k = 0; k < n; k++) {
        why = NULL;
        rc = find_guarded(c->body, k, &v, &vlen, &why, &g);
        guarded_free(g, k);
        if (k == n - 2 && memcmp(c->body + k, "\r\n", 2) == 0)
            ck_assert_msg(rc == whole, "%s: cut at %zu: rc %d", c->note, k,
                          rc);
        else
            ck_assert_msg(rc == BAD, "%s: cut at %zu: rc %d", c->note, k, rc);
    }
}
END_TEST

START_TEST(test_bounds)
{
    char body[64 * 80 + 64], *p = body;
    const char *v, *why;
    size_t vlen, len;
    int i;

    check_head_bound(MULTIPART_MAX_HEAD, OK);
    check_head_bound(MULTIPART_MAX_HEAD + 1, BAD);
    /* 64 parts pass, 65 do not. */
    for (i = 0; i < MULTIPART_MAX_PARTS; i++)
        p += sprintf(p, "--XyZ\r\nContent-Disposition: form-data; "
                     "name=\"f%d\"\r\n\r\n\r\n", i);
    len = (size_t)(p - body);
    memcpy(p, "--XyZ--", 7);
    ck_assert_int_eq(multipart_find(body, len + 7, "XyZ", 3, "f63", &v,
                                     &vlen, &why), 0);
    p += sprintf(p, "--XyZ\r\nContent-Disposition: form-data; "
                 "name=\"f%d\"\r\n\r\n\r\n--XyZ--", i);
    ck_assert_int_eq(multipart_find(body, (size_t)(p - body), "XyZ", 3,
                                    "f0", &v, &vlen, &why), GW_EPARSE);
    /* A boundary out of range is refused, whatever the body. */
    ck_assert_int_eq(multipart_find("--", 2, "", 0, "model", &v, &vlen,
                                    &why), GW_EPARSE);
}
END_TEST

static Suite *
multipart_suite(void)
{
    Suite *s = suite_create("multipart");
    TCase *tc = tcase("content_type");

    tcase_add_loop_test(tc, test_boundary, 0, (int)GW_ARRAY_LEN(ct_cases));
    suite_add_tcase(s, tc);

    tc = tcase("body");
    tcase_add_loop_test(tc, test_body, 0, (int)GW_ARRAY_LEN(body_cases));
    tcase_add_loop_test(tc, test_body_prefixes, 0,
                        (int)GW_ARRAY_LEN(body_cases));
    suite_add_tcase(s, tc);

    tc = tcase("bounds");
    tcase_add_test(tc, test_bounds);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(multipart_suite()));
}
