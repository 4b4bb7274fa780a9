/* SPDX-License-Identifier: MIT */
/*
 * check_prom_read.c - unit tests for common/prom_read.c: the sums of
 * named series read from Prometheus text (a vLLM upstream's /metrics),
 * and the labels of a series' latest sample (vllm:lora_requests_info).
 *
 * Most cases are a table of (text, what one wanted name sums to, note).
 * Every text is copied so that its last byte sits right before a
 * PROT_NONE page, so a read past the end crashes the test instead of
 * passing by luck (picohttpparser's test.c); a vLLM exposition is read
 * cut at every byte offset, and in two pieces, that way.  What the
 * writer (prom.c) writes is read back.  Values of wanted series are
 * binary fractions wherever sums are compared, so that every sum is
 * exact in any order.
 */
#include <check.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "prom.h"
#include "prom_read.h"
#include "testutil.h"
#include "util.h"

/* A string literal as (pointer, length), so texts may hold NUL bytes. */
#define S(lit) lit, sizeof(lit) - 1

#define RUNNING "vllm:num_requests_running"
#define WAITING "vllm:num_requests_waiting"
#define KV_USAGE "vllm:kv_cache_usage_perc"
#define GPU_USAGE "vllm:gpu_cache_usage_perc"

/*
 * Read text[0..len) from a guarded copy into want[0..n), and check that
 * the return value says what the entries do.
 */
static int
read_guarded(const char *text, size_t len, struct prom_read_sum *want,
             size_t n)
{
    char *copy = guarded_copy(text, len);
    size_t refused = 0;
    int rc;

    rc = prom_read_sums(copy, len, want, n);
    guarded_free(copy, len);
    for (size_t i = 0; i < n; i++)
        refused += want[i].refused;
    ck_assert_int_eq(rc, refused > 0 ? GW_EPARSE : 0);
    return rc;
}

static void
assert_sum(const struct prom_read_sum *s, double sum, size_t samples,
           size_t refused, const char *note)
{
    ck_assert_msg(s->sum == sum && s->samples == samples
                      && s->refused == refused,
                  "%s: %s: sum %.17g samples %zu refused %zu, want %.17g "
                  "%zu %zu",
                  note, s->name, s->sum, s->samples, s->refused, sum,
                  samples, refused);
}

/* ---- a vLLM exposition -------------------------------------------------- */

/*
 * What vLLM (V1 engine) serves on /metrics, cut down: prometheus_client
 * writes labels sorted (so le sits between engine and model_name), 3.0
 * for integers, "e+09" and "e+010" exponents (floatToGoString), and each
 * counter's _created as a gauge family of its own.
 */
#define MODEL "meta-llama/Llama-3.1-8B-Instruct"
static const char vllm_text[] =
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12786.0\n"
    "python_gc_objects_collected_total{generation=\"1\"} 1532.0\n"
    "# HELP python_info Python platform information\n"
    "# TYPE python_info gauge\n"
    "python_info{implementation=\"CPython\",major=\"3\",minor=\"12\","
    "patchlevel=\"9\",version=\"3.12.9\"} 1.0\n"
    "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
    "# TYPE process_virtual_memory_bytes gauge\n"
    "process_virtual_memory_bytes 3.4359738368e+010\n"
    "# HELP process_start_time_seconds Start time of the process since "
    "unix epoch in seconds.\n"
    "# TYPE process_start_time_seconds gauge\n"
    "process_start_time_seconds 1.71934215508e+09\n"
    "# HELP vllm:num_requests_running Number of requests in model "
    "execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"" MODEL "\"} 3.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be "
    "processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"" MODEL "\"} 5.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent "
    "usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"" MODEL "\"} "
    "0.4375\n"
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms "
    "of number of queried tokens.\n"
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"" MODEL "\"} "
    "81920.0\n"
    "# HELP vllm:prefix_cache_queries_created Prefix cache queries, in "
    "terms of number of queried tokens.\n"
    "# TYPE vllm:prefix_cache_queries_created gauge\n"
    "vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"" MODEL
    "\"} 1.7193421550812e+09\n"
    "# HELP vllm:request_success_total Count of successfully processed "
    "requests.\n"
    "# TYPE vllm:request_success_total counter\n"
    "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\","
    "model_name=\"" MODEL "\"} 97.0\n"
    "vllm:request_success_total{engine=\"0\",finished_reason=\"length\","
    "model_name=\"" MODEL "\"} 3.0\n"
    "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\","
    "model_name=\"" MODEL "\"} 0.0\n"
    "# HELP vllm:time_to_first_token_seconds Histogram of time to first "
    "token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\","
    "model_name=\"" MODEL "\"} 0.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.02\","
    "model_name=\"" MODEL "\"} 61.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.5\","
    "model_name=\"" MODEL "\"} 99.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\","
    "model_name=\"" MODEL "\"} 100.0\n"
    "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\""
    MODEL "\"} 100.0\n"
    "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\""
    MODEL "\"} 2.625\n"
    "# HELP vllm:time_to_first_token_seconds_created Histogram of time to "
    "first token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds_created gauge\n"
    "vllm:time_to_first_token_seconds_created{engine=\"0\",model_name=\""
    MODEL "\"} 1.7193421550813e+09\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine "
    "CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
    "enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\","
    "num_cpu_blocks=\"2048\",num_gpu_blocks=\"27893\"} 1.0\n";

