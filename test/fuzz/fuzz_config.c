/* SPDX-License-Identifier: MIT */
/*
 * fuzz_config.c - libFuzzer target for the configuration file: its
 * syntax (common/cfg.c) and its schema (gateway/base/config.c and
 * config_schema.c).
 *
 * An input is a configuration file, byte for byte (the corpus files are
 * plain gateway.conf snippets).  It is read three ways:
 *   - cfg_parse_text() over an exact-size heap copy of all of it, so ASan
 *     catches a read past the end;
 *   - config_load_text(), which takes a C string, over the text up to
 *     its first NUL (a NUL in a file is refused by the syntax layer, the
 *     first way, as a control character);
 *   - config_load_text() once more with one allocation failing (common/
 *     alloc's fault injection): the Nth, or the Nth and all after it,
 *     with N and the choice taken from a hash of the input.
 *
 * Besides crashes, leaks and sanitizer reports, the target aborts when
 * one of these properties fails:
 *   syntax   cfg_parse_text returns 0 or GW_EPARSE; on 0, entries come
 *            in line order, each line 1..LINES (LINES: how many lines
 *            the text has), a key is empty (a section header) or made
 *            of name characters, and no string holds a control byte but
 *            HTAB; on GW_EPARSE the message is "fuzz.conf:LINE: TEXT".
 *   load     config_load_text returns 0, GW_EPARSE or GW_EINVAL, and
 *            gives a syntax error exactly as cfg_parse_text does; every
 *            error names its place as "fuzz.conf:LINE: TEXT", LINE
 *            1..LINES, and no message holds a control byte (messages
 *            reach terminals and logs).
 *   config   on success: 1..CONFIG_MAX_UPSTREAMS upstreams, each named,
 *            with an http:// or https:// url without a trailing '/' and
 *            timeouts > 0; every tenant named, with 1..16 keys; a listen
 *            address.  config_release() leaves the struct zeroed, and
 *            nothing leaks (LeakSanitizer, in fuzz and asan builds).
 *   memory   with an allocation failing, the load returns what it does
 *            without the failure (if no allocation failed after all), or
 *            GW_ENOMEM with "fuzz.conf: out of memory"; and it leaks
 *            nothing either way.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "alloc.h"
#include "cfg.h"
#include "base/config.h"
#include "util.h"

#define FUZZ_NAME "fuzz.conf"
#define FUZZ_ERRLEN 512


/* Lines as cfg_parse_text counts them: a last line needs no '\n'. */
static int
count_lines(const char *p, size_t n)
{
    int lines = 0;

    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n')
            lines++;
    if (n > 0 && p[n - 1] != '\n')
        lines++;
    return lines;
}

/* No control byte but HTAB in the C string s. */
static int
printable(const char *s)
{
    for (; *s != '\0'; s++)
        if (((unsigned char)*s < 0x20 && *s != '\t')
            || (unsigned char)*s == 0x7f)
            return 0;
    return 1;
}

static int
name_chars(const char *s)
{
    for (; *s != '\0'; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')
              || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'
              || *s == '.'))
            return 0;
    return 1;
}

/*
 * An error message names its place: "fuzz.conf:LINE: TEXT" with LINE in
 * 1..lines, TEXT not empty, nothing unprintable.
 */
static void
check_located(const char *err, int lines)
{
    const char *p = err + strlen(FUZZ_NAME ":");
    long line = 0;

    REQUIRE(strncmp(err, FUZZ_NAME ":", strlen(FUZZ_NAME ":")) == 0);
    REQUIRE(*p >= '1' && *p <= '9');
    while (*p >= '0' && *p <= '9' && line <= lines)
        line = line * 10 + (*p++ - '0');
    REQUIRE(line >= 1 && line <= lines);
    REQUIRE(p[0] == ':' && p[1] == ' ' && p[2] != '\0');
    REQUIRE(printable(err));
}

static void
fuzz_syntax(const char *p, size_t n)
{
    struct cfg_file f;
    char err[FUZZ_ERRLEN];
    int lines = count_lines(p, n), last = 0, rc;

    rc = cfg_parse_text(FUZZ_NAME, p, n, &f, err, sizeof(err));
    if (rc != 0) {
        REQUIRE(rc == GW_EPARSE && f.count == 0 && f.entries == NULL);
        check_located(err, lines);
        return;
    }
    REQUIRE(err[0] == '\0');
    for (size_t i = 0; i < f.count; i++) {
        const struct cfg_entry *e = &f.entries[i];

        REQUIRE(e->line >= last && e->line >= 1 && e->line <= lines);
        last = e->line;
        REQUIRE(name_chars(e->section) && name_chars(e->name)
                && name_chars(e->key));
        REQUIRE(e->key[0] != '\0' || e->value[0] == '\0');
        REQUIRE(e->key[0] != '\0' || e->section[0] != '\0');
        REQUIRE(printable(e->value));
    }
    cfg_file_release(&f);
    REQUIRE(f.count == 0 && f.entries == NULL && f.path == NULL);
}

