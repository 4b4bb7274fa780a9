/* SPDX-License-Identifier: MIT */
/*
 * util.h - error codes, clocks and small helpers shared by every module.
 *
 * Error convention (STYLE.md section 3): a function that can fail returns
 * int, 0 on success or one of the negative GW_E* codes below.  Incremental
 * parsers return the bytes consumed (> 0), GW_EAGAIN or an error.
 */
#ifndef INFERGW_COMMON_UTIL_H
#define INFERGW_COMMON_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum {
    GW_EAGAIN = -1,         /* need more input; not an error */
    GW_ENOMEM = -2,         /* allocation failed */
    GW_EIO = -3,            /* I/O error; errno was logged where it happened */
    GW_EPARSE = -4,         /* malformed input */
    GW_ETOOBIG = -5,        /* a bound was exceeded */
    GW_ETIMEDOUT = -6,      /* a deadline passed */
    GW_EUPSTREAM = -7,      /* the upstream failed or answered badly */
    GW_ECLOSED = -8,        /* the peer closed the connection */
    GW_EINVAL = -9,         /* invalid argument or value */
    GW_EABORTED = -10,      /* cancelled by the caller (drain, no readers) */
    GW_ESTOPPING = -11,     /* the process is stopping: every wait ends */
    GW_ENOTFOUND = -12,     /* no such thing (a model no upstream serves) */
    GW_EUNAVAIL = -13,      /* nothing usable now (every upstream ejected) */
    GW_ESHED = -14,         /* refused to make room for others (a
                               sheddable request when all are busy) */
    GW_EBUSY = -15,         /* every one of a bounded set stayed taken
                               until the deadline (Redis's pool): not a
                               failure of what it leads to */
};

/* Text for a GW_E* code; never NULL. */
const char *gw_strerror(int rc);

/*
 * GW_TESTABLE marks a static function that unit tests call: it expands to
 * 'static' in normal builds and to nothing when INFERGW_UNIT_TEST is set
 * (curl's UNITTEST).
 */
#ifdef INFERGW_UNIT_TEST
#define GW_TESTABLE
#else
#define GW_TESTABLE static
#endif

#define GW_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#if defined(__GNUC__)
#define GW_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define GW_PRINTF(f, a)
#endif

/* Milliseconds on CLOCK_MONOTONIC; only differences are meaningful. */
int64_t gw_now_ms(void);

/* Microseconds on CLOCK_MONOTONIC; for latency measurements. */
int64_t gw_now_us(void);

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): a date to show. */
int64_t gw_wall_ms(void);

/* Whole seconds since the Unix epoch (CLOCK_REALTIME), rounded down, so
 * that a time before 1970 is in the right UTC day (gw_wall_ms() / 1000
 * rounds toward zero). */
int64_t gw_wall_s(void);

/*
 * Milliseconds left until 'deadline_ms' (a gw_now_ms() value), clamped to
 * [0, INT32_MAX] so it fits poll()'s timeout.  A deadline of -1 means
 * "never" and yields -1 (poll's infinite wait).
 */
int gw_ms_left(int64_t deadline_ms);

/* Case-insensitive compare of a (pointer, length) view with a C string. */
int gw_strieq(const char *p, size_t n, const char *s);

/*
 * How much of the NUL-terminated origin-form 'target' a log line may
 * show: its path, up to the '?' of a query.  A query can carry a key
 * ("?api_key=..."), and no log line carries a key.  As an int for "%.*s"
 * (a target is bounded by max_header_size, far below INT_MAX).
 */
int gw_log_path_len(const char *target);

/*
 * Parse a decimal long in [lo, hi] from the whole of 's' (no sign-only,
 * no trailing bytes).  OUT *out.  0 or GW_EINVAL.
 */
int gw_parse_long(const char *s, long lo, long hi, long *out);

