/* SPDX-License-Identifier: MIT */
/*
 * check_tls.c - unit tests for the tls module, gateway/wire/tls.c and
 * tls_server.c: server-side TLS over a socket, against an mbedTLS client
 * in a thread (over a socketpair) and against libcurl with OpenSSL (over
 * loopback TCP).
 *
 * The certificates come from tools/mkcert.c, included here with its
 * main() left out: main() below makes them once, in a fresh temporary
 * directory, before the forked test cases run.  That way the tests use
 * exactly what the tool makes, and do not depend on the tool being built.
 */
#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/x509_crt.h>

#include "alloc.h"
#include "net.h"
#include "wire/tls.h"
#include "util.h"
#include "testutil.h"

#define MKCERT_NO_MAIN
#include "../../tools/mkcert.c"

#define BIG (1024 * 1024)
#define HS_TIMEOUT_MS 3000
#define SESSION_S 3600          /* the fixture's tls_session_timeout */

static char certdir[64];                /* set in main(), before any fork */

/*
 * certdir/NAME, in one of a few rotating static buffers: for the test's
 * own thread only.
 */
static const char *
cert(const char *name)
{
    static char bufs[4][128];
    static int next;
    char *b = bufs[next++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", certdir, name);
    return b;
}

/* ---- fixture: one server per test case, from mkcert's server.pem ---- */

static struct tls_server *srv;
static struct tls_stats stats;

static void
setup(void)
{
    struct tls_server_opts o = {
        cert("server.pem"), cert("server.key"), 12, HS_TIMEOUT_MS, &stats,
        SESSION_S, NULL,
    };
    char err[256];

    memset(&stats, 0, sizeof(stats));
    ck_assert_msg(tls_server_new(&o, &srv, err, sizeof(err)) == 0, "%s",
                  err);
}

static void
teardown(void)
{
    tls_server_free(srv);
    srv = NULL;
}

/* A connected pair: sv[0] non-blocking for the server, sv[1] blocking. */
static void
pair(int sv[2], int sndbuf)
{
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
                     0);
    ck_assert_int_eq(net_set_nonblock(sv[0]), 0);
    if (sndbuf > 0)
        ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf,
                                    sizeof(sndbuf)), 0);
}

static void
sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* The byte at offset 'i' of test stream 'seed'. */
static unsigned char
pattern(size_t i, unsigned seed)
{
    return (unsigned char)((i * 131 + (i >> 12) * 7 + seed) & 0xff);
}

static unsigned char *
pattern_new(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);

    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(i, seed);
    return p;
}

/* ---- the client: mbedTLS in a thread, blocking I/O ---- */

struct client {
    /* set by the test */
    int fd;                     /* the client's end; closed when it ends */
    char ca[128];               /* trusted CA file (client_init: ca.pem) */
    const char *alpn[3];        /* offered, NULL-terminated; none if empty */
    int max_minor;              /* 0: TLS 1.2; else MBEDTLS_SSL_MINOR_... */
    int trickle_ms;             /* > 0: send one byte, then sleep */
    int distrust_ms;            /* > 0: refuse the certificate, so late */
    const int *suites;          /* offer only these (0-terminated); NULL:
                                   mbedTLS's defaults */
    const mbedtls_ssl_session *resume;  /* NULL, or offer it back */
    mbedtls_ssl_session *saved; /* NULL, or OUT: the session (and ticket)
                                   of a good handshake */
    int (*script)(struct client *);     /* after a good handshake */
    int go[2];                  /* the test releases the script: go_client */
    size_t len;                 /* for scripts: how many bytes */
    pthread_barrier_t *start;   /* NULL, or wait here before starting */
    /* set by the thread */
    mbedtls_ssl_context ssl;
    int hs_ret;                 /* mbedtls_ssl_handshake()'s result */
    char alpn_got[32];
    char suite_got[64];         /* the cipher suite negotiated */
    int fail_line;              /* a failed CL_CHECK in the script */
    pthread_t thread;
};

/* A check inside a client script: failures are asserted by the test. */
#define CL_CHECK(cl, cond)                                              \
    do {                                                                \
        if (!(cond)) {                                                  \
            (cl)->fail_line = __LINE__;                                 \
            return -1;                                                  \
        }                                                               \
    } while (0)

static int
cl_send(void *ctx, const unsigned char *p, size_t len)
{
    struct client *cl = ctx;
    ssize_t w;

    if (cl->trickle_ms > 0 && len > 1)
        len = 1;
    w = send(cl->fd, p, len, MSG_NOSIGNAL);
    if (w < 0)
        return MBEDTLS_ERR_NET_SEND_FAILED;
    if (cl->trickle_ms > 0)
        sleep_ms(cl->trickle_ms);
    return (int)w;
}

static int
cl_recv(void *ctx, unsigned char *p, size_t len)
{
    struct client *cl = ctx;
    ssize_t r = recv(cl->fd, p, len, 0);

    return r < 0 ? MBEDTLS_ERR_NET_RECV_FAILED : (int)r;
}

static int
cl_write_all(struct client *cl, const void *p, size_t len)
{
    const unsigned char *q = p;
    int ret;

    while (len > 0) {
        ret = mbedtls_ssl_write(&cl->ssl, q, len);
        if (ret <= 0)
            return -1;
        q += ret;
        len -= (size_t)ret;
    }
    return 0;
}

static int
cl_read_exact(struct client *cl, void *p, size_t len)
{
    unsigned char *q = p;
    int ret;

    while (len > 0) {
        ret = mbedtls_ssl_read(&cl->ssl, q, len);
        if (ret <= 0)
            return -1;
        q += ret;
        len -= (size_t)ret;
    }
    return 0;
}

/* A verify callback: refuse the server's certificate after a pause. */
static int
cl_distrust(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags)
{
    struct client *cl = ctx;

    (void)crt;
    if (depth == 0) {
        sleep_ms(cl->distrust_ms);
        *flags |= MBEDTLS_X509_BADCERT_NOT_TRUSTED;
    }
    return 0;
}

/* In a script: wait until the test calls go_client(). */
static void
cl_wait_go(struct client *cl)
{
    char x;

    while (read(cl->go[0], &x, 1) == -1 && errno == EINTR)
        ;
}

static void
go_client(struct client *cl)
{
    ck_assert_int_eq(write(cl->go[1], "g", 1), 1);
}

