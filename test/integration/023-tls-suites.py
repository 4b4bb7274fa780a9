# SPDX-License-Identifier: MIT
"""023 - TLS cipher suites and session resumption (issue 16 item 13),
against OpenSSL (Python's ssl), with mkcert's ECDSA and RSA certificates:
every TLS 1.2 suite OpenSSL has is offered alone, and only ECDHE with
ChaCha20-Poly1305 or AES-GCM is accepted (static RSA, DHE, CBC, CCM,
CCM_8, Camellia, ARIA ... refused and counted); a session ticket resumes
a session until tls_session_timeout and no longer; 0 turns resumption
off; a reload keeps the ticket keys unless tls_session_timeout changes;
a session whose suite the server would no longer pick (another offer, a
certificate with another kind of key) makes a full handshake, not a
failed one.
"""

import signal
import ssl
import time

from gwtest import budget, wait_for

from coalesce_util import present
from tls_util import (HANDSHAKES, RESUMED, TlsConnection, certs, client_ctx,
                      handshakes, tls_gateway)

# What the gateway must accept, by certificate (OpenSSL's names).
ALLOWED = {
    "server": {"ECDHE-ECDSA-CHACHA20-POLY1305",
               "ECDHE-ECDSA-AES128-GCM-SHA256",
               "ECDHE-ECDSA-AES256-GCM-SHA384"},
    "rsa": {"ECDHE-RSA-CHACHA20-POLY1305", "ECDHE-RSA-AES128-GCM-SHA256",
            "ECDHE-RSA-AES256-GCM-SHA384"},
}


def tls12_ctx(d, ciphers=None):
    """A client context that speaks TLS 1.2 only, offering 'ciphers' (an
    OpenSSL cipher string) if given; security level 0, so that OpenSSL
    offers whatever it is asked to."""
    ctx = client_ctx(d)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        ctx.set_ciphers(ciphers + ":@SECLEVEL=0")
    return ctx


def classes(c):
    """The excluded classes an OpenSSL suite description belongs to."""
    out = set()
    name, sym, kea = c["name"], c["symmetric"] or "null", c["kea"]
    if kea == "kx-rsa":
        out.add("static RSA")
    if kea == "kx-dhe":
        out.add("DHE")
    if "-cbc" in sym:
        out.add("CBC")
    if "ccm" in sym:
        out.add("CCM_8" if "CCM8" in name else "CCM")
    if "camellia" in sym:
        out.add("Camellia")
    if "aria" in sym:
        out.add("ARIA")
    if sym == "null":
        out.add("no encryption")
    if kea == "kx-ecdhe" and not c["aead"]:
        out.add("ECDHE without AEAD")
    return out


def offerable(d):
    """Every suite OpenSSL will offer in a TLS 1.2 ClientHello with a
    certificate-based key exchange (PSK ones need a secret it does not
    have).  OpenSSL labels a suite with the oldest protocol that has it
    ("SSLv3" for AES128-SHA): only its TLS 1.3 ones are left out."""
    out = []
    for c in tls12_ctx(d, "ALL:COMPLEMENTOFALL").get_ciphers():
        if c["protocol"] == "TLSv1.3":
            continue
        if c["kea"] in ("kx-psk", "kx-dhe-psk", "kx-ecdhe-psk",
                        "kx-rsa-psk", "kx-srp"):
            continue
        out.append(c)
    return out


def one_suite(g, d, name):
    """Offer only 'name': the suite negotiated, or None if refused."""
    try:
        c = TlsConnection(g.tls_port, tls12_ctx(d, name))
    except ssl.SSLError:
        return None
    got = c.sock.cipher()[0]
    assert c.request("GET", "/healthz").status == 200
    c.close()
    return got


def check_suites(t, key):
    d = certs(t)
    g = tls_gateway(t, t.mock(), d, key=key)
    refused, accepted, seen = {}, set(), set()
    suites = offerable(d)
    assert len(suites) > 50, [c["name"] for c in suites]
    for c in suites:
        got = one_suite(g, d, c["name"])
        if got is not None:
            assert got == c["name"], (c["name"], got)
            accepted.add(got)
        else:
            refused[c["name"]] = classes(c)
            seen |= refused[c["name"]]
    assert accepted == ALLOWED[key], (accepted, ALLOWED[key])
    for what in ("static RSA", "DHE", "CBC", "CCM", "CCM_8", "Camellia"):
        assert what in seen, "no %s suite was offered: %s" % (what, refused)
    # Each refusal was the server's, said and counted as such.
    wait_for(lambda: handshakes(g, "protocol") == len(refused))
    assert handshakes(g, "ok") == len(accepted)
    g.wait_log(r"tls: handshake failed .*no cipher suite in common")
    return refused


def test_ecdsa_certificate_takes_only_ecdhe_aead(t):
    refused = check_suites(t, "server")
    # ECDHE and AEAD, but not for this key, or not on the list (ARIA).
    assert not refused["ECDHE-RSA-AES128-GCM-SHA256"]
    assert refused["ECDHE-ECDSA-ARIA128-GCM-SHA256"] == {"ARIA"}