/* Older vLLM: gpu_cache_usage_perc, and no engine label. */
static const char older_text[] =
    "# HELP vllm:num_requests_swapped Number of requests swapped to CPU.\n"
    "# TYPE vllm:num_requests_swapped gauge\n"
    "vllm:num_requests_swapped{model_name=\"m\"} 0.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be "
    "processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{model_name=\"m\"} 12.0\n"
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 "
    "percent usage.\n"
    "# TYPE vllm:gpu_cache_usage_perc gauge\n"
    "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.96875\n";

/*
 * Two models on one server, and two data-parallel engines of one model:
 * a sample each.
 */
static const char two_models_text[] =
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"a\"} 3.0\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"b\"} 4.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"b\"} 1.0\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"a\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"b\"} 0.5\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"b\"} 0.125\n";

/* Two bad lines of one metric among good ones, and another metric. */
static const char spoiled_text[] =
    "vllm:num_requests_running{model_name=\"a\"} 3.0\n"
    "vllm:num_requests_running{model_name=\"b\"} NaN\n"
    "vllm:num_requests_running{model_name=\"c\" 1.0\n"
    "vllm:num_requests_running{model_name=\"d\"} 2.0\n"
    "vllm:num_requests_waiting{model_name=\"a\"} 7.0\n";

#define WANTS 9

struct expect {
    const char *name;           /* NULL: no more */
    double sum;
    size_t samples;
    size_t refused;
};

struct text_case {
    const char *text;
    size_t len;
    struct expect want[WANTS];
    const char *note;
};

static const struct text_case text_cases[] = {
    { S(vllm_text),
      { { RUNNING, 3, 1, 0 }, { WAITING, 5, 1, 0 },
        { KV_USAGE, 0.4375, 1, 0 }, { GPU_USAGE, 0, 0, 0 } },
      "vLLM V1: the load gauges; no gpu_cache_usage_perc, so absent" },
    { S(vllm_text),
      { { "vllm:time_to_first_token_seconds_count", 100, 1, 0 },
        { "vllm:time_to_first_token_seconds_sum", 2.625, 1, 0 },
        { "vllm:time_to_first_token_seconds_bucket", 0 + 61 + 99 + 100, 4,
          0 },
        { "vllm:time_to_first_token_seconds", 0, 0, 0 },
        { "vllm:request_success_total", 100, 3, 0 },
        { "vllm:request_success", 0, 0, 0 },
        { "vllm:prefix_cache_queries_created", 1.7193421550812e+09, 1, 0 },
        { "process_virtual_memory_bytes", 34359738368.0, 1, 0 },
        { "python_info", 1, 1, 0 } },
      "vLLM V1: a histogram's parts (not its family name), a counter over "
      "label sets (not without _total), e+09 and e+010, five labels" },
    { S(older_text),
      { { KV_USAGE, 0, 0, 0 }, { GPU_USAGE, 0.96875, 1, 0 },
        { WAITING, 12, 1, 0 } },
      "older vLLM: kv_cache_usage_perc absent, the caller falls back" },
    { S(two_models_text),
      { { RUNNING, 8, 3, 0 }, { KV_USAGE, 0.875, 3, 0 } },
      "two models and two engines: every label set summed" },
    { S(spoiled_text),
      { { RUNNING, 5, 2, 2 }, { WAITING, 7, 1, 0 } },
      "a NaN and an open '{' spoil their metric only; the good samples of "
      "it are still summed, and said to be incomplete" },
    { S("a 1\nb 2\na 4\n"),
      { { "a", 5, 2, 0 }, { "c", 0, 0, 0 }, { "a", 5, 2, 0 } },
      "a name asked for twice is filled twice" },
    { S(""), { { "a", 0, 0, 0 } }, "an empty text" },
};

/*
 * Each case's wanted names, read from a guarded copy into entries that
 * start out holding garbage (prom_read_sums() zeroes them).
 */
