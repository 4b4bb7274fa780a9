/* SPDX-License-Identifier: MIT */
/*
 * check_jsonx.c - unit tests for common/jsonx.c: bounded parsing of
 * request bodies and OpenAI error bodies.
 *
 * Every parser input ends right at a PROT_NONE page, so a read past 'len'
 * crashes the test instead of passing by luck.
 */
#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "buf.h"
#include "jsonx.h"
#include "util.h"
#include "testutil.h"

/* Parse 'text' from a guarded copy; OUT *out as jsonx_parse_object. */
static int
parse(const char *text, size_t len, int max_depth, json_t **out, char *err,
      size_t errlen)
{
    char *g = guarded_copy(text, len);
    int rc;

    rc = jsonx_parse_object(g, len, max_depth, out, err, errlen);
    guarded_free(g, len);
    return rc;
}

/* '[' x n, then "1", then ']' x n; wrapped in an object when 'object'. */
static char *
nested(int n, int object)
{
    size_t k = (size_t)n, len = 2 * k + 1 + (object ? 6 : 0), at = 0;
    char *t = malloc(len + 1);

    /* memset, not one checked append per byte: a million of those took
     * half a minute under TSan. */
    ck_assert_ptr_nonnull(t);
    if (object) {
        memcpy(t, "{\"a\":", 5);
        at = 5;
    }
    memset(t + at, '[', k);
    at += k;
    t[at++] = '1';
    memset(t + at, ']', k);
    at += k;
    if (object)
        t[at++] = '}';
    t[at] = '\0';
    return t;
}

/* ---- valid objects ---------------------------------------------------- */

static const struct {
    const char *text;
    const char *key;            /* a key that must be present, or NULL */
    const char *note;
} valid[] = {
    { "{}", NULL, "empty object" },
    { " \n\t{ } \r\n", NULL, "blanks around" },
    { "{\"model\":\"m\",\"stream\":true}", "stream", "typical" },
    { "{\"a\":\"[[[[{{{{\"}", "a", "brackets inside a string" },
    { "{\"a\":\"\\\"[[[[\"}", "a", "escaped quote, then brackets" },
    { "{\"a\":\"\\\\\",\"b\":[1]}", "b", "escaped backslash ends string" },
    { "{\"\\u00e9\":\"\xc3\xa9\"}", "\xc3\xa9", "unicode key and value" },
    { "{\"a\":{\"a\":1}}", "a", "same key at two levels" },
    { "{\"a\":1,\"A\":2}", "A", "keys are case-sensitive" },
    { "{\"a\":[1,2,{\"b\":null}]}", "a", "mixed nesting" },
};

START_TEST(test_valid)
{
    const char *text = valid[_i].text;
    json_t *root = NULL;
    char err[256];

    ck_assert_msg(parse(text, strlen(text), JSONX_MAX_DEPTH, &root, err,
                        sizeof(err)) == 0, "%s: %s", valid[_i].note, err);
    ck_assert(json_is_object(root));
    if (valid[_i].key != NULL)
        ck_assert_ptr_nonnull(json_object_get(root, valid[_i].key));
    json_decref(root);
}
END_TEST

/* ---- invalid JSON ----------------------------------------------------- */

static const struct {
    const char *text;
    size_t len;                 /* 0: strlen(text) */
    const char *err;
    const char *note;
} invalid[] = {
    { "", 0, "body is not valid JSON: unexpected token near end of file at "
      "line 1 column 0", "empty" },
    { "{", 0, "body is not valid JSON: string or '}' expected near end of "
      "file at line 1 column 1", "unclosed" },
    { "{\"a\":}", 0, "body is not valid JSON: unexpected token near '}' at "
      "line 1 column 6", "missing value" },
    { "{} x", 0, "body is not valid JSON: end of file expected near 'x' at "
      "line 1 column 4", "trailing garbage" },
    { "{'a':1}", 0, NULL, "single quotes" },
    { "{\"a\":1,}", 0, NULL, "trailing comma" },
    { "{\"a\":\"x\ny\"}", 0, NULL, "raw newline in a string" },
    { "{\"a\":01}", 0, NULL, "leading zero" },
    { "{\"a\":NaN}", 0, NULL, "NaN" },
    { "{\"a\":\"\\u0000\"}", 0, NULL, "NUL escape refused by jansson" },
    { "{\"a\":\"\xff\"}", 0, NULL, "invalid UTF-8" },
    { "{\"a\":1}\0", 8, NULL, "NUL byte after the object" },
    { "]]]]{}", 0, NULL, "unbalanced closers" },
    { "{\"a\":\"\\", 0, NULL, "backslash at the very end" },
};

