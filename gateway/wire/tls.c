/* SPDX-License-Identifier: MIT */
/*
 * tls.c - server-side TLS with mbedTLS 2.28 (API and contracts in tls.h).
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
 * instrumented; it does check this file's own shared state, which is the
 * atomic counters and the tickets' reference count only.
 *
 * Reads: mbedTLS asks its receive callback for exactly one record at a
 * time (a 5-byte header, then the body it announces), so whatever else the
 * client sent stays in the kernel, where poll() sees it.  Only the
 * decrypted rest of the current record is buffered: tls_pending().
 *
 * Writes: after MBEDTLS_ERR_SSL_WANT_WRITE, mbedTLS holds a whole
 * encrypted record of which only part was sent, and requires the same
 * mbedtls_ssl_write() call again; a later call with other arguments would
 * only flush the old record yet return its own length (ssl_write_real()
 * in ssl_msg.c), losing or repeating data.  So the plaintext of that
 * record is copied to c->wbuf, it is not reported as taken, and the next
 * write first repeats the call from the copy.  mbedTLS itself also sends
 * alerts from inside mbedtls_ssl_read() (no_renegotiation, when a client
 * tries to renegotiate), and such an alert would flush our half-sent
 * record instead; so reads wait until no record is pending, and a read
 * that would itself leave output pending ends the connection.
 */
#include "wire/tls.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/config.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/ssl_ticket.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>

#include "alloc.h"
#include "net.h"

#if !defined(MBEDTLS_THREADING_C) || !defined(MBEDTLS_THREADING_PTHREAD)
#error "tls.c shares one mbedTLS configuration between threads: mbedTLS \
must be built with MBEDTLS_THREADING_C and MBEDTLS_THREADING_PTHREAD"
#endif
#if !defined(MBEDTLS_SSL_SRV_C) || !defined(MBEDTLS_SSL_PROTO_TLS1_2) \
    || !defined(MBEDTLS_SSL_ALPN) || !defined(MBEDTLS_HAVE_TIME_DATE)
#error "tls.c needs an mbedTLS with a TLS 1.2 server, ALPN and dates"
#endif
#if !defined(MBEDTLS_SSL_SESSION_TICKETS) || !defined(MBEDTLS_SSL_TICKET_C) \
    || !defined(MBEDTLS_GCM_C) || !defined(MBEDTLS_CHACHAPOLY_C) \
    || !defined(MBEDTLS_KEY_EXCHANGE_ECDHE_ECDSA_ENABLED) \
    || !defined(MBEDTLS_KEY_EXCHANGE_ECDHE_RSA_ENABLED)
#error "tls.c needs an mbedTLS with session tickets, AES-GCM, \
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

struct tls_server {
    mbedtls_ssl_config conf;        /* read-only once built */
    mbedtls_x509_crt chain;         /* the leaf first */
    mbedtls_pk_context key;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;  /* locks itself (see the top) */
    const char *alpn[2];            /* "http/1.1", NULL: conf points here */
    int handshake_timeout_ms;
    struct tls_stats *stats;        /* borrowed, may be NULL */
    struct tls_tickets *tickets;    /* one reference; NULL: no resumption */
};

struct tls_conn {
    mbedtls_ssl_context ssl;
    int fd;                     /* borrowed */
    short want;                 /* POLLIN or POLLOUT, after GW_EAGAIN */
    int dead;                   /* 0, or the code every later call returns */
    int sys_err;                /* errno of the last failed recv/send */
    unsigned char first[8];     /* the first bytes received, for a hint */
    size_t nfirst;
    size_t wlen;                /* bytes in wbuf whose record is pending */
    unsigned char wbuf[TLS_RECORD_MAX]; /* gathers iovecs; copy of the
                                           pending record's plaintext */
};

/* ---- counters and messages -------------------------------------------- */

/* One handshake's outcome 'rc' in s->stats; 'resumed': from a ticket. */
static void
count(struct tls_server *s, int rc, int resumed)
{
    _Atomic uint64_t *n;

    if (s->stats == NULL)
        return;
    if (resumed)
        atomic_fetch_add_explicit(&s->stats->resumed, 1,
                                  memory_order_relaxed);
    if (rc == 0)
        n = &s->stats->handshakes;
    else if (rc == GW_ETIMEDOUT)
        n = &s->stats->failed_timeout;
    else if (rc == GW_EPARSE)
        n = &s->stats->failed_protocol;
    else
        n = &s->stats->failed_other;
    atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
}

