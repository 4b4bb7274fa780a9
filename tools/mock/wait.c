/* SPDX-License-Identifier: MIT */
/*
 * wait.c - every wait of a request in mock_upstream (wait.h).
 *
 * Design: every wait (first-byte delay, inter-chunk delay, stall, engine
 * token) is a poll() for POLLRDHUP on the client socket, so a client
 * that goes away ends the wait at once.  A hold or a gate waits on the
 * shared condition variable st.cv in short slices and checks the socket
 * between them: the cost is up to MOCK_HOLD_SLICE_MS of delay in
 * noticing a hang-up.  POST /release and POST /gate (control.c)
 * broadcast st.cv.
 */
#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "engine.h"
#include "log.h"
#include "mock.h"
#include "net.h"
#include "util.h"

#define MOCK_GATE_MS 30000          /* longest wait at a mock_gate */
#define MOCK_HOLD_SLICE_MS 20       /* socket check interval while held */

int
wait_client_or(struct req *q, int64_t ms, int wake_fd)
{
    int64_t deadline = ms < 0 ? -1 : gw_now_ms() + ms;
    struct pollfd pfd[2];
    int n, err;

    for (;;) {
        pfd[0].fd = q->c->fd;
        pfd[0].events = POLLRDHUP;
        pfd[0].revents = 0;
        pfd[1].fd = wake_fd;    /* poll() skips a negative one */
        pfd[1].events = POLLIN;
        pfd[1].revents = 0;
        n = poll(pfd, 2, gw_ms_left(deadline));
        if (n == 0)
            return 0;
        if (n == -1) {
            err = errno;
            if (err == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, err, "mock: poll");
            q->close = 1;
            return GW_EIO;
        }
        if (pfd[0].revents == 0)
            return 1;
        q->gone = 1;
        q->close = 1;
        return GW_ECLOSED;
    }
}

int
wait_client(struct req *q, int64_t ms)
{
    return wait_client_or(q, ms, -1);
}

int
wait_tokens(struct req *q, long n)
{
    int rc;

    if (n > q->chunks)
        n = q->chunks;
    while (engine_seq_tokens(engine, q->seq) < n) {
        rc = wait_client_or(q, -1, engine_seq_fd(q->seq));
        if (rc < 0)
            return rc;
    }
    return 0;
}

int
wait_chunk(struct req *q, long i)
{
    int rc;

    if (q->gate != NULL && (rc = wait_gate(q, i)) != 0)
        return rc;
    if (q->seq != NULL)
        return wait_tokens(q, i + 1);
    return q->delay_ms > 0 ? wait_client(q, q->delay_ms) : 0;
}

void
wait_stall(struct req *q)
{
    wait_client(q, MOCK_STALL_MS);
    q->close = 1;
}

/*
 * Sleep on st.cv for at most MOCK_HOLD_SLICE_MS (st.mu held, and held
 * again on return): woken by a /release or /gate, or, the usual outcome,
 * by the time being up, to look at the client's socket.
 */
static void
wait_slice_locked(void)
{
    struct timespec ts;
    int rc;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += MOCK_HOLD_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    rc = pthread_cond_timedwait(&st.cv, &st.mu, &ts);
    if (rc != 0 && rc != ETIMEDOUT) {
        log_errno(GW_LOG_ERROR, rc, "mock: pthread_cond_timedwait");
        abort();
    }
}

/*
 * How a wait in slices ended (st.mu held): 0 when what it waited for
 * came ('came'), else GW_EABORTED (stopping), GW_ECLOSED (the client is
 * 'gone') or GW_ETIMEDOUT.
 */
static int
wait_result_locked(int came, int gone)
{
    if (came)
        return 0;
    if (st.stopping)
        return GW_EABORTED;
    return gone ? GW_ECLOSED : GW_ETIMEDOUT;
}

int
wait_hold(struct req *q)
{
    struct holder h = { q->hold, 0, NULL };
    struct holder **pp;
    int64_t deadline = gw_now_ms() + MOCK_HOLD_MS;
    int gone = 0, rc;

    mock_lock();
    if (json_object_get(st.released, q->hold) != NULL) {
        mock_unlock();
        return 0;               /* released before it arrived */
    }
    h.next = st.holders;
    st.holders = &h;
    st.held++;
    while (!h.released && !st.stopping && !gone
           && gw_now_ms() < deadline) {
        wait_slice_locked();
        if (h.released || st.stopping)
            break;
        mock_unlock();
        gone = net_peer_gone(q->c->fd);
        mock_lock();
    }
    for (pp = &st.holders; *pp != &h; pp = &(*pp)->next)
        ;
    *pp = h.next;
    st.held--;
    rc = wait_result_locked(h.released, gone);
    mock_unlock();
    if (rc == GW_ECLOSED)
        q->gone = 1;
    if (rc == GW_ECLOSED || rc == GW_EABORTED)
        q->close = 1;           /* a timeout is answered and kept alive */
    return rc;
}

json_int_t
wait_gate_open_locked(const char *tag)
{
    return json_integer_value(json_object_get(st.gates, tag));
}

int
wait_gate(struct req *q, long i)
{
    int64_t deadline = gw_now_ms() + MOCK_GATE_MS;
    int gone = 0, counted = 0, rc;

    mock_lock();
    while (wait_gate_open_locked(q->gate) <= i && !st.stopping && !gone
           && gw_now_ms() < deadline) {
        if (!counted) {
            st.gated++;
            counted = 1;
        }
        wait_slice_locked();
        if (wait_gate_open_locked(q->gate) > i || st.stopping)
            break;
        mock_unlock();
        gone = net_peer_gone(q->c->fd);
        mock_lock();
    }
    if (counted)
        st.gated--;
    rc = wait_result_locked(wait_gate_open_locked(q->gate) > i, gone);
    mock_unlock();
    if (rc == GW_ECLOSED)
        q->gone = 1;
    if (rc == GW_ETIMEDOUT)
        log_msg(GW_LOG_WARN, "mock: mock_gate \"%s\" not opened past "
                "chunk %ld within %d s: the body is cut short", q->gate, i,
                MOCK_GATE_MS / 1000);
    if (rc != 0)
        q->close = 1;
    return rc;
}