static void *
client_main(void *arg)
{
    struct client *cl = arg;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_x509_crt ca;
    mbedtls_ssl_config conf;
    const char *alpn;
    int ret;

    if (cl->start != NULL)
        pthread_barrier_wait(cl->start);
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    mbedtls_x509_crt_init(&ca);
    mbedtls_ssl_config_init(&conf);
    mbedtls_ssl_init(&cl->ssl);
    ret = mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy,
                                NULL, 0);
    if (ret == 0)
        ret = mbedtls_x509_crt_parse_file(&ca, cl->ca);
    if (ret == 0)
        ret = mbedtls_ssl_config_defaults(&conf, MBEDTLS_SSL_IS_CLIENT,
                                          MBEDTLS_SSL_TRANSPORT_STREAM,
                                          MBEDTLS_SSL_PRESET_DEFAULT);
    if (ret == 0) {
        mbedtls_ssl_conf_authmode(&conf, MBEDTLS_SSL_VERIFY_REQUIRED);
        mbedtls_ssl_conf_ca_chain(&conf, &ca, NULL);
        mbedtls_ssl_conf_rng(&conf, mbedtls_ctr_drbg_random, &drbg);
        if (cl->max_minor != 0) {
            mbedtls_ssl_conf_min_version(&conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                         MBEDTLS_SSL_MINOR_VERSION_1);
            mbedtls_ssl_conf_max_version(&conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                         cl->max_minor);
        }
        if (cl->distrust_ms > 0)
            mbedtls_ssl_conf_verify(&conf, cl_distrust, cl);
        if (cl->suites != NULL)
            mbedtls_ssl_conf_ciphersuites(&conf, cl->suites);
        if (cl->alpn[0] != NULL)
            ret = mbedtls_ssl_conf_alpn_protocols(&conf, cl->alpn);
    }
    if (ret == 0)
        ret = mbedtls_ssl_setup(&cl->ssl, &conf);
    if (ret == 0)
        ret = mbedtls_ssl_set_hostname(&cl->ssl, "localhost");
    if (ret == 0 && cl->resume != NULL)
        ret = mbedtls_ssl_set_session(&cl->ssl, cl->resume);
    if (ret == 0) {
        mbedtls_ssl_set_bio(&cl->ssl, cl, cl_send, cl_recv, NULL);
        ret = mbedtls_ssl_handshake(&cl->ssl);
    }
    cl->hs_ret = ret;
    if (ret == 0 && cl->saved != NULL
        && mbedtls_ssl_get_session(&cl->ssl, cl->saved) != 0)
        cl->fail_line = __LINE__;
    if (ret == 0) {
        alpn = mbedtls_ssl_get_alpn_protocol(&cl->ssl);
        snprintf(cl->alpn_got, sizeof(cl->alpn_got), "%s",
                 alpn != NULL ? alpn : "");
        snprintf(cl->suite_got, sizeof(cl->suite_got), "%s",
                 mbedtls_ssl_get_ciphersuite(&cl->ssl));
        if (cl->script != NULL)
            cl->script(cl);
    }
    mbedtls_ssl_free(&cl->ssl);
    mbedtls_ssl_config_free(&conf);
    mbedtls_x509_crt_free(&ca);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
    close(cl->fd);
    return NULL;
}

/* Prepare 'cl' on the client end 'fd' with the defaults: h2 + http/1.1. */
static void
client_init(struct client *cl, int fd)
{
    memset(cl, 0, sizeof(*cl));
    cl->fd = fd;
    snprintf(cl->ca, sizeof(cl->ca), "%s", cert("ca.pem"));
    cl->alpn[0] = "h2";
    cl->alpn[1] = "http/1.1";
    ck_assert_int_eq(pipe(cl->go), 0);
}

static void
client_start(struct client *cl)
{
    ck_assert_int_eq(pthread_create(&cl->thread, NULL, client_main, cl), 0);
}

static void
client_join(struct client *cl)
{
    ck_assert_int_eq(pthread_join(cl->thread, NULL), 0);
    close(cl->go[0]);
    close(cl->go[1]);
    ck_assert_msg(cl->fail_line == 0, "client script failed at line %d",
                  cl->fail_line);
}

/* Accept on 'fd' with a deadline 'ms' from now; OUT *c. */
static int
accept_ms(int fd, int ms, struct tls_conn **c, char *err, size_t errlen)
{
    return tls_accept(srv, fd, gw_now_ms() + ms, -1, c, err, errlen);
}

/* ---- handshakes ---- */

static int
script_ping(struct client *cl)
{
    char buf[8];

    CL_CHECK(cl, cl_write_all(cl, "ping", 4) == 0);
    CL_CHECK(cl, cl_read_exact(cl, buf, 4) == 0);
    CL_CHECK(cl, memcmp(buf, "pong", 4) == 0);
    /* tls_close() sent close_notify. */
    CL_CHECK(cl, mbedtls_ssl_read(&cl->ssl, (unsigned char *)buf,
                                  sizeof(buf))
                 == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY);
    return 0;
}

/*
 * The server's side of script_ping, on 's': returns tls_accept()'s code
 * (its reason in 'err'); after a good handshake the ping is asserted.
 */
static int
ping_server(struct tls_server *s, int fd, char *err, size_t errlen)
{
    struct tls_conn *c;
    char buf[8];
    size_t n;
    int rc;

    rc = tls_accept(s, fd, gw_now_ms() + 5000, -1, &c, err, errlen);
    if (rc != 0)
        return rc;
    ck_assert_int_eq(tls_read_deadline(c, buf, 4, gw_now_ms() + 5000, -1,
                                       &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert(memcmp(buf, "ping", 4) == 0);
    ck_assert_int_eq(tls_write_all(c, "pong", 4, gw_now_ms() + 5000, -1), 0);
    tls_close(c);
    return 0;
}

/* The same with the fixture's server, which must accept. */
static void
serve_ping(int fd)
{
    char err[256];

    ck_assert_msg(ping_server(srv, fd, err, sizeof(err)) == 0, "%s", err);
}

START_TEST(test_handshake_alpn)
{
    struct client cl;
    int sv[2];

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.script = script_ping;
    client_start(&cl);
    serve_ping(sv[0]);
    client_join(&cl);
    close(sv[0]);
    ck_assert_int_eq(cl.hs_ret, 0);
    ck_assert_str_eq(cl.alpn_got, "http/1.1");
    ck_assert_uint_eq(atomic_load(&stats.handshakes), 1);
}
END_TEST

START_TEST(test_handshake_without_alpn)
{
    struct client cl;
    int sv[2];

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.alpn[0] = NULL;
    cl.script = script_ping;
    client_start(&cl);
    serve_ping(sv[0]);
    client_join(&cl);
    close(sv[0]);
    ck_assert_int_eq(cl.hs_ret, 0);
    ck_assert_str_eq(cl.alpn_got, "");
}
END_TEST

/*
 * A handshake the server must refuse: the client is set up by 'how';
 * the server's code must be 'want_rc' with 'want_err' in its message.
 */
static void
refused(void (*how)(struct client *), int want_rc, const char *want_err)
{
    struct tls_conn *c = NULL;
    struct client cl;
    char err[256];
    int sv[2], rc;

    pair(sv, 0);
    client_init(&cl, sv[1]);
    how(&cl);
    client_start(&cl);
    rc = accept_ms(sv[0], 5000, &c, err, sizeof(err));
    close(sv[0]);
    client_join(&cl);
    ck_assert_msg(rc == want_rc, "rc %d (%s), want %d", rc, err, want_rc);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err, want_err) != NULL, "err \"%s\", want \"%s\"",
                  err, want_err);
    ck_assert_int_ne(cl.hs_ret, 0);
    ck_assert_uint_eq(atomic_load(&stats.handshakes), 0);
    ck_assert_uint_eq(atomic_load(&stats.failed_protocol), 1);
}

static void
offer_h2_only(struct client *cl)
{
    cl->alpn[0] = "h2";
    cl->alpn[1] = NULL;
}

static void
offer_tls11(struct client *cl)
{
    cl->max_minor = MBEDTLS_SSL_MINOR_VERSION_2;
}

static void
offer_tls10(struct client *cl)
{
    cl->max_minor = MBEDTLS_SSL_MINOR_VERSION_1;
}

static void
trust_other_ca(struct client *cl)
{
    snprintf(cl->ca, sizeof(cl->ca), "%s", cert("other-ca.pem"));
}

