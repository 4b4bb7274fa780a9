# SPDX-License-Identifier: MIT
"""031 - /readyz says whether an upstream can take a call (issue 26 item 4).

/readyz is 503 from the moment no upstream, of any model, can take a
call: ejected, held back by a Retry-After, or, with the health beat on,
not probed yet or its last GET /health failed (the first failed probe,
not the eject_after-th).  With the beat off the breakers and holds alone
decide.  A reload keeps the verdicts.  docs/UPSTREAMS.md "When the
gateway is ready (/readyz)" has the reasons.

The probes are the test's to answer: Upstream below holds every
GET /health until the test says how it ends, so "not probed yet", "the
first failed probe" and "the new configuration's first probe" are
moments the test makes, never races it hopes to win.  A held probe must
be answered within the gateway's HEALTH_PROBE_MAX_MS (5 s); the checks
made meanwhile are a few local requests.
"""

import http.server
import signal
import threading

import gwtest
from gwtest import budget, chat_body, refused_port, request, wait_for

ADMIN = {"listen": "127.0.0.1:0"}
MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


class Upstream:
    """GET /health answered as the test says: at once with 'auto' (a
    status), or, with 'auto' None, held until answer() (a status, or None
    to close the connection unanswered, as a dying server's is).
    GET /v1/models lists one model; anything else is a 404.  Every answer
    closes its connection, so that a probe is never sent again on a fresh
    one (upstream.h's resend of a reused connection's failure)."""

    def __init__(self):
        self.cv = threading.Condition()
        self.auto = 200
        self.held = []              # a [status] per probe waiting
        self.closing = False
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = b""
                if self.path == "/health":
                    status = outer._health()
                elif self.path == "/v1/models":
                    status, body = 200, MODELS
                else:
                    status = 404
                self.close_connection = True
                if status is None:
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, args=(0.05,),
                         daemon=True).start()
        gwtest._register(self)

    def _health(self):
        with self.cv:
            if self.auto is not None:
                return self.auto
            slot = []
            self.held.append(slot)
            self.cv.notify_all()
            self.cv.wait_for(lambda: slot or self.closing, budget(30))
            return slot[0] if slot else None

    def hold(self):
        """Hold every probe from now on."""
        with self.cv:
            self.auto = None

    def wait_held(self):
        """Wait until a probe is held."""
        wait_for(lambda: self.held, 10, msg="a GET /health held")

    def answer(self, status):
        """End the oldest held probe with 'status' (None: unanswered)."""
        with self.cv:
            slot = self.held.pop(0)
            slot.append(status)
            self.cv.notify_all()

    def close(self):
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        self.srv.shutdown()
        self.srv.server_close()


def gateway(t, upstream, routing):
    return t.gateway(upstream, conf={"routing": routing, "admin": ADMIN})


def status(g):
    r = request(g.admin_port, "GET", "/status.json")
    assert r.status == 200, r
    return r.json()


def the_upstream(s):
    assert len(s["upstreams"]) == 1, s["upstreams"]
    return s["upstreams"][0]


def assert_not_ready(g):
    """/readyz is 503 no_upstream on both listeners."""
    for port in (g.port, g.admin_port):
        r = request(port, "GET", "/readyz")
        assert r.status == 503, (port, r)
        assert r.json() == {"status": "no_upstream"}, r


def test_503_until_the_first_probe_passes(t):
    up = Upstream()
    up.hold()
    g = gateway(t, up.port, {"health_interval": "1h"})
    up.wait_held()
    # Probed, not answered: nothing says a call would go anywhere.
    assert_not_ready(g)
    s = status(g)
    u = the_upstream(s)
    assert s["readyz"] == "no_upstream", s
    assert u["probe"] == "pending" and u["ready"] is False, u
    assert u["state"] == "up", u        # the breaker has nothing against it
    up.answer(200)
    g.wait_ready()
    assert request(g.admin_port, "GET", "/readyz").status == 200
    s = status(g)
    assert s["readyz"] == "ready", s
    assert the_upstream(s)["probe"] == "passed", s


