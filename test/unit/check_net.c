/* SPDX-License-Identifier: MIT */
/*
 * check_net.c - unit tests for common/net.c's address parsers:
 * net_parse_hostport(), the one reading of "HOST:PORT" that the
 * listeners, the connects and the config's checks share; and the IP
 * addresses and networks ([server] trusted_proxies) with their matcher.
 *
 * Each input is copied so that its NUL is the last byte before a
 * PROT_NONE page: a read past the end of the string crashes the case.
 */
#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
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

static const struct {
    const char *s;
    int rc;
    int family;                 /* on success */
    unsigned bits;
    const char *text;           /* net_addr_format() of the network */
    const char *note;
} cidr_cases[] = {
    { "10.0.0.0/8", 0, AF_INET, 8, "10.0.0.0", "IPv4 network" },
    { "192.168.1.7", 0, AF_INET, 32, "192.168.1.7", "lone IPv4: /32" },
    { "192.168.1.7/32", 0, AF_INET, 32, "192.168.1.7", "IPv4 /32" },
    { "0.0.0.0/0", 0, AF_INET, 0, "0.0.0.0", "every IPv4 address" },
    { "fd00::/8", 0, AF_INET6, 8, "fd00::", "IPv6 network" },
    { "::1", 0, AF_INET6, 128, "::1", "lone IPv6: /128" },
    { "::/0", 0, AF_INET6, 0, "::", "every IPv6 address" },
    { "2001:db8::/32", 0, AF_INET6, 32, "2001:db8::", "documentation" },
    { "2001:db8:0:1::/63", GW_EINVAL, 0, 0, NULL, "host bit 64 set" },
    { "::ffff:10.0.0.0/104", 0, AF_INET, 8, "10.0.0.0",
      "mapped IPv4 network: the IPv4 one" },
    { "::ffff:10.1.2.3", 0, AF_INET, 32, "10.1.2.3", "lone mapped" },
    { "::ffff:0.0.0.0/95", GW_EINVAL, 0, 0, NULL,
      "wider than the mapped space" },
    { "10.1.0.0/8", GW_EINVAL, 0, 0, NULL, "host bits past the prefix" },
    { "10.0.0.1/31", GW_EINVAL, 0, 0, NULL, "last host bit set" },
    { "10.0.0.0/33", GW_EINVAL, 0, 0, NULL, "prefix past 32" },
    { "::/129", GW_EINVAL, 0, 0, NULL, "prefix past 128" },
    { "10.0.0.0/08", GW_EINVAL, 0, 0, NULL, "leading zero in the prefix" },
    { "10.0.0.0/", GW_EINVAL, 0, 0, NULL, "empty prefix" },
    { "10.0.0.0/+8", GW_EINVAL, 0, 0, NULL, "signed prefix" },
    { "10.0.0.0/8/8", GW_EINVAL, 0, 0, NULL, "two slashes" },
    { "/8", GW_EINVAL, 0, 0, NULL, "no address" },
    { "", GW_EINVAL, 0, 0, NULL, "empty" },
    { "10.0.0", GW_EINVAL, 0, 0, NULL, "three parts" },
    { "010.0.0.0/8", GW_EINVAL, 0, 0, NULL, "leading zero (octal?)" },
    { "256.0.0.0/8", GW_EINVAL, 0, 0, NULL, "octet past 255" },
    { " 10.0.0.0/8", GW_EINVAL, 0, 0, NULL, "blank before" },
    { "10.0.0.0/8 ", GW_EINVAL, 0, 0, NULL, "blank after" },
    { "[::1]", GW_EINVAL, 0, 0, NULL, "brackets" },
    { "fe80::1%eth0", GW_EINVAL, 0, 0, NULL, "zone" },
    { "1.2.3.4:80", GW_EINVAL, 0, 0, NULL, "port" },
    { "localhost", GW_EINVAL, 0, 0, NULL, "a name" },
    { "1:2:3:4:5:6:7:8:9", GW_EINVAL, 0, 0, NULL, "nine groups" },
    { "0000:0000:0000:0000:0000:ffff:255.255.255.255/128", 0, AF_INET, 32,
      "255.255.255.255", "the longest IPv6 text (45 characters)" },
    { "00000:0000:0000:0000:0000:ffff:255.255.255.255", GW_EINVAL, 0, 0,
      NULL, "longer than any IPv6 text" },
};

START_TEST(test_cidr_parse)
{
    size_t n = strlen(cidr_cases[_i].s);
    char *s = guarded_copy(cidr_cases[_i].s, n);
    struct net_cidr c;
    char text[NET_ADDR_STRLEN];

    memset(&c, 0x5a, sizeof(c));
    ck_assert_msg(net_cidr_parse(s, n, &c) == cidr_cases[_i].rc, "%s",
                  cidr_cases[_i].note);
    if (cidr_cases[_i].rc == 0) {
        ck_assert_msg(c.addr.family == cidr_cases[_i].family, "%s: family",
                      cidr_cases[_i].note);
        ck_assert_msg(c.bits == cidr_cases[_i].bits, "%s: bits %u",
                      cidr_cases[_i].note, c.bits);
        net_addr_format(&c.addr, text, sizeof(text));
        ck_assert_str_eq(text, cidr_cases[_i].text);
    }
    guarded_free(s, n);
}
END_TEST