static int
has_prefix_ci(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);

    return strlen(s) >= n && gw_strieq(s, n, prefix);
}

static const struct gw_config zero;

/* The loaded config holds together; then it is released to zero. */
static void
check_config(struct gw_config *c)
{
    REQUIRE(c->listen != NULL && c->path != NULL);
    REQUIRE(c->num_upstreams >= 1
            && c->num_upstreams <= CONFIG_MAX_UPSTREAMS);
    for (size_t i = 0; i < c->num_upstreams; i++) {
        const struct config_upstream *u = &c->upstreams[i];
        size_t n;

        REQUIRE(u->name != NULL && u->name[0] != '\0' && u->url != NULL);
        REQUIRE(has_prefix_ci(u->url, "http://")
                || has_prefix_ci(u->url, "https://"));
        n = strlen(u->url);
        REQUIRE(u->url[n - 1] != '/');
        REQUIRE(u->connect_timeout_ms > 0 && u->first_byte_timeout_ms > 0
                && u->idle_timeout_ms > 0 && u->total_timeout_ms > 0);
    }
    REQUIRE(c->num_tenants <= CONFIG_MAX_TENANTS);
    for (size_t i = 0; i < c->num_tenants; i++) {
        REQUIRE(c->tenants[i].name != NULL);
        REQUIRE(c->tenants[i].num_keys >= 1
                && c->tenants[i].num_keys <= CONFIG_MAX_TENANT_KEYS);
    }
    config_release(c);
    REQUIRE(memcmp(c, &zero, sizeof(zero)) == 0);
}

/* FNV-1a: picks the failing allocation, the same for the same input. */
static uint32_t
hash(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct gw_config c;          /* 30 KiB: keep off the stack */
    struct cfg_file f;
    char err[FUZZ_ERRLEN], syn_err[FUZZ_ERRLEN], mem_err[FUZZ_ERRLEN];
    const char *nul = memchr(data, '\0', size);
    size_t len = nul != NULL ? (size_t)(nul - (const char *)data) : size;
    char *text = malloc(size + 1);
    uint32_t h = hash(data, size);
    int rc, syn_rc, mem_rc, lines;

    /* libFuzzer's and replay.c's blocks are of the input's exact size. */
    fuzz_syntax((const char *)data, size);
    REQUIRE(text != NULL);
    memcpy(text, data, len);
    text[len] = '\0';
    lines = count_lines(text, len);

    /* The syntax layer's verdict on the same text, for comparison. */
    syn_rc = cfg_parse_text(FUZZ_NAME, text, len, &f, syn_err,
                            sizeof(syn_err));
    if (syn_rc == 0)
        cfg_file_release(&f);

    rc = config_load_text(FUZZ_NAME, text, &c, err, sizeof(err));
    REQUIRE(rc == 0 || rc == GW_EPARSE || rc == GW_EINVAL);
    REQUIRE((rc == GW_EPARSE) == (syn_rc == GW_EPARSE));
    if (rc == 0) {
        REQUIRE(err[0] == '\0');
        check_config(&c);
    } else {
        check_located(err, lines);
        REQUIRE(rc != GW_EPARSE || strcmp(err, syn_err) == 0);
        REQUIRE(memcmp(&c, &zero, sizeof(zero)) == 0);
    }

    /* Again with allocation N failing (and every later one if sticky). */
    alloc_fail_after(1 + (long)(h % 97), (int)((h >> 8) & 1));
    mem_rc = config_load_text(FUZZ_NAME, text, &c, mem_err, sizeof(mem_err));
    if (alloc_failures() == 0) {
        REQUIRE(mem_rc == rc && strcmp(mem_err, err) == 0);
    } else {
        REQUIRE(mem_rc == GW_ENOMEM);
        REQUIRE(strcmp(mem_err, FUZZ_NAME ": out of memory") == 0);
    }
    alloc_fail_after(0, 0);
    if (mem_rc == 0)
        check_config(&c);
    else
        REQUIRE(memcmp(&c, &zero, sizeof(zero)) == 0);

    free(text);
    return 0;
}
