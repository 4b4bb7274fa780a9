/* SPDX-License-Identifier: MIT */
/*
 * cfg.h - the configuration file syntax and value parsers.
 *
 * Syntax (one setting per line):
 *
 *     # comment                    (also after a value: "key = v  # note")
 *     [section]                    a section
 *     [section name]               a named section, e.g. [tenant acme]
 *     key = value                  value runs to the end of the line or a
 *                                  " #" comment; surrounding blanks trimmed;
 *                                  may be empty; "..." quotes keep '#'
 *
 * This module knows nothing about which keys exist: it turns a file into a
 * list of entries, each with its line number, and gives value parsers with
 * units.  gateway/base/config_schema.c holds the schema.  Errors are
 * written into the caller's 'err' buffer as "FILE:LINE: message" (no
 * logging here: the caller decides how to show them).
 */
#ifndef INFERGW_COMMON_CFG_H
#define INFERGW_COMMON_CFG_H

#include <stddef.h>
#include <stdint.h>

struct cfg_entry {
    char *section;      /* "" before the first [section] */
    char *name;         /* the section's name, "" when none */
    char *key;
    char *value;        /* unquoted */
    int line;
};

struct cfg_file {
    char *path;
    struct cfg_entry *entries;  /* owned */
    size_t count;
};

/*
 * Parse the file at 'path' (at most 1 MiB).  OUT *f is owned by the caller
 * (cfg_file_release) on success and empty on failure.
 * Returns 0, GW_EIO ("FILE: cannot open: <strerror>"), GW_EPARSE
 * ("FILE:LINE: ..."), GW_ETOOBIG or GW_ENOMEM, with 'err' filled.
 */
int cfg_parse_file(const char *path, struct cfg_file *f, char *err,
                   size_t errlen);

void cfg_file_release(struct cfg_file *f);

/* Binary units of a size ("k", "m", "g"): the parser reads them, the
 * formatter writes them, and a schema's bounds are written in them. */
#define CFG_KIB (UINT64_C(1) << 10)
#define CFG_MIB (UINT64_C(1) << 20)
#define CFG_GIB (UINT64_C(1) << 30)

/*
 * Value parsers: 0 or GW_EINVAL.  Never partially accept ("10x" fails).
 *   size:     bytes, with optional k/m/g (1024-based, case-insensitive)
 *   duration: milliseconds from "250ms", "30s", "5m", "1h"; a bare number
 *             means seconds
 *   bool:     on/off, yes/no, true/false, 1/0
 *   uint:     decimal, at most 'max'
 */
int cfg_parse_size(const char *s, uint64_t *out);
int cfg_parse_duration_ms(const char *s, int64_t *out);
int cfg_parse_bool(const char *s, int *out);
int cfg_parse_uint(const char *s, uint64_t max, uint64_t *out);

/*
 * More value parsers: 0 or GW_EINVAL (nothing stored), never partially.
 *   decimal:  "0", "0.7", "2.0", ".5": plain decimals only, no exponent or
 *             sign, in [lo, hi]
 *   percent:  "20%" or "12.5%": a plain decimal in [lo, hi] and a percent
 *             sign; *out is the share (0.2, 0.125)
 */
int cfg_parse_decimal(const char *s, double lo, double hi, double *out);
int cfg_parse_percent(const char *s, double lo, double hi, double *out);

/*
 * The inverse, for messages: 'v' as the shortest exact text the parsers
 * read back, into out[0..n) (truncated, always NUL-terminated).
 *   size:     "64k", "1m", "123"
 *   duration: "24h", "5m", "30s", "1ms"
 */
void cfg_format_size(uint64_t v, char *out, size_t n);
void cfg_format_duration_ms(uint64_t v, char *out, size_t n);

#ifdef INFERGW_UNIT_TEST
/* ---- test builds only (test/check_exports.py) ---- */

/* cfg_parse_file() over text already in memory; 'name' is used in
 * messages. */
int cfg_parse_text(const char *name, const char *text, size_t len,
                   struct cfg_file *f, char *err, size_t errlen);
#endif

#endif
