/* SPDX-License-Identifier: MIT */
/*
 * mock.c - mock_upstream's shared state (mock.h): the options and their
 * defaults, 'st' and its lock, and the small helpers every file of the
 * mock uses.
 */
#include "mock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "log.h"
#include "util.h"

#define MOCK_DEMO_MODEL "llama-3-8b"        /* the tutorial's demo asks it */

/* The defaults, which -h lists. */
struct mock_options opt = { "127.0.0.1:8000", 8, 0, 0, 0, 0,
                            { MOCK_MODEL, MOCK_DEMO_MODEL }, 2, 0, 0, 256, 0,
                            { 0 }, { NULL }, 0 };

struct engine *engine;

double start_time;

struct mock_state st;

/* mock_fault's names, by enum fault. */
static const char *const fault_names[] = {
    "", "reset", "stall", "die_mid_stream", "stall_mid_stream",
    "big_headers", "chunked_json", "chunked_json_die", "head_then_die",
    "head_then_stall", "error_event", "no_store", "private",
};

void
mock_lock(void)
{
    int err = pthread_mutex_lock(&st.mu);

    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_mutex_lock");
        abort();
    }
}

void
mock_unlock(void)
{
    int err = pthread_mutex_unlock(&st.mu);

    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread_mutex_unlock");
        abort();
    }
}

enum fault
mock_fault_parse(const char *name)
{
    size_t i;

    for (i = 1; i < GW_ARRAY_LEN(fault_names); i++)
        if (strcmp(name, fault_names[i]) == 0)
            return (enum fault)i;
    return FAULT_NONE;
}

const char *
mock_fault_name(enum fault f)
{
    return fault_names[f];
}

uint64_t
mock_mix64(uint64_t x)
{
    return gw_mix64(x + UINT64_C(0x9e3779b97f4a7c15));
}

int
mock_dump_to_buf(const char *p, size_t n, void *arg)
{
    return buf_append(arg, p, n) == 0 ? 0 : -1;
}

void
mock_log_safe(char *out, size_t size, const char *s, size_t n)
{
    size_t i;

    if (n > size - 1)
        n = size - 1;
    for (i = 0; i < n; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[n] = '\0';
}

int
mock_state_init(void)
{
    pthread_condattr_t ca;
    int err;

    err = pthread_mutex_init(&st.mu, NULL);
    if (err == 0)
        err = pthread_condattr_init(&ca);
    if (err == 0) {
        /* Hold deadlines are monotonic; a clock step must not move them. */
        err = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (err == 0)
            err = pthread_cond_init(&st.cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (err != 0) {
        log_errno(GW_LOG_ERROR, err, "mock: pthread init");
        return GW_EIO;
    }
    st.released = json_object();
    st.gates = json_object();
    st.last_headers = json_object();
    st.rec = gw_calloc(MOCK_REC_MAX, sizeof(*st.rec));
    st.prefixes = gw_calloc(MOCK_PREFIX_SLOTS, sizeof(*st.prefixes));
    st.stored = gw_calloc(MOCK_STORED, sizeof(*st.stored));
    if (st.released == NULL || st.gates == NULL || st.last_headers == NULL
        || st.rec == NULL
        || st.prefixes == NULL || st.stored == NULL)
        return GW_ENOMEM;
    st.slow_every = opt.slow_every;
    st.poison_status = 500;
    st.slow_ms = opt.slow_ms;
    return 0;
}