START_TEST(test_text_table)
{
    const struct text_case *c = &text_cases[_i];
    struct prom_read_sum want[WANTS];
    size_t n = 0, refused = 0;

    for (; n < WANTS && c->want[n].name != NULL; n++) {
        want[n].name = c->want[n].name;
        want[n].sum = -1;
        want[n].samples = want[n].refused = 99;
        refused += c->want[n].refused;
    }
    ck_assert_int_eq(read_guarded(c->text, c->len, want, n),
                     refused > 0 ? GW_EPARSE : 0);
    for (size_t i = 0; i < n; i++)
        assert_sum(&want[i], c->want[i].sum, c->want[i].samples,
                   c->want[i].refused, c->note);
}
END_TEST

/* No text at all (NULL), and nothing wanted. */
START_TEST(test_nothing)
{
    struct prom_read_sum want = { .name = "a", .sum = 1, .samples = 1 };

    ck_assert_int_eq(prom_read_sums(NULL, 0, &want, 1), 0);
    assert_sum(&want, 0, 0, 0, "NULL, 0");
    ck_assert_int_eq(prom_read_sums(S("a NaN\n"), &want, 0), 0);
}
END_TEST


/* ---- one name, many lines: the table ------------------------------------ */

struct sum_case {
    const char *text;
    size_t len;
    const char *name;           /* the one series wanted */
    double sum;
    size_t samples;
    size_t refused;
    const char *note;
};

/* A case whose text is read as "x", or refused for "x". */
#define OK(lit, v, k, note) { S(lit), "x", v, k, 0, note }
#define BAD(lit, note) { S(lit), "x", 0, 0, 1, note }