START_TEST(test_invalid)
{
    const char *text = invalid[_i].text;
    size_t len = invalid[_i].len != 0 ? invalid[_i].len : strlen(text);
    json_t *root = (json_t *)1;
    char err[256];
    size_t i;

    ck_assert_int_eq(parse(text, len, JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), GW_EPARSE);
    ck_assert_ptr_null(root);
    if (invalid[_i].err != NULL)
        ck_assert_str_eq(err, invalid[_i].err);
    else
        ck_assert_msg(strncmp(err, "body is not valid JSON: ", 24) == 0,
                      "%s: '%s'", invalid[_i].note, err);
    for (i = 0; err[i] != '\0'; i++)
        ck_assert_msg((unsigned char)err[i] >= 0x20, "control byte in '%s'",
                      err);
}
END_TEST

/* ---- valid JSON that is not an object --------------------------------- */

static const char *const non_objects[] = {
    "[]", "[{}]", "1", "-0.5", "\"s\"", "null", "true", "false",
};

START_TEST(test_non_object)
{
    const char *text = non_objects[_i];
    json_t *root = (json_t *)1;
    char err[256];

    ck_assert_int_eq(parse(text, strlen(text), JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), GW_EPARSE);
    ck_assert_ptr_null(root);
    ck_assert_str_eq(err, "body must be a JSON object");
}
END_TEST

/* ---- duplicate keys --------------------------------------------------- */

static const struct {
    const char *text;
    const char *err;
} duplicates[] = {
    { "{\"a\":1,\"a\":2}", "body is not valid JSON: duplicate object key "
      "near '\"a\"' at line 1 column 10" },
    { "{\"a\":1,\"b\":{\"c\":1,\"c\":2}}", "body is not valid JSON: "
      "duplicate object key near '\"c\"' at line 1 column 21" },
    { "{\"a\":1,\"\\u0061\":2}", NULL },        /* same key, escaped */
    { "{\"x\":[{\"k\":1,\"k\":1}]}", NULL },   /* inside an array */
};

START_TEST(test_duplicates)
{
    const char *text = duplicates[_i].text;
    json_t *root = (json_t *)1;
    char err[256];

    ck_assert_int_eq(parse(text, strlen(text), JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), GW_EPARSE);
    ck_assert_ptr_null(root);
    if (duplicates[_i].err != NULL)
        ck_assert_str_eq(err, duplicates[_i].err);
    else
        ck_assert_ptr_nonnull(strstr(err, "duplicate object key"));
}
END_TEST

/* ---- depth ------------------------------------------------------------ */

START_TEST(test_depth_limit)
{
    json_t *root = NULL;
    char err[256];
    char *t;

    /* The object is level 1: 63 arrays inside it make 64 levels. */
    t = nested(JSONX_MAX_DEPTH - 1, 1);
    ck_assert_int_eq(parse(t, strlen(t), JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), 0);
    json_decref(root);
    free(t);

    t = nested(JSONX_MAX_DEPTH, 1);
    ck_assert_int_eq(parse(t, strlen(t), JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), GW_EPARSE);
    ck_assert_ptr_null(root);
    ck_assert_str_eq(err, "body nests deeper than 64 levels");
    free(t);
}
END_TEST

