# SPDX-License-Identifier: MIT
"""020 - /metrics behind an admin key, and the admin listener (issue 16
item 11).  /metrics names every tenant and counts its traffic: with
tenants configured, the API port serves it only to a request with an
[admin] api_key (401 otherwise); [admin] listen is a listener of its own
for /metrics, /healthz and /readyz, which asks for a key only when
[admin] has one.  /healthz and /readyz never need a key.  Without tenants
(and without admin keys) nothing changes.
"""

import hashlib
import signal

from gwtest import (ADMIN_KEY, assert_error, chat_body, has_metric,
                    parse_metrics, request)

CHAT = "/v1/chat/completions"
TENANT_KEY = "sk-tenant-a-7c41e09b2d"
TENANTS = "[tenant a]\napi_key = %s\n" % TENANT_KEY
ADMIN_LISTEN = {"admin": {"listen": "127.0.0.1:0"}}


def bearer(key):
    return {"Authorization": "Bearer %s" % key}


def metrics_ok(r):
    assert r.status == 200, r
    assert r.content_type.startswith("text/plain; version=0.0.4"), r
    return parse_metrics(r.text)


def test_api_port_metrics_need_the_admin_key_with_tenants(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANTS)
    for h in ({}, bearer(TENANT_KEY), bearer(ADMIN_KEY + "x"),
              {"Authorization": ADMIN_KEY}):
        r = g.get("/metrics", headers=h)
        assert_error(r, 401, "invalid_api_key")
        assert b"[admin] api_key" in r.body, r.body
    gm = metrics_ok(g.get("/metrics", headers=bearer(ADMIN_KEY)))
    assert any(n == "infergw_requests_total" for n, _ in gm), gm
    # Load balancers probe these with no key at all (/readyz: 200 once
    # the health beat's first probe has passed).
    assert g.get("/healthz").status == 200
    g.wait_ready()
    # An admin key is not a tenant's: it reads /metrics, nothing more.
    assert_error(g.post(CHAT, chat_body("x"), dict(
        bearer(ADMIN_KEY), **{"Content-Type": "application/json"})),
        401, "invalid_api_key")
    r = g.post(CHAT, chat_body("x"), dict(
        bearer(TENANT_KEY), **{"Content-Type": "application/json"}))
    assert r.status == 200, r


def test_without_tenants_nothing_changes(t):
    m = t.mock()
    g = t.gateway(m)
    assert g.admin_key is None, g.conf_text
    metrics_ok(g.get("/metrics"))
    metrics_ok(g.get("/metrics", headers=bearer("sk-anything-at-all-0")))
    r = g.post(CHAT, chat_body("x"))
    assert r.status == 200, r


def test_admin_listener_without_a_key(t):
    """Tenants, no admin key: the API port's /metrics is closed to
    everyone, the admin listener's is open, and the admin listener serves
    nothing else."""
    m = t.mock()
    g = t.gateway(m, conf=ADMIN_LISTEN, extra=TENANTS, admin_key=None)
    assert g.admin_port and g.admin_port != g.port
    g.wait_ready()                      # /readyz below answers 200
    for h in ({}, bearer(TENANT_KEY)):
        assert_error(g.get("/metrics", headers=h), 401, "invalid_api_key")
    gm = metrics_ok(request(g.admin_port, "GET", "/metrics"))
    assert has_metric(gm, "infergw_coalesce_followers_by_tenant_total",
                      tenant="a"), gm
    assert request(g.admin_port, "GET", "/healthz").status == 200
    assert request(g.admin_port, "GET", "/readyz").status == 200
    for method, path, body in (("POST", CHAT, chat_body("x")),
                               ("GET", "/v1/models", b""),
                               ("GET", "/nope", b"")):
        r = request(g.admin_port, method, path,
                    dict(bearer(TENANT_KEY),
                         **{"Content-Type": "application/json"}), body)
        assert_error(r, 404, "not_found")
        assert b"admin listener" in r.body, r.body
    assert m.stats()["completions"] == 0
    # A wrong method on an admin route is still a 405 there.
    r = request(g.admin_port, "POST", "/metrics")
    assert_error(r, 405, "method_not_allowed")


def test_admin_listener_asks_for_its_key_when_set(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN_LISTEN, extra=TENANTS)
    g.wait_ready()                      # /readyz below answers 200
    for h in ({}, bearer(TENANT_KEY)):
        assert_error(request(g.admin_port, "GET", "/metrics", h), 401,
                     "invalid_api_key")
    metrics_ok(request(g.admin_port, "GET", "/metrics", bearer(ADMIN_KEY)))
    metrics_ok(g.get("/metrics", headers=bearer(ADMIN_KEY)))
    assert request(g.admin_port, "GET", "/healthz").status == 200
    assert request(g.admin_port, "GET", "/readyz").status == 200


def test_admin_key_without_tenants_closes_metrics_too(t):
    """An operator who sets an admin key means it, tenants or not; and a
    digest works as a key does."""
    m = t.mock()
    other = "sk-rotated-admin-31f0aa9c"
    g = t.gateway(m, conf={"admin": {
        "api_key_sha256": hashlib.sha256(other.encode()).hexdigest()}},
        admin_key=ADMIN_KEY)
    assert_error(g.get("/metrics"), 401, "invalid_api_key")
    metrics_ok(g.get("/metrics", headers=bearer(ADMIN_KEY)))
    metrics_ok(g.get("/metrics", headers=bearer(other)))


def test_reload_takes_new_admin_keys_and_keeps_the_listener(t):
    m = t.mock()
    g = t.gateway(m, conf=ADMIN_LISTEN, extra=TENANTS)
    new_key = "sk-new-admin-key-88e2f1"
    # The [admin] listen is the file's second "listen = 127.0.0.1:0".
    head, listen, tail = g.conf_text.replace(ADMIN_KEY, new_key).rpartition(
        "listen = 127.0.0.1:0")
    text = head + "listen = 127.0.0.1:1" + tail
    assert text.count(new_key) == 1 and head.count("listen =") == 1, text
    with open(g.conf_path, "w") as f:
        f.write(text)
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    g.wait_log(r"reload: \[admin\] listen changed to '127\.0\.0\.1:1': "
               r"that needs a restart, still '127\.0\.0\.1:0'")
    for port in (g.port, g.admin_port):
        assert_error(request(port, "GET", "/metrics", bearer(ADMIN_KEY)),
                     401, "invalid_api_key")
        metrics_ok(request(port, "GET", "/metrics", bearer(new_key)))
