/* SPDX-License-Identifier: MIT */
/*
 * control.h - mock_upstream's control endpoints, which tests use to
 * steer an instance and read it back: POST /control, GET /metrics,
 * GET /stats, POST /stats/reset, POST /release and POST /gate
 * (docs/MOCK_UPSTREAM.md).  GET /recorded is record.c's.
 *
 * Each answers the request 'q' whose head conn.c has read.  They copy
 * what they need from 'st' under st.mu and answer without it.
 */
#ifndef INFERGW_TOOLS_MOCK_CONTROL_H
#define INFERGW_TOOLS_MOCK_CONTROL_H

struct req;

/*
 * POST /control?status=S&retry_after=N&health=S&slow_every=N&slow_ms=MS
 * &fault=F&poison=MARKER&poison_status=S&metrics=on|old|off
 * &metrics_delay_ms=MS: change how this instance answers from now on
 * (docs/MOCK_UPSTREAM.md).
 */
void control_set(struct req *q);

/*
 * GET /metrics: vLLM's series (engine_metrics()), with the engine's
 * numbers or, without the engine, the completions being answered as
 * running and zeros for the rest.  /control's metrics= picks the current
 * names, older vLLM's or a 404; its metrics_delay_ms= makes every answer
 * (the 404 too) wait that long first, watching the client.
 */
void control_metrics(struct req *q);

/* GET /stats: the counters, copied under the lock and sent without it. */
void control_stats(struct req *q);

/*
 * POST /stats/reset: zero the counters, forget released tags,
 * last_headers and the request record, and empty the engine's prefix
 * cache and zero its counters.  The gauges (connections_open,
 * in_progress, held, the engine's) describe the present and stay.  The
 * old record is swapped out under the lock and freed after it.
 */
void control_reset(struct req *q);

/* POST /release?tag=T: release every request held on T, now and later. */
void control_release(struct req *q);

/*
 * POST /gate?tag=T&chunks=N: requests gated on T (mock_gate) may send
 * their content chunks up to N (now and later requests; it only opens
 * further: a smaller N leaves it as it was).  Answers {"gate": the
 * opening now, "gated": requests waiting at any gate}.
 */
void control_gate(struct req *q);

#endif