static const struct sum_case sum_cases[] = {
    /* lines */
    OK("x 1\n", 1, 1, "one line"),
    OK("x 1", 1, 1, "no final newline"),
    OK("x 1\r\nx 2\r\n", 3, 2, "CRLF"),
    OK("x 1\r\nx 2\r", 3, 2, "CRLF, the last LF missing"),
    OK("x 1\n\n\n \t \nx 2\n", 3, 2, "blank lines between"),
    OK("# HELP x Help.\n# TYPE x gauge\n#x 5\n # x 6\nx 1\n", 1, 1,
       "'#' lines, even ones that look like samples"),
    OK("  \tx 1\n", 1, 1, "blanks before the name"),
    OK("x\t1\n", 1, 1, "a tab between"),
    OK("x 1 \t\n", 1, 1, "blanks after the value"),
    OK("x 1\n\n", 1, 1, "a blank last line"),
    OK("\n", 0, 0, "only a newline"),
    OK("# EOF\n", 0, 0, "only a comment"),
    BAD("x 1\r\r\n", "two CRs: the first stays"),
    BAD("x \r1\n", "a CR inside the line"),
    BAD("x\n", "a name alone"),
    BAD("x", "a name alone, no newline"),
    BAD("x \n", "no value"),
    BAD("x{a=\"b\"}\n", "labels, no value"),

    /* names */
    OK("x_total 5\nx_created 6\nx:y 7\nxx 8\nx 1\n", 1, 1,
       "longer names that start with x are not x"),
    OK("x_bucket{le=\"+Inf\"} 5\nx_count 5\nx_sum 2\n", 0, 0,
       "a histogram family's name has no sample"),
    OK("X 1\n", 0, 0, "names are case-sensitive"),
    OK("1x 1\n{x=\"1\"} 1\n", 0, 0, "no name: not a sample"),
    OK("x {a=\"b\"} 1\n", 1, 1, "a blank before '{'"),
    OK("x{a=\"b\"}1\n", 1, 1, "no blank after '}'"),
    BAD("x-1\n", "the name runs into the value (Go reads x = -1)"),
    BAD("x=1\n", "a byte after the name that is not '{' or a blank"),
    { S("vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n"
        "vllm:num_requests_waiting{model_name=\"m\"} 2\n"
        "vllm:num_requests_waiting_total 4\n"),
      WAITING, 2, 1, 0, "a name that another starts with" },
    { S("vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n"),
      WAITING, 0, 0, 0, "only the longer name" },
    { S("vllm:num_requests_waitin 2\nvllm:num_requests_wait 3\n"),
      WAITING, 0, 0, 0, "names shorter than the one wanted" },
    { S("a:b:c 2\na 3\n"), "a:b:c", 2, 1, 0, "colons in the name" },

    /* labels */
    OK("x{} 1\n", 1, 1, "an empty label set"),
    OK("x{ } 1\n", 1, 1, "a blank label set"),
    OK("x{a=\"b\",} 1\n", 1, 1, "a trailing comma"),
    OK("x{ a = \"b\" , c = \"d\" , } 1\n", 1, 1, "blanks everywhere"),
    OK("x{a=\"\"} 1\n", 1, 1, "an empty value"),
    OK("x{a=\"say \\\"hi\\\"\"} 1\n", 1, 1, "escaped quotes"),
    OK("x{a=\"}\"} 1\n", 1, 1, "a '}' in a value"),
    OK("x{a=\",b=\\\"c\\\"\"} 1\n", 1, 1, "a ',' and quotes in a value"),
    OK("x{a=\"} 9\"} 1\n", 1, 1, "a value that looks like the line's end"),
    OK("x{a=\"\\\\\"} 1\n", 1, 1, "a value that is one backslash"),
    OK("x{a=\"\\\\\\\"\"} 1\n", 1, 1, "a backslash, then an escaped quote"),
    OK("x{a=\"line\\nnext\"} 1\n", 1, 1, "an escaped newline"),
    OK("x{a=\"\r\"} 1\r\n", 1, 1, "a raw CR in a value"),
    OK("x{a=\"\xc3\xa9\xff\"} 1\n", 1, 1, "bytes above 0x7f: UTF-8 or not"),
    OK("x{a=\"b\0c\"} 1\n", 1, 1, "a NUL byte in a value"),
    OK("x{_a1=\"b\",A_=\"c\"} 1\n", 1, 1, "label names with _ and digits"),
    BAD("x{a=\"\\t\"} 1\n", "an escape the format has not"),
    BAD("x{a=\"\\\"} 1\n", "the quote escaped: the value never ends"),
    BAD("x{a=\"b} 1\n", "an open value"),
    BAD("x{a=\"b\" 1\n", "an open label set"),
    BAD("x{a=\"b\"\n", "an open label set at the line's end"),
    BAD("x{a=b} 1\n", "an unquoted value"),
    BAD("x{a} 1\n", "no '='"),
    BAD("x{=\"b\"} 1\n", "no label name"),
    BAD("x{1a=\"b\"} 1\n", "a label name starting with a digit"),
    BAD("x{a:b=\"c\"} 1\n", "a ':' in a label name"),
    BAD("x{a=\"b\" c=\"d\"} 1\n", "no ',' between labels"),
    BAD("x{a=\"b\",,c=\"d\"} 1\n", "two commas"),
    BAD("x{,} 1\n", "only a comma"),
    BAD("x{a=\"b\"}} 1\n", "two '}'"),
    BAD("x{a=\"\nb\"} 1\n", "a raw newline in a value ends the line"),

    /* values */
    OK("x 3.0\n", 3, 1, "prometheus_client's integers"),
    OK("x 42\n", 42, 1, "an integer"),
    OK("x -2\n", -2, 1, "negative"),
    OK("x +1.5\n", 1.5, 1, "a plus sign"),
    OK("x .5\n", 0.5, 1, "no integer part"),
    OK("x 5.\n", 5, 1, "no fraction digits"),
    OK("x 1e-3\n", 1e-3, 1, "an exponent"),
    OK("x 1E+09\n", 1e9, 1, "E and a signed exponent"),
    OK("x 1.25e+010\n", 1.25e10, 1, "floatToGoString's e+010"),
    OK("x -0.0\n", 0, 1, "minus zero"),
    OK("x 1e-400\n", 0, 1, "below the smallest double: zero"),
    OK("x 00012\n", 12, 1, "leading zeros"),
    OK("x 1.7976931348623157e308\n", 1.7976931348623157e308, 1,
       "the largest double"),
    BAD("x NaN\n", "NaN"),
    BAD("x nan\n", "nan"),
    BAD("x +Inf\n", "+Inf"),
    BAD("x -Inf\n", "-Inf"),
    BAD("x Inf\n", "Inf"),
    BAD("x Infinity\n", "Infinity"),
    BAD("x 1e999\n", "above the largest double"),
    BAD("x -1e999\n", "below the most negative double"),
    BAD("x 0x10\n", "hex"),
    BAD("x 1,5\n", "a decimal comma"),
    BAD("x 1_000\n", "an underscore"),
    BAD("x 1e\n", "an exponent without digits"),
    BAD("x 1e+\n", "a signed exponent without digits"),
    BAD("x e5\n", "an exponent without a mantissa"),
    BAD("x .\n", "a point alone"),
    BAD("x -\n", "a sign alone"),
    BAD("x +-1\n", "two signs"),
    BAD("x 1.2.3\n", "two points"),
    BAD("x 1e5.5\n", "a fractional exponent"),
    BAD("x 1f\n", "a suffix"),
    BAD("x \"1\"\n", "quoted"),

    /* timestamps */
    OK("x 1 1719342155081\n", 1, 1, "a timestamp, ignored"),
    OK("x 1 -5\n", 1, 1, "a negative timestamp"),
    OK("x 1 +5\n", 1, 1, "a signed timestamp"),
    OK("x 1 9223372036854775807\n", 1, 1, "INT64_MAX"),
    OK("x 1 -9223372036854775808\n", 1, 1, "INT64_MIN"),
    OK("x{a=\"b\"} 2 0 \r\n", 2, 1, "labels, timestamp, blank, CRLF"),
    BAD("x 1 9223372036854775808\n", "above INT64_MAX"),
    BAD("x 1 -9223372036854775809\n", "below INT64_MIN"),
    BAD("x 1 1.5\n", "a timestamp with a point"),
    BAD("x 1 12a\n", "a timestamp with a letter"),
    BAD("x 1 -\n", "a sign alone"),
    BAD("x 1 2 3\n", "a third token"),
};

