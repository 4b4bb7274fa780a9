/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tenant_usage.c - libFuzzer target for tenant_usage_read()
 * (gateway/base/tenant_usage.c), the reader of the usage script's
 * answer, over replies that hiredis's own reader builds from the
 * input's bytes (a server's), every complete reply in turn, the
 * reader bound as the pool binds its own (redis_reader_bound()), so a
 * huge array header is refused before hiredis allocates its slots.
 *
 * Besides crashes and sanitizer reports, the target aborts when an
 * accepted reply is not what the script can answer: a state other than
 * 0, 1 or 2, or a total that no decimal of at most 19 digits (HINCRBY's
 * int64) gives; and when a refused one changed the state it reports.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "base/tenant.h"
#include "base/tenant_impl.h"
#include "fuzz.h"
#include "redis.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct redis_reply_budget budget;
    redisReader *r;
    void *reply = NULL;

    r = redisReaderCreate();
    REQUIRE(r != NULL);
    redis_reader_bound(r, &budget);
    if (redisReaderFeed(r, (const char *)data, size) == REDIS_OK) {
        while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != NULL) {
            uint64_t v[TENANT_USAGE_FIELDS];
            int applied = -7;

            if (tenant_usage_read(reply, &applied, v) == 0) {
                REQUIRE(applied >= 0 && applied <= 2);
                for (size_t f = 0; f < TENANT_USAGE_FIELDS; f++)
                    REQUIRE(v[f] <= UINT64_C(9999999999999999999));
            } else {
                REQUIRE(applied == -7);
            }
            freeReplyObject(reply);
            reply = NULL;
        }
    }
    redisReaderFree(r);
    return 0;
}
