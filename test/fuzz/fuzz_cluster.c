/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cluster.c - libFuzzer target for what of ours reads Redis's
 * replies and the redis URL: cluster_members_read() (gateway/base/
 * cluster.c) and tenant_shared_read() (the shared limits' script's
 * answer, gateway/base/tenant_shared.c) over replies that hiredis's own
 * reader builds from the input's bytes, and redis_url_parse()
 * (common/redis.c).
 *
 * An input's first byte picks: 'U' reads the rest as a URL (cut at its
 * first NUL); anything else feeds the rest to hiredis's protocol reader
 * as a server's bytes and reads every complete reply as the heartbeat
 * script's answer, and as a heartbeat (cluster_heartbeat_read()).  The
 * reader is bound as the pool binds its own (redis_reader_bound()): a
 * huge array header is refused before hiredis allocates its slots.
 *
 * Besides crashes and sanitizer reports, the target aborts when:
 *   members    a read member count exceeds its room, or a member has an
 *              empty or unterminated node or version, a node with a
 *              blank or a brace, or a negative time to live;
 *   limits     a read answer has a verdict other than admitted or one of
 *              the five shared limits, or a negative wait or reset;
 *   url        a parsed URL has no host, a TCP port outside 1..65535, a
 *              db outside 0..REDIS_URL_DB_MAX, or a socket's URL with a
 *              password; a refused one is left all zero; and the URL
 *              shown for it is printable ASCII and does not depend on
 *              the password (the same with the password wiped).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "base/cluster.h"
#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "fuzz.h"
#include "redis.h"

#define ROOM 8

static void
check_url(const char *s)
{
    struct redis_url u;
    char shown[600], again[600];
    static const struct redis_url zero;

    if (redis_url_parse(s, &u) != 0) {
        REQUIRE(memcmp(&u, &zero, sizeof(u)) == 0);
        return;
    }
    REQUIRE(u.host[0] != '\0');
    REQUIRE(u.unix_socket || (u.port >= 1 && u.port <= 65535));
    REQUIRE(u.db >= 0 && u.db <= REDIS_URL_DB_MAX);
    REQUIRE(!u.unix_socket || u.password[0] == '\0');
    redis_url_show(&u, shown, sizeof(shown));
    for (const char *p = shown; *p != '\0'; p++)
        REQUIRE(*p > 0x20 && *p < 0x7f);
    memset(u.password, 0, sizeof(u.password));
    redis_url_show(&u, again, sizeof(again));
    REQUIRE(strcmp(shown, again) == 0);
    redis_url_wipe(&u);
}

static void
check_member(const struct cluster_member *m)
{
    size_t n = strnlen(m->node, sizeof(m->node));

    REQUIRE(n > 0 && n < sizeof(m->node));
    REQUIRE(strpbrk(m->node, " \t{}\"") == NULL);
    n = strnlen(m->version, sizeof(m->version));
    REQUIRE(n > 0 && n < sizeof(m->version));
    REQUIRE(m->ttl_ms >= 0);
}

static void
check_replies(const uint8_t *p, size_t n)
{
    redisReader *r = redisReaderCreate();
    struct redis_reply_budget budget;
    struct cluster_member got[ROOM], one;
    struct tenant_shared_answer a;
    void *reply = NULL;
    size_t count;

    REQUIRE(r != NULL);
    redis_reader_bound(r, &budget);
    if (redisReaderFeed(r, (const char *)p, n) == REDIS_OK) {
        while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != NULL) {
            memset(got, 0xa5, sizeof(got));
            if (cluster_members_read(reply, got, ROOM, &count) == 0) {
                REQUIRE(count <= ROOM);
                for (size_t i = 0; i < count; i++)
                    check_member(&got[i]);
            } else {
                REQUIRE(count == 0);
            }
            if (tenant_shared_read(reply, &a) == 0) {
                REQUIRE(a.verdict == TENANT_ADMITTED
                        || (a.verdict >= TENANT_MAX_INFLIGHT
                            && a.verdict <= TENANT_QUOTA_MONTH));
                REQUIRE(a.wait_us >= 0 && a.reset_us >= 0
                        && a.tokens_reset_us >= 0);
            }
            if (cluster_heartbeat_read(reply, &one) == 0)
                check_member(&one);
            freeReplyObject(reply);
            reply = NULL;
        }
    }
    redisReaderFree(r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s;

    if (size == 0)
        return 0;
    if (data[0] == 'U') {
        s = malloc(size);
        REQUIRE(s != NULL);
        memcpy(s, data + 1, size - 1);
        s[size - 1] = '\0';
        check_url(s);
        free(s);
        return 0;
    }
    check_replies(data + 1, size - 1);
    return 0;
}