START_TEST(test_depth_custom)
{
    json_t *root = NULL;
    char err[256];

    ck_assert_int_eq(parse("{\"a\":[]}", 8, 2, &root, err, sizeof(err)), 0);
    json_decref(root);
    ck_assert_int_eq(parse("{\"a\":[[]]}", 10, 2, &root, err, sizeof(err)),
                     GW_EPARSE);
    ck_assert_str_eq(err, "body nests deeper than 2 levels");
    ck_assert_int_eq(parse("{}", 2, 0, &root, err, sizeof(err)), GW_EPARSE);
    ck_assert_str_eq(err, "body nests deeper than 0 levels");
}
END_TEST

START_TEST(test_depth_hostile)
{
    json_t *root = (json_t *)1;
    char err[256];
    char *t;

    /* A million unclosed brackets: refused by the scan, no recursion. */
    t = nested(1000000, 0);
    ck_assert_int_eq(parse(t, 1000000, JSONX_MAX_DEPTH, &root, err,
                           sizeof(err)), GW_EPARSE);
    ck_assert_ptr_null(root);
    ck_assert_str_eq(err, "body nests deeper than 64 levels");
    free(t);
}
END_TEST

START_TEST(test_depth_strings_ignored)
{
    struct buf b;
    json_t *root = NULL;
    char err[256];
    int i;

    /* Brackets inside strings, after an escaped quote, are text. */
    buf_init(&b, 1 << 20);
    ck_assert_int_eq(buf_append_str(&b, "{\"a\":\"\\\""), 0);
    for (i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_append_str(&b, "[{"), 0);
    ck_assert_int_eq(buf_append_str(&b, "\",\"b\":[[1]]}"), 0);
    ck_assert_int_eq(parse(buf_ptr(&b), buf_len(&b), JSONX_MAX_DEPTH, &root,
                           err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(json_object_get(root, "b"));
    json_decref(root);

    /* But an escaped backslash closes the string before the brackets. */
    buf_reset(&b);
    ck_assert_int_eq(buf_append_str(&b, "{\"a\":\"\\\\\","), 0);
    for (i = 0; i < 100; i++)
        ck_assert_int_eq(buf_append_str(&b, "["), 0);
    ck_assert_int_eq(parse(buf_ptr(&b), buf_len(&b), JSONX_MAX_DEPTH, &root,
                           err, sizeof(err)), GW_EPARSE);
    ck_assert_str_eq(err, "body nests deeper than 64 levels");
    buf_release(&b);
}
END_TEST

START_TEST(test_parse_no_err_buffer)
{
    json_t *root = (json_t *)1;

    ck_assert_int_eq(jsonx_parse_object("[", 1, 4, &root, NULL, 0),
                     GW_EPARSE);
    ck_assert_ptr_null(root);
}
END_TEST

/* ---- error bodies ----------------------------------------------------- */

static const struct {
    const char *message, *type, *param, *code;
    const char *body;
    const char *note;
} bodies[] = {
    { "Invalid API key", "invalid_request_error", NULL, "invalid_api_key",
      "{\"error\":{\"message\":\"Invalid API key\",\"type\":"
      "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}",
      "typical" },
    { "m", "t", "model", NULL,
      "{\"error\":{\"message\":\"m\",\"type\":\"t\",\"param\":\"model\","
      "\"code\":null}}", "param set, code null" },
    { "", "", NULL, NULL,
      "{\"error\":{\"message\":\"\",\"type\":\"\",\"param\":null,"
      "\"code\":null}}", "empty strings" },
    { "say \"hi\" \\ bye", "t", NULL, NULL,
      "{\"error\":{\"message\":\"say \\\"hi\\\" \\\\ bye\",\"type\":\"t\","
      "\"param\":null,\"code\":null}}", "quote and backslash" },
    { "a\nb\rc\td\be\ff\x01g\x1fh", "t", NULL, NULL,
      "{\"error\":{\"message\":\"a\\nb\\rc\\td\\be\\ff\\u0001g\\u001fh\","
      "\"type\":\"t\",\"param\":null,\"code\":null}}", "control characters" },
    { "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 /", "t", NULL, NULL,
      "{\"error\":{\"message\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 /\","
      "\"type\":\"t\",\"param\":null,\"code\":null}}", "UTF-8 kept" },
    { "bad \xff\xc3 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 end", "t", NULL,
      NULL,
      "{\"error\":{\"message\":\"bad \\ufffd\\ufffd \\ufffd\\ufffd "
      "\\ufffd\\ufffd\\ufffd \\ufffd\\ufffd\\ufffd\\ufffd end\",\"type\":"
      "\"t\",\"param\":null,\"code\":null}}",
      "invalid UTF-8, overlong, surrogate, above U+10FFFF" },
    { "x", "t\"", "p\n", "c\\", "{\"error\":{\"message\":\"x\",\"type\":"
      "\"t\\\"\",\"param\":\"p\\n\",\"code\":\"c\\\\\"}}",
      "every field escaped" },
};

START_TEST(test_error_body)
{
    struct buf b;
    json_t *root;
    json_error_t jerr;

    buf_init(&b, 4096);
    ck_assert_int_eq(jsonx_error_body(&b, bodies[_i].message, bodies[_i].type,
                                      bodies[_i].param, bodies[_i].code), 0);
    ck_assert_msg(strcmp(buf_ptr(&b), bodies[_i].body) == 0, "%s: got %s",
                  bodies[_i].note, buf_ptr(&b));
    ck_assert_uint_eq(buf_len(&b), strlen(bodies[_i].body));

    /* Always valid JSON, and it round-trips whatever was valid UTF-8. */
    root = json_loadb(buf_ptr(&b), buf_len(&b), JSON_REJECT_DUPLICATES,
                      &jerr);
    ck_assert_msg(root != NULL, "%s: %s", bodies[_i].note, jerr.text);
    if (strstr(bodies[_i].note, "invalid") == NULL)
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(root, "error"), "message")),
                         bodies[_i].message);
    json_decref(root);
    buf_release(&b);
}
END_TEST