START_TEST(test_sum_table)
{
    const struct sum_case *c = &sum_cases[_i];
    struct prom_read_sum want = { .name = c->name };
    int rc;

    rc = read_guarded(c->text, c->len, &want, 1);
    assert_sum(&want, c->sum, c->samples, c->refused, c->note);
    ck_assert_int_eq(rc, c->refused > 0 ? GW_EPARSE : 0);
}
END_TEST

/* The longest value taken is PROM_READ_MAX_VALUE bytes. */
START_TEST(test_value_length)
{
    char line[PROM_READ_MAX_VALUE + 8];
    struct prom_read_sum want = { .name = "x" };
    size_t n;

    /* "x 0.000...01\n": the value is "0." and zeros and a final 1. */
    for (size_t vlen = PROM_READ_MAX_VALUE; vlen <= PROM_READ_MAX_VALUE + 1;
         vlen++) {
        n = 0;
        line[n++] = 'x';
        line[n++] = ' ';
        line[n++] = '0';
        line[n++] = '.';
        memset(line + n, '0', vlen - 3);
        n += vlen - 3;
        line[n++] = '1';
        line[n++] = '\n';
        read_guarded(line, n, &want, 1);
        if (vlen <= PROM_READ_MAX_VALUE)
            ck_assert_msg(want.samples == 1 && want.sum > 0, "%zu", vlen);
        else
            assert_sum(&want, 0, 0, 1, "one byte too long");
    }
}
END_TEST

/* ---- cut short, and in two pieces --------------------------------------- */

static const char *const vllm_names[] = {
    RUNNING, WAITING, KV_USAGE, GPU_USAGE,
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:cache_config_info",
};
#define NAMES GW_ARRAY_LEN(vllm_names)

static void
read_names(const char *text, size_t len, struct prom_read_sum *want)
{
    for (size_t i = 0; i < NAMES; i++)
        want[i].name = vllm_names[i];
    read_guarded(text, len, want, NAMES);
}

/*
 * The text cut at every offset k: the lines before the cut read as they
 * do in the whole text (their prefix, up to the last line end before k),
 * and the cut line adds at most one sample or one refusal.  A wanted
 * line cut inside its value reads as a shorter value, which is why the
 * caller must pass a whole body (prom_read.h).
 */
START_TEST(test_cut_at_every_offset)
{
    const size_t len = sizeof(vllm_text) - 1;
    struct prom_read_sum whole[NAMES], lines[NAMES], cut[NAMES];
    size_t line_start = 0;

    read_names(vllm_text, len, whole);
    for (size_t k = 0; k <= len; k++) {
        if (k > 0 && vllm_text[k - 1] == '\n')
            line_start = k;
        read_names(vllm_text, line_start, lines);
        read_names(vllm_text, k, cut);
        for (size_t i = 0; i < NAMES; i++) {
            size_t more = cut[i].samples - lines[i].samples;
            size_t bad = cut[i].refused - lines[i].refused;

            ck_assert_msg(cut[i].samples >= lines[i].samples
                              && cut[i].refused >= lines[i].refused
                              && more + bad <= 1,
                          "cut at %zu: %s: %zu/%zu after %zu/%zu", k,
                          vllm_names[i], cut[i].samples, cut[i].refused,
                          lines[i].samples, lines[i].refused);
            ck_assert(cut[i].samples <= whole[i].samples);
        }
    }
    for (size_t i = 0; i < NAMES; i++)
        assert_sum(&cut[i], whole[i].sum, whole[i].samples, whole[i].refused,
                   "not cut");
}
END_TEST

/*
 * Two pieces split at each line end: their counts and sums add up to the
 * whole's (exactly: the values are binary fractions).
 */
START_TEST(test_two_pieces)
{
    const size_t len = sizeof(vllm_text) - 1;
    struct prom_read_sum whole[NAMES], a[NAMES], b[NAMES];

    read_names(vllm_text, len, whole);
    for (size_t k = 0; k <= len; k++) {
        if (k > 0 && vllm_text[k - 1] != '\n')
            continue;
        read_names(vllm_text, k, a);
        read_names(vllm_text + k, len - k, b);
        for (size_t i = 0; i < NAMES; i++) {
            ck_assert_msg(a[i].samples + b[i].samples == whole[i].samples
                              && a[i].refused + b[i].refused == 0
                              && a[i].sum + b[i].sum == whole[i].sum,
                          "split at %zu: %s", k, vllm_names[i]);
        }
    }
}
END_TEST

