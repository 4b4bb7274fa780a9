"""020 - a fleet a poison prompt cannot eject (issue 16 item 7).

A poison request fails on every upstream it reaches: here a prompt
holding a marker that every mock answers 500 (or 502) to, while
everything else gets 200 (the mock's /control?poison=MARKER).  Three
defences keep such prompts from taking the fleet out for everyone else:

- poison: a request that failed the same way (the same 5xx) on two
  upstreams is the request's fault, and its failures do not count
  toward ejection;
- [routing] max_ejected: never more than that share of a model's
  upstreams ejected at once;
- [routing] panic_below: with fewer than that share usable, calls go to
  all of them, ejected or not (Envoy's panic mode).

The first test is the issue's: default settings, 80% poison, 15 s.  The
others take one defence at a time, with the other two turned off, so
each fails when its own is broken.
"""

import random
import threading
import time

from gwtest import (JSON_HEADERS, Connection, chat_body, has_metric, metric,
                    request, wait_for)

STATE = "infergw_upstream_state"
EJECTIONS = "infergw_upstream_ejections_total"
FAILURES = "infergw_upstream_failures_total"
POISON = "infergw_upstream_poison_requests_total"
CAPPED = "infergw_upstream_ejections_capped_total"
PANIC = "infergw_upstream_panic"
CHAT = "/v1/chat/completions"
MARKER = "POISON-PILL-7f3a"


def pool(t, mocks, routing=None):
    """A gateway over 'mocks' (Mock objects or ports) as [upstream uN]."""
    conf = {"routing": dict(routing or {})}
    for i, m in enumerate(mocks):
        port = m if isinstance(m, int) else m.port
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % port}
    return t.gateway(None, conf)


def value(g, name, **labels):
    """A metric that must exist (checked first), summed over labels."""
    ms = g.metrics()
    assert has_metric(ms, name, **labels), "no %s %r" % (name, labels)
    return metric(ms, name, **labels)


def states(g, n):
    return [value(g, STATE, upstream="u%d" % i) for i in range(n)]


def poison(m, status=None):
    q = "/control?poison=" + MARKER
    if status is not None:
        q += "&poison_status=%d" % status
    r = request(m.port, "POST", q)
    assert r.status == 200, r


def post(g, content):
    return g.post(CHAT, chat_body(content))


def test_mock_answers_the_marker_with_its_poison_status(t):
    m = t.mock()
    r = request(m.port, "POST", "/control?poison=" + MARKER
                + "&poison_status=502")
    assert r.status == 200 and r.json()["poison"] == MARKER, r
    marked = m.call("POST", CHAT, chat_body("say " + MARKER + " now"))
    assert marked.status == 502, marked
    assert m.call("POST", CHAT, chat_body("clean")).status == 200
    assert request(m.port, "POST", "/control?poison_status=99").status == 400
    assert request(m.port, "POST", "/control?poison=%01").status == 400
    assert request(m.port, "POST", "/control?poison=").status == 200
    assert m.call("POST", CHAT, chat_body(MARKER)).status == 200