START_TEST(test_error_body_appends)
{
    struct buf b;

    buf_init(&b, 4096);
    ck_assert_int_eq(buf_append_str(&b, "HEAD\r\n\r\n"), 0);
    ck_assert_int_eq(jsonx_error_body(&b, "m", "t", NULL, "c"), 0);
    ck_assert_str_eq(buf_ptr(&b), "HEAD\r\n\r\n{\"error\":{\"message\":\"m\","
                     "\"type\":\"t\",\"param\":null,\"code\":\"c\"}}");
    buf_release(&b);
}
END_TEST

START_TEST(test_error_body_too_big)
{
    struct buf b;
    char *data;

    /* Whatever does not fit leaves the buffer exactly as it was. */
    buf_init(&b, 40);
    ck_assert_int_eq(buf_append_str(&b, "prefix"), 0);
    data = b.data;
    ck_assert_int_eq(jsonx_error_body(&b, "a long message that cannot fit",
                                      "t", NULL, NULL), GW_ETOOBIG);
    ck_assert_str_eq(buf_ptr(&b), "prefix");
    ck_assert_uint_eq(buf_len(&b), 6);
    ck_assert_ptr_eq(b.data, data);
    buf_release(&b);
}
END_TEST

START_TEST(test_error_body_alloc_fail)
{
    struct buf b;
    long n;
    int rc;

    buf_init(&b, 4096);
    ck_assert_int_eq(buf_append_str(&b, "prefix"), 0);
    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = jsonx_error_body(&b, "m\n\xff", "t", "p", "c");
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_str_eq(buf_ptr(&b), "prefix");
    }
    ck_assert_int_gt(n, 1);
    ck_assert_str_eq(buf_ptr(&b), "prefix{\"error\":{\"message\":"
                     "\"m\\n\\ufffd\",\"type\":\"t\",\"param\":\"p\","
                     "\"code\":\"c\"}}");
    buf_release(&b);
}
END_TEST

/* ---- runner ----------------------------------------------------------- */

/* ---- jsonx_member() ---- */

