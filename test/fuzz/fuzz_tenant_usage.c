/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tenant_usage.c - libFuzzer target for tenant_usage_read()
 * (gateway/base/tenant_usage.c), the reader of the usage script's
 * answer, over replies that hiredis's own reader builds from the
 * input's bytes (a server's), every complete reply in turn.  Inputs
 * whose array headers ask for 10,000 elements or more are skipped
 * (fuzz.h: fuzz_huge_redis_array()).
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

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *r;
    void *reply = NULL;

    if (fuzz_huge_redis_array(data, size))
        return 0;
    r = redisReaderCreate();
    REQUIRE(r != NULL);
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