static const struct {
    const char *net;
    const char *addr;
    int match;
    const char *note;
} match_cases[] = {
    { "10.0.0.0/8", "10.255.255.255", 1, "last address inside" },
    { "10.0.0.0/8", "11.0.0.0", 0, "first address past it" },
    { "10.0.0.0/8", "9.255.255.255", 0, "last address before it" },
    { "192.168.4.0/22", "192.168.7.200", 1, "prefix not on a byte" },
    { "192.168.4.0/22", "192.168.8.1", 0, "next /22" },
    { "192.168.4.0/22", "192.168.3.255", 0, "previous /22" },
    { "127.0.0.1", "127.0.0.1", 1, "a /32 is one address" },
    { "127.0.0.1", "127.0.0.2", 0, "and no other" },
    { "0.0.0.0/0", "203.0.113.9", 1, "/0 holds every IPv4 address" },
    { "0.0.0.0/0", "::1", 0, "but no IPv6 one" },
    { "::/0", "10.0.0.1", 0, "nor the reverse" },
    { "::/0", "2001:db8::1", 1, "::/0 holds every IPv6 address" },
    { "fd00::/8", "fdff:ffff::1", 1, "IPv6 inside" },
    { "fd00::/8", "fe00::1", 0, "IPv6 outside" },
    { "2001:db8::/33", "2001:db8:7fff::1", 1, "bit 33 clear" },
    { "2001:db8::/33", "2001:db8:8000::1", 0, "bit 33 set" },
    { "::1", "::1", 1, "IPv6 /128" },
    { "10.0.0.0/8", "::ffff:10.1.2.3", 1,
      "a mapped address matches its IPv4 network" },
    { "::ffff:10.0.0.0/104", "10.9.9.9", 1,
      "a mapped network holds IPv4 addresses" },
    { "::ffff:10.0.0.0/104", "11.0.0.1", 0, "... only its own" },
};

START_TEST(test_cidr_match)
{
    struct net_cidr c;
    struct net_addr a;
    const char *net = match_cases[_i].net, *addr = match_cases[_i].addr;

    ck_assert_int_eq(net_cidr_parse(net, strlen(net), &c), 0);
    ck_assert_int_eq(net_addr_parse(addr, strlen(addr), &a), 0);
    ck_assert_msg(net_cidr_match(&c, &a) == match_cases[_i].match, "%s",
                  match_cases[_i].note);
}
END_TEST

/* A socket's address, as accept() gives it, of either family. */
START_TEST(test_addr_from_sockaddr)
{
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr un = { .sa_family = AF_UNIX };
    struct net_addr a;
    char text[NET_ADDR_STRLEN];

    memset(&in4, 0, sizeof(in4));
    in4.sin_family = AF_INET;
    ck_assert_int_eq(inet_pton(AF_INET, "198.51.100.7", &in4.sin_addr), 1);
    ck_assert_int_eq(net_addr_from_sockaddr(&in4, &a), 0);
    net_addr_format(&a, text, sizeof(text));
    ck_assert_str_eq(text, "198.51.100.7");

    memset(&in6, 0, sizeof(in6));
    in6.sin6_family = AF_INET6;
    ck_assert_int_eq(inet_pton(AF_INET6, "::ffff:198.51.100.7",
                               &in6.sin6_addr), 1);
    ck_assert_int_eq(net_addr_from_sockaddr(&in6, &a), 0);
    ck_assert_int_eq(a.family, AF_INET);    /* a dual-stack IPv4 peer */
    net_addr_format(&a, text, sizeof(text));
    ck_assert_str_eq(text, "198.51.100.7");

    ck_assert_int_eq(inet_pton(AF_INET6, "2001:db8::7", &in6.sin6_addr), 1);
    ck_assert_int_eq(net_addr_from_sockaddr(&in6, &a), 0);
    ck_assert_int_eq(a.family, AF_INET6);
    net_addr_format(&a, text, sizeof(text));
    ck_assert_str_eq(text, "2001:db8::7");

    ck_assert_int_eq(net_addr_from_sockaddr(&un, &a), GW_EINVAL);
    net_addr_format(&a, text, sizeof(text));
    ck_assert_str_eq(text, "-");
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
    tc = tcase("cidr_parse");
    tcase_add_loop_test(tc, test_cidr_parse, 0,
                        (int)GW_ARRAY_LEN(cidr_cases));
    suite_add_tcase(s, tc);
    tc = tcase("cidr_match");
    tcase_add_loop_test(tc, test_cidr_match, 0,
                        (int)GW_ARRAY_LEN(match_cases));
    suite_add_tcase(s, tc);
    tc = tcase("addr_from_sockaddr");
    tcase_add_test(tc, test_addr_from_sockaddr);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return test_run(srunner_create(net_suite()));
}
