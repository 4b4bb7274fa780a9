/* SPDX-License-Identifier: MIT */
/*
 * tls_server.c - the server side of TLS with mbedTLS 2.28 (API and
 * contracts in tls.h): the certificate chain and key, loaded and checked;
 * the one mbedTLS configuration every connection shares; and the
 * session-ticket keys, which a reload hands on.  The connections on it
 * are tls.c's.
 *
 * Design.  One mbedtls_ssl_config, with the chain and the key, serves
 * every connection; mbedTLS only reads it during a handshake, with two
 * exceptions that decide whether sharing is safe:
 *
 *   - The random generator (a CTR-DRBG) is written on every use.  With
 *     MBEDTLS_THREADING_C mbedtls_ctr_drbg_random() takes the context's own
 *     mutex, so one generator may serve all threads; the #error below
 *     refuses a build without it.
 *   - ecp.h and ecdsa.h warn that an EC group or ECDSA context must not be
 *     shared between threads: a multiplication by the generator caches a
 *     table in grp->T.  But mbedtls_pk_sign() on an MBEDTLS_PK_ECKEY key,
 *     the type mbedtls_pk_parse_key() gives every EC key, signs with a
 *     private copy (eckey_sign_wrap() in pk_wrap.c calls
 *     mbedtls_ecdsa_from_keypair()), so the shared key is only read.  An
 *     MBEDTLS_PK_ECDSA key would be signed in place, so only RSA and ECKEY
 *     keys are accepted; RSA keys lock their own mutex for blinding.
 *
 * The session-ticket keys (struct tls_tickets) are the one mutable thing
 * servers share: mbedtls_ssl_ticket_write() and _parse() take the ticket
 * context's own mutex, under which they also rotate the keys, and they
 * draw on the tickets' own generator, since the keys may outlive the
 * server that made them (a reload hands them on).
 *
 * ThreadSanitizer cannot check these points, as libmbedcrypto is not
 * instrumented; it does check the module's own shared state, which is the
 * atomic counters (tls.c) and the tickets' reference count only.
 */
#include "wire/tls_server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/config.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/ssl_ticket.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>

#include "alloc.h"

#if !defined(MBEDTLS_THREADING_C) || !defined(MBEDTLS_THREADING_PTHREAD)
#error "tls_server.c shares one mbedTLS configuration between threads: \
mbedTLS must be built with MBEDTLS_THREADING_C and MBEDTLS_THREADING_PTHREAD"
#endif
#if !defined(MBEDTLS_SSL_SRV_C) || !defined(MBEDTLS_SSL_PROTO_TLS1_2) \
    || !defined(MBEDTLS_SSL_ALPN) || !defined(MBEDTLS_HAVE_TIME_DATE)
#error "tls_server.c needs an mbedTLS with a TLS 1.2 server, ALPN and dates"
#endif
#if !defined(MBEDTLS_SSL_SESSION_TICKETS) || !defined(MBEDTLS_SSL_TICKET_C) \
    || !defined(MBEDTLS_GCM_C) || !defined(MBEDTLS_CHACHAPOLY_C) \
    || !defined(MBEDTLS_KEY_EXCHANGE_ECDHE_ECDSA_ENABLED) \
    || !defined(MBEDTLS_KEY_EXCHANGE_ECDHE_RSA_ENABLED)
#error "tls_server.c needs an mbedTLS with session tickets, AES-GCM, \
ChaCha20-Poly1305 and the ECDHE-ECDSA and ECDHE-RSA key exchanges"
#endif

/* A certificate chain or key file larger than this is refused. */
#define TLS_PEM_MAX (1024 * 1024)

/*
 * Session-ticket keys: made by one server, shared with the servers that
 * replace it while the lifetime stays the same (tls.h).  'refs' counts
 * those servers; the last tls_server_free() frees the keys, wiped.
 */
struct tls_tickets {
    mbedtls_ssl_ticket_context ctx; /* locks itself (see the top) */
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;  /* the keys' own, for rotations */
    int lifetime_s;                 /* > 0 */
    _Atomic long refs;
};

/* ---- loading the chain and the key ------------------------------------ */

/*
 * Read the file at 'path' (named 'what' in messages) into a new buffer
 * with a NUL after the bytes, as mbedTLS's PEM parser wants: OUT *len
 * counts the NUL.  OUT *data is owned by the caller (gw_wipe_free(), *len).
 * Returns 0, GW_EIO (cannot open or read), GW_EINVAL (not a regular file,
 * or too large) or GW_ENOMEM.
 */