static const struct {
    const char *doc;
    const char *key;
    int want;                       /* 1, 0 or -1 */
    const char *value;              /* when 1 */
} member_cases[] = {
    { "{\"usage\":{\"a\":1}}", "usage", 1, "{\"a\":1}" },
    { " {\n \"x\" : \"usage\" , \"usage\" :\t[1,{\"b\":\"}\"}] } ", "usage",
      1, "[1,{\"b\":\"}\"}]" },
    { "{\"text\":\"\\\"usage\\\": {\",\"usage\":null}", "usage", 1, "null" },
    { "{\"a\":{\"usage\":1},\"b\":2}", "usage", 0, NULL },
    { "{}", "usage", 0, NULL },
    { "{ }", "usage", 0, NULL },
    { "{\"usage\":-12.5e3}", "usage", 1, "-12.5e3" },
    { "{\"usage\":true,\"x\":1}", "usage", 1, "true" },
    { "{\"usag\":1,\"usagex\":2}", "usage", 0, NULL },
    { "{\"us\\u0061ge\":1}", "usage", -1, NULL },     /* might spell it */
    { "[\"usage\"]", "usage", -1, NULL },
    { "", "usage", -1, NULL },
    { "{\"usage\":{\"a\":1}", "usage", -1, NULL },       /* cut short */
    { "{\"usage\":1,\"usage\":2}", "usage", 1, "1" },       /* the first */
    { "{\"usage\":1} x", "usage", -1, NULL },
    { "{\"a\":{\"b\":1}", "usage", -1, NULL },              /* not closed */
    { "{\"a\":\"open", "usage", -1, NULL },
    { "{\"a\" 1}", "usage", -1, NULL },
    { "{\"a\":1 \"usage\":2}", "usage", -1, NULL },
    { "{\"a\":}", "usage", -1, NULL },
    { "{\"a\":1,}", "usage", -1, NULL },
    /* A quote ends a string unless an odd run of backslashes is before
     * it (string_end()). */
    { "{\"a\":\"\\\"\",\"usage\":1}", "usage", 1, "1" },
    { "{\"a\":\"\\\\\",\"usage\":2}", "usage", 1, "2" },
    { "{\"a\":\"x\\\\\\\"y\\\\\\\\\",\"usage\":3}", "usage", 1, "3" },
    { "{\"a\":\"\\\",\"usage\":4}", "usage", -1, NULL },
    { "{\"usage\":\"\\\\\\\"\"}", "usage", 1, "\"\\\\\\\"\"" },
};

START_TEST(test_member_cases)
{
    const char *v = NULL;
    size_t vn = 0;
    const char *doc = member_cases[_i].doc;
    int r = jsonx_member(doc, strlen(doc), member_cases[_i].key, &v, &vn);

    ck_assert_msg(r == member_cases[_i].want, "case %d: %d", _i, r);
    if (r == 1) {
        ck_assert_uint_eq(vn, strlen(member_cases[_i].value));
        ck_assert(memcmp(v, member_cases[_i].value, vn) == 0);
    }
}
END_TEST

/* A random JSON value, 'depth' levels at most, into 'b'. */
static void
random_value(struct buf *b, unsigned *seed, int depth)
{
    static const char *const atoms[] = {
        "0", "-1.5e-3", "true", "false", "null", "\"\"", "\"a\\\"}]\"",
        "\"usage\"", "\"\\\\\"", "\"{[\"", "\"\\u00e9\"",
        "\"\\\\\\\"}\\\\\"", "\"\\\"\\\"\"",
    };
    static const char *const keys[] = {
        "usage", "response", "a", "us", "usage2", "",
    };
    int kind = depth > 0 ? rand_r(seed) % 4 : 0;
    int n = rand_r(seed) % 4;

    if (kind < 2) {
        buf_append_str(b, atoms[rand_r(seed) % GW_ARRAY_LEN(atoms)]);
        return;
    }
    buf_append_str(b, kind == 2 ? "[" : "{");
    for (int i = 0; i < n; i++) {
        if (i > 0)
            buf_append_str(b, rand_r(seed) % 2 ? "," : " ,\n ");
        if (kind == 3) {
            /* A key used once in this object: jansson keeps the last of
             * two, jsonx_member() the first. */
            buf_printf(b, "\"%s%d\" : ", keys[rand_r(seed)
                                              % GW_ARRAY_LEN(keys)], i);
        }
        random_value(b, seed, depth - 1);
    }
    buf_append_str(b, kind == 2 ? "]" : "}");
}