/* ---- what the writer writes --------------------------------------------- */

/*
 * prom.c's output read back: the writer and the reader agree on the
 * format, label escapes and floats included.
 */
START_TEST(test_reads_the_writer)
{
    static const double le[] = { 0.005, 0.25, 1, 120 };
    static const uint64_t counts[] = { 2, 0, 3, 1 };
    const struct prom_histogram h = {
        .le = le, .counts = counts, .n = 4, .count = 9, .sum = 1410.5,
    };
    const struct prom_label odd[] = {
        { "model", "we\\ird \"m\"\nx} 7,{" }, { "kind", "" },
    };
    const struct prom_label plain = { "model", "m" };
    struct prom_read_sum want[] = {
        { .name = "g" }, { .name = "d_seconds_bucket" },
        { .name = "d_seconds_sum" }, { .name = "d_seconds_count" },
    };
    struct buf b;
    struct prom w;

    buf_init(&b, 1 << 16);
    prom_init(&w, &b);
    prom_family(&w, "g", PROM_GAUGE, "A gauge, \\ and \"quotes\".");
    prom_int(&w, odd, GW_ARRAY_LEN(odd), -3);
    prom_uint(&w, &plain, 1, UINT64_C(1) << 40);
    prom_uint(&w, NULL, 0, 2);
    prom_family(&w, "d_seconds", PROM_HISTOGRAM, "Latency.");
    prom_histogram(&w, odd, GW_ARRAY_LEN(odd), &h);
    prom_histogram(&w, NULL, 0, &h);
    ck_assert_int_eq(w.rc, 0);

    ck_assert_int_eq(read_guarded(buf_ptr(&b), buf_len(&b), want, 4), 0);
    assert_sum(&want[0], -3.0 + 1099511627776.0 + 2, 3, 0, "gauge");
    assert_sum(&want[1], 2 * (2 + 2 + 5 + 6 + 9), 10, 0, "buckets");
    assert_sum(&want[2], 2 * 1410.5, 2, 0, "sums");
    assert_sum(&want[3], 2 * 9, 2, 0, "counts");
    buf_release(&b);
}
END_TEST

/* ---- the latest sample ------------------------------------------------- */

#define INFO "vllm:lora_requests_info"
#define INFO_HEAD "# HELP " INFO " Running stats on lora requests.\n" \
                  "# TYPE " INFO " gauge\n"

/* The labels vLLM writes on it, in the order asked for here. */
enum { MAX_LORA, RUNNING_L, WAITING_L, NUM_L };

/* A label's value as written: (pointer, length); NONE: absent. */
struct view {
    const char *p;
    size_t n;
};

#define V(lit) { lit, sizeof(lit) - 1 }
#define NONE { NULL, 0 }

struct latest_case {
    const char *text;
    size_t len;
    double value;               /* of the latest */
    struct view labels[NUM_L];  /* their views as written */
    size_t samples, refused;
    const char *note;
};

