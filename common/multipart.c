/* SPDX-License-Identifier: MIT */
/*
 * multipart.c - find a form field in a multipart/form-data body
 * (multipart.h).
 */
#include "multipart.h"

#include <string.h>

#include "http.h"
#include "util.h"

/* A parameter of a media type or a disposition: name=value. */
struct param {
    const char *name;
    size_t name_len;
    const char *value;          /* without the quotes of a quoted-string */
    size_t value_len;
    int quoted_pair;            /* the quoted-string held a "\x" */
};

static int
is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static const char *
skip_ows(const char *p, const char *end)
{
    while (p < end && is_ows(*p))
        p++;
    return p;
}

/* p[0..n) is 1*tchar. */
static const char *
skip_token(const char *p, const char *end)
{
    while (p < end && http_is_tchar((unsigned char)*p))
        p++;
    return p;
}

/*
 * The next parameter of a field value at *cur (after its type), RFC 9110
 * section 5.6.6: *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] ).
 * Returns 1 with *out set, 0 at the end of the value, GW_EPARSE (*why).
 */
static int
next_param(const char **cur, const char *end, struct param *out,
           const char **why)
{
    const char *p = *cur, *q;

    memset(out, 0, sizeof(*out));
    for (;;) {
        p = skip_ows(p, end);
        if (p == end) {
            *cur = p;
            return 0;
        }
        if (*p != ';') {
            *why = "a parameter must follow ';'";
            return GW_EPARSE;
        }
        p = skip_ows(p + 1, end);
        if (p < end && *p != ';')
            break;              /* else an empty parameter: allowed */
    }
    q = skip_token(p, end);
    if (q == p || q == end || *q != '=') {
        *why = "a parameter must be name=value";
        return GW_EPARSE;
    }
    out->name = p;
    out->name_len = (size_t)(q - p);
    p = q + 1;
    if (p < end && *p == '"') {
        out->value = ++p;
        while (p < end && *p != '"') {
            if (*p == '\\') {
                /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
                if (p + 1 == end || !http_is_field_char((unsigned char)p[1]))
                    break;
                out->quoted_pair = 1;
                p += 2;
            } else if (http_is_qdtext((unsigned char)*p)) {
                p++;
            } else {
                break;
            }
        }
        if (p == end || *p != '"') {
            *why = "a quoted parameter value is not closed";
            return GW_EPARSE;
        }
        out->value_len = (size_t)(p - out->value);
        p++;
    } else {
        q = skip_token(p, end);
        if (q == p) {
            *why = "a parameter has no value";
            return GW_EPARSE;
        }
        out->value = p;
        out->value_len = (size_t)(q - p);
        p = q;
    }
    *cur = p;
    return 1;
}

/* RFC 2046 section 5.1.1: bcharsnospace, and the space. */
static int
is_bchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
           || (c >= 'A' && c <= 'Z') || c == ' '
           || (c != '\0' && strchr("'()+_,-./:=?", c) != NULL);
}

int
multipart_boundary(const char *ct, size_t n, char *out, size_t *out_len,
                   const char **why)
{
    const char *p = ct, *end = ct + n, *q;
    struct param prm, b = { 0 };
    int rc, seen = 0;
    size_t i;

    *out_len = 0;
    out[0] = '\0';
    q = skip_token(p, end);
    if (!gw_strieq(p, (size_t)(q - p), "multipart") || q == end
        || *q != '/') {
        *why = "Content-Type must be multipart/form-data";
        return GW_EPARSE;
    }
    p = q + 1;
    q = skip_token(p, end);
    if (!gw_strieq(p, (size_t)(q - p), "form-data")) {
        *why = "Content-Type must be multipart/form-data";
        return GW_EPARSE;
    }
    p = q;
    while ((rc = next_param(&p, end, &prm, why)) == 1) {
        if (!gw_strieq(prm.name, prm.name_len, "boundary"))
            continue;
        if (seen++) {
            *why = "Content-Type has two boundary parameters";
            return GW_EPARSE;
        }
        if (prm.quoted_pair || prm.value_len == 0
            || prm.value_len > MULTIPART_MAX_BOUNDARY
            || prm.value[prm.value_len - 1] == ' ') {
            *why = "the multipart boundary must be 1 to 70 characters, "
                   "not ending in a space (RFC 2046)";
            return GW_EPARSE;
        }
        for (i = 0; i < prm.value_len; i++)
            if (!is_bchar((unsigned char)prm.value[i])) {
                *why = "the multipart boundary has a character RFC 2046 "
                       "does not allow";
                return GW_EPARSE;
            }
        b = prm;
    }
    if (rc < 0)
        return rc;
    if (!seen) {
        *why = "multipart/form-data without a boundary";
        return GW_EPARSE;
    }
    memcpy(out, b.value, b.value_len);
    out[b.value_len] = '\0';
    *out_len = b.value_len;
    return 0;
}

/* What a part's header lines said. */
struct part_head {
    int disposition;            /* Content-Disposition lines seen */
    const char *name;           /* its name parameter */
    size_t name_len;
};