/*
 * Against jansson on 20,000 random objects: where jansson parses the
 * text, jsonx_member() finds each top-level member that jansson has,
 * with the same value, and says 0 for one it has not.
 */
START_TEST(test_member_agrees_with_jansson)
{
    unsigned seed = 7;

    for (int t = 0; t < 20000; t++) {
        struct buf b;
        json_t *root, *want, *got;
        json_error_t e;
        const char *k, *v;
        size_t vn;
        char key[32];

        buf_init(&b, 1 << 20);
        buf_append_str(&b, "{");
        for (int i = 0, n = rand_r(&seed) % 5; i < n; i++) {
            buf_printf(&b, "%s\"%s%d\":", i > 0 ? "," : "",
                       i % 2 ? "usage" : "response", i);
            random_value(&b, &seed, 3);
        }
        buf_append_str(&b, "}");
        root = json_loadb(buf_ptr(&b), buf_len(&b), 0, &e);
        ck_assert_msg(root != NULL, "%s: %s", buf_ptr(&b), e.text);
        json_object_foreach(root, k, want) {
            ck_assert_int_eq(jsonx_member(buf_ptr(&b), buf_len(&b), k, &v,
                                          &vn), 1);
            got = json_loadb(v, vn, JSON_DECODE_ANY, &e);
            ck_assert_msg(got != NULL && json_equal(got, want), "%s: %s",
                          buf_ptr(&b), k);
            json_decref(got);
        }
        snprintf(key, sizeof(key), "usage%d", 9);
        ck_assert_int_eq(jsonx_member(buf_ptr(&b), buf_len(&b), key, &v,
                                      &vn), 0);
        json_decref(root);
        buf_release(&b);
    }
}
END_TEST

static Suite *
jsonx_suite(void)
{
    Suite *s = suite_create("jsonx");
    TCase *tc;

    tc = tcase("valid");
    tcase_add_loop_test(tc, test_valid, 0, (int)GW_ARRAY_LEN(valid));
    suite_add_tcase(s, tc);

    tc = tcase("invalid");
    tcase_add_loop_test(tc, test_invalid, 0, (int)GW_ARRAY_LEN(invalid));
    tcase_add_test(tc, test_parse_no_err_buffer);
    suite_add_tcase(s, tc);

    tc = tcase("non_object");
    tcase_add_loop_test(tc, test_non_object, 0,
                        (int)GW_ARRAY_LEN(non_objects));
    suite_add_tcase(s, tc);

    tc = tcase("duplicate_keys");
    tcase_add_loop_test(tc, test_duplicates, 0,
                        (int)GW_ARRAY_LEN(duplicates));
    suite_add_tcase(s, tc);

    tc = tcase("depth");
    tcase_add_test(tc, test_depth_limit);
    tcase_add_test(tc, test_depth_custom);
    tcase_add_test(tc, test_depth_hostile);
    tcase_add_test(tc, test_depth_strings_ignored);
    suite_add_tcase(s, tc);

    tc = tcase("error_body");
    tcase_add_loop_test(tc, test_error_body, 0, (int)GW_ARRAY_LEN(bodies));
    tcase_add_test(tc, test_error_body_appends);
    tcase_add_test(tc, test_error_body_too_big);
    tcase_add_test(tc, test_error_body_alloc_fail);
    tcase_add_loop_test(tc, test_member_cases, 0,
                        (int)GW_ARRAY_LEN(member_cases));
    tcase_add_test(tc, test_member_agrees_with_jansson);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(jsonx_suite()));
}