static const struct latest_case latest_cases[] = {
    { S(INFO_HEAD INFO "{max_lora=\"4\",running_lora_adapters=\"a,b\","
        "waiting_lora_adapters=\"\"} 1.7562292345678e+09\n"),
      1.7562292345678e+09, { V("4"), V("a,b"), V("") }, 1, 0,
      "vLLM's one sample" },
    { S(INFO_HEAD
        INFO "{max_lora=\"4\",running_lora_adapters=\"a\","
        "waiting_lora_adapters=\"\"} 1.75e+09\n"
        INFO "{max_lora=\"4\",running_lora_adapters=\"a,b\","
        "waiting_lora_adapters=\"c\"} 1.7500002e+09\n"
        INFO "{max_lora=\"4\",running_lora_adapters=\"\","
        "waiting_lora_adapters=\"\"} 1.7500001e+09\n"),
      1.7500002e+09, { V("4"), V("a,b"), V("c") }, 3, 0,
      "the highest value wins, wherever it is" },
    { S(INFO "{max_lora=\"1\",running_lora_adapters=\"first\"} 7\n"
        INFO "{max_lora=\"1\",running_lora_adapters=\"second\"} 7\n"),
      7, { V("1"), V("first"), NONE }, 2, 0, "of equals, the first" },
    { S(INFO "{waiting_lora_adapters=\"w\",running_lora_adapters=\"r\","
        "max_lora=\"2\"} 1\n"),
      1, { V("2"), V("r"), V("w") }, 1, 0, "labels in any order" },
    { S(INFO "{max_lora=\"2\",running_lora_adapters=\"a\\\"b,c\\\\d\\n\"} "
        "1\n"),
      1, { V("2"), V("a\\\"b,c\\\\d\\n"), NONE }, 1, 0,
      "a view as written, escapes and all" },
    { S(INFO "{running_lora_adapters=\"x},{y\",max_lora=\"3\"} 1\n"),
      1, { V("3"), V("x},{y"), NONE }, 1, 0, "'}' and ',' inside a value" },
    { S(INFO "{max_lora=\"1\",max_lora=\"2\"} 1\n"),
      1, { V("1"), NONE, NONE }, 1, 0, "a label twice: the first" },
    { S(INFO " 5\n"), 5, { NONE, NONE, NONE }, 1, 0, "no labels at all" },
    { S(INFO "_total{max_lora=\"9\"} 9\n"
        "vllm:lora{max_lora=\"9\"} 9\n"
        "other{max_lora=\"9\"} 9\n" INFO "{max_lora=\"1\"} 1\n"),
      1, { V("1"), NONE, NONE }, 1, 0, "only the series' own lines" },
    { S(INFO "{max_lora=\"1\"} 1\n" INFO "{max_lora=\"2\" 2\n"
        INFO "{max_lora=\"3\"} NaN\n"),
      1, { V("1"), NONE, NONE }, 1, 2, "malformed lines are refused" },
    { S(INFO "{max_lora=\"1\"} 1\n" INFO "{max_lora=\"9\"} 1e999\n"),
      1, { V("1"), NONE, NONE }, 1, 1, "out of range: refused, not latest" },
    { S("# nothing of it\nx 1\n"), 0, { NONE, NONE, NONE }, 0, 0,
      "absent" },
    { S(INFO "{max_lora=\"1\"} -5\n" INFO "{max_lora=\"2\"} -7\n"),
      -5, { V("1"), NONE, NONE }, 2, 0, "negative values compare too" },
    { S(INFO "{max_lora=\"1\",running_lora_adapters=\"a\0b\"} 1\r\n"),
      1, { V("1"), V("a\0b"), NONE }, 1, 0, "a NUL inside a value, CRLF" },
};

/* 'want' for INFO with the three labels, into labels[NUM_L]. */
static void
latest_init(struct prom_read_latest *want, struct prom_read_label *labels)
{
    labels[MAX_LORA].name = "max_lora";
    labels[RUNNING_L].name = "running_lora_adapters";
    labels[WAITING_L].name = "waiting_lora_adapters";
    want->name = INFO;
    want->labels = labels;
    want->num_labels = NUM_L;
}

START_TEST(test_latest_table)
{
    const struct latest_case *c = &latest_cases[_i];
    struct prom_read_label labels[NUM_L];
    struct prom_read_latest want;
    char *copy = guarded_copy(c->text, c->len);
    int rc;

    latest_init(&want, labels);
    rc = prom_read_latest(copy, c->len, &want);
    ck_assert_int_eq(rc, c->refused > 0 ? GW_EPARSE : 0);
    ck_assert_msg(want.samples == c->samples && want.refused == c->refused
                      && want.value == c->value,
                  "%s: samples %zu refused %zu value %.17g", c->note,
                  want.samples, want.refused, want.value);
    for (size_t i = 0; i < NUM_L; i++) {
        const struct view *v = &c->labels[i];

        if (v->p == NULL) {
            ck_assert_msg(labels[i].value == NULL, "%s: %s is there",
                          c->note, labels[i].name);
            continue;
        }
        ck_assert_msg(labels[i].value != NULL, "%s: no %s", c->note,
                      labels[i].name);
        /* A view into the text, and what it should be (NUL and all). */
        ck_assert(labels[i].value >= copy
                  && labels[i].value + labels[i].len <= copy + c->len);
        ck_assert_msg(labels[i].len == v->n
                      && memcmp(labels[i].value, v->p, v->n) == 0,
                      "%s: %s is \"%.*s\"", c->note, labels[i].name,
                      (int)labels[i].len, labels[i].value);
    }
    guarded_free(copy, c->len);
}
END_TEST

