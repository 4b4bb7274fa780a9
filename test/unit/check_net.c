/*
 * check_net.c - unit tests for common/net.c's address parser,
 * net_parse_hostport(): the one reading of "HOST:PORT" that the
 * listeners, the connects and the config's checks share.
 *
 * Each input is copied so that its NUL is the last byte before a
 * PROT_NONE page: a read past the end of the string crashes the case.
 */
#include <check.h>

#include <stdint.h>
#include <string.h>

#include "net.h"
#include "util.h"
#include "testutil.h"

static const struct {
    const char *s;
    int rc;
    const char *host;           /* what the view holds, on success */
    int port;
    const char *note;
} hostport_cases[] = {
    { "127.0.0.1:8080", 0, "127.0.0.1", 8080, "IPv4 and port" },
    { "localhost:0", 0, "localhost", 0, "port 0: the kernel picks" },
    { ":8080", 0, "", 8080, "every interface" },
    { "[::1]:443", 0, "::1", 443, "IPv6, brackets off" },
    { "[::]:0", 0, "::", 0, "IPv6 wildcard" },
    { "h:65535", 0, "h", 65535, "the largest port" },
    { "h:00080", 0, "h", 80, "five digits, leading zeros" },
    { "h:65536", GW_EINVAL, NULL, 0, "port above 65535" },
    { "h:000080", GW_EINVAL, NULL, 0, "six digits" },
    { "h:", GW_EINVAL, NULL, 0, "no port" },
    { "h", GW_EINVAL, NULL, 0, "no colon" },
    { "", GW_EINVAL, NULL, 0, "empty" },
    { "h:+80", GW_EINVAL, NULL, 0, "signed port" },
    { "h:-1", GW_EINVAL, NULL, 0, "negative port" },
    { "h: 80", GW_EINVAL, NULL, 0, "blank before the port" },
    { "h:80 ", GW_EINVAL, NULL, 0, "blank after the port" },
    { "h:0x50", GW_EINVAL, NULL, 0, "hex port" },
    { "h:http", GW_EINVAL, NULL, 0, "a service name" },
    { "a:b:80", GW_EINVAL, NULL, 0, "two colons outside brackets" },
    { "::1:80", GW_EINVAL, NULL, 0, "bare IPv6" },
    { "[]:80", GW_EINVAL, NULL, 0, "empty brackets" },
    { "[::1]80", GW_EINVAL, NULL, 0, "no colon after the bracket" },
    { "[::1]", GW_EINVAL, NULL, 0, "brackets, no port" },
    { "[::1]:", GW_EINVAL, NULL, 0, "brackets, empty port" },
    { "[::1:80", GW_EINVAL, NULL, 0, "unclosed bracket" },
    { "[::1]]:80", GW_EINVAL, NULL, 0, "the first ']' closes" },
    { "[::1]:80:90", GW_EINVAL, NULL, 0, "a colon in the port" },
};

START_TEST(test_parse_hostport)
{
    size_t n = strlen(hostport_cases[_i].s) + 1;
    char *s = guarded_copy(hostport_cases[_i].s, n);
    const char *host = NULL;
    size_t host_len = 12345;
    int port = -1;

    ck_assert_msg(net_parse_hostport(s, &host, &host_len, &port)
                  == hostport_cases[_i].rc, "%s", hostport_cases[_i].note);
    if (hostport_cases[_i].rc == 0) {
        ck_assert_msg(host_len == strlen(hostport_cases[_i].host)
                      && memcmp(host, hostport_cases[_i].host, host_len) == 0,
                      "%s: host", hostport_cases[_i].note);
        ck_assert_msg(host >= s && host + host_len < s + n,
                      "%s: a view into the input", hostport_cases[_i].note);
        ck_assert_int_eq(port, hostport_cases[_i].port);
    } else {
        ck_assert_msg(host == NULL && host_len == 12345 && port == -1,
                      "%s: untouched", hostport_cases[_i].note);
    }
    guarded_free(s, n);
}
END_TEST

static Suite *
net_suite(void)
{
    Suite *s = suite_create("net");
    TCase *tc;

    tc = tcase("parse_hostport");
    tcase_add_loop_test(tc, test_parse_hostport, 0,
                        (int)GW_ARRAY_LEN(hostport_cases));
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(net_suite()));
}