static int
read_pem(const char *what, const char *path, unsigned char **data,
         size_t *len, char *err, size_t errlen)
{
    unsigned char *p = NULL;
    struct stat st;
    size_t size = 0, got = 0;
    ssize_t r;
    char ebuf[128];
    int fd = -1, e, rc = GW_EIO;

    *data = NULL;
    *len = 0;
    /* O_NONBLOCK: a FIFO named by mistake must not hang -t or a reload. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd == -1 || fstat(fd, &st) == -1) {
        e = errno;
        tls_set_err(err, errlen, "%s %s: cannot open: %s", what, path,
                    strerror_r(e, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > TLS_PEM_MAX) {
        rc = GW_EINVAL;
        tls_set_err(err, errlen, "%s %s: not a regular file of at most %d "
                    "bytes", what, path, TLS_PEM_MAX);
        goto out;
    }
    size = (size_t)st.st_size + 1;
    p = gw_malloc(size);
    if (p == NULL) {
        rc = GW_ENOMEM;
        tls_set_err(err, errlen, "%s %s: out of memory", what, path);
        goto out;
    }
    while (got < size - 1) {
        r = read(fd, p + got, size - 1 - got);
        if (r == -1 && errno == EINTR)
            continue;
        if (r == -1) {
            e = errno;
            tls_set_err(err, errlen, "%s %s: cannot read: %s", what, path,
                        strerror_r(e, ebuf, sizeof(ebuf)));
            goto out;
        }
        if (r == 0)
            break;              /* shrank meanwhile: take what is there */
        got += (size_t)r;
    }
    p[got] = '\0';
    *data = p;
    *len = got + 1;
    p = NULL;
    rc = 0;

out:
    gw_wipe_free(p, size);
    if (fd != -1)
        close(fd);
    return rc;
}

/* "2026-01-31 23:59:59 UTC" */
static const char *
x509_date(const mbedtls_x509_time *t, char *buf, size_t len)
{
    snprintf(buf, len, "%04d-%02d-%02d %02d:%02d:%02d UTC", t->year, t->mon,
             t->day, t->hour, t->min, t->sec);
    return buf;
}