/*
 * Parse all 'n' bytes at 'p' (borrowed; no NUL needed, none read past
 * p + n) as an unsigned decimal of at most 'max': 1*DIGIT, so no sign, no
 * blank and no other byte; leading zeros are digits like any other.
 * OUT *out, set only on success.  Returns 0, GW_EPARSE (empty, or a byte
 * that is not a digit) or GW_ETOOBIG (above 'max').  The bytes are read
 * in order and the first that fails decides which: with max UINT64_MAX,
 * "99999999999999999999x" is GW_ETOOBIG.  Rules of a grammar on top of
 * this (exactly three digits, at most five) stay with the caller.
 */
int gw_parse_uint(const char *p, size_t n, uint64_t max, uint64_t *out);

/*
 * A span in a coarser unit, rounded up (ms to s, us to s, us to ms): a
 * wait told to a client (Retry-After) or to poll() is never shorter than
 * the real one, so 1 ms is 1 s, and 0 stays 0.  Exact for every input,
 * UINT64_MAX included: no sum that could wrap is formed (as
 * "(ms + 999) / 1000" would within 999 of UINT64_MAX).  The result is
 * below UINT64_MAX / 1000 + 2; a caller narrowing it to int bounds its
 * input first.
 */
uint64_t gw_ms_to_s_ceil(uint64_t ms);
uint64_t gw_us_to_s_ceil(uint64_t us);
uint64_t gw_us_to_ms_ceil(uint64_t us);

/* Returns 1 when a + b would overflow size_t, else stores the sum in *out. */
int gw_add_overflows(size_t a, size_t b, size_t *out);

/*
 * 64-bit FNV-1a: fold the 'n' bytes at 'p' into the hash 'h' (start from
 * GW_FNV1A64_OFFSET, or that xor a salt), so that a key may be hashed in
 * pieces.  Fast and stable, but its high bits spread poorly: pass the
 * result through gw_mix64() before using all 64 (a hash ring does).
 */
#define GW_FNV1A64_OFFSET UINT64_C(0xcbf29ce484222325)
uint64_t gw_fnv1a64(uint64_t h, const void *p, size_t n);

/* splitmix64's finaliser: every input bit moves every output bit. */
uint64_t gw_mix64(uint64_t z);

/*
 * 'v' in decimal into out[0..GW_U64_DIGITS), no NUL; returns how many
 * digits.  printf's %llu without printf: for the request path.
 */
#define GW_U64_DIGITS 20
size_t gw_fmt_u64(uint64_t v, char out[GW_U64_DIGITS]);

/* 'n' bytes at 'p' as 2n lowercase hex digits and a NUL into 'out'. */
void gw_hex(const unsigned char *p, size_t n, char *out);

/*
 * Fill 'out' with 'n' random lowercase hex digits and a NUL ('out' must hold
 * n + 1 bytes).  Uses a per-thread xorshift seeded from the clock and thread;
 * good for request ids, not for secrets.
 */
void gw_random_hex(char *out, size_t n);

/*
 * Mutex and condition-variable wrappers (Varnish cache_lck.c): any pthread
 * error is a bug and aborts; the owner is recorded so that a *_locked
 * function can assert(gw_mutex_held(m)).
 */
struct gw_mutex {
    pthread_mutex_t m;
    _Atomic unsigned long owner;    /* pthread_self() of the holder */
    _Atomic int held;
};

void gw_mutex_init(struct gw_mutex *mx);
void gw_mutex_destroy(struct gw_mutex *mx);
void gw_mutex_lock(struct gw_mutex *mx);
void gw_mutex_unlock(struct gw_mutex *mx);
int gw_mutex_held(struct gw_mutex *mx);     /* by the calling thread */

/* Condition variables on CLOCK_MONOTONIC, to match gw_now_ms(). */
void gw_cond_init(pthread_cond_t *cv);
void gw_cond_wait(pthread_cond_t *cv, struct gw_mutex *mx);

/* Wait until 'deadline_ms' (gw_now_ms clock); 0, or GW_ETIMEDOUT. */
int gw_cond_timedwait(pthread_cond_t *cv, struct gw_mutex *mx,
                      int64_t deadline_ms);

#endif
