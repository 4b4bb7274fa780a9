/* SPDX-License-Identifier: MIT */
/*
 * mkcert.c - throwaway certificates for TLS tests, made with mbedTLS's
 * own x509write API (no openssl command needed).
 *
 *   mkcert [-h] DIR
 *
 * writes into DIR, which must exist (existing files are replaced):
 *
 *   ca.pem, ca.key            a CA, "CN=infergw test CA"
 *   server.pem, server.key    signed by that CA: CN=localhost with
 *                             subjectAltName DNS:localhost, IP:127.0.0.1
 *                             and IP:::1, valid from an hour ago for a day
 *                             (for TLS servers and clients alike)
 *   rsa.pem, rsa.key          the same as server.pem, for an RSA 2048
 *                             key (which takes a fraction of a second to
 *                             make)
 *   other-ca.pem              an unrelated CA: a client that trusts only
 *                             it must refuse server.pem
 *   expired.pem, expired.key  signed by the CA, expired a day ago
 *   mismatch.key              a key that does not belong to server.pem
 *
 * Keys are EC P-256 (fast to make and to use), but for rsa.key, written
 * as SEC1 (PKCS#1 for RSA) PEM with mode 0600.  curl --cacert DIR/ca.pem https://127.0.0.1:PORT/ accepts
 * the server (OpenSSL checks the SAN IP).
 *
 * test/unit/check_tls.c includes this file with MKCERT_NO_MAIN defined
 * and calls mkcert_dir(), so that the tests use exactly the certificates
 * the tool makes, without depending on the tool being built first.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/bignum.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/rsa.h>
#include <mbedtls/platform_util.h>
#include <mbedtls/x509_crt.h>

#define MKCERT_PEM_MAX 4096     /* one certificate or key, as PEM (an
                                   RSA 2048 key takes about 1.7 KiB) */
#define MKCERT_RSA_BITS 2048
#define MKCERT_HOUR 3600
#define MKCERT_DAY (24 * MKCERT_HOUR)

#define MKCERT_CA_NAME "CN=infergw test CA,O=infergw"
#define MKCERT_OTHER_CA_NAME "CN=infergw other test CA,O=infergw"
#define MKCERT_SERVER_NAME "CN=localhost,O=infergw"

/*
 * subjectAltName for the server (RFC 5280 section 4.2.1.6), in DER, since
 * mbedTLS 2.28 has no writer for it: a SEQUENCE of GeneralName, here
 * dNSName [2] and iPAddress [7] (IMPLICIT, so the tags are 0x82, 0x87).
 */
static const unsigned char mkcert_san[] = {
    0x30, 35,
    0x82, 9, 'l', 'o', 'c', 'a', 'l', 'h', 'o', 's', 't',
    0x87, 4, 127, 0, 0, 1,
    0x87, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
};

_Static_assert(sizeof(mkcert_san) == 2 + 35, "subjectAltName length");

/*
 * extKeyUsage: a SEQUENCE of the OIDs id-kp-serverAuth and
 * id-kp-clientAuth, so that server.pem also serves as the gateway's
 * client certificate towards a test upstream that asks for one.
 */
static const unsigned char mkcert_eku_server[] = {
    0x30, 20, 0x06, 8, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01,
    0x06, 8, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02,
};

/* What one certificate is. */
struct mkcert_spec {
    const char *subject;
    int is_ca;
    long from_s, to_s;          /* validity, in seconds from now */
};

struct mkcert_rng {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
};

static int
mkcert_rng_init(struct mkcert_rng *r)
{
    static const unsigned char pers[] = "infergw mkcert";

    mbedtls_entropy_init(&r->entropy);
    mbedtls_ctr_drbg_init(&r->drbg);
    return mbedtls_ctr_drbg_seed(&r->drbg, mbedtls_entropy_func, &r->entropy,
                                 pers, sizeof(pers) - 1);
}

static void
mkcert_rng_release(struct mkcert_rng *r)
{
    mbedtls_ctr_drbg_free(&r->drbg);
    mbedtls_entropy_free(&r->entropy);
}