def test_rsa_certificate_takes_only_ecdhe_aead(t):
    refused = check_suites(t, "rsa")
    # The 16 suites with static RSA key exchange that used to be taken.
    assert refused["AES128-GCM-SHA256"] == {"static RSA"}
    assert refused["DHE-RSA-CHACHA20-POLY1305"] == {"DHE"}
    assert sum("static RSA" in v for v in refused.values()) >= 10, refused


def resumes(g, ctx, session):
    """Connect offering 'session'; (reused?, the new connection's
    session).  A request goes through either way."""
    c = TlsConnection(g.tls_port, ctx, session=session)
    assert c.request("GET", "/healthz").status == 200
    out = (c.sock.session_reused, c.sock.session)
    c.close()
    return out


def test_a_ticket_resumes_until_tls_session_timeout(t):
    d = certs(t)
    # The second connection below must come within the ticket's life,
    # which mbedTLS counts in whole seconds: at least 2 s, and as long
    # as the build's other budgets are slow (a handshake under a
    # sanitizer, on a busy core, takes a good part of a second).
    life = max(2, round(budget(2)))
    g = tls_gateway(t, t.mock(), d, {"tls_session_timeout": "%ds" % life})
    ctx = tls12_ctx(d)
    start = time.monotonic()
    reused, first = resumes(g, ctx, None)
    assert not reused
    assert first.has_ticket and first.ticket_lifetime_hint == life, first
    assert present(g.metrics(), RESUMED) == 0
    reused, _ = resumes(g, ctx, first)
    assert reused, "the ticket did not resume the session"
    gm = g.metrics()
    assert present(gm, RESUMED) == 1
    assert present(gm, HANDSHAKES, result="ok") == 2
    # Older than its life: a full handshake, with a new ticket that
    # resumes in turn.
    wait_for(lambda: not resumes(g, ctx, first)[0], timeout=life + 8,
             interval=0.1, msg="the session still resumes")
    assert time.monotonic() - start >= life
    reused, fresh = resumes(g, ctx, first)
    assert not reused
    assert resumes(g, ctx, fresh)[0]


def test_no_resumption_with_tls_session_timeout_0(t):
    d = certs(t)
    g = tls_gateway(t, t.mock(), d, {"tls_session_timeout": "0"})
    ctx = tls12_ctx(d)
    reused, first = resumes(g, ctx, None)
    assert not reused and not first.has_ticket
    assert not resumes(g, ctx, first)[0]
    assert present(g.metrics(), RESUMED) == 0


def reload_to(g, gen, old, new):
    with open(g.conf_path) as f:
        text = f.read()
    assert old in text, (old, text)
    with open(g.conf_path, "w") as f:
        f.write(text.replace(old, new))
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=%d in force" % gen)


def test_a_reload_keeps_the_ticket_keys(t):
    """Sessions resume across a reload; a new tls_session_timeout makes
    new keys (logged), so they no longer do, and a session whose ECDSA
    suite an RSA certificate cannot keep makes a full handshake."""
    d = certs(t)
    g = tls_gateway(t, t.mock(), d, {"tls_session_timeout": "1h"})
    ctx = tls12_ctx(d)
    _, first = resumes(g, ctx, None)
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=2 in force")
    assert resumes(g, ctx, first)[0], "a reload lost the ticket keys"
    # The certificate becomes an RSA one: the ECDSA session cannot
    # resume, and the OpenSSL client must not see it resumed under an
    # RSA suite ("old session cipher not returned").
    reload_to(g, 3, "server.", "rsa.")
    reused, rsa_session = resumes(g, ctx, first)
    assert not reused
    assert resumes(g, ctx, rsa_session)[0]
    reload_to(g, 4, "tls_session_timeout = 1h", "tls_session_timeout = 30m")
    g.wait_log(r"generation: tls_session_timeout=1800s: new session ticket keys")
    assert not resumes(g, ctx, rsa_session)[0]


def test_a_changed_offer_makes_a_full_handshake(t):
    """A session made when the client offered AES-128-GCM only, offered
    back with ChaCha20 first in the list, which the server prefers: a
    full handshake under ChaCha20 (mbedTLS alone would resume it under
    ChaCha20, and OpenSSL would abort the handshake)."""
    d = certs(t)
    g = tls_gateway(t, t.mock(), d)
    ctx = tls12_ctx(d, "ECDHE-ECDSA-AES128-GCM-SHA256")
    c = TlsConnection(g.tls_port, ctx)
    assert c.sock.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    first = c.sock.session
    c.close()
    ctx.set_ciphers("ECDHE-ECDSA-CHACHA20-POLY1305:"
                    "ECDHE-ECDSA-AES128-GCM-SHA256")
    c = TlsConnection(g.tls_port, ctx, session=first)
    assert not c.sock.session_reused
    assert c.sock.cipher()[0] == "ECDHE-ECDSA-CHACHA20-POLY1305"
    assert c.request("GET", "/healthz").status == 200
    second = c.sock.session
    c.close()
    assert resumes(g, ctx, second)[0]
    assert handshakes(g, "protocol") == 0