/* Parse 'path' into s->chain and check the leaf's validity dates. */
static int
load_chain(struct tls_server *s, const char *path, char *err, size_t errlen)
{
    unsigned char *pem = NULL;
    size_t len = 0;
    char ebuf[128];
    int ret, rc;

    rc = read_pem("cert_file", path, &pem, &len, err, errlen);
    if (rc != 0)
        goto out;
    rc = GW_EINVAL;
    ret = mbedtls_x509_crt_parse(&s->chain, pem, len);
    if (ret < 0 || s->chain.version == 0) {
        tls_set_err(err, errlen, "cert_file %s: not a PEM certificate chain "
                    "(%s)", path, tls_mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (ret > 0) {
        tls_set_err(err, errlen, "cert_file %s: %d of its certificates cannot "
                    "be parsed", path, ret);
        goto out;
    }
    /* Only the leaf: an intermediate is the client's to judge. */
    if (mbedtls_x509_time_is_past(&s->chain.valid_to)) {
        tls_set_err(err, errlen, "cert_file %s: the certificate expired on %s",
                    path, x509_date(&s->chain.valid_to, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (mbedtls_x509_time_is_future(&s->chain.valid_from)) {
        tls_set_err(err, errlen, "cert_file %s: the certificate is not valid "
                    "before %s", path,
                    x509_date(&s->chain.valid_from, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = 0;

out:
    gw_free(pem);
    return rc;
}

/*
 * Parse 'path' into s->key and check that it matches the leaf and that
 * it may be shared between threads (see the top).
 */
static int
load_key(struct tls_server *s, const char *path, const char *cert_path,
         char *err, size_t errlen)
{
    unsigned char *pem = NULL;
    size_t len = 0;
    char ebuf[128];
    mbedtls_pk_type_t type;
    int ret, rc;

    rc = read_pem("key_file", path, &pem, &len, err, errlen);
    if (rc != 0)
        goto out;
    rc = GW_EINVAL;
    ret = mbedtls_pk_parse_key(&s->key, pem, len, NULL, 0);
    if (ret == MBEDTLS_ERR_PK_PASSWORD_REQUIRED) {
        tls_set_err(err, errlen, "key_file %s: the key is encrypted; a key "
                    "without a passphrase is needed", path);
        goto out;
    }
    if (ret != 0) {
        tls_set_err(err, errlen, "key_file %s: not a PEM private key (%s)",
                    path, tls_mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    type = mbedtls_pk_get_type(&s->key);
    if (type != MBEDTLS_PK_RSA && type != MBEDTLS_PK_ECKEY) {
        tls_set_err(err, errlen, "key_file %s: a %s key is not supported",
                    path, mbedtls_pk_get_name(&s->key));
        goto out;
    }
    if (mbedtls_pk_check_pair(&s->chain.pk, &s->key) != 0) {
        tls_set_err(err, errlen, "key_file %s does not match the certificate "
                    "in cert_file %s", path, cert_path);
        goto out;
    }
    rc = 0;

out:
    gw_wipe_free(pem, len);
    return rc;
}

/* ---- the server ------------------------------------------------------- */

/*
 * The key exchange's curves, in the server's order of preference.
 * mbedTLS's default list is largest first, so a client offering all of
 * them got P-521: 7.2 ms of CPU per handshake here, against 2.3 ms for
 * X25519 (docs/BENCHMARKS.md "TLS").  Fastest first, then the NIST
 * curves for clients without X25519.
 */
static const mbedtls_ecp_group_id tls_curves[] = {
    MBEDTLS_ECP_DP_CURVE25519, MBEDTLS_ECP_DP_SECP256R1,
    MBEDTLS_ECP_DP_SECP384R1, MBEDTLS_ECP_DP_SECP521R1, MBEDTLS_ECP_DP_NONE,
};

/*
 * The cipher suites, in the server's order of preference (mbedTLS picks
 * the first of these the client offers and the certificate's key can
 * sign for: the ECDSA three or the RSA three).  Every one has an
 * ephemeral ECDHE key exchange, so a stolen key_file cannot decrypt
 * recorded traffic, and an AEAD cipher, so no CBC padding oracles
 * (Lucky Thirteen and kin).  Left out on purpose: static RSA and ECDH
 * key exchange (no forward secrecy), DHE (a client offering only
 * DHE-RSA-2048 made a handshake cost 3-4 times the CPU of the default
 * one: issue 16), CBC, CCM and CCM_8 (the truncated tag), Camellia, and
 * PSK (no keys configured).  ChaCha20-Poly1305 comes first: this mbedTLS
 * seals a 16 KiB record with it in 77 µs on the reference machine,
 * against 137 µs with AES-128-GCM and 145 µs with AES-256-GCM (the
 * library's own calls, one thread).
 */
static const int tls_suites[] = {
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    0,
};

/* Give back one reference to 't'; the last frees it.  NULL-safe. */
static void
tickets_drop(struct tls_tickets *t)
{
    if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    mbedtls_ssl_ticket_free(&t->ctx);       /* zeroises the keys */
    mbedtls_ctr_drbg_free(&t->drbg);
    mbedtls_entropy_free(&t->entropy);
    gw_free(t);
}

/*
 * New ticket keys for tickets of 'lifetime_s' (> 0) seconds, which
 * mbedTLS also takes as the keys' rotation period.  OUT *out: one
 * reference, for the caller.  Returns 0, GW_ENOMEM or GW_EIO.
 */
static int
tickets_new(int lifetime_s, struct tls_tickets **out, char *err,
            size_t errlen)
{
    static const unsigned char pers[] = "infergw tls_tickets";
    struct tls_tickets *t = NULL;
    char ebuf[128];
    int ret, rc = GW_ENOMEM;

    *out = NULL;
    t = gw_calloc(1, sizeof(*t));
    if (t == NULL) {
        tls_set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_ticket_init(&t->ctx);
    mbedtls_entropy_init(&t->entropy);
    mbedtls_ctr_drbg_init(&t->drbg);
    t->lifetime_s = lifetime_s;
    atomic_init(&t->refs, 1);
    ret = mbedtls_ctr_drbg_seed(&t->drbg, mbedtls_entropy_func, &t->entropy,
                                pers, sizeof(pers) - 1);
    if (ret == 0)
        ret = mbedtls_ssl_ticket_setup(&t->ctx, mbedtls_ctr_drbg_random,
                                       &t->drbg, MBEDTLS_CIPHER_AES_256_GCM,
                                       (uint32_t)lifetime_s);
    if (ret != 0) {
        rc = ret == MBEDTLS_ERR_CIPHER_ALLOC_FAILED ? GW_ENOMEM : GW_EIO;
        tls_set_err(err, errlen, "cannot make session ticket keys (%s)",
                    tls_mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    *out = t;
    t = NULL;
    rc = 0;

out:
    tickets_drop(t);
    return rc;
}

/*
 * The suite this server picks from the ClientHello in 'msg', by mbedTLS's
 * rule (ssl_parse_client_hello(): the first of tls_suites that the client
 * offers and the certificate's key signs for; the other conditions, a
 * common curve and signature hash, are the same for every suite of one
 * key type), or 0.  'msg' is the whole handshake message, its 4-byte
 * header first (RFC 5246 section 7.4.1.2), which mbedTLS has checked
 * before it reads the extensions; the bounds are checked again all the
 * same.
 */
static int
suite_picked(const struct tls_server *s, const unsigned char *msg)
{
    size_t len = 4 + ((size_t)msg[2] << 8 | msg[3]);
    size_t off = 4 + 2 + 32, n;         /* version, random */
    const mbedtls_ssl_ciphersuite_t *info;

    if (off >= len)
        return 0;
    off += 1 + (size_t)msg[off];        /* session_id */
    if (off + 2 > len)
        return 0;
    n = (size_t)msg[off] << 8 | msg[off + 1];
    off += 2;
    if (off + n > len)
        return 0;
    for (const int *id = tls_suites; *id != 0; id++) {
        info = mbedtls_ssl_ciphersuite_from_id(*id);
        if (!mbedtls_pk_can_do(&s->key,
                               mbedtls_ssl_get_ciphersuite_sig_pk_alg(info)))
            continue;
        for (size_t i = 0; i + 1 < n; i += 2)
            if (((int)msg[off + i] << 8 | msg[off + i + 1]) == *id)
                return *id;
    }
    return 0;
}

/* mbedTLS's ticket write callback: the shared keys seal the session. */
static int
ticket_write(void *p, const mbedtls_ssl_session *session,
             unsigned char *start, const unsigned char *end, size_t *tlen,
             uint32_t *lifetime)
{
    struct tls_server *s = p;

    return mbedtls_ssl_ticket_write(&s->tickets->ctx, session, start, end,
                                    tlen, lifetime);
}

/*
 * mbedTLS's ticket parse callback: mbedtls_ssl_ticket_parse(), which
 * refuses a forged, expired or unknown-key ticket, and then a ticket
 * whose cipher suite is not the one this handshake picks.  A resumed
 * session keeps its suite (RFC 5246 section 7.4.1.3).  mbedTLS 2.28
 * checks that for sessions from a cache (ssl_handle_id_based_session_
 * resumption()) but not for tickets: it picks the suite afresh after
 * reading the ticket and resumes under that one, which OpenSSL clients
 * abort ("old session cipher not returned") and mbedTLS clients take for
 * a full handshake.  It happens to a client whose offer has changed, and
 * after a reload to a certificate with another kind of key.  Any error
 * makes mbedTLS ignore the ticket: a full handshake, with a new ticket.
 */
static int
ticket_parse(void *p, mbedtls_ssl_session *session, unsigned char *buf,
             size_t len)
{
    struct tls_server *s = p;
    int ret = mbedtls_ssl_ticket_parse(&s->tickets->ctx, session, buf, len);
    const unsigned char *hello = tls_handshake_hello();

    if (ret == 0
        && (hello == NULL || session->ciphersuite != suite_picked(s, hello)))
        ret = MBEDTLS_ERR_SSL_BAD_INPUT_DATA;
    return ret;
}

/*
 * Session tickets for 's', as 'o' asks: none, the keys of o->prev (same
 * lifetime), or new ones.  Returns 0 or tickets_new()'s code.
 */
static int
setup_tickets(struct tls_server *s, const struct tls_server_opts *o,
              char *err, size_t errlen)
{
    struct tls_tickets *prev = o->prev != NULL ? o->prev->tickets : NULL;
    int rc;

    if (o->session_timeout_s == 0)
        return 0;
    if (prev != NULL && prev->lifetime_s == o->session_timeout_s) {
        /* o->prev holds a reference for as long as this call runs. */
        atomic_fetch_add(&prev->refs, 1);
        s->tickets = prev;
    } else {
        rc = tickets_new(o->session_timeout_s, &s->tickets, err, errlen);
        if (rc != 0)
            return rc;
    }
    mbedtls_ssl_conf_session_tickets_cb(&s->conf, ticket_write, ticket_parse,
                                        s);
    return 0;
}

int
tls_server_new(const struct tls_server_opts *o, struct tls_server **out,
               char *err, size_t errlen)
{
    static const unsigned char pers[] = "infergw tls_server";
    struct tls_server *s = NULL;
    char ebuf[128];
    int ret, rc = GW_EINVAL;

    *out = NULL;
    tls_set_err(err, errlen, "%s", "");
    if (o->min_version == 13) {
        tls_set_err(err, errlen, "tls_min_version 1.3: this mbedTLS (%s) has "
                    "no TLS 1.3 (mbedTLS 2.28 does not support it); use 1.2",
                    MBEDTLS_VERSION_STRING);
        goto out;
    }
    if (o->min_version != 12) {
        tls_set_err(err, errlen, "tls_min_version: 1.2 or 1.3, not %d",
                    o->min_version);
        goto out;
    }
    if (o->handshake_timeout_ms <= 0) {
        tls_set_err(err, errlen, "tls handshake timeout: must be > 0 ms");
        goto out;
    }
    if (o->session_timeout_s < 0) {
        tls_set_err(err, errlen, "tls session timeout: must be >= 0 s");
        goto out;
    }
    s = gw_calloc(1, sizeof(*s));
    if (s == NULL) {
        rc = GW_ENOMEM;
        tls_set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_config_init(&s->conf);
    mbedtls_x509_crt_init(&s->chain);
    mbedtls_pk_init(&s->key);
    mbedtls_entropy_init(&s->entropy);
    mbedtls_ctr_drbg_init(&s->drbg);
    s->alpn[0] = "http/1.1";
    s->alpn[1] = NULL;
    s->handshake_timeout_ms = o->handshake_timeout_ms;
    s->stats = o->stats;

    ret = mbedtls_ctr_drbg_seed(&s->drbg, mbedtls_entropy_func, &s->entropy,
                                pers, sizeof(pers) - 1);
    if (ret != 0) {
        rc = GW_EIO;
        tls_set_err(err, errlen, "cannot seed the random generator (%s)",
                    tls_mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = load_chain(s, o->cert_file, err, errlen);
    if (rc != 0)
        goto out;
    rc = load_key(s, o->key_file, o->cert_file, err, errlen);
    if (rc != 0)
        goto out;

    rc = GW_EINVAL;
    ret = mbedtls_ssl_config_defaults(&s->conf, MBEDTLS_SSL_IS_SERVER,
                                      MBEDTLS_SSL_TRANSPORT_STREAM,
                                      MBEDTLS_SSL_PRESET_DEFAULT);
    if (ret == 0) {
        /* TLS 1.2 only: Debian's build also has 1.0 and 1.1 compiled in. */
        mbedtls_ssl_conf_min_version(&s->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                     MBEDTLS_SSL_MINOR_VERSION_3);
        mbedtls_ssl_conf_max_version(&s->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                     MBEDTLS_SSL_MINOR_VERSION_3);
        mbedtls_ssl_conf_rng(&s->conf, mbedtls_ctr_drbg_random, &s->drbg);
        mbedtls_ssl_conf_renegotiation(&s->conf,
                                       MBEDTLS_SSL_RENEGOTIATION_DISABLED);
        mbedtls_ssl_conf_curves(&s->conf, tls_curves);
        mbedtls_ssl_conf_ciphersuites(&s->conf, tls_suites);
        ret = mbedtls_ssl_conf_alpn_protocols(&s->conf, s->alpn);
    }
    if (ret == 0)
        ret = mbedtls_ssl_conf_own_cert(&s->conf, &s->chain, &s->key);
    if (ret != 0) {
        rc = ret == MBEDTLS_ERR_SSL_ALLOC_FAILED ? GW_ENOMEM : GW_EINVAL;
        tls_set_err(err, errlen, "cannot configure TLS (%s)",
                    tls_mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = setup_tickets(s, o, err, errlen);
    if (rc != 0)
        goto out;
    *out = s;
    s = NULL;
    rc = 0;

out:
    tls_server_free(s);
    return rc;
}

void
tls_server_free(struct tls_server *s)
{
    if (s == NULL)
        return;
    mbedtls_ssl_config_free(&s->conf);
    tickets_drop(s->tickets);
    mbedtls_pk_free(&s->key);               /* zeroises the key */
    mbedtls_x509_crt_free(&s->chain);
    mbedtls_ctr_drbg_free(&s->drbg);        /* zeroises the state */
    mbedtls_entropy_free(&s->entropy);
    gw_free(s);
}