static void
set_err(char *err, size_t errlen, const char *fmt, ...) GW_PRINTF(3, 4);

static void
set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* mbedTLS's text for 'ret' ("X509 - Certificate verification failed"). */
static const char *
mbed_text(int ret, char *buf, size_t len)
{
    mbedtls_strerror(ret, buf, len);
    return buf;
}

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
        set_err(err, errlen, "%s %s: cannot open: %s", what, path,
                strerror_r(e, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > TLS_PEM_MAX) {
        rc = GW_EINVAL;
        set_err(err, errlen, "%s %s: not a regular file of at most %d "
                "bytes", what, path, TLS_PEM_MAX);
        goto out;
    }
    size = (size_t)st.st_size + 1;
    p = gw_malloc(size);
    if (p == NULL) {
        rc = GW_ENOMEM;
        set_err(err, errlen, "%s %s: out of memory", what, path);
        goto out;
    }
    while (got < size - 1) {
        r = read(fd, p + got, size - 1 - got);
        if (r == -1 && errno == EINTR)
            continue;
        if (r == -1) {
            e = errno;
            set_err(err, errlen, "%s %s: cannot read: %s", what, path,
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
        set_err(err, errlen, "cert_file %s: not a PEM certificate chain "
                "(%s)", path, mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (ret > 0) {
        set_err(err, errlen, "cert_file %s: %d of its certificates cannot "
                "be parsed", path, ret);
        goto out;
    }
    /* Only the leaf: an intermediate is the client's to judge. */
    if (mbedtls_x509_time_is_past(&s->chain.valid_to)) {
        set_err(err, errlen, "cert_file %s: the certificate expired on %s",
                path, x509_date(&s->chain.valid_to, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (mbedtls_x509_time_is_future(&s->chain.valid_from)) {
        set_err(err, errlen, "cert_file %s: the certificate is not valid "
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
        set_err(err, errlen, "key_file %s: the key is encrypted; a key "
                "without a passphrase is needed", path);
        goto out;
    }
    if (ret != 0) {
        set_err(err, errlen, "key_file %s: not a PEM private key (%s)",
                path, mbed_text(ret, ebuf, sizeof(ebuf)));
        goto out;
    }
    type = mbedtls_pk_get_type(&s->key);
    if (type != MBEDTLS_PK_RSA && type != MBEDTLS_PK_ECKEY) {
        set_err(err, errlen, "key_file %s: a %s key is not supported", path,
                mbedtls_pk_get_name(&s->key));
        goto out;
    }
    if (mbedtls_pk_check_pair(&s->chain.pk, &s->key) != 0) {
        set_err(err, errlen, "key_file %s does not match the certificate "
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
        set_err(err, errlen, "out of memory");
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
        set_err(err, errlen, "cannot make session ticket keys (%s)",
                mbed_text(ret, ebuf, sizeof(ebuf)));
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
 * The connection whose handshake this thread is running (handshake_steps()
 * sets it), for ticket_parse(), to which mbedTLS passes only the shared
 * context; NULL outside a handshake.
 */
static _Thread_local const struct tls_conn *handshaking;

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

    if (ret == 0
        && (handshaking == NULL
            || session->ciphersuite != suite_picked(s,
                                                    handshaking->ssl.in_msg)))
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
    set_err(err, errlen, "%s", "");
    if (o->min_version == 13) {
        set_err(err, errlen, "tls_min_version 1.3: this mbedTLS (%s) has "
                "no TLS 1.3 (mbedTLS 2.28 does not support it); use 1.2",
                MBEDTLS_VERSION_STRING);
        goto out;
    }
    if (o->min_version != 12) {
        set_err(err, errlen, "tls_min_version: 1.2 or 1.3, not %d",
                o->min_version);
        goto out;
    }
    if (o->handshake_timeout_ms <= 0) {
        set_err(err, errlen, "tls handshake timeout: must be > 0 ms");
        goto out;
    }
    if (o->session_timeout_s < 0) {
        set_err(err, errlen, "tls session timeout: must be >= 0 s");
        goto out;
    }
    s = gw_calloc(1, sizeof(*s));
    if (s == NULL) {
        rc = GW_ENOMEM;
        set_err(err, errlen, "out of memory");
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
        set_err(err, errlen, "cannot seed the random generator (%s)",
                mbed_text(ret, ebuf, sizeof(ebuf)));
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
        set_err(err, errlen, "cannot configure TLS (%s)",
                mbed_text(ret, ebuf, sizeof(ebuf)));
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

/* ---- the socket under mbedTLS ----------------------------------------- */

/* mbedTLS's send callback: never blocks, never raises SIGPIPE. */
static int
bio_send(void *ctx, const unsigned char *p, size_t len)
{
    struct tls_conn *c = ctx;
    ssize_t w;

    do
        w = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w == -1 && errno == EINTR);
    if (w >= 0)
        return (int)w;          /* mbedTLS never asks for more than INT_MAX */
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return MBEDTLS_ERR_SSL_WANT_WRITE;
    c->sys_err = errno;
    return errno == EPIPE || errno == ECONNRESET
           ? MBEDTLS_ERR_NET_CONN_RESET : MBEDTLS_ERR_NET_SEND_FAILED;
}

/* mbedTLS's receive callback; 0 is EOF to mbedTLS too. */
static int
bio_recv(void *ctx, unsigned char *p, size_t len)
{
    struct tls_conn *c = ctx;
    ssize_t r;

    do
        r = recv(c->fd, p, len, MSG_DONTWAIT);
    while (r == -1 && errno == EINTR);
    if (r > 0) {
        for (ssize_t i = 0; i < r && c->nfirst < sizeof(c->first); i++)
            c->first[c->nfirst++] = p[i];
        return (int)r;
    }
    if (r == 0)
        return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return MBEDTLS_ERR_SSL_WANT_READ;
    c->sys_err = errno;
    return errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET
                               : MBEDTLS_ERR_NET_RECV_FAILED;
}

/*
 * Do the first bytes look like an HTTP request line ("GET /", "POST ")?
 * A TLS record starts with a byte in 20..23, so no handshake looks so.
 */
static int
looks_like_http(const unsigned char *p, size_t n)
{
    size_t i;

    if (n < 4)
        return 0;
    for (i = 0; i < n && p[i] != ' '; i++)
        if (p[i] < 'A' || p[i] > 'Z')
            return 0;
    return i >= 3;
}

/*
 * The GW_E* code for mbedTLS's 'ret' after a failed read or write (not
 * WANT_READ/WANT_WRITE); the connection is dead from now on.
 */
static int
conn_failed(struct tls_conn *c, int ret)
{
    if (ret == 0 || ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY
        || ret == MBEDTLS_ERR_SSL_CONN_EOF
        || ret == MBEDTLS_ERR_NET_CONN_RESET)
        c->dead = GW_ECLOSED;
    else
        c->dead = GW_EIO;
    return c->dead;
}

/*
 * The fatal alert with which the client ended the handshake, or -1.
 * Either mbedTLS read it (FATAL_ALERT_MESSAGE; 2.28 leaves the record in
 * ssl.in_msg: level, description), or the client closed right after
 * sending it while we were still sending our flight, so that our send
 * failed first: then it is still unread, a plaintext record 21 (alert),
 * version 3.x, length 2, level 2 (fatal), description.
 */
static int
client_alert(struct tls_conn *c, int ret)
{
    unsigned char b[7];

    if (ret == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE)
        return c->ssl.in_msg[1];
    if ((ret == MBEDTLS_ERR_NET_CONN_RESET
         || ret == MBEDTLS_ERR_NET_SEND_FAILED)
        && recv(c->fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT) == sizeof(b)
        && b[0] == 21 && b[1] == 3 && b[3] == 0 && b[4] == 2 && b[5] == 2)
        return b[6];
    return -1;
}

/* The alerts that say the client does not accept our certificate. */
static const char *
cert_alert_name(int alert)
{
    switch (alert) {
    case MBEDTLS_SSL_ALERT_MSG_BAD_CERT:
        return "bad_certificate";
    case MBEDTLS_SSL_ALERT_MSG_UNSUPPORTED_CERT:
        return "unsupported_certificate";
    case MBEDTLS_SSL_ALERT_MSG_CERT_REVOKED:
        return "certificate_revoked";
    case MBEDTLS_SSL_ALERT_MSG_CERT_EXPIRED:
        return "certificate_expired";
    case MBEDTLS_SSL_ALERT_MSG_CERT_UNKNOWN:
        return "certificate_unknown";
    case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA:
        return "unknown_ca";
    }
    return NULL;
}

/* Why the handshake failed, as a GW_E* code and a line in 'err'. */
static int
handshake_failed(struct tls_conn *c, int ret, char *err, size_t errlen)
{
    const char *name;
    char ebuf[128];
    int rc = conn_failed(c, ret), alert = client_alert(c, ret);

    if (alert >= 0) {
        name = cert_alert_name(alert);
        if (name != NULL)
            set_err(err, errlen, "client refused our certificate (alert %d "
                    "%s)", alert, name);
        else
            set_err(err, errlen, "client aborted the handshake (alert %d)",
                    alert);
        return c->dead = GW_EPARSE;
    }
    if (rc == GW_ECLOSED) {
        set_err(err, errlen, "client closed the connection during the "
                "handshake");
        return rc;
    }
    if (ret == MBEDTLS_ERR_NET_SEND_FAILED
        || ret == MBEDTLS_ERR_NET_RECV_FAILED) {
        set_err(err, errlen, "socket error during the handshake: %s",
                strerror_r(c->sys_err, ebuf, sizeof(ebuf)));
        return rc;
    }
    if (ret == MBEDTLS_ERR_SSL_ALLOC_FAILED) {
        set_err(err, errlen, "out of memory during the handshake");
        return c->dead = GW_ENOMEM;
    }
    rc = c->dead = GW_EPARSE;
    if (looks_like_http(c->first, c->nfirst))
        set_err(err, errlen, "plain HTTP request on the TLS port");
    else if (ret == MBEDTLS_ERR_SSL_BAD_HS_PROTOCOL_VERSION)
        set_err(err, errlen, "client offered no TLS version >= 1.2");
    else if (ret == MBEDTLS_ERR_SSL_BAD_HS_CLIENT_HELLO
             && c->ssl.out_msgtype == MBEDTLS_SSL_MSG_ALERT
             && c->ssl.out_msg[1]
                == MBEDTLS_SSL_ALERT_MSG_NO_APPLICATION_PROTOCOL)
        /* The alert mbedTLS just sent (2.28 leaves it in ssl.out_msg). */
        set_err(err, errlen, "client offered ALPN without http/1.1");
    else if (ret == MBEDTLS_ERR_SSL_NO_CIPHER_CHOSEN
             || ret == MBEDTLS_ERR_SSL_NO_USABLE_CIPHERSUITE)
        /* NO_USABLE: suites in common, but none for our key or curves. */
        set_err(err, errlen, "no cipher suite in common with the client "
                "(offered: ECDHE with ChaCha20-Poly1305 or AES-GCM, signed "
                "by the certificate's key)");
    else
        set_err(err, errlen, "TLS handshake failed (%s)",
                mbed_text(ret, ebuf, sizeof(ebuf)));
    return rc;
}

/* ---- connections ------------------------------------------------------ */

/*
 * mbedtls_ssl_handshake(), which is this same loop, but looking at the
 * state after each step to tell a resumed handshake from a full one: a
 * full TLS 1.2 handshake reads the client's key exchange, an abbreviated
 * one (RFC 5246 section 7.3, figure 2) has none.  OUT *full: set to 1
 * once mbedTLS is in the state that reads it (it stays there while it
 * waits for it, so a WANT_READ cannot hide it).  Returns 0,
 * MBEDTLS_ERR_SSL_WANT_READ/WRITE or mbedTLS's error.
 */
static int
handshake_steps(struct tls_conn *c, int *full)
{
    int ret = 0;

    handshaking = c;
    while (ret == 0 && c->ssl.state != MBEDTLS_SSL_HANDSHAKE_OVER) {
        ret = mbedtls_ssl_handshake_step(&c->ssl);
        if (c->ssl.state == MBEDTLS_SSL_CLIENT_KEY_EXCHANGE)
            *full = 1;
    }
    handshaking = NULL;
    return ret;
}

int
tls_accept(struct tls_server *s, int fd, int64_t deadline, int wake_fd,
           struct tls_conn **out, char *err, size_t errlen)
{
    struct tls_conn *c = NULL;
    int64_t start = gw_now_ms(), end = start + s->handshake_timeout_ms;
    int ret, full = 0, rc = GW_ENOMEM;

    *out = NULL;
    set_err(err, errlen, "%s", "");
    if (deadline >= 0 && deadline < end)
        end = deadline;
    c = gw_calloc(1, sizeof(*c));
    if (c == NULL) {
        set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_init(&c->ssl);
    c->fd = fd;
    c->want = POLLIN;
    ret = mbedtls_ssl_setup(&c->ssl, &s->conf);
    if (ret != 0) {
        set_err(err, errlen, "out of memory");
        goto out;
    }
    mbedtls_ssl_set_bio(&c->ssl, c, bio_send, bio_recv, NULL);
    for (;;) {
        ret = handshake_steps(c, &full);
        if (ret == 0)
            break;
        if (ret != MBEDTLS_ERR_SSL_WANT_READ
            && ret != MBEDTLS_ERR_SSL_WANT_WRITE) {
            rc = handshake_failed(c, ret, err, errlen);
            goto out;
        }
        rc = net_wait(fd, ret == MBEDTLS_ERR_SSL_WANT_READ ? POLLIN : POLLOUT,
                      end, wake_fd);
        if (rc != 0) {
            if (rc == GW_ETIMEDOUT)
                set_err(err, errlen, "TLS handshake not done in %lld ms",
                        (long long)(end - start));
            else
                set_err(err, errlen, "TLS handshake abandoned: %s",
                        rc == GW_EABORTED ? "the server is draining"
                                          : "poll failed");
            goto out;
        }
    }
    *out = c;
    c = NULL;
    rc = 0;

out:
    count(s, rc, rc == 0 && !full);
    if (c != NULL) {
        mbedtls_ssl_free(&c->ssl);
        gw_free(c);
    }
    return rc;
}

size_t
tls_pending(const struct tls_conn *c)
{
    return mbedtls_ssl_get_bytes_avail(&c->ssl);
}

short
tls_want(const struct tls_conn *c)
{
    return c->want;
}

int
tls_read(struct tls_conn *c, void *p, size_t len, size_t *got)
{
    int ret;

    assert(len > 0);
    assert(c->wlen == 0);       /* tls.h: finish the write first */
    *got = 0;
    if (c->dead != 0)
        return c->dead;
    ret = mbedtls_ssl_read(&c->ssl, p, len);
    if (ret > 0) {
        *got = (size_t)ret;
        return 0;
    }
    if (ret == MBEDTLS_ERR_SSL_WANT_READ)
        c->want = POLLIN;
    else
        /*
         * WANT_WRITE: mbedTLS had to answer something (a renegotiation
         * attempt) and the socket is full.  Its alert would then be
         * flushed in place of our next record (see the top), so give up
         * on the connection instead.
         */
        conn_failed(c, ret == MBEDTLS_ERR_SSL_WANT_WRITE
                       ? MBEDTLS_ERR_SSL_INTERNAL_ERROR : ret);
    return c->dead != 0 ? c->dead : GW_EAGAIN;
}

int
tls_read_deadline(struct tls_conn *c, void *p, size_t len, int64_t deadline,
                  int wake_fd, size_t *n)
{
    int rc;

    for (;;) {
        rc = tls_read(c, p, len, n);
        if (rc != GW_EAGAIN)
            return rc;
        rc = net_wait(c->fd, c->want, deadline, wake_fd);
        if (rc != 0)
            return rc;
    }
}

/* Does 'iov' start with the 'len' bytes at 'p'?  (tls.h's retry rule.) */
static int
iov_starts_with(const struct iovec *iov, int iovcnt, const unsigned char *p,
                size_t len)
{
    size_t k;

    for (int i = 0; i < iovcnt && len > 0; i++) {
        k = iov[i].iov_len < len ? iov[i].iov_len : len;
        if (memcmp(iov[i].iov_base, p, k) != 0)
            return 0;
        p += k;
        len -= k;
    }
    return len == 0;
}

/*
 * The next record's plaintext: up to 'max' bytes of 'iov' from byte 'off'.
 * OUT *p: where they are - in place when one iovec holds them all, else
 * gathered into c->wbuf.  Returns their count (0: nothing left).
 */
static size_t
next_record(struct tls_conn *c, const struct iovec *iov, int iovcnt,
            size_t off, size_t max, const unsigned char **p)
{
    size_t n = 0, k;
    int i;

    for (i = 0; i < iovcnt && off >= iov[i].iov_len; i++)
        off -= iov[i].iov_len;
    if (i == iovcnt)
        return 0;
    if (iov[i].iov_len - off >= max || i == iovcnt - 1) {
        *p = (const unsigned char *)iov[i].iov_base + off;
        return iov[i].iov_len - off < max ? iov[i].iov_len - off : max;
    }
    for (; i < iovcnt && n < max; i++, off = 0) {
        k = iov[i].iov_len - off < max - n ? iov[i].iov_len - off : max - n;
        memcpy(c->wbuf + n, (const char *)iov[i].iov_base + off, k);
        n += k;
    }
    *p = c->wbuf;
    return n;
}

int
tls_writev_some(struct tls_conn *c, const struct iovec *iov, int iovcnt,
                size_t *n)
{
    const unsigned char *p;
    size_t taken = 0, max, k;
    int ret;

    *n = 0;
    if (c->dead != 0)
        return c->dead;
    ret = mbedtls_ssl_get_max_out_record_payload(&c->ssl);
    max = ret > 0 && ret < TLS_RECORD_MAX ? (size_t)ret : TLS_RECORD_MAX;
    c->want = POLLOUT;
    if (c->wlen > 0) {
        /* The record mbedTLS half sent: the same call again, from the copy. */
        assert(iov_starts_with(iov, iovcnt, c->wbuf, c->wlen));
        ret = mbedtls_ssl_write(&c->ssl, c->wbuf, c->wlen);
        if (ret == MBEDTLS_ERR_SSL_WANT_WRITE)
            return 0;
        if (ret < 0)
            return conn_failed(c, ret);
        taken = c->wlen;
        c->wlen = 0;
    }
    while ((k = next_record(c, iov, iovcnt, taken, max, &p)) > 0) {
        ret = mbedtls_ssl_write(&c->ssl, p, k);
        if (ret > 0) {
            taken += (size_t)ret;
            continue;
        }
        /* (No WANT_READ: without renegotiation, writes never read.) */
        if (ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
            /* Encrypted and partly sent: keep its plaintext for the retry. */
            if (p != c->wbuf)
                memcpy(c->wbuf, p, k);
            c->wlen = k;
        } else if (taken == 0) {
            return conn_failed(c, ret);
        } else {
            conn_failed(c, ret);        /* the next call reports it */
        }
        break;
    }
    *n = taken;
    return 0;
}

int
tls_write(struct tls_conn *c, const void *p, size_t len, size_t *n)
{
    struct iovec iov;
    int rc;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    rc = tls_writev_some(c, &iov, 1, n);
    if (rc == 0 && *n == 0 && len > 0)
        return GW_EAGAIN;
    return rc;
}

int
tls_writev_all(struct tls_conn *c, struct iovec *iov, int iovcnt,
               int64_t deadline, int wake_fd)
{
    size_t w;
    int rc;

    for (;;) {
        while (iovcnt > 0 && iov[0].iov_len == 0) {
            iov++;
            iovcnt--;
        }
        if (iovcnt == 0)
            return 0;
        rc = tls_writev_some(c, iov, iovcnt, &w);
        if (rc != 0)
            return rc;
        if (w == 0) {
            rc = net_wait(c->fd, c->want, deadline, wake_fd);
            if (rc != 0)
                return rc;
            continue;
        }
        while (iovcnt > 0 && w >= iov[0].iov_len) {
            w -= iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + w;
            iov[0].iov_len -= w;
        }
    }
}

int
tls_write_all(struct tls_conn *c, const void *p, size_t len,
              int64_t deadline, int wake_fd)
{
    struct iovec iov;

    iov.iov_base = (void *)p;
    iov.iov_len = len;
    return tls_writev_all(c, &iov, 1, deadline, wake_fd);
}

void
tls_close(struct tls_conn *c)
{
    if (c == NULL)
        return;
    /*
     * Best effort: a socket that cannot take the alert now does not get
     * it.  After a broken record mbedTLS must not be used at all.
     */
    if (c->dead == 0 || c->dead == GW_ECLOSED)
        mbedtls_ssl_close_notify(&c->ssl);
    mbedtls_ssl_free(&c->ssl);
    gw_free(c);
}

/* ---- as a net.h stream ---- */

static int
stream_read(struct net_stream *s, void *p, size_t len, int64_t deadline,
            int wake_fd, size_t *n)
{
    return tls_read_deadline(s->impl, p, len, deadline, wake_fd, n);
}

static int
stream_writev_some(struct net_stream *s, const struct iovec *iov, int iovcnt,
                   size_t *n)
{
    return tls_writev_some(s->impl, iov, iovcnt, n);
}

static int
stream_writev_all(struct net_stream *s, struct iovec *iov, int iovcnt,
                  int64_t deadline, int wake_fd)
{
    return tls_writev_all(s->impl, iov, iovcnt, deadline, wake_fd);
}

static size_t
stream_pending(const struct net_stream *s)
{
    return tls_pending(s->impl);
}

static const struct net_stream_ops stream_ops = {
    stream_read, stream_writev_some, stream_writev_all, stream_pending,
};

void
tls_stream_init(struct net_stream *s, struct tls_conn *c)
{
    net_stream_init_ops(s, c->fd, &stream_ops, c);
}
