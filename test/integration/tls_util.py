# SPDX-License-Identifier: MIT
"""Helpers for the TLS integration tests (017, 023): throwaway
certificates from tools/mkcert, a gateway with a TLS listener, and
gwtest connections over Python's ssl."""

import os
import socket
import subprocess

import gwtest
from gwtest import Connection, budget

from coalesce_util import present

HANDSHAKES = "infergw_tls_handshakes_total"
RESUMED = "infergw_tls_resumed_total"


def certs(t, name="certs"):
    """mkcert's files in a fresh directory of the test's: ca.pem,
    server.pem/.key (EC P-256), rsa.pem/.key (RSA 2048), ..."""
    d = os.path.join(t.tmp, name)
    os.makedirs(d, exist_ok=True)
    p = subprocess.run([os.path.join(t.bin, "mkcert"), d],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    assert p.returncode == 0, p.stdout
    return d


def tls_gateway(t, m, d, extra_server=None, key="server", **kw):
    """A gateway in front of 'm' with a TLS listener on port 0 (its port
    in g.tls_port), serving mkcert's 'key'.pem (server or rsa)."""
    server = {"tls_listen": "127.0.0.1:0",
              "tls_cert": os.path.join(d, key + ".pem"),
              "tls_key": os.path.join(d, key + ".key")}
    server.update(extra_server or {})
    conf = kw.pop("conf", {})
    conf.setdefault("server", {}).update(server)
    g = t.gateway(m, conf, **kw)
    line = g.wait_log(r"server: listening for TLS tls_addr=\S+ "
                      r"tls_port=(\d+)")
    g.tls_port = int(line.rsplit("tls_port=", 1)[1])
    return g


def client_ctx(d, ca="ca.pem"):
    import ssl

    ctx = ssl.create_default_context(cafile=os.path.join(d, ca))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class TlsConnection(Connection):
    """A gwtest.Connection over TLS (the reader reads the ssl socket),
    offering 'session' (an ssl.SSLSession of 'ctx') when given."""

    def __init__(self, port, ctx, timeout=10.0, session=None):
        self.port = port
        self.timeout = timeout
        raw = socket.create_connection(("127.0.0.1", port),
                                       timeout=budget(5))
        try:
            s = ctx.wrap_socket(raw, server_hostname="localhost",
                                session=session)
        except Exception:
            raw.close()
            raise
        self.sock = gwtest._register(s)
        self.reader = gwtest._Reader(s)


def handshakes(g, result):
    return present(g.metrics(), HANDSHAKES, result=result)
