/* SPDX-License-Identifier: MIT */
/*
 * tls_server.h - struct tls_server, private to the two files of the tls
 * module: tls_server.c builds and frees a server (its chain, its key, its
 * session-ticket keys), tls.c runs connections on one.  Nothing else
 * includes it.
 *
 * Locking: a server is read-only once tls_server_new() has returned it
 * (tls.h), but for the parts that lock themselves, the random generator
 * and the ticket keys (tls_server.c says how).
 */
#ifndef INFERGW_GATEWAY_WIRE_TLS_SERVER_H
#define INFERGW_GATEWAY_WIRE_TLS_SERVER_H

#include <stddef.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include "util.h"
#include "wire/tls.h"

struct tls_tickets;             /* tls_server.c */

struct tls_server {
    mbedtls_ssl_config conf;        /* read-only once built */
    mbedtls_x509_crt chain;         /* the leaf first */
    mbedtls_pk_context key;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;  /* locks itself (tls_server.c) */
    const char *alpn[2];            /* "http/1.1", NULL: conf points here */
    int handshake_timeout_ms;
    struct tls_stats *stats;        /* borrowed, may be NULL */
    struct tls_tickets *tickets;    /* one reference; NULL: no resumption */
};

/*
 * Write one line, printf-style, into 'err' (errlen bytes, NUL-terminated;
 * nothing when errlen is 0): the messages tls.h promises.
 */
void tls_set_err(char *err, size_t errlen, const char *fmt, ...)
    GW_PRINTF(3, 4);

/* mbedTLS's text for 'ret' ("X509 - Certificate verification failed"),
 * written into buf[len]; returns 'buf'. */
const char *tls_mbed_text(int ret, char *buf, size_t len);

/*
 * The ClientHello of the handshake this thread is running (tls.c), the
 * whole handshake message with its 4-byte header, for the ticket parse
 * callback, to which mbedTLS passes only the shared context; NULL outside
 * a handshake.
 */
const unsigned char *tls_handshake_hello(void);

#endif