def test_the_first_failed_probe_after_it_dies_makes_readyz_503(t):
    """The issue's case: the only upstream dies.  eject_after = 1000, so
    only the probe's verdict can take it out, and the next probe is held
    while /readyz is asked, so exactly one has failed."""
    up = Upstream()
    g = gateway(t, up.port, {"health_interval": "20ms",
                             "eject_after": 1000})
    g.wait_ready()
    up.hold()
    up.wait_held()
    assert g.get("/readyz").status == 200   # not known to be dead yet
    up.answer(None)                          # it dies under the probe
    up.wait_held()                           # the next one: judged
    assert_not_ready(g)
    s = status(g)
    u = the_upstream(s)
    assert sum(u["failures"].values()) == 1, u
    assert u["state"] == "up" and u["probe"] == "failed", u
    assert u["ready"] is False and s["readyz"] == "no_upstream", s
    # Back: the first probe that passes makes it ready again.
    up.answer(200)
    g.wait_ready()


def test_half_open_is_not_ready_until_a_probe_passes(t):
    """Its ejection over, a dead upstream turns half-open: the breaker
    would let a trial through, but the last word on it is still the
    failed probe.  (The issue saw /readyz 200 there.)  The next probe is
    an hour away: this is the only one."""
    g = gateway(t, refused_port(), {"health_interval": "1h",
                                    "eject_after": 1, "eject_time": "50ms"})

    def half_open():
        s = status(g)
        return s if the_upstream(s)["state"] == "half_open" else None
    s = wait_for(half_open, 10, msg="half-open")
    u = the_upstream(s)
    assert u["failures"]["connect"] == 1 and u["probe"] == "failed", u
    assert u["ready"] is False and s["readyz"] == "no_upstream", s
    assert_not_ready(g)


def test_held_back_by_retry_after_is_not_ready(t):
    """Every upstream held back by its Retry-After takes no call until
    the hold is over: 503 meanwhile, though its probes pass and it is
    not ejected."""
    m = t.mock()
    ra = round(budget(2))           # the checks below fit in it
    r = request(m.port, "POST", "/control?status=429&retry_after=%d" % ra)
    assert r.status == 200, r
    g = gateway(t, m, {"eject_after": 1000})
    g.wait_ready()
    r = g.post("/v1/chat/completions", chat_body("busy"))
    assert r.status in (429, 503), r    # relayed, or the gateway's for it

    def held():
        s = status(g)
        return s if the_upstream(s)["held_ms"] > 0 else None
    s = wait_for(held, 10, msg="held back")
    u = the_upstream(s)
    # One document, one lock: held, so not ready, in the same instant.
    assert u["state"] == "up" and u["probe"] == "passed", u
    assert u["ready"] is False and s["readyz"] == "no_upstream", s
    assert_not_ready(g)
    r = request(m.port, "POST", "/control?status=0")
    assert r.status == 200, r
    g.wait_ready(timeout=ra + 5)


def test_beat_off_ready_from_the_start_until_ejected(t):
    """With health_interval = 0 nothing will ever probe: "not probed yet"
    cannot count, or /readyz would wait for a call no balancer sends."""
    g = gateway(t, refused_port(), {"health_interval": 0, "eject_after": 1,
                                    "eject_time": "1m"})
    r = g.get("/readyz")
    assert r.status == 200 and r.json() == {"status": "ready"}, r
    u = the_upstream(status(g))
    assert u["probe"] is None and u["ready"] is True, u
    r = g.post("/v1/chat/completions", chat_body("x"))
    assert r.status == 502, r
    # The verdict may land just after its answer reached the client.
    wait_for(lambda: g.get("/readyz").status == 503, msg="ejected: 503")
    assert_not_ready(g)


def test_a_reload_keeps_the_verdict_while_its_probes_run(t):
    up = Upstream()
    g = gateway(t, up.port, {"health_interval": "1h"})
    g.wait_ready()
    up.hold()
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    up.wait_held()                  # the new generation's first probe
    s = status(g)
    assert s["generation"] == 2, s
    assert the_upstream(s)["probe"] == "passed", s
    r = g.get("/readyz")
    assert r.status == 200, r
    up.answer(200)