/*
 * The client refuses our certificate only once the server has sent its
 * whole flight and waits for an answer: the server reads the alert.
 */
static void
distrust_late(struct client *cl)
{
    cl->distrust_ms = 200;
}

START_TEST(test_late_alert_read)
{
    refused(distrust_late, GW_EPARSE, "client refused our certificate "
            "(alert 48 unknown_ca)");
}
END_TEST

START_TEST(test_alpn_h2_only_refused)
{
    /* RFC 7301 3.2: no_application_protocol, as nginx >= 1.21.4 does. */
    refused(offer_h2_only, GW_EPARSE, "ALPN without http/1.1");
}
END_TEST

START_TEST(test_tls11_refused)
{
    refused(offer_tls11, GW_EPARSE, "no TLS version >= 1.2");
}
END_TEST

START_TEST(test_tls10_refused)
{
    refused(offer_tls10, GW_EPARSE, "no TLS version >= 1.2");
}
END_TEST

START_TEST(test_wrong_ca_refused)
{
    refused(trust_other_ca, GW_EPARSE, "client refused our certificate");
}
END_TEST

/* ---- garbage, trickles, hang-ups and drains during the handshake ---- */

static void
garbage(const char *bytes, size_t len, const char *want_err)
{
    struct tls_conn *c = NULL;
    char err[256];
    int sv[2], rc;
    int64_t t0;

    pair(sv, 0);
    ck_assert_int_eq(write(sv[1], bytes, len), (ssize_t)len);
    t0 = gw_now_ms();
    rc = accept_ms(sv[0], 5000, &c, err, sizeof(err));
    /* Refused on the first bytes, not left to time out. */
    ck_assert_int_lt(gw_now_ms() - t0, 1000);
    ck_assert_msg(rc == GW_EPARSE, "rc %d (%s)", rc, err);
    ck_assert_msg(strstr(err, want_err) != NULL, "err \"%s\"", err);
    ck_assert_uint_eq(atomic_load(&stats.failed_protocol), 1);
    close(sv[0]);
    close(sv[1]);
}

START_TEST(test_plain_http)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";

    garbage(req, sizeof(req) - 1, "plain HTTP request on the TLS port");
}
END_TEST

START_TEST(test_plain_http_post)
{
    static const char req[] = "POST /v1/chat/completions HTTP/1.1\r\n";

    garbage(req, sizeof(req) - 1, "plain HTTP request on the TLS port");
}
END_TEST

START_TEST(test_garbage)
{
    static const char junk[] = "\x01\x02\x03\x04\x05 not TLS at all";

    garbage(junk, sizeof(junk) - 1, "TLS handshake failed");
}
END_TEST

START_TEST(test_trickle_cut_at_deadline)
{
    struct tls_conn *c = NULL;
    struct client cl;
    char err[256];
    int sv[2], rc;
    int64_t t0, took;

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.trickle_ms = 100;        /* a ClientHello byte every 100 ms */
    client_start(&cl);
    t0 = gw_now_ms();
    rc = accept_ms(sv[0], 700, &c, err, sizeof(err));
    took = gw_now_ms() - t0;
    close(sv[0]);               /* the client's next send fails */
    client_join(&cl);
    ck_assert_msg(rc == GW_ETIMEDOUT, "rc %d (%s)", rc, err);
    ck_assert_msg(took >= 650 && took < 1500, "took %lld ms",
                  (long long)took);
    ck_assert_uint_eq(atomic_load(&stats.failed_timeout), 1);
}
END_TEST

START_TEST(test_handshake_timeout_from_opts)
{
    struct tls_server_opts o = {
        cert("server.pem"), cert("server.key"), 12, 300, &stats, SESSION_S,
        NULL,
    };
    struct tls_server *s;
    struct tls_conn *c = NULL;
    char err[256];
    int sv[2], rc;
    int64_t t0, took;

    ck_assert_int_eq(tls_server_new(&o, &s, err, sizeof(err)), 0);
    pair(sv, 0);
    t0 = gw_now_ms();
    /* The caller's deadline is later: the server's 300 ms win. */
    rc = tls_accept(s, sv[0], gw_now_ms() + 5000, -1, &c, err, sizeof(err));
    took = gw_now_ms() - t0;
    ck_assert_int_eq(rc, GW_ETIMEDOUT);
    ck_assert_msg(took >= 280 && took < 1000, "took %lld", (long long)took);
    close(sv[0]);
    close(sv[1]);
    tls_server_free(s);
}
END_TEST

START_TEST(test_client_closes)
{
    struct tls_conn *c = NULL;
    char err[256];
    int sv[2];

    pair(sv, 0);
    close(sv[1]);
    ck_assert_int_eq(accept_ms(sv[0], 5000, &c, err, sizeof(err)),
                     GW_ECLOSED);
    ck_assert_uint_eq(atomic_load(&stats.failed_other), 1);
    close(sv[0]);
}
END_TEST