/* A new P-256 key into 'k' (initialised by the caller). */
static int
mkcert_key(mbedtls_pk_context *k, struct mkcert_rng *r)
{
    int ret;

    ret = mbedtls_pk_setup(k, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
    if (ret == 0)
        ret = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(*k),
                                  mbedtls_ctr_drbg_random, &r->drbg);
    return ret;
}

/* A new RSA key of MKCERT_RSA_BITS into 'k' (initialised by the caller). */
static int
mkcert_rsa_key(mbedtls_pk_context *k, struct mkcert_rng *r)
{
    int ret;

    ret = mbedtls_pk_setup(k, mbedtls_pk_info_from_type(MBEDTLS_PK_RSA));
    if (ret == 0)
        ret = mbedtls_rsa_gen_key(mbedtls_pk_rsa(*k), mbedtls_ctr_drbg_random,
                                  &r->drbg, MKCERT_RSA_BITS, 65537);
    return ret;
}

/* 'now + delta_s' as X.509 wants it here: "YYYYMMDDhhmmss", UTC. */
static void
mkcert_time(time_t now, long delta_s, char out[16])
{
    time_t t = now + delta_s;
    struct tm tm;

    gmtime_r(&t, &tm);
    strftime(out, 16, "%Y%m%d%H%M%S", &tm);
}

/*
 * keyUsage: a CA signs certificates and CRLs; a leaf signs, and an RSA
 * leaf may also encrypt (keyEncipherment), as RSA server certificates
 * usually do: it lets a client use static RSA key exchange with it, so a
 * TLS server that refuses those cipher suites is seen refusing them
 * itself, not through the certificate (mbedTLS checks the usage).
 */
static unsigned int
mkcert_usage(const struct mkcert_spec *spec, mbedtls_pk_context *key)
{
    if (spec->is_ca)
        return MBEDTLS_X509_KU_KEY_CERT_SIGN | MBEDTLS_X509_KU_CRL_SIGN;
    if (mbedtls_pk_get_type(key) == MBEDTLS_PK_RSA)
        return MBEDTLS_X509_KU_DIGITAL_SIGNATURE
               | MBEDTLS_X509_KU_KEY_ENCIPHERMENT;
    return MBEDTLS_X509_KU_DIGITAL_SIGNATURE;
}

/*
 * Write the certificate 'spec' describes, for 'key', signed by 'issuer_key'
 * under 'issuer' (the subject itself for a CA), as PEM into 'pem'.
 */
static int
mkcert_cert(const struct mkcert_spec *spec, mbedtls_pk_context *key,
            const char *issuer, mbedtls_pk_context *issuer_key,
            struct mkcert_rng *r, unsigned char *pem, size_t pemlen)
{
    mbedtls_x509write_cert crt;
    mbedtls_mpi serial;
    time_t now = time(NULL);
    char from[16], to[16];
    int ret;

