# SPDX-License-Identifier: MIT
"""The soak's processes and what they need: a child whose output goes to
a log (Proc), a mock upstream (Mock), the small client for control
requests (simple_http), and the TLS certificates."""

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

from .client import build_request
from .response import parse_http


class Proc:
    """A child whose stdout is read by a thread into a log file."""

    def __init__(self, argv, logpath, ready_rx, timeout=10.0, on_line=None):
        self.argv = argv
        self.logpath = logpath
        self.lines_seen = []
        self.cond = threading.Condition()
        self.eof = False
        self.on_line = on_line
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.log = open(logpath, "a")
        self.keep = 200               # early lines kept in memory
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.wait_line(ready_rx, timeout) if ready_rx else None

    def _read(self):
        for raw in iter(self.p.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.write(line + "\n")
            if self.on_line:
                self.on_line(line)
            with self.cond:
                if len(self.lines_seen) < self.keep:
                    self.lines_seen.append(line)
                self.cond.notify_all()
        self.log.flush()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_line(self, rx, timeout):
        rx = re.compile(rx)
        deadline = time.monotonic() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.lines_seen):
                    m = rx.search(self.lines_seen[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.2))

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def kill(self):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
            except OSError:
                pass
            try:
                self.p.kill()
            except OSError:
                pass
        try:
            self.p.wait(timeout=5)
        except Exception:
            pass


def simple_http(port, method, path, body=b"", timeout=3.0):
    """A tiny client for control requests: (status, body) or None."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return None
    try:
        s.settimeout(timeout)
        s.sendall(build_request(path, body, method=method)
                  if method == "POST" else
                  ("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
                   "\r\n\r\n" % (method, path)).encode())
        raw = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            raw += d
            p = parse_http(raw, method)
            if p.state == "complete":
                break
    except OSError:
        return None
    finally:
        s.close()
    p = parse_http(raw, method)
    if p.state != "complete":
        return None
    return p.status, p.body


class Mock:
    def __init__(self, bindir, tmp, name, port=0):
        self.bindir, self.tmp, self.name = bindir, tmp, name
        self.port = None
        self.stopped = False
        self.start(port)

    def start(self, port=0):
        exe = os.path.join(self.bindir, "mock_upstream")
        self.proc = Proc([exe, "-l", "127.0.0.1:%d" % port, "-q",
                          "-n", "8", "-d", "20"],
                         os.path.join(self.tmp, self.name + ".log"),
                         r"mock_upstream listening port=(\d+)")
        if not self.proc.ready:
            self.proc.kill()
            return False
        self.port = int(self.proc.ready.group(1))
        return True

    def control(self, query):
        return simple_http(self.port, "POST", "/control?" + query, b"")


def ensure_certs(args):
    d = os.path.abspath(args.tls)
    need = ["ca.pem", "server.pem", "server.key"]
    if not all(os.path.exists(os.path.join(d, f)) for f in need):
        mk = os.path.join(args.bin or "", "mkcert")
        if args.bin and os.access(mk, os.X_OK):
            os.makedirs(d, exist_ok=True)
            r = subprocess.run([mk, d], capture_output=True, timeout=60)
            if r.returncode != 0:
                print("soak: %s %s failed: %s" % (mk, d, r.stderr.decode()))
                sys.exit(2)
        else:
            print("soak: --tls %s needs ca.pem, server.pem, server.key "
                  "(make them with BIN/mkcert DIR)" % d)
            sys.exit(2)
    return d


def client_tls_ctx(cert_dir):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(cert_dir, "ca.pem"))
    ctx.check_hostname = True
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