START_TEST(test_wake_aborts)
{
    struct tls_conn *c = NULL;
    char err[256];
    int sv[2], wake[2];
    int64_t t0;

    pair(sv, 0);
    ck_assert_int_eq(pipe(wake), 0);
    ck_assert_int_eq(write(wake[1], "x", 1), 1);
    t0 = gw_now_ms();
    ck_assert_int_eq(tls_accept(srv, sv[0], gw_now_ms() + 5000, wake[0], &c,
                                err, sizeof(err)), GW_EABORTED);
    ck_assert_int_lt(gw_now_ms() - t0, 1000);
    ck_assert_uint_eq(atomic_load(&stats.failed_other), 1);
    close(wake[0]);
    close(wake[1]);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

/* ---- data ---- */

/* Client: send BIG bytes of stream 1, then read BIG of stream 2 slowly. */
static int
script_big(struct client *cl)
{
    unsigned char *out = pattern_new(BIG, 1), buf[4096];
    size_t got = 0;
    int ret;

    CL_CHECK(cl, cl_write_all(cl, out, BIG) == 0);
    free(out);
    while (got < BIG) {
        ret = mbedtls_ssl_read(&cl->ssl, buf, sizeof(buf));
        CL_CHECK(cl, ret > 0);
        for (int i = 0; i < ret; i++)
            CL_CHECK(cl, buf[i] == pattern(got + (size_t)i, 2));
        got += (size_t)ret;
        if (got % (64 * 1024) < sizeof(buf))
            sleep_ms(5);        /* a slow reader: the server must wait */
    }
    return 0;
}

START_TEST(test_big_both_ways)
{
    unsigned char *in = malloc(BIG), *out = pattern_new(BIG, 2);
    struct tls_conn *c;
    struct client cl;
    char err[256];
    size_t got = 0, n;
    int sv[2];

    ck_assert_ptr_nonnull(in);
    pair(sv, 16384);            /* a small send buffer: many waits */
    client_init(&cl, sv[1]);
    cl.script = script_big;
    client_start(&cl);
    ck_assert_msg(accept_ms(sv[0], 5000, &c, err, sizeof(err)) == 0, "%s",
                  err);
    while (got < BIG) {
        ck_assert_int_eq(tls_read_deadline(c, in + got, BIG - got,
                                           gw_now_ms() + 5000, -1, &n), 0);
        got += n;
    }
    for (size_t i = 0; i < BIG; i++)
        if (in[i] != pattern(i, 1))
            ck_abort_msg("byte %zu differs", i);
    ck_assert_int_eq(tls_write_all(c, out, BIG, gw_now_ms() + 8000, -1), 0);
    client_join(&cl);
    tls_close(c);
    close(sv[0]);
    free(in);
    free(out);
}
END_TEST

/* Client: wait for go, then read cl->len bytes of stream 3 and check. */
static int
script_drain(struct client *cl)
{
    unsigned char buf[16384];
    size_t got = 0;
    int ret;

    cl_wait_go(cl);
    while (got < cl->len) {
        ret = mbedtls_ssl_read(&cl->ssl, buf, sizeof(buf));
        CL_CHECK(cl, ret > 0);
        for (int i = 0; i < ret; i++)
            CL_CHECK(cl, buf[i] == pattern(got + (size_t)i, 3));
        got += (size_t)ret;
    }
    /*
     * Then close_notify, or EOF: tls_close() does not wait for a full
     * socket to take its alert, and the server closes right after.
     */
    ret = mbedtls_ssl_read(&cl->ssl, buf, sizeof(buf));
    CL_CHECK(cl, ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || ret == 0);
    return 0;
}

/*
 * Split the 'len' bytes at 'p' into up to 4 iovecs, differently on each
 * call ('round'): a retry need only offer the same bytes, not the same
 * pieces.
 */
static int
split(const unsigned char *p, size_t len, unsigned round, struct iovec *iov)
{
    size_t cut[3] = { round % 7, round % 5 * 1000 + 1, round % 3 * 9000 };
    size_t off = 0;
    int n = 0;

    for (int i = 0; i < 3 && off < len; i++) {
        size_t k = cut[i] < len - off ? cut[i] : len - off;

        iov[n].iov_base = (void *)(p + off);
        iov[n++].iov_len = k;
        off += k;
    }
    iov[n].iov_base = (void *)(p + off);
    iov[n++].iov_len = len - off;
    return n;
}

/*
 * Write 'len' bytes of stream 3 without blocking into a client that does
 * not read yet, until the socket is full; then let it read and finish.
 * 'vector': through tls_writev_some() with a new split every call.
 */
static void
write_when_full(int vector)
{
    const size_t len = 4 * BIG;
    unsigned char *out = pattern_new(len, 3);
    struct tls_conn *c;
    struct client cl;
    struct iovec iov[4];
    char err[256];
    size_t off = 0, n;
    int sv[2], rc, partial = 0, blocked = 0;
    unsigned round = 0;

    pair(sv, 32768);
    client_init(&cl, sv[1]);
    cl.script = script_drain;
    cl.len = len;
    client_start(&cl);
    ck_assert_msg(accept_ms(sv[0], 5000, &c, err, sizeof(err)) == 0, "%s",
                  err);
    while (off < len) {
        if (vector) {
            rc = tls_writev_some(c, iov, split(out + off, len - off, round++,
                                               iov), &n);
            if (rc == 0 && n == 0)
                rc = GW_EAGAIN;
        } else {
            rc = tls_write(c, out + off, len - off, &n);
        }
        if (rc == GW_EAGAIN) {
            ck_assert_uint_eq(n, 0);
            ck_assert_int_eq(tls_want(c), POLLOUT);
            if (blocked++ == 0) {
                /* Really full: a second try takes nothing either. */
                ck_assert_int_eq(tls_write(c, out + off, len - off, &n),
                                 GW_EAGAIN);
                go_client(&cl);
            }
            ck_assert_int_eq(net_wait(sv[0], tls_want(c), gw_now_ms() + 5000,
                                      -1), 0);
            continue;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_uint_gt(n, 0);
        ck_assert_uint_le(n, len - off);
        if (n < len - off)
            partial++;
        off += n;
    }
    ck_assert_int_gt(blocked, 0);
    ck_assert_int_gt(partial, 0);
    tls_close(c);
    close(sv[0]);
    client_join(&cl);
    free(out);
}

START_TEST(test_write_eagain_then_complete)
{
    write_when_full(0);
}
END_TEST

START_TEST(test_writev_eagain_resplit)
{
    write_when_full(1);
}
END_TEST

/*
 * Fill the socket of a client that does not read, until a write is left
 * unfinished; OUT *c, *off (bytes taken).  The client waits for go.
 */
static void
fill_until_blocked(struct client *cl, int sv[2], unsigned char *out,
                   struct tls_conn **c, size_t *off)
{
    char err[256];
    size_t n;
    int rc;

    pair(sv, 32768);
    client_init(cl, sv[1]);
    cl->script = script_drain;
    cl->len = BIG;
    client_start(cl);
    ck_assert_msg(accept_ms(sv[0], 5000, c, err, sizeof(err)) == 0, "%s",
                  err);
    *off = 0;
    while ((rc = tls_write(*c, out + *off, BIG - *off, &n)) == 0)
        *off += n;
    ck_assert_int_eq(rc, GW_EAGAIN);
    /* Quiet: the assert's message is expected. */
    ck_assert_int_ne(dup2(open("/dev/null", O_WRONLY), 2), -1);
}

/* A retry with other bytes than the refused ones is a bug: it aborts. */
START_TEST(test_write_retry_other_bytes_aborts)
{
    unsigned char *out = pattern_new(BIG, 3);
    struct tls_conn *c;
    struct client cl;
    size_t off, n;
    int sv[2];

    fill_until_blocked(&cl, sv, out, &c, &off);
    tls_write(c, out + off + 1, BIG - off - 1, &n);     /* SIGABRT */
}
END_TEST

/* So is a read before the unfinished write is done. */
START_TEST(test_read_during_unfinished_write_aborts)
{
    unsigned char *out = pattern_new(BIG, 3), buf[16];
    struct tls_conn *c;
    struct client cl;
    size_t off, n;
    int sv[2];

    fill_until_blocked(&cl, sv, out, &c, &off);
    tls_read(c, buf, sizeof(buf), &n);                  /* SIGABRT */
}
END_TEST

/* Client: one record of 100 bytes, then wait until released. */
static int
script_hundred(struct client *cl)
{
    unsigned char buf[100];

    for (int i = 0; i < 100; i++)
        buf[i] = (unsigned char)i;
    CL_CHECK(cl, cl_write_all(cl, buf, sizeof(buf)) == 0);
    cl_wait_go(cl);
    return 0;
}

START_TEST(test_pending)
{
    struct tls_conn *c;
    struct client cl;
    unsigned char buf[200];
    char err[256];
    size_t n;
    int sv[2];

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.script = script_hundred;
    client_start(&cl);
    ck_assert_msg(accept_ms(sv[0], 5000, &c, err, sizeof(err)) == 0, "%s",
                  err);
    ck_assert_int_eq(tls_read_deadline(c, buf, 10, gw_now_ms() + 5000, -1,
                                       &n), 0);
    ck_assert_uint_eq(n, 10);
    /* The rest of the record is decrypted already: no poll() needed. */
    ck_assert_uint_eq(tls_pending(c), 90);
    ck_assert_int_eq(tls_read(c, buf + 10, sizeof(buf) - 10, &n), 0);
    ck_assert_uint_eq(n, 90);
    for (int i = 0; i < 100; i++)
        ck_assert_uint_eq(buf[i], i);
    ck_assert_uint_eq(tls_pending(c), 0);
    ck_assert_int_eq(tls_read(c, buf, sizeof(buf), &n), GW_EAGAIN);
    ck_assert_int_eq(tls_want(c), POLLIN);
    go_client(&cl);
    client_join(&cl);
    ck_assert_int_eq(tls_read_deadline(c, buf, sizeof(buf),
                                       gw_now_ms() + 5000, -1, &n),
                     GW_ECLOSED);
    tls_close(c);
    close(sv[0]);
}
END_TEST

/*
 * The connection's stream over TLS (net.h): reads go through TLS, and a
 * wait for input returns at once while decrypted bytes are buffered,
 * though the socket itself has nothing to read.
 */
START_TEST(test_stream_over_tls)
{
    struct net_stream st;
    struct tls_conn *c;
    struct client cl;
    unsigned char buf[200];
    char err[256];
    size_t n;
    int sv[2];

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.script = script_hundred;
    client_start(&cl);
    ck_assert_msg(accept_ms(sv[0], 5000, &c, err, sizeof(err)) == 0, "%s",
                  err);
    tls_stream_init(&st, c);
    ck_assert_int_eq(net_stream_fd(&st), sv[0]);
    ck_assert_int_eq(net_stream_read(&st, buf, 10, gw_now_ms() + 5000, -1,
                                     &n), 0);
    ck_assert_uint_eq(n, 10);
    ck_assert_int_eq(net_wait(sv[0], POLLIN, gw_now_ms(), -1),
                     GW_ETIMEDOUT);
    ck_assert_int_eq(net_stream_wait(&st, POLLIN, gw_now_ms(), -1), 0);
    ck_assert_int_eq(net_stream_read(&st, buf + 10, sizeof(buf) - 10,
                                     gw_now_ms() + 5000, -1, &n), 0);
    ck_assert_uint_eq(n, 90);
    for (int i = 0; i < 100; i++)
        ck_assert_uint_eq(buf[i], i);
    ck_assert_int_eq(net_stream_wait(&st, POLLIN, gw_now_ms(), -1),
                     GW_ETIMEDOUT);
    go_client(&cl);
    client_join(&cl);
    ck_assert_int_eq(net_stream_read(&st, buf, sizeof(buf),
                                     gw_now_ms() + 5000, -1, &n),
                     GW_ECLOSED);
    tls_close(c);
    close(sv[0]);
}
END_TEST

/* ---- cipher suites ---- */

/*
 * One client 'cl' (client_init'ed on sv[1] and set up) against 's' on
 * sv[0], which is closed after: the handshake, and a ping when it
 * succeeds.  Returns tls_accept()'s code, with its reason in 'err'.
 */
static int
shake(struct tls_server *s, struct client *cl, int sv0, char *err,
      size_t errlen)
{
    int rc;

    cl->script = script_ping;
    client_start(cl);
    rc = ping_server(s, sv0, err, errlen);
    close(sv0);
    client_join(cl);
    ck_assert_msg((rc == 0) == (cl->hs_ret == 0), "server rc %d (%s), "
                  "client -0x%04x", rc, err, (unsigned)-cl->hs_ret);
    return rc;
}

/* A server for mkcert's 'cert' and 'key' with the fixture's settings. */
static struct tls_server *
server_for(const char *crt, const char *key, int session_s,
           const struct tls_server *prev)
{
    struct tls_server_opts o = {
        cert(crt), cert(key), 12, HS_TIMEOUT_MS, &stats, session_s, prev,
    };
    struct tls_server *s;
    char err[256];

    ck_assert_msg(tls_server_new(&o, &s, err, sizeof(err)) == 0, "%s", err);
    return s;
}

/* What tls_server.c must offer, by the key of the certificate. */
static const int suites_ecdsa[] = {
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, 0,
};
static const int suites_rsa[] = {
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, 0,
};

static int
in_list(const int *list, int id)
{
    for (; *list != 0; list++)
        if (*list == id)
            return 1;
    return 0;
}

/*
 * The classes of suites the server must refuse (tls.h), told by their
 * names ("TLS-DHE-RSA-WITH-AES-128-CBC-SHA"); a suite may be in several.
 */
static const struct {
    const char *what, *part;    /* the class, a part of its names */
    int at_start;               /* 'part' begins the name */
} suite_classes[] = {
    { "static RSA key exchange", "TLS-RSA-WITH-", 1 },
    { "static ECDH key exchange", "TLS-ECDH-", 1 },
    { "DHE key exchange", "TLS-DHE-RSA-", 1 },
    { "CBC", "-CBC-", 0 },
    { "CCM_8", "-CCM-8", 0 },
    { "Camellia", "-CAMELLIA-", 0 },
};

static int
in_class(const char *name, size_t k)
{
    const char *p = strstr(name, suite_classes[k].part);

    return p != NULL && (!suite_classes[k].at_start || p == name);
}

/*
 * Every TLS 1.2 suite this mbedTLS has (but PSK ones: without a key the
 * client does not even offer them), offered alone by the client, to a
 * server with an ECDSA (_i = 0) and an RSA (_i = 1) certificate: the
 * three ECDHE + AEAD suites for that key are accepted and negotiated,
 * every other is refused with a handshake failure that says why, and
 * each class of tls.h's list (plus CCM with its full tag) was offered
 * and refused at least once.
 */
START_TEST(test_only_ecdhe_aead_suites)
{
    static const char *const crt[] = { "server.pem", "rsa.pem" };
    static const char *const key[] = { "server.key", "rsa.key" };
    const int *want = _i == 0 ? suites_ecdsa : suites_rsa;
    const mbedtls_ssl_ciphersuite_t *info;
    struct tls_server *s = server_for(crt[_i], key[_i], 0, NULL);
    size_t refused[GW_ARRAY_LEN(suite_classes)] = { 0 }, nbad = 0;
    int accepted = 0, ccm = 0, one[2] = { 0, 0 }, sv[2], rc;
    struct client cl;
    char err[256], bad[4096] = "";

    for (const int *id = mbedtls_ssl_list_ciphersuites(); *id != 0; id++) {
        info = mbedtls_ssl_ciphersuite_from_id(*id);
        if (info->max_minor_ver < MBEDTLS_SSL_MINOR_VERSION_3
            || mbedtls_ssl_ciphersuite_uses_psk(info))
            continue;
        one[0] = *id;
        pair(sv, 0);
        client_init(&cl, sv[1]);
        cl.suites = one;
        rc = shake(s, &cl, sv[0], err, sizeof(err));
        if (in_list(want, *id)) {
            ck_assert_msg(rc == 0, "%s refused: %s", info->name, err);
            ck_assert_str_eq(cl.suite_got, info->name);
            accepted++;
            continue;
        }
        if (rc == 0) {
            /* Listed all together below: how many, and which. */
            nbad++;
            snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), " %s",
                     info->name);
            continue;
        }
        ck_assert_msg(rc == GW_EPARSE, "%s: rc %d (%s)", info->name, rc,
                      err);
        ck_assert_msg(strstr(err, "no cipher suite in common") != NULL,
                      "%s: %s", info->name, err);
        for (size_t k = 0; k < GW_ARRAY_LEN(suite_classes); k++)
            refused[k] += (size_t)in_class(info->name, k);
        ccm += strstr(info->name, "-CCM") != NULL
               && strstr(info->name, "-CCM-8") == NULL;
    }
    ck_assert_msg(nbad == 0, "%zu suites accepted that must not be:%s",
                  nbad, bad);
    ck_assert_int_eq(accepted, 3);
    for (size_t k = 0; k < GW_ARRAY_LEN(suite_classes); k++)
        ck_assert_msg(refused[k] > 0, "no %s suite was tried",
                      suite_classes[k].what);
    ck_assert_int_gt(ccm, 0);
    ck_assert_uint_eq(atomic_load(&stats.handshakes), 3);
    tls_server_free(s);
}
END_TEST