    mbedtls_x509write_crt_init(&crt);
    mbedtls_mpi_init(&serial);
    mkcert_time(now, spec->from_s, from);
    mkcert_time(now, spec->to_s, to);
    mbedtls_x509write_crt_set_version(&crt, MBEDTLS_X509_CRT_VERSION_3);
    mbedtls_x509write_crt_set_md_alg(&crt, MBEDTLS_MD_SHA256);
    mbedtls_x509write_crt_set_subject_key(&crt, key);
    mbedtls_x509write_crt_set_issuer_key(&crt, issuer_key);
    /* A random positive serial, so that no two runs share one. */
    ret = mbedtls_mpi_fill_random(&serial, 15, mbedtls_ctr_drbg_random,
                                  &r->drbg);
    if (ret == 0)
        ret = mbedtls_mpi_set_bit(&serial, 0, 1);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_serial(&crt, &serial);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_subject_name(&crt, spec->subject);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_issuer_name(&crt, issuer);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_validity(&crt, from, to);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_basic_constraints(&crt, spec->is_ca,
                                                          spec->is_ca ? 0
                                                                      : -1);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_subject_key_identifier(&crt);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_authority_key_identifier(&crt);
    if (ret == 0)
        ret = mbedtls_x509write_crt_set_key_usage(&crt, mkcert_usage(spec,
                                                                     key));
    if (ret == 0 && !spec->is_ca)
        ret = mbedtls_x509write_crt_set_extension(
            &crt, MBEDTLS_OID_SUBJECT_ALT_NAME,
            MBEDTLS_OID_SIZE(MBEDTLS_OID_SUBJECT_ALT_NAME), 0, mkcert_san,
            sizeof(mkcert_san));
    if (ret == 0 && !spec->is_ca)
        ret = mbedtls_x509write_crt_set_extension(
            &crt, MBEDTLS_OID_EXTENDED_KEY_USAGE,
            MBEDTLS_OID_SIZE(MBEDTLS_OID_EXTENDED_KEY_USAGE), 0,
            mkcert_eku_server, sizeof(mkcert_eku_server));
    if (ret == 0)
        ret = mbedtls_x509write_crt_pem(&crt, pem, pemlen,
                                        mbedtls_ctr_drbg_random, &r->drbg);
    mbedtls_mpi_free(&serial);
    mbedtls_x509write_crt_free(&crt);
    return ret;
}