/* A Content-Disposition value: form-data with exactly one plain name. */
static int
read_disposition(const char *p, const char *end, struct part_head *h,
                 const char **why)
{
    const char *q = skip_token(p, end);
    struct param prm;
    int rc, names = 0;

    if (!gw_strieq(p, (size_t)(q - p), "form-data")) {
        *why = "a part's Content-Disposition must be form-data";
        return GW_EPARSE;
    }
    p = q;
    while ((rc = next_param(&p, end, &prm, why)) == 1) {
        if (gw_strieq(prm.name, prm.name_len, "name*")) {
            *why = "a part's name must be a plain name= (RFC 7578)";
            return GW_EPARSE;
        }
        if (!gw_strieq(prm.name, prm.name_len, "name"))
            continue;
        if (names++ || prm.quoted_pair) {
            *why = names > 1 ? "a part has two names"
                             : "a part's name has a quoted-pair";
            return GW_EPARSE;
        }
        h->name = prm.value;
        h->name_len = prm.value_len;
    }
    if (rc < 0)
        return rc;
    if (names == 0) {
        *why = "a part's Content-Disposition has no name";
        return GW_EPARSE;
    }
    return 0;
}

/*
 * The header lines of a part, from p[*pos] up to and with the empty line
 * (at most MULTIPART_MAX_HEAD bytes).  Moves *pos past them.
 */
static int
read_part_head(const char *p, size_t n, size_t *pos, struct part_head *h,
               const char **why)
{
    const char *cur = p + *pos, *end, *name, *colon, *val, *eol, *v_end;
    int clipped = n - *pos > MULTIPART_MAX_HEAD;
    int rc;

    memset(h, 0, sizeof(*h));
    end = clipped ? cur + MULTIPART_MAX_HEAD : p + n;
    for (;;) {
        if (end - cur >= 2 && cur[0] == '\r' && cur[1] == '\n')
            break;
        name = cur;
        colon = skip_token(cur, end);
        val = colon < end ? skip_ows(colon + 1, end) : end;
        eol = val;
        while (eol < end && http_is_field_char((unsigned char)*eol))
            eol++;
        if (clipped && end - eol < 2) {
            *why = "a part's header lines are too long";
            return GW_EPARSE;
        }
        if (colon == name || colon == end || *colon != ':') {
            *why = "a part's header line is not name: value";
            return GW_EPARSE;
        }
        if (end - eol < 2 || eol[0] != '\r' || eol[1] != '\n') {
            *why = "a part's header line must end in CRLF";
            return GW_EPARSE;
        }
        v_end = eol;
        while (v_end > val && is_ows(v_end[-1]))
            v_end--;
        if (gw_strieq(name, (size_t)(colon - name), "content-disposition")) {
            if (h->disposition++) {
                *why = "a part has two Content-Disposition lines";
                return GW_EPARSE;
            }
            rc = read_disposition(val, v_end, h, why);
            if (rc != 0)
                return rc;
        } else if (gw_strieq(name, (size_t)(colon - name),
                             "content-transfer-encoding")) {
            *why = "a part has a Content-Transfer-Encoding (RFC 7578: "
                   "none may be sent)";
            return GW_EPARSE;
        }
        cur = eol + 2;
    }
    if (!h->disposition) {
        *why = "a part has no Content-Disposition";
        return GW_EPARSE;
    }
    *pos = (size_t)(cur + 2 - p);
    return 0;
}

int
multipart_find(const char *p, size_t n, const char *boundary, size_t b_len,
               const char *name, const char **value, size_t *value_len,
               const char **why)
{
    char delim[4 + MULTIPART_MAX_BOUNDARY];
    size_t d_len = 4 + b_len, pos, name_len = strlen(name);
    const char *q, *found_at = NULL;
    size_t found_len = 0;
    struct part_head h;
    int parts = 0, found = 0, rc;

    *value = NULL;
    *value_len = 0;
    if (b_len == 0 || b_len > MULTIPART_MAX_BOUNDARY) {
        *why = "bad multipart boundary";
        return GW_EPARSE;
    }
    memcpy(delim, "\r\n--", 4);
    memcpy(delim + 4, boundary, b_len);
    /* The first boundary has no CRLF before it: no preamble. */
    if (n < d_len - 2 || memcmp(p, delim + 2, d_len - 2) != 0) {
        *why = "the body does not start with the multipart boundary";
        return GW_EPARSE;
    }
    pos = d_len - 2;
    for (;;) {
        /* Just past a boundary: the close, or CRLF and a part. */
        if (n - pos >= 2 && p[pos] == '-' && p[pos + 1] == '-') {
            pos += 2;
            if (!(n == pos || (n - pos == 2 && p[pos] == '\r'
                               && p[pos + 1] == '\n'))) {
                *why = "bytes after the closing multipart boundary";
                return GW_EPARSE;
            }
            break;
        }
        if (n - pos < 2 || p[pos] != '\r' || p[pos + 1] != '\n') {
            *why = "a multipart boundary line must end in CRLF";
            return GW_EPARSE;
        }
        pos += 2;
        if (++parts > MULTIPART_MAX_PARTS) {
            *why = "more than 64 parts in the form";
            return GW_EPARSE;
        }
        rc = read_part_head(p, n, &pos, &h, why);
        if (rc != 0)
            return rc;
        q = memmem(p + pos, n - pos, delim, d_len);
        if (q == NULL) {
            *why = "the multipart body has no closing boundary";
            return GW_EPARSE;
        }
        if (h.name_len == name_len && memcmp(h.name, name, name_len) == 0) {
            if (found++) {
                *why = "the form has the field twice";
                return GW_EPARSE;
            }
            found_at = p + pos;
            found_len = (size_t)(q - (p + pos));
        }
        pos = (size_t)(q - p) + d_len;
    }
    if (!found)
        return GW_ENOTFOUND;
    *value = found_at;          /* only now: the whole body is sound */
    *value_len = found_len;
    return 0;
}