/* A label value of a mebibyte is a view like any other: no copy. */
START_TEST(test_latest_huge_label)
{
    const size_t big = 1 << 20;
    struct prom_read_label labels[NUM_L];
    struct prom_read_latest want;
    struct buf b;
    char *copy;

    buf_init(&b, 2 * big);
    ck_assert_int_eq(buf_append_str(&b, INFO "{max_lora=\"2\","
                                    "running_lora_adapters=\""), 0);
    for (size_t i = 0; i < big / 8; i++)
        ck_assert_int_eq(buf_append(&b, "adapter,", 8), 0);
    ck_assert_int_eq(buf_append_str(&b, "\"} 2\n" INFO "{max_lora=\"1\"} 1"),
                     0);
    copy = guarded_copy(buf_ptr(&b), buf_len(&b));
    latest_init(&want, labels);
    ck_assert_int_eq(prom_read_latest(copy, buf_len(&b), &want), 0);
    ck_assert(want.samples == 2 && want.value == 2);
    ck_assert_uint_eq(labels[RUNNING_L].len, big);
    ck_assert(labels[RUNNING_L].value == copy + strlen(
                  INFO "{max_lora=\"2\",running_lora_adapters=\""));
    guarded_free(copy, buf_len(&b));
    buf_release(&b);
}
END_TEST

/*
 * prometheus_client keeps every label set a gauge ever had: a long-lived
 * vLLM shows thousands.  The highest is found wherever it is, and the
 * text is read once (a second a million lines would be far too slow).
 */
START_TEST(test_latest_many_samples)
{
    const size_t n = 100000, top = 77777;
    struct prom_read_label labels[NUM_L];
    struct prom_read_latest want;
    struct buf b;
    char want_running[32];

    buf_init(&b, 16 << 20);
    ck_assert_int_eq(buf_append_str(&b, INFO_HEAD), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(buf_printf(&b, INFO "{max_lora=\"4\","
                                    "running_lora_adapters=\"a%zu\","
                                    "waiting_lora_adapters=\"\"} %zu.5\n",
                                    i, i == top ? n : i), 0);
    latest_init(&want, labels);
    ck_assert_int_eq(prom_read_latest(buf_ptr(&b), buf_len(&b), &want), 0);
    ck_assert_uint_eq(want.samples, n);
    ck_assert(want.value == (double)n + 0.5);
    snprintf(want_running, sizeof(want_running), "a%zu", top);
    ck_assert_uint_eq(labels[RUNNING_L].len, strlen(want_running));
    ck_assert(memcmp(labels[RUNNING_L].value, want_running,
                     strlen(want_running)) == 0);
    buf_release(&b);
}
END_TEST

/* Cut at every byte offset: no read past the end, and a sample whole. */
START_TEST(test_latest_cut_at_every_offset)
{
    static const char text[] =
        INFO_HEAD INFO "{max_lora=\"4\",running_lora_adapters=\"a,b\","
        "waiting_lora_adapters=\"c\"} 1.7562292345678e+09\n"
        INFO "{max_lora=\"4\",running_lora_adapters=\"\","
        "waiting_lora_adapters=\"\"} 1.75e+09\n";
    struct prom_read_label labels[NUM_L];
    struct prom_read_latest want;

    for (size_t len = 0; len <= sizeof(text) - 1; len++) {
        char *copy = guarded_copy(text, len);

        latest_init(&want, labels);
        prom_read_latest(len > 0 ? copy : NULL, len, &want);
        ck_assert(want.samples + want.refused <= 2);
        for (size_t i = 0; i < NUM_L; i++)
            ck_assert(labels[i].value == NULL
                      || (labels[i].value >= copy
                          && labels[i].value + labels[i].len
                             <= copy + len));
        guarded_free(copy, len);
    }
    latest_init(&want, labels);
    ck_assert_int_eq(prom_read_latest(text, sizeof(text) - 1, &want), 0);
    ck_assert(want.value == 1.7562292345678e+09);
    ck_assert(labels[WAITING_L].len == 1 && *labels[WAITING_L].value == 'c');
}
END_TEST

static Suite *
prom_read_suite(void)
{
    Suite *s = suite_create("prom_read");
    TCase *tc;

    tc = tcase("texts");
    tcase_add_loop_test(tc, test_text_table, 0, (int)GW_ARRAY_LEN(text_cases));
    tcase_add_test(tc, test_nothing);
    suite_add_tcase(s, tc);

    tc = tcase("lines");
    tcase_add_loop_test(tc, test_sum_table, 0, (int)GW_ARRAY_LEN(sum_cases));
    tcase_add_test(tc, test_value_length);
    suite_add_tcase(s, tc);

    tc = tcase("cut");
    tcase_add_test(tc, test_cut_at_every_offset);
    tcase_add_test(tc, test_two_pieces);
    suite_add_tcase(s, tc);

    tc = tcase("writer");
    tcase_add_test(tc, test_reads_the_writer);
    suite_add_tcase(s, tc);

    tc = tcase("latest");
    tcase_add_loop_test(tc, test_latest_table, 0,
                        (int)GW_ARRAY_LEN(latest_cases));
    tcase_add_test(tc, test_latest_huge_label);
    tcase_add_test(tc, test_latest_many_samples);
    tcase_add_test(tc, test_latest_cut_at_every_offset);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    return test_run(srunner_create(prom_read_suite()));
}