/* Write the NUL-terminated 'text' to DIR/NAME with 'mode'; 0 or -1. */
static int
mkcert_write(const char *dir, const char *name, const unsigned char *text,
             mode_t mode, char *err, size_t errlen)
{
    char path[4096];
    size_t len = strlen((const char *)text), off = 0;
    ssize_t w;
    int fd, rc = -1;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name)
        >= sizeof(path)) {
        snprintf(err, errlen, "%s/%s: path too long", dir, name);
        return -1;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd == -1 || fchmod(fd, mode) == -1) {
        snprintf(err, errlen, "%s/%s: %s", dir, name, strerror(errno));
        goto out;
    }
    while (off < len) {
        w = write(fd, text + off, len - off);
        if (w == -1 && errno == EINTR)
            continue;
        if (w == -1) {
            snprintf(err, errlen, "%s/%s: %s", dir, name, strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    rc = 0;

out:
    if (fd != -1 && close(fd) == -1 && rc == 0) {
        snprintf(err, errlen, "%s/%s: %s", dir, name, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* Write 'key' as PEM to DIR/NAME (mode 0600); the PEM is wiped after. */
static int
mkcert_write_key(const char *dir, const char *name, mbedtls_pk_context *key,
                 char *err, size_t errlen)
{
    unsigned char pem[MKCERT_PEM_MAX];
    int rc = -1;

    if (mbedtls_pk_write_key_pem(key, pem, sizeof(pem)) != 0)
        snprintf(err, errlen, "%s: cannot encode the key", name);
    else
        rc = mkcert_write(dir, name, pem, 0600, err, errlen);
    mbedtls_platform_zeroize(pem, sizeof(pem));
    return rc;
}

/*
 * Make every file listed at the top in 'dir'.  Returns 0, or -1 with a
 * message in 'err'.
 */
static int
mkcert_dir(const char *dir, char *err, size_t errlen)
{
    static const struct mkcert_spec ca = {
        MKCERT_CA_NAME, 1, -2 * MKCERT_DAY, MKCERT_DAY,
    };
    static const struct mkcert_spec other_ca = {
        MKCERT_OTHER_CA_NAME, 1, -2 * MKCERT_DAY, MKCERT_DAY,
    };
    static const struct mkcert_spec server = {
        MKCERT_SERVER_NAME, 0, -MKCERT_HOUR, MKCERT_DAY,
    };
    static const struct mkcert_spec expired = {
        MKCERT_SERVER_NAME, 0, -2 * MKCERT_DAY, -MKCERT_DAY,
    };
    mbedtls_pk_context ca_key, other_key, server_key, expired_key, odd_key,
        rsa_key;
    unsigned char pem[MKCERT_PEM_MAX];
    struct mkcert_rng r;
    int rc = -1;

    mbedtls_pk_init(&ca_key);
    mbedtls_pk_init(&other_key);
    mbedtls_pk_init(&server_key);
    mbedtls_pk_init(&expired_key);
    mbedtls_pk_init(&odd_key);
    mbedtls_pk_init(&rsa_key);
    snprintf(err, errlen, "cannot make keys or certificates");
    if (mkcert_rng_init(&r) != 0 || mkcert_key(&ca_key, &r) != 0
        || mkcert_key(&other_key, &r) != 0
        || mkcert_key(&server_key, &r) != 0
        || mkcert_key(&expired_key, &r) != 0
        || mkcert_key(&odd_key, &r) != 0
        || mkcert_rsa_key(&rsa_key, &r) != 0)
        goto out;

    if (mkcert_cert(&ca, &ca_key, ca.subject, &ca_key, &r, pem,
                    sizeof(pem)) != 0
        || mkcert_write(dir, "ca.pem", pem, 0644, err, errlen) != 0
        || mkcert_write_key(dir, "ca.key", &ca_key, err, errlen) != 0)
        goto out;
    if (mkcert_cert(&other_ca, &other_key, other_ca.subject, &other_key, &r,
                    pem, sizeof(pem)) != 0
        || mkcert_write(dir, "other-ca.pem", pem, 0644, err, errlen) != 0)
        goto out;
    if (mkcert_cert(&server, &server_key, ca.subject, &ca_key, &r, pem,
                    sizeof(pem)) != 0
        || mkcert_write(dir, "server.pem", pem, 0644, err, errlen) != 0
        || mkcert_write_key(dir, "server.key", &server_key, err,
                            errlen) != 0)
        goto out;
    if (mkcert_cert(&server, &rsa_key, ca.subject, &ca_key, &r, pem,
                    sizeof(pem)) != 0
        || mkcert_write(dir, "rsa.pem", pem, 0644, err, errlen) != 0
        || mkcert_write_key(dir, "rsa.key", &rsa_key, err, errlen) != 0)
        goto out;
    if (mkcert_cert(&expired, &expired_key, ca.subject, &ca_key, &r, pem,
                    sizeof(pem)) != 0
        || mkcert_write(dir, "expired.pem", pem, 0644, err, errlen) != 0
        || mkcert_write_key(dir, "expired.key", &expired_key, err,
                            errlen) != 0)
        goto out;
    if (mkcert_write_key(dir, "mismatch.key", &odd_key, err, errlen) != 0)
        goto out;
    snprintf(err, errlen, "%s", "");
    rc = 0;

out:
    mbedtls_pk_free(&ca_key);           /* mbedtls_pk_free() zeroises */
    mbedtls_pk_free(&other_key);
    mbedtls_pk_free(&server_key);
    mbedtls_pk_free(&expired_key);
    mbedtls_pk_free(&odd_key);
    mbedtls_pk_free(&rsa_key);
    mkcert_rng_release(&r);
    return rc;
}

#ifndef MKCERT_NO_MAIN
static void
usage(FILE *f)
{
    fputs("usage: mkcert [-h] DIR\n"
          "\n"
          "Write throwaway TLS test certificates into DIR (which must\n"
          "exist; existing files are replaced):\n"
          "  ca.pem ca.key            a test CA\n"
          "  server.pem server.key    signed by it, for localhost,\n"
          "                           127.0.0.1 and ::1, valid 1 day\n"
          "  rsa.pem rsa.key          the same, for an RSA 2048 key\n"
          "  other-ca.pem             an unrelated CA\n"
          "  expired.pem expired.key  signed by the CA, already expired\n"
          "  mismatch.key             a key not matching server.pem\n"
          "Keys are EC P-256 (rsa.key: RSA 2048), mode 0600.  Not for\n"
          "production use.\n", f);
}

int
main(int argc, char **argv)
{
    char err[512];
    int opt;

    while ((opt = getopt(argc, argv, "h")) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    if (mkcert_dir(argv[optind], err, sizeof(err)) != 0) {
        fprintf(stderr, "mkcert: %s\n", err);
        return 1;
    }
    return 0;
}
#endif