/* ---- session resumption ---- */

/*
 * One handshake of a fresh client with 's', offering 'offer' (or no
 * session); OUT *saved (initialised by the caller; may be NULL): the
 * session it ends with.  Returns 1 when the server resumed a session,
 * as its counters say (asserted to move by one handshake).
 */
static int
resumes(struct tls_server *s, const mbedtls_ssl_session *offer,
        mbedtls_ssl_session *saved)
{
    uint64_t hs = atomic_load(&stats.handshakes);
    uint64_t was = atomic_load(&stats.resumed);
    struct client cl;
    char err[256];
    int sv[2];

    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.resume = offer;
    cl.saved = saved;
    ck_assert_msg(shake(s, &cl, sv[0], err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(atomic_load(&stats.handshakes), hs + 1);
    return atomic_load(&stats.resumed) != was;
}

/* The name of the key that sealed 'ss''s ticket (its first 4 bytes). */
static uint32_t
ticket_key_name(const mbedtls_ssl_session *ss)
{
    uint32_t name;

    ck_assert_uint_ge(ss->ticket_len, sizeof(name));
    memcpy(&name, ss->ticket, sizeof(name));
    return name;
}

/*
 * A client that offers its session back resumes it from the ticket
 * (abbreviated handshake, counted as resumed); one that does not makes a
 * full handshake.
 */
START_TEST(test_ticket_resumes)
{
    mbedtls_ssl_session first, again;

    mbedtls_ssl_session_init(&first);
    mbedtls_ssl_session_init(&again);
    ck_assert(!resumes(srv, NULL, &first));
    ck_assert_uint_gt(first.ticket_len, 0);
    ck_assert_uint_eq(first.ticket_lifetime, SESSION_S);
    ck_assert(resumes(srv, &first, &again));
    ck_assert(resumes(srv, &first, NULL));
    ck_assert(!resumes(srv, NULL, NULL));
    ck_assert_uint_eq(atomic_load(&stats.resumed), 2);
    mbedtls_ssl_session_free(&first);
    mbedtls_ssl_session_free(&again);
}
END_TEST

/* session_timeout_s 0: no ticket is issued, and nothing resumes. */
START_TEST(test_no_resumption_when_off)
{
    struct tls_server *s = server_for("server.pem", "server.key", 0, NULL);
    mbedtls_ssl_session first;

    mbedtls_ssl_session_init(&first);
    ck_assert(!resumes(s, NULL, &first));
    ck_assert_uint_eq(first.ticket_len, 0);
    ck_assert(!resumes(s, &first, NULL));
    ck_assert_uint_eq(atomic_load(&stats.resumed), 0);
    mbedtls_ssl_session_free(&first);
    tls_server_free(s);
}
END_TEST

/*
 * A reload: the server that replaces another with the same lifetime
 * resumes the old one's sessions, even once the old one is freed; with
 * another lifetime, or made afresh, it does not.  Nor does it after a
 * reload to an RSA certificate: the session's ECDSA suite cannot be
 * kept, so that is a full handshake (it used to fail, see ticket_parse()
 * in tls_server.c).
 */
START_TEST(test_tickets_carry_over)
{
    struct tls_server *a = server_for("server.pem", "server.key", 60, NULL);
    struct tls_server *b, *c, *d, *e;
    mbedtls_ssl_session first;

    mbedtls_ssl_session_init(&first);
    ck_assert(!resumes(a, NULL, &first));
    b = server_for("server.pem", "server.key", 60, a);
    c = server_for("server.pem", "server.key", 61, a);
    d = server_for("server.pem", "server.key", 60, NULL);
    e = server_for("rsa.pem", "rsa.key", 60, a);
    tls_server_free(a);
    ck_assert(resumes(b, &first, NULL));
    ck_assert(!resumes(c, &first, NULL));
    ck_assert(!resumes(d, &first, NULL));
    ck_assert(!resumes(e, &first, NULL));
    mbedtls_ssl_session_free(&first);
    tls_server_free(b);
    tls_server_free(c);
    tls_server_free(d);
    tls_server_free(e);
}
END_TEST

/*
 * A client that offers its session back with another list of suites,
 * from which the server picks another suite than the session's: a full
 * handshake under the new suite, not a resumption under it.  (mbedTLS
 * alone resumed it, and the client aborted: see ticket_parse().)  The
 * same list again resumes the new session.
 */
START_TEST(test_changed_offer_is_a_full_handshake)
{
    static const int aes128[] = {
        MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, 0,
    };
    mbedtls_ssl_session first, second;
    struct client cl;
    char err[256];
    int sv[2];

    mbedtls_ssl_session_init(&first);
    mbedtls_ssl_session_init(&second);
    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.suites = aes128;
    cl.saved = &first;
    ck_assert_msg(shake(srv, &cl, sv[0], err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(cl.suite_got, "TLS-ECDHE-ECDSA-WITH-AES-128-GCM-SHA256");
    /* mbedTLS's default list, in which the server prefers ChaCha20. */
    pair(sv, 0);
    client_init(&cl, sv[1]);
    cl.resume = &first;
    cl.saved = &second;
    ck_assert_msg(shake(srv, &cl, sv[0], err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(cl.suite_got,
                     "TLS-ECDHE-ECDSA-WITH-CHACHA20-POLY1305-SHA256");
    ck_assert_uint_eq(atomic_load(&stats.resumed), 0);
    ck_assert(resumes(srv, &second, NULL));
    mbedtls_ssl_session_free(&first);
    mbedtls_ssl_session_free(&second);
}
END_TEST

/*
 * The ticket key is replaced every session_timeout_s: with 1 s, a ticket
 * made a little over a second after another is sealed by another key.
 * (Polled: mbedTLS counts whole seconds of time().)
 */
START_TEST(test_ticket_key_rotates)
{
    struct tls_server *s = server_for("server.pem", "server.key", 1, NULL);
    mbedtls_ssl_session first, later;
    int64_t start = gw_now_ms();
    uint32_t name;

    mbedtls_ssl_session_init(&first);
    ck_assert(!resumes(s, NULL, &first));
    name = ticket_key_name(&first);
    for (;;) {
        mbedtls_ssl_session_init(&later);
        ck_assert(!resumes(s, NULL, &later));
        if (ticket_key_name(&later) != name)
            break;
        mbedtls_ssl_session_free(&later);
        ck_assert_msg(gw_now_ms() - start < 5000, "no new key in 5 s");
        sleep_ms(50);
    }
    mbedtls_ssl_session_free(&later);
    mbedtls_ssl_session_free(&first);
    tls_server_free(s);
}
END_TEST

/* ---- tls_server_new ---- */

static const struct {
    const char *cert, *key;     /* names in certdir; "" is certdir itself */
    int min_version, timeout_ms, session_s;
    int rc;
    const char *err;            /* a part of the message */
    const char *note;
} opts_cases[] = {
    { "server.pem", "server.key", 12, 1000, 3600, 0, "", "good" },
    { "nonexistent.pem", "server.key", 12, 1000, 3600, GW_EIO,
      "nonexistent.pem: cannot open: No such file", "missing cert" },
    { "server.pem", "nonexistent.key", 12, 1000, 3600, GW_EIO,
      "nonexistent.key: cannot open", "missing key" },
    { "", "server.key", 12, 1000, 3600, GW_EINVAL, "not a regular file",
      "a directory" },
    { "garbage.pem", "server.key", 12, 1000, 3600, GW_EINVAL,
      "not a PEM certificate chain", "garbage cert" },
    { "server.key", "server.key", 12, 1000, 3600, GW_EINVAL,
      "not a PEM certificate chain", "a key as the cert" },
    { "server.pem", "server.pem", 12, 1000, 3600, GW_EINVAL,
      "not a PEM private key", "a cert as the key" },
    { "server.pem", "garbage.pem", 12, 1000, 3600, GW_EINVAL,
      "not a PEM private key", "garbage key" },
    { "server.pem", "mismatch.key", 12, 1000, 3600, GW_EINVAL,
      "does not match the certificate", "key of another cert" },
    { "expired.pem", "expired.key", 12, 1000, 3600, GW_EINVAL,
      "the certificate expired on", "expired" },
    { "server.pem", "server.key", 13, 1000, 3600, GW_EINVAL, "no TLS 1.3",
      "1.3 is not in mbedTLS 2.28" },
    { "server.pem", "server.key", 11, 1000, 3600, GW_EINVAL,
      "1.2 or 1.3, not 11", "1.1 is never allowed" },
    { "server.pem", "server.key", 12, 0, 3600, GW_EINVAL, "timeout",
      "no handshake timeout" },
    { "server.pem", "server.key", 12, 1000, -1, GW_EINVAL,
      "session timeout: must be >= 0", "negative session timeout" },
    { "server.pem", "server.key", 12, 1000, 0, 0, "", "no resumption" },
};

START_TEST(test_server_new)
{
    struct tls_server_opts o;
    struct tls_server *s;
    char err[512], c[128], k[128];
    FILE *f;
    int rc;

    f = fopen(cert("garbage.pem"), "w");
    ck_assert_ptr_nonnull(f);
    fputs("hello, this is not PEM\n", f);
    fclose(f);
    snprintf(c, sizeof(c), "%s", cert(opts_cases[_i].cert));
    snprintf(k, sizeof(k), "%s", cert(opts_cases[_i].key));
    o.cert_file = c;
    o.key_file = k;
    o.min_version = opts_cases[_i].min_version;
    o.handshake_timeout_ms = opts_cases[_i].timeout_ms;
    o.stats = NULL;
    o.session_timeout_s = opts_cases[_i].session_s;
    o.prev = NULL;
    rc = tls_server_new(&o, &s, err, sizeof(err));
    ck_assert_msg(rc == opts_cases[_i].rc, "%s: rc %d (%s)",
                  opts_cases[_i].note, rc, err);
    ck_assert_msg(strstr(err, opts_cases[_i].err) != NULL, "%s: \"%s\"",
                  opts_cases[_i].note, err);
    if (rc == 0)
        ck_assert_ptr_nonnull(s);
    else
        ck_assert_ptr_null(s);
    tls_server_free(s);
    unlink(cert("garbage.pem"));
}
END_TEST

START_TEST(test_server_new_alloc_fail)
{
    struct tls_server_opts o = {
        cert("server.pem"), cert("server.key"), 12, 1000, NULL, SESSION_S,
        NULL,
    };
    struct tls_server *s;
    char err[256];
    long n;
    int rc;

    for (n = 1;; n++) {
        alloc_fail_after(n, 0);
        rc = tls_server_new(&o, &s, err, sizeof(err));
        alloc_fail_after(0, 0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, GW_ENOMEM);
        ck_assert_ptr_null(s);
    }
    ck_assert_int_gt(n, 1);
    tls_server_free(s);
    tls_server_free(NULL);
    tls_close(NULL);
}
END_TEST

/* ---- threads: one shared server, concurrent handshakes ---- */

#define NPAIRS 4

struct side {
    struct tls_server *s;
    int fd;
    pthread_barrier_t *start;
    int rc;
};

static int
script_hi(struct client *cl)
{
    char buf[2];

    CL_CHECK(cl, cl_write_all(cl, "hi", 2) == 0);
    CL_CHECK(cl, cl_read_exact(cl, buf, 2) == 0);
    CL_CHECK(cl, memcmp(buf, "ok", 2) == 0);
    return 0;
}

static void *
server_side(void *arg)
{
    struct side *sd = arg;
    struct tls_conn *c;
    char err[256], buf[2];
    size_t n, got = 0;

    pthread_barrier_wait(sd->start);
    sd->rc = tls_accept(sd->s, sd->fd, gw_now_ms() + 8000, -1, &c, err,
                        sizeof(err));
    if (sd->rc != 0)
        return NULL;
    while (got < 2 && (sd->rc = tls_read_deadline(c, buf + got, 2 - got,
                                                  gw_now_ms() + 8000, -1,
                                                  &n)) == 0)
        got += n;
    if (sd->rc == 0)
        sd->rc = tls_write_all(c, "ok", 2, gw_now_ms() + 8000, -1);
    tls_close(c);
    return NULL;
}

START_TEST(test_concurrent_handshakes)
{
    struct tls_server_opts o = {
        cert("server.pem"), cert("server.key"), 12, 8000, &stats, SESSION_S,
        NULL,
    };
    struct tls_server *s;
    struct side sd[NPAIRS];
    struct client cl[NPAIRS];
    pthread_t st[NPAIRS];
    pthread_barrier_t start;
    char err[256];
    int sv[2];

    /* A fresh server: its key has signed only once, in tls_server_new. */
    ck_assert_int_eq(tls_server_new(&o, &s, err, sizeof(err)), 0);
    ck_assert_int_eq(pthread_barrier_init(&start, NULL, 2 * NPAIRS), 0);
    for (int i = 0; i < NPAIRS; i++) {
        pair(sv, 0);
        sd[i].s = s;
        sd[i].fd = sv[0];
        sd[i].start = &start;
        client_init(&cl[i], sv[1]);
        cl[i].script = script_hi;
        cl[i].start = &start;
        ck_assert_int_eq(pthread_create(&st[i], NULL, server_side, &sd[i]),
                         0);
        client_start(&cl[i]);
    }
    for (int i = 0; i < NPAIRS; i++) {
        ck_assert_int_eq(pthread_join(st[i], NULL), 0);
        client_join(&cl[i]);
        close(sd[i].fd);
        ck_assert_int_eq(sd[i].rc, 0);
        ck_assert_int_eq(cl[i].hs_ret, 0);
    }
    ck_assert_uint_eq(atomic_load(&stats.handshakes), NPAIRS);
    pthread_barrier_destroy(&start);
    tls_server_free(s);
}
END_TEST

/* ---- libcurl (OpenSSL) against the server, over loopback TCP ---- */

struct tcp_server {
    int lfd;
    uint16_t port;
    int rc;                     /* tls_accept's */
    char err[256];
    pthread_t thread;
};

/* Accept one connection, answer one request with "ok", close. */
static void *
tcp_serve(void *arg)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                               "Connection: close\r\n\r\nok";
    struct tcp_server *t = arg;
    struct tls_conn *c;
    char req[4096];
    size_t got = 0, n;
    int fd = -1;

    t->rc = net_wait(t->lfd, POLLIN, gw_now_ms() + 5000, -1);
    if (t->rc == 0)
        t->rc = net_accept(t->lfd, &fd);
    if (t->rc != 0)
        return NULL;
    t->rc = tls_accept(srv, fd, gw_now_ms() + 5000, -1, &c, t->err,
                       sizeof(t->err));
    if (t->rc == 0) {
        while (got < sizeof(req) - 1
               && tls_read_deadline(c, req + got, sizeof(req) - 1 - got,
                                    gw_now_ms() + 5000, -1, &n) == 0) {
            got += n;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n") != NULL)
                break;
        }
        tls_write_all(c, resp, sizeof(resp) - 1, gw_now_ms() + 5000, -1);
        tls_close(c);
    }
    close(fd);
    return NULL;
}

static size_t
curl_body(char *p, size_t size, size_t n, void *arg)
{
    char *body = arg;
    size_t have = strlen(body);

    if (have + size * n < 64)
        memcpy(body + have, p, size * n);
    return size * n;
}

/*
 * curl 'scheme'://'host':PORT/ trusting 'ca'; OUT body (64 bytes), the
 * HTTP version; returns curl's code.  The server's outcome is in *t.
 */
static CURLcode
curl_once(struct tcp_server *t, const char *scheme, const char *host,
          const char *ca, char *body, long *version)
{
    struct curl_slist *resolve = NULL;
    char url[128], entry[128];
    CURL *h;
    CURLcode cc;

    memset(body, 0, 64);
    *version = 0;
    ck_assert_int_eq(net_listen("127.0.0.1:0", 4, &t->lfd, &t->port), 0);
    ck_assert_int_eq(pthread_create(&t->thread, NULL, tcp_serve, t), 0);
    snprintf(url, sizeof(url), "%s://%s:%u/v1/models", scheme, host,
             t->port);
    snprintf(entry, sizeof(entry), "localhost:%u:127.0.0.1", t->port);
    resolve = curl_slist_append(NULL, entry);
    h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_RESOLVE, resolve);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, curl_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, body);
    cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_HTTP_VERSION, version);
    curl_easy_cleanup(h);
    curl_slist_free_all(resolve);
    ck_assert_int_eq(pthread_join(t->thread, NULL), 0);
    close(t->lfd);
    return cc;
}

START_TEST(test_curl_accepts)
{
    static const char *hosts[] = { "127.0.0.1", "localhost" };
    struct tcp_server t;
    char body[64];
    long version;
    CURLcode cc;

    memset(&t, 0, sizeof(t));
    cc = curl_once(&t, "https", hosts[_i], cert("ca.pem"), body, &version);
    ck_assert_msg(cc == CURLE_OK, "curl: %s; server rc %d (%s)",
                  curl_easy_strerror(cc), t.rc, t.err);
    ck_assert_int_eq(t.rc, 0);
    ck_assert_str_eq(body, "ok");
    /* curl offers h2 and http/1.1 by ALPN; the server picks http/1.1. */
    ck_assert_int_eq(version, CURL_HTTP_VERSION_1_1);
}
END_TEST

START_TEST(test_curl_wrong_ca)
{
    struct tcp_server t;
    char body[64];
    long version;
    CURLcode cc;

    memset(&t, 0, sizeof(t));
    cc = curl_once(&t, "https", "127.0.0.1", cert("other-ca.pem"), body,
                   &version);
    ck_assert_msg(cc == CURLE_PEER_FAILED_VERIFICATION, "curl: %s",
                  curl_easy_strerror(cc));
    ck_assert_msg(t.rc == GW_EPARSE, "server rc %d (%s)", t.rc, t.err);
    ck_assert_str_eq(t.err, "client refused our certificate "
                     "(alert 48 unknown_ca)");
}
END_TEST

START_TEST(test_curl_plain_http)
{
    struct tcp_server t;
    char body[64];
    long version;
    CURLcode cc;

    memset(&t, 0, sizeof(t));
    cc = curl_once(&t, "http", "127.0.0.1", cert("ca.pem"), body, &version);
    ck_assert_msg(cc != CURLE_OK, "curl: %s", curl_easy_strerror(cc));
    ck_assert_msg(t.rc == GW_EPARSE, "server rc %d (%s)", t.rc, t.err);
    ck_assert_str_eq(t.err, "plain HTTP request on the TLS port");
}
END_TEST

static Suite *
tls_suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc;

    tc = tcase("handshake");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_handshake_alpn);
    tcase_add_test(tc, test_handshake_without_alpn);
    tcase_add_test(tc, test_alpn_h2_only_refused);
    tcase_add_test(tc, test_tls11_refused);
    tcase_add_test(tc, test_tls10_refused);
    tcase_add_test(tc, test_wrong_ca_refused);
    tcase_add_test(tc, test_late_alert_read);
    suite_add_tcase(s, tc);

    tc = tcase("suites");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_only_ecdhe_aead_suites, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase("resumption");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_ticket_resumes);
    tcase_add_test(tc, test_no_resumption_when_off);
    tcase_add_test(tc, test_tickets_carry_over);
    tcase_add_test(tc, test_changed_offer_is_a_full_handshake);
    tcase_add_test(tc, test_ticket_key_rotates);
    suite_add_tcase(s, tc);

    tc = tcase("bad_handshake");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_plain_http);
    tcase_add_test(tc, test_plain_http_post);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_trickle_cut_at_deadline);
    tcase_add_test(tc, test_handshake_timeout_from_opts);
    tcase_add_test(tc, test_client_closes);
    tcase_add_test(tc, test_wake_aborts);
    suite_add_tcase(s, tc);

    tc = tcase("data");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_big_both_ways);
    tcase_add_test(tc, test_write_eagain_then_complete);
    tcase_add_test(tc, test_writev_eagain_resplit);
    tcase_add_test_raise_signal(tc, test_write_retry_other_bytes_aborts,
                                SIGABRT);
    tcase_add_test_raise_signal(tc, test_read_during_unfinished_write_aborts,
                                SIGABRT);
    tcase_add_test(tc, test_pending);
    tcase_add_test(tc, test_stream_over_tls);
    suite_add_tcase(s, tc);

    tc = tcase("server_new");
    tcase_add_loop_test(tc, test_server_new, 0,
                        (int)GW_ARRAY_LEN(opts_cases));
    tcase_add_test(tc, test_server_new_alloc_fail);
    suite_add_tcase(s, tc);

    tc = tcase("threads");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_concurrent_handshakes);
    suite_add_tcase(s, tc);

    tc = tcase("curl");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_curl_accepts, 0, 2);
    tcase_add_test(tc, test_curl_wrong_ca);
    tcase_add_test(tc, test_curl_plain_http);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    static const char *files[] = {
        "ca.pem", "ca.key", "server.pem", "server.key", "rsa.pem", "rsa.key",
        "other-ca.pem",
        "expired.pem", "expired.key", "mismatch.key", "garbage.pem",
    };
    char err[512];
    int rc;

    snprintf(certdir, sizeof(certdir), "/tmp/check_tls.XXXXXX");
    if (mkdtemp(certdir) == NULL) {
        perror("check_tls: mkdtemp");
        return EXIT_FAILURE;
    }
    if (mkcert_dir(certdir, err, sizeof(err)) != 0) {
        fprintf(stderr, "check_tls: %s\n", err);
        return EXIT_FAILURE;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = test_run(srunner_create(tls_suite()));
    curl_global_cleanup();
    for (size_t i = 0; i < GW_ARRAY_LEN(files); i++)
        unlink(cert(files[i]));
    rmdir(certdir);
    return rc;
}
