# SPDX-License-Identifier: MIT
"""gwtest - the harness for infergw's integration tests.

Python 3 standard library only.  HTTP is spoken over raw sockets so that a
test can send hostile bytes exactly and see exactly what came back.

What is here:
  SLOW, budget()        time budgets scaled by INFERGW_TEST_SLOW_FACTOR
  wait_for()            poll a predicate until a deadline (no blind sleeps)
  Skip, skip(), tool()  skip a test that cannot run here (run.py's rule)
  Mock                  tools/mock_upstream on 127.0.0.1, port 0
  Gateway               infergw with a generated config file, port 0
  Connection            one client socket; several requests (keep-alive)
  request()             one request on a fresh connection
  Stream                a streaming response read as it arrives
  send_raw()            hostile bytes in, raw bytes and "closed?" out
  parse_response()      raw bytes -> Response
  assert_error()        the OpenAI error shape every gateway error uses
  normalise()           blank out the mock's per-call "id" and "created"
  Ctx                   per-test context: temp dir, processes, cleanup

Every process and socket a test starts is registered, and Ctx.cleanup()
(called by run.py after each test, pass or fail) kills or closes them.
Everything listens on 127.0.0.1 port 0; the chosen port is read back.
"""

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))

SLOW = float(os.environ.get("INFERGW_TEST_SLOW_FACTOR", "1") or "1")


def budget(seconds):
    """A time budget scaled for slow (sanitizer) builds."""
    return seconds * SLOW


# --------------------------------------------------------------------------
# Skips.  A test that cannot run here raises Skip, and run.py reports it as
# "skip" with the reason.  A skip for want of a program names the program
# and its Debian package (tool()), so that run.py can tell whether the
# install step (tools/install-deps.sh) should have provided it: under
# INFERGW_TEST_NO_SKIP=1 (make check) such a skip is a failure.

class Skip(Exception):
    """This test cannot run here.  'package' is the Debian package that
    would let it run, or None when it is not a missing program."""

    def __init__(self, reason, package=None):
        super().__init__(reason)
        self.reason = reason
        self.package = package


def skip(reason):
    """Skip the running test, saying why."""
    raise Skip(reason)


# Debian puts daemons (haproxy) in sbin, which a user's PATH often lacks.
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def tool(name, package=None):
    """The path of program 'name' (PATH, then the sbin directories), or
    skip the test, naming the Debian package ('package', default 'name')
    that provides it."""
    path = shutil.which(name) or shutil.which(name, path=_SBIN)
    if path is None:
        package = package or name
        raise Skip("no %s here (apt-get install %s)" % (name, package),
                   package)
    return path


def wait_for(pred, timeout=5.0, interval=0.02, msg=None):
    """Call pred() until it returns a truthy value, which is returned.

    'timeout' is scaled by SLOW.  On timeout raises AssertionError naming
    'msg' (or the predicate) and the last value or exception seen.
    """
    deadline = time.monotonic() + budget(timeout)
    last = None
    while True:
        try:
            last = pred()
            if last:
                return last
        except AssertionError:
            raise
        except Exception as e:          # a transient failure: keep polling
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s "
                                 "(last: %r)" % (budget(timeout),
                                                 msg or getattr(
                                                     pred, "__name__", pred),
                                                 last))
        time.sleep(interval)


# --------------------------------------------------------------------------
# Resource registry: everything is cleaned up by the Ctx that created it.

class _Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, obj):
        with self.lock:
            self.items.append(obj)
        return obj

    def drain(self):
        with self.lock:
            items, self.items = self.items, []
        return items


_current = _Registry()      # the running test's resources


def _register(obj):
    return _current.add(obj)


def _close_quietly(obj):
    try:
        obj.close()
    except Exception:
        pass


def kill_process(proc):
    """SIGKILL a process this harness started, and reap it."""
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except Exception:
        pass


def kill_group(proc):
    """SIGTERM the process group of 'proc', started with
    start_new_session=True (a script such as tools/run.sh and what it
    started), then SIGKILL and reap 'proc' itself."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    kill_process(proc)


# --------------------------------------------------------------------------
# Child process output, captured line by line in a background thread.

class _Output:
    def __init__(self, stream, logpath=None):
        self.lines = []
        self.cond = threading.Condition()
        self.eof = False
        self.logfile = open(logpath, "w") if logpath else None
        self.thread = threading.Thread(target=self._run, args=(stream,),
                                       daemon=True)
        self.thread.start()

    def _run(self, stream):
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self.cond:
                    self.lines.append(line)
                    self.cond.notify_all()
                if self.logfile:
                    self.logfile.write(line + "\n")
                    self.logfile.flush()
        except Exception:
            pass
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()
            if self.logfile:
                _close_quietly(self.logfile)
            _close_quietly(stream)

    def snapshot(self):
        with self.cond:
            return list(self.lines)

    def wait_eof(self, timeout):
        """Wait until every line the process wrote has been read (its
        output closed), for at most 'timeout' seconds; True if so."""
        with self.cond:
            return self.cond.wait_for(lambda: self.eof, timeout)

    def wait_line(self, pattern, timeout):
        """First line matching regex 'pattern' (a match object), or None
        at EOF or after 'timeout' seconds (not scaled here)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    return None
                self.cond.wait(min(left, 0.2))


# --------------------------------------------------------------------------
# HTTP: a socket reader with deadlines, and a response parser.

class HttpError(AssertionError):
    """The peer's bytes are not a well-formed HTTP response."""


class _Reader:
    """Buffered reads from a socket (or fixed bytes) with deadlines."""

    def __init__(self, sock=None, data=b""):
        self.sock = sock
        self.buf = bytearray(data)
        self.eof = sock is None
        self.reset = False
        self.raw = bytearray(data)      # every byte ever received

    def fill(self, deadline):
        """Read more bytes; False at EOF/reset, raises socket.timeout
        after 'deadline' (time.monotonic())."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline passed")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            self.eof = True
            self.reset = True
            return False
        if not data:
            self.eof = True
            return False
        self.buf += data
        self.raw += data
        return True

    def read_until(self, delim, deadline, limit=1 << 20):
        while True:
            i = self.buf.find(delim)
            if i >= 0:
                n = i + len(delim)
                out = bytes(self.buf[:n])
                del self.buf[:n]
                return out
            if len(self.buf) > limit:
                raise HttpError("no %r within %d bytes" % (delim, limit))
            if not self.fill(deadline):
                return None

    def read_exact(self, n, deadline):
        """Up to n bytes: fewer only at EOF."""
        while len(self.buf) < n:
            if not self.fill(deadline):
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_some(self, deadline, maxn=65536):
        """Whatever is buffered, else wait for at least one byte; b"" at
        EOF."""
        if not self.buf:
            if not self.fill(deadline):
                return b""
        out = bytes(self.buf[:maxn])
        del self.buf[:maxn]
        return out

    def pieces(self, n, deadline):
        """Yield the next n bytes as they arrive; returns how many did
        not (nonzero only at EOF)."""
        while n > 0:
            if not self.buf and not self.fill(deadline):
                break
            piece = bytes(self.buf[:n])
            del self.buf[:len(piece)]
            n -= len(piece)
            yield piece
        return n

    def read_to_eof(self, deadline):
        while self.fill(deadline):
            pass
        out = bytes(self.buf)
        self.buf.clear()
        return out


class Headers:
    """Response header fields in order, with case-insensitive lookup."""

    def __init__(self, items):
        self.items = list(items)

    def get(self, name, default=None):
        n = name.lower()
        for k, v in self.items:
            if k.lower() == n:
                return v
        return default

    def get_all(self, name):
        n = name.lower()
        return [v for k, v in self.items if k.lower() == n]

    def has_token(self, name, token):
        """Does a comma-separated field contain 'token' (any case)?"""
        t = token.lower()
        for v in self.get_all(name):
            if t in [x.strip().lower() for x in v.split(",")]:
                return True
        return False

    def __contains__(self, name):
        return self.get(name) is not None

    def __iter__(self):
        return iter(self.items)

    def __repr__(self):
        return "Headers(%r)" % (self.items,)


class Response:
    def __init__(self):
        self.version = None
        self.status = None
        self.reason = ""
        self.headers = Headers([])
        self.interim = []           # 1xx responses seen first (status list)
        self.body = b""
        self.raw = b""              # the bytes of this response (final)
        self.chunked = False
        self.framing = None         # "length", "chunked", "close", "none"
        self.clean_end = False      # full Content-Length / 0-chunk seen
        self.trailers = []

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except Exception as e:
            raise AssertionError("response body is not JSON (%s): %r"
                                 % (e, self.body[:300]))

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    @property
    def content_type(self):
        return self.headers.get("Content-Type", "")

    @property
    def connection_close(self):
        return self.headers.has_token("Connection", "close")

    def __repr__(self):
        return ("<Response %s %r framing=%s clean=%s body=%r>"
                % (self.status, self.headers.items, self.framing,
                   self.clean_end, self.body[:200]))


_STATUS_RX = re.compile(rb"^HTTP/(\d)\.(\d) (\d{3})(?: (.*))?\r\n$")


def _read_head(reader, deadline, resp):
    """Read one status line and header block into 'resp'.  Returns False
    if the connection ended before a single byte of it."""
    start = len(reader.raw) - len(reader.buf)
    line = reader.read_until(b"\r\n", deadline, limit=65536)
    if line is None:
        if reader.buf:
            raise HttpError("connection closed inside a status line: %r"
                            % bytes(reader.buf[:200]))
        return False
    m = _STATUS_RX.match(line)
    if not m:
        raise HttpError("bad status line %r" % line[:200])
    resp.version = "HTTP/%s.%s" % (m.group(1).decode(), m.group(2).decode())
    resp.status = int(m.group(3))
    resp.reason = (m.group(4) or b"").decode("latin-1")
    items = []
    while True:
        line = reader.read_until(b"\r\n", deadline, limit=1 << 20)
        if line is None:
            raise HttpError("connection closed inside the response head")
        if line == b"\r\n":
            break
        if b":" not in line:
            raise HttpError("bad header line %r" % line[:200])
        k, v = line[:-2].split(b":", 1)
        if k != k.strip() or not k:
            raise HttpError("bad header name %r" % k)
        items.append((k.decode("latin-1"), v.strip().decode("latin-1")))
    resp.headers = Headers(items)
    resp._head_start = start
    return True


def _no_body(method, status):
    return (method == "HEAD" or 100 <= status < 200 or status in (204, 304))


def read_head(reader, deadline, method="GET", want_interim=False):
    """Read a response head, skipping (and recording) 1xx responses.
    Returns a Response with no body read yet, or None if the connection
    ended before any byte."""
    resp = Response()
    interim = []
    while True:
        if not _read_head(reader, deadline, resp):
            if interim:
                raise HttpError("connection closed after 1xx %r" % interim)
            return None
        if 100 <= resp.status < 200 and resp.status != 101:
            interim.append(resp.status)
            if want_interim:
                resp.interim = interim
                return resp
            resp = Response()
            continue
        resp.interim = interim
        return resp


def _chunk_size(line):
    """Parse a chunk-size line (extensions ignored); None if malformed."""
    s = line[:-2].split(b";", 1)[0].strip()
    if not s or not re.fullmatch(rb"[0-9a-fA-F]+", s):
        return None
    return int(s, 16)


def iter_body(reader, resp, deadline, method="GET"):
    """Yield the response body as it arrives (de-chunked).  Sets
    resp.framing, resp.chunked and, at the end, resp.clean_end."""
    if _no_body(method, resp.status):
        resp.framing = "none"
        resp.clean_end = True
        return
    te = resp.headers.get("Transfer-Encoding")
    cl = resp.headers.get("Content-Length")
    if te is not None:
        if te.strip().lower() != "chunked":
            raise HttpError("unexpected Transfer-Encoding %r" % te)
        if cl is not None:
            raise HttpError("response has both Content-Length and "
                            "Transfer-Encoding")
        resp.chunked = True
        resp.framing = "chunked"
        while True:
            line = reader.read_until(b"\r\n", deadline, limit=4096)
            if line is None:
                return                  # EOF: not a clean end
            size = _chunk_size(line)
            if size is None:
                raise HttpError("bad chunk size line %r" % line[:100])
            if size == 0:
                while True:             # trailers up to the empty line
                    t = reader.read_until(b"\r\n", deadline)
                    if t is None:
                        return
                    if t == b"\r\n":
                        resp.clean_end = True
                        return
                    resp.trailers.append(t)
            if (yield from reader.pieces(size, deadline)):
                return                  # EOF inside the chunk
            crlf = reader.read_exact(2, deadline)
            if crlf != b"\r\n":
                if len(crlf) < 2:
                    return
                raise HttpError("chunk data not followed by CRLF: %r" % crlf)
    elif cl is not None:
        if not re.fullmatch(r"\d+", cl.strip()) or \
                len(resp.headers.get_all("Content-Length")) != 1:
            raise HttpError("bad Content-Length %r" % cl)
        resp.framing = "length"
        if (yield from reader.pieces(int(cl), deadline)):
            return                      # EOF before Content-Length bytes
        resp.clean_end = True
    else:
        resp.framing = "close"          # never a "clean" end: can't tell
        while True:
            piece = reader.read_some(deadline)
            if not piece:
                return
            yield piece


def read_response(reader, deadline, method="GET"):
    """A whole response (1xx skipped and recorded), or None if the
    connection ended before any byte."""
    resp = read_head(reader, deadline, method)
    if resp is None:
        return None
    parts = []
    for piece in iter_body(reader, resp, deadline, method):
        parts.append(piece)
    resp.body = b"".join(parts)
    end = len(reader.raw) - len(reader.buf)
    resp.raw = bytes(reader.raw[resp._head_start:end])
    return resp


def parse_response(raw, method="GET"):
    """Parse raw response bytes (as from send_raw) into a Response."""
    r = _Reader(data=raw)
    resp = read_response(r, time.monotonic() + 1, method)
    if resp is None:
        raise HttpError("no response bytes at all")
    return resp


def build_request(method, path, headers=None, body=b"",
                  version="HTTP/1.1", host="127.0.0.1"):
    """Request bytes.  'headers' is a dict or a list of pairs.  Host is
    added unless given or host is None; Content-Length is added for a
    body or a POST unless Content-Length or Transfer-Encoding is given."""
    if isinstance(body, str):
        body = body.encode()
    if headers is None:
        headers = []
    elif isinstance(headers, dict):
        headers = list(headers.items())
    names = [k.lower() for k, _ in headers]
    lines = ["%s %s %s" % (method, path, version)]
    if host is not None and "host" not in names:
        lines.append("Host: %s" % host)
    for k, v in headers:
        lines.append("%s: %s" % (k, v))
    if ("content-length" not in names and "transfer-encoding" not in names
            and (body or method == "POST")):
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=budget(timeout))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Connection:
    """One client connection; requests on it reuse the socket."""

    def __init__(self, port, timeout=10.0):
        self.port = port
        self.timeout = timeout
        self.sock = _register(connect(port))
        self.reader = _Reader(self.sock)

    def deadline(self, timeout=None):
        return time.monotonic() + budget(self.timeout if timeout is None
                                         else timeout)

    def send(self, data):
        self.sock.settimeout(budget(self.timeout))
        self.sock.sendall(data)

    def request(self, method, path, headers=None, body=b"", timeout=None,
                **kw):
        self.send(build_request(method, path, headers, body, **kw))
        return self.read_response(method, timeout)

    def read_response(self, method="GET", timeout=None):
        resp = read_response(self.reader, self.deadline(timeout), method)
        if resp is None:
            raise HttpError("connection closed before a response")
        return resp

    def read_head(self, method="GET", timeout=None, want_interim=False):
        return read_head(self.reader, self.deadline(timeout), method,
                         want_interim)

    def stream(self, method, path, headers=None, body=b"", timeout=None,
               **kw):
        """Send a request and return a Stream over its response."""
        self.send(build_request(method, path, headers, body, **kw))
        return Stream(self, method, timeout)

    def readable(self, timeout):
        """Is there data (or EOF) to read within 'timeout' seconds?"""
        if self.reader.buf or self.reader.eof:
            return True
        r, _, _ = select.select([self.sock], [], [], timeout)
        return bool(r)

    def wait_closed(self, timeout=5.0):
        """True if the server closes (EOF or reset) within 'timeout'
        (scaled); bytes received meanwhile are kept in self.extra."""
        deadline = self.deadline(timeout)
        try:
            self.extra = self.reader.read_to_eof(deadline)
        except socket.timeout:
            self.extra = bytes(self.reader.buf)
            return False
        return True

    def is_open(self):
        """No EOF seen and none pending right now (non-blocking check)."""
        if self.reader.eof:
            return False
        r, _, _ = select.select([self.sock], [], [], 0)
        if not r:
            return True
        try:
            self.reader.fill(time.monotonic() + 0.1)
        except socket.timeout:
            return True
        return not self.reader.eof

    def close(self):
        _close_quietly(self.sock)


class Stream:
    """A response read as it arrives.  .resp has the status and headers;
    iterate .chunks() or .events(); .body is everything read so far."""

    def __init__(self, conn, method="POST", timeout=None):
        self.conn = conn
        self.timeout = conn.timeout if timeout is None else timeout
        self.resp = read_head(conn.reader, conn.deadline(self.timeout),
                              method)
        if self.resp is None:
            raise HttpError("connection closed before a response")
        self._parts = []                # joined once, on demand: a long
        self._joined = b""              # stream must not be quadratic
        self._it = None
        self._method = method
        self._pending = b""             # SSE bytes not yet a whole event
        self.done = False

    def _body_iter(self):
        if self._it is None:
            # One overall deadline for the rest of the body.
            self._it = iter_body(self.conn.reader, self.resp,
                                 self.conn.deadline(self.timeout),
                                 self._method)
        return self._it

    def chunks(self):
        """Yield body data as it arrives (de-chunked)."""
        for piece in self._body_iter():
            self._parts.append(piece)
            yield piece
        self.done = True

    @property
    def body(self):
        """Everything read so far."""
        if self._parts:
            self._joined += b"".join(self._parts)
            self._parts = []
        return self._joined

    def next_data(self):
        """The next piece of body data, or None at the end."""
        for piece in self.chunks():
            return piece
        return None

    def events(self):
        """Yield complete SSE events (bytes, without the blank line)."""
        while True:
            i = self._pending.find(b"\n\n")
            if i >= 0:
                ev = self._pending[:i]
                self._pending = self._pending[i + 2:]
                yield ev
                continue
            piece = self.next_data()
            if piece is None:
                return
            self._pending += piece

    def next_event(self):
        for ev in self.events():
            return ev
        return None

    def read_all(self):
        """Read to the end; returns the whole body."""
        for _ in self.chunks():
            pass
        return self.body

    @property
    def clean_end(self):
        return self.resp.clean_end

    def close(self):
        self.conn.close()


def request(port, method, path, headers=None, body=b"", timeout=10.0, **kw):
    """One request on a new connection, which is then closed."""
    c = Connection(port, timeout)
    try:
        return c.request(method, path, headers, body, **kw)
    finally:
        c.close()


def stream(port, method, path, headers=None, body=b"", timeout=10.0, **kw):
    """Start a request on a new connection; returns its Stream."""
    return Connection(port, timeout).stream(method, path, headers, body,
                                            **kw)


def recv_all(s, timeout=5.0):
    """Read socket 's' until the server closes (or resets) it or
    'timeout' (scaled) passes.  Returns (raw bytes received,
    closed_by_server)."""
    reader = _Reader(s)
    try:
        reader.read_to_eof(time.monotonic() + budget(timeout))
    except socket.timeout:
        return bytes(reader.raw), False
    return bytes(reader.raw), True


def send_raw(port, data, timeout=5.0, pieces=None):
    """Send 'data' (or each of 'pieces' in turn) and read until the server
    closes or 'timeout' (scaled) passes.  Returns (raw bytes received,
    closed_by_server).  A reset counts as closed; write errors after the
    server has answered are ignored (it may close before reading all)."""
    s = _register(connect(port))
    try:
        for p in (pieces if pieces is not None else [data]):
            try:
                s.settimeout(budget(timeout))
                s.sendall(p)
            except (BrokenPipeError, ConnectionResetError):
                break
        return recv_all(s, timeout)
    finally:
        _close_quietly(s)


def port_refuses(port):
    """True if a TCP connect to 127.0.0.1:port is refused right now."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    _close_quietly(s)
    return False


def closed_port():
    """A port that was just bound and closed: nothing listens there."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_REFUSING = []


def refused_port():
    """A port where a connect is refused, for as long as the test runs: a
    socket bound there that does not listen.  closed_port() would do but
    for one race: a gateway started later may be given that very port
    for its own listener (port 0), and an upstream there is the gateway
    itself (028 saw a request come back and join its own flight)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _REFUSING.append(s)             # held open: the port stays taken
    return s.getsockname()[1]


# --------------------------------------------------------------------------
# Body helpers and assertions.

_ID_RX = re.compile(rb'"id"\s*:\s*"[^"]*"')
_CREATED_RX = re.compile(rb'"created"\s*:\s*\d+')


def normalise(body):
    """The mock's bytes with per-call "id" and "created" blanked out."""
    if isinstance(body, str):
        body = body.encode()
    body = _ID_RX.sub(b'"id":"X"', body)
    return _CREATED_RX.sub(b'"created":0', body)


def jbody(**fields):
    """A compact JSON request body."""
    return json.dumps(fields, separators=(",", ":")).encode()


def chat_body(content="hello", **extra):
    d = {"model": "mock-model",
         "messages": [{"role": "user", "content": content}]}
    d.update(extra)
    return jbody(**d)


def completion_body(prompt="hello", **extra):
    d = {"model": "mock-model", "prompt": prompt}
    d.update(extra)
    return jbody(**d)


JSON_HEADERS = {"Content-Type": "application/json"}

# The [admin] api_key a Gateway with tenants gets unless told otherwise:
# with tenants configured, /metrics on the API port needs it
# (Gateway.metrics sends it).
ADMIN_KEY = "sk-test-admin-5b0e9d17c2a4"
AUTO = "auto"       # admin_key: ADMIN_KEY if the config has a [tenant]

# The error code every gateway-made framing error carries, by status.
CODE_FOR_STATUS = {400: "bad_request", 408: "request_timeout",
                   413: "request_too_large", 414: "uri_too_long",
                   431: "headers_too_large", 501: "not_implemented",
                   505: "http_version_not_supported"}

REQUEST_ID_RX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def error_json(resp, param=None):
    """Check the exact OpenAI error shape (with "param" 'param');
    returns the inner object."""
    ct = resp.headers.get("Content-Type", "")
    assert ct.split(";")[0].strip().lower() == "application/json", \
        "error Content-Type is %r, want application/json (%r)" % (ct, resp)
    doc = resp.json()
    assert isinstance(doc, dict) and set(doc) == {"error"}, \
        "error body top level is not exactly {\"error\"}: %r" % resp.body
    e = doc["error"]
    assert isinstance(e, dict) and \
        set(e) == {"message", "type", "param", "code"}, \
        "error object keys are %r, want message/type/param/code" % (
            sorted(e) if isinstance(e, dict) else e,)
    assert isinstance(e["message"], str) and e["message"], \
        "error.message not a non-empty string: %r" % (e["message"],)
    assert isinstance(e["type"], str) and e["type"], \
        "error.type not a non-empty string: %r" % (e["type"],)
    assert e["param"] == param, "error.param is %r, want %r" % (
        e["param"], param)
    assert isinstance(e["code"], str), \
        "error.code not a string: %r" % (e["code"],)
    return e


def assert_error(resp, status, code, close=None, param=None):
    """A gateway-made error: status, Content-Type, exact body shape, code
    (a string or a set of acceptable strings), "param", an X-Request-Id,
    and Connection: close when 'close' is True."""
    assert resp is not None, "no response"
    assert resp.status == status, "status %s, want %s: %r" % (
        resp.status, status, resp)
    e = error_json(resp, param)
    codes = {code} if isinstance(code, str) else set(code)
    assert e["code"] in codes, "error.code %r, want %s" % (
        e["code"], " or ".join(sorted(codes)))
    rid = resp.headers.get("X-Request-Id")
    assert rid and REQUEST_ID_RX.match(rid), \
        "X-Request-Id missing or not sane: %r" % (rid,)
    if close:
        assert resp.connection_close, \
            "framing error without Connection: close: %r" % (resp,)
    return e


def sse_events(body):
    """Split an SSE body into events (bytes, without the blank line);
    asserts the body ends at an event boundary."""
    assert body.endswith(b"\n\n") or not body, \
        "SSE body does not end with a blank line: %r" % body[-80:]
    return [e for e in body.split(b"\n\n")[:-1]]


def sse_data(ev):
    """The JSON of a 'data: {...}' event (or the string '[DONE]')."""
    assert ev.startswith(b"data: "), "SSE event without 'data: ': %r" % ev
    payload = ev[len(b"data: "):]
    if payload == b"[DONE]":
        return "[DONE]"
    try:
        return json.loads(payload)
    except ValueError:
        raise AssertionError("SSE data is not JSON: %r" % payload[:200])


# --------------------------------------------------------------------------
# Prometheus text.

_SAMPLE_RX = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL_RX = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """{(name, frozenset of (label, value)): float}.  Raises on a line
    that is not a comment, blank or sample."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE_RX.match(line)
        assert m, "bad Prometheus line %r" % line
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        pairs = []
        pos = 0
        while pos < len(labels):
            lm = _LABEL_RX.match(labels, pos)
            assert lm and lm.end() > pos, "bad labels in %r" % line
            pairs.append((lm.group(1),
                          lm.group(2).encode().decode("unicode_escape")))
            pos = lm.end()
        key = (name, frozenset(pairs))
        assert key not in out, "duplicate sample %r" % line
        out[key] = float(value)
    return out


def metric(metrics, name, **labels):
    """Sum of the samples named 'name' whose labels include 'labels'."""
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items()
               if n == name and want <= set(ls))


def has_metric(metrics, name, **labels):
    want = set(labels.items())
    return any(n == name and want <= set(ls) for (n, ls) in metrics)


def metric_value(g, name, **labels):
    """The gateway g's metric, which must exist (checked first), summed
    over the samples with these labels."""
    ms = g.metrics()
    assert has_metric(ms, name, **labels), "no %s %r" % (name, labels)
    return metric(ms, name, **labels)


def metric_at_least(g, name, floor, **labels):
    """Does g's metric exist, with at least 'floor'?  (For wait_for.)"""
    ms = g.metrics()
    return has_metric(ms, name, **labels) and \
        metric(ms, name, **labels) >= floor


# --------------------------------------------------------------------------
# The processes.

class Mock:
    """tools/mock_upstream on 127.0.0.1, port 0."""

    def __init__(self, bin_dir, args=(), logpath=None):
        exe = os.path.join(bin_dir, "mock_upstream")
        assert os.access(exe, os.X_OK), "no mock_upstream at %s" % exe
        self.proc = subprocess.Popen(
            [exe, "-l", "127.0.0.1:0", "-q"] + [str(a) for a in args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True)
        _register(self)
        self.out = _Output(self.proc.stdout, logpath)
        m = self.out.wait_line(r"mock_upstream listening port=(\d+)",
                               budget(10))
        if not m:
            self.close()
            raise AssertionError("mock_upstream did not start: %r"
                                 % self.out.snapshot()[-10:])
        self.port = int(m.group(1))

    def get(self, path):
        return request(self.port, "GET", path)

    def stats(self):
        r = request(self.port, "GET", "/stats")
        assert r.status == 200, "mock /stats: %r" % r
        return r.json()

    def reset(self):
        r = request(self.port, "POST", "/stats/reset")
        assert r.status == 200, "mock /stats/reset: %r" % r

    def release(self, tag):
        r = request(self.port, "POST", "/release?tag=%s" % tag)
        assert r.status == 200, "mock /release: %r" % r
        return r.json().get("released")

    def gate(self, tag, chunks):
        """Open mock_gate 'tag' up to 'chunks' content chunks; returns
        how far it is open now."""
        r = request(self.port, "POST", "/gate?tag=%s&chunks=%d"
                    % (tag, chunks))
        assert r.status == 200, "mock /gate: %r" % r
        return r.json()["gate"]

    def call(self, method, path, body=b"", headers=None):
        """A direct request to the mock (for comparing with the gateway).
        Stats are changed by it, so read them afterwards."""
        if headers is None:
            headers = dict(JSON_HEADERS) if body else {}
        return request(self.port, method, path, headers, body)

    def log_lines(self):
        return self.out.snapshot()

    def close(self):
        kill_process(self.proc)


class Gateway:
    """infergw with a generated config file, listening on port 0.

    'conf' is {section: {key: value}} merged over the base config
    ([server] listen = 127.0.0.1:0, [upstream] url = the upstream, left
    out when upstream_port is None, and [admin] api_key = 'admin_key'
    unless that is None; AUTO: ADMIN_KEY when a [tenant] is configured);
    'extra' is raw text appended to the file.  Section names may carry a
    name: "tenant acme".  With an [admin] listen, its port is read back
    too (admin_port)."""

    def __init__(self, bin_dir, tmpdir, upstream_port, conf=None, extra="",
                 name="gw", wait=True, env=None, admin_key=AUTO):
        self.exe = os.path.join(bin_dir, "infergw")
        assert os.access(self.exe, os.X_OK), "no infergw at %s" % self.exe
        sections = {"server": {"listen": "127.0.0.1:0"}}
        if upstream_port is not None:
            sections["upstream"] = {"url": "http://127.0.0.1:%d"
                                    % upstream_port}
        if admin_key == AUTO:
            tenants = "[tenant " in extra or any(
                sec.startswith("tenant ") for sec in (conf or {}))
            admin_key = ADMIN_KEY if tenants else None
        self.admin_key = admin_key
        if admin_key is not None:
            sections["admin"] = {"api_key": admin_key}
        for sec, kv in (conf or {}).items():
            sections.setdefault(sec, {}).update(kv)
        text = ""
        for sec, kv in sections.items():
            text += "[%s]\n" % sec
            for k, v in kv.items():
                text += "%s = %s\n" % (k, v)
            text += "\n"
        text += extra
        self.conf_text = text
        self.conf_path = os.path.join(tmpdir, name + ".conf")
        with open(self.conf_path, "w") as f:
            f.write(text)
        self.logpath = os.path.join(tmpdir, name + ".log")
        penv = None
        if env:
            penv = dict(os.environ)
            penv.update(env)
        self.proc = subprocess.Popen(
            [self.exe, "-c", self.conf_path], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env=penv)
        _register(self)
        self.out = _Output(self.proc.stdout, self.logpath)
        self.port = None
        self.admin_port = None
        self.admin_listener = "listen" in sections.get("admin", {})
        if wait:
            self.wait_listening()

    def wait_listening(self, timeout=10):
        m = self.out.wait_line(r"server: listening.*\bport=(\d+)",
                               budget(timeout))
        if not m:
            rc = self.proc.poll()
            raise AssertionError("infergw did not log 'server: listening "
                                 "... port=N' (exit %r)" % (rc,))
        self.port = int(m.group(1))
        if self.admin_listener:
            m = self.out.wait_line(r"server: listening for admin .*"
                                   r"\badmin_port=(\d+)", budget(timeout))
            assert m, "infergw did not log its admin listener"
            self.admin_port = int(m.group(1))
        return self.port

    # -- HTTP shortcuts
    def request(self, method, path, headers=None, body=b"", **kw):
        return request(self.port, method, path, headers, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, headers=None, **kw):
        if headers is None:
            headers = JSON_HEADERS
        return self.request("POST", path, headers, body, **kw)

    def connection(self, timeout=10.0):
        return Connection(self.port, timeout)

    def stream(self, path, body, headers=None, timeout=10.0):
        if headers is None:
            headers = JSON_HEADERS
        return stream(self.port, "POST", path, headers, body, timeout)

    def wait_ready(self, timeout=5.0):
        """Wait for /readyz to answer 200 (with the health beat on, once
        an upstream's first probe has passed); returns that answer."""
        def ready():
            r = self.get("/readyz")
            return r if r.status == 200 else None
        return wait_for(ready, timeout, msg="/readyz 200")

    def metrics_response(self):
        """GET /metrics on the API port, with the admin key if any."""
        h = {}
        if self.admin_key is not None:
            h["Authorization"] = "Bearer %s" % self.admin_key
        return self.get("/metrics", headers=h)

    def metrics(self):
        r = self.metrics_response()
        assert r.status == 200, "/metrics: %r" % r
        return parse_metrics(r.body.decode("utf-8"))

    # -- log
    def log_lines(self):
        return self.out.snapshot()

    def log_tail(self, n=25):
        return self.out.snapshot()[-n:]

    def access_lines(self):
        return [l for l in self.log_lines()
                if re.search(r"\baccess\b", l)]

    def wait_log(self, pattern, timeout=5.0):
        """The first log line matching regex 'pattern' (waits)."""
        rx = re.compile(pattern)

        def find():
            for l in self.log_lines():
                if rx.search(l):
                    return l
            return None
        return wait_for(find, timeout, msg="log line /%s/" % pattern)

    # -- process
    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        """Exit status, or None if still running after 'timeout' (scaled)."""
        try:
            return self.proc.wait(timeout=budget(timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Send 'sig' and return the exit status; SIGKILL and fail if it
        does not exit within 'timeout'."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait_exit(timeout)
        if rc is None:
            kill_process(self.proc)
            raise AssertionError("infergw did not exit within %.1fs of "
                                 "signal %d" % (budget(timeout), sig))
        # Its last lines may still be in the pipe: read them all first.
        assert self.out.wait_eof(budget(10)), "infergw's output not closed"
        return rc

    def close(self):
        kill_process(self.proc)


def run_infergw(bin_dir, args, timeout=10.0):
    """Run infergw to completion: (exit status, stdout+stderr text)."""
    exe = os.path.join(bin_dir, "infergw")
    assert os.access(exe, os.X_OK), "no infergw at %s" % exe
    p = subprocess.Popen([exe] + list(args), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    _register(_ProcHandle(p))
    try:
        out, _ = p.communicate(timeout=budget(timeout))
    except subprocess.TimeoutExpired:
        kill_process(p)
        raise AssertionError("infergw %s did not exit within %.1fs"
                             % (" ".join(args), budget(timeout)))
    return p.returncode, out.decode("utf-8", "replace")


def chromium_dom(tmpdir, url):
    """The DOM of 'url' after its script ran, from headless Chromium (its
    profile in 'tmpdir'); skips without chromium."""
    exe = tool("chromium")
    profile = os.path.join(tmpdir, "chromium-profile")
    p = subprocess.run(
        [exe, "--headless", "--disable-gpu", "--no-sandbox",
         "--no-first-run", "--user-data-dir=" + profile,
         "--virtual-time-budget=5000", "--dump-dom", url],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, timeout=budget(90))
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    return p.stdout.decode("utf-8", "replace")


class _ProcHandle:
    def __init__(self, proc):
        self.proc = proc

    def close(self):
        kill_process(self.proc)


# --------------------------------------------------------------------------
# Per-test context.

class Ctx:
    """What a test function receives: its temp dir and process helpers.
    run.py calls cleanup() after the test, whatever happened."""

    def __init__(self, bin_dir, tmpdir):
        self.bin = bin_dir
        self.tmp = tmpdir
        self.gateways = []
        self.mocks = []
        self._n = 0

    def mock(self, *args):
        self._n += 1
        m = Mock(self.bin, args,
                 os.path.join(self.tmp, "mock%d.log" % self._n))
        self.mocks.append(m)
        return m

    def gateway(self, upstream, conf=None, extra="", wait=True, env=None,
                admin_key=AUTO):
        """Start infergw in front of 'upstream' (a Mock or a port), with
        'env' ({name: value}) added to its environment and 'admin_key' as
        its [admin] api_key (None: none; AUTO: see Gateway)."""
        port = upstream.port if isinstance(upstream, Mock) else upstream
        # None: the config names its upstreams itself ([upstream NAME]).
        g = Gateway(self.bin, self.tmp, port, conf, extra,
                    name="gw%d" % (len(self.gateways) + 1), wait=wait,
                    env=env, admin_key=admin_key)
        self.gateways.append(g)
        return g

    def infergw(self, *args, timeout=10.0):
        return run_infergw(self.bin, args, timeout)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def diagnostics(self, n=25):
        """The tail of every gateway log, for a failure report."""
        out = []
        for g in self.gateways:
            out.append("--- %s (%s)" % (os.path.basename(g.logpath),
                                        g.conf_path))
            out.extend("    " + l for l in g.log_tail(n))
        return out

    def finish(self):
        """End the test's processes gently so sanitizers can report:
        close client sockets, SIGTERM each running gateway (SIGKILL later
        in cleanup() if it does not exit in time), then return every
        sanitizer report line found in the gateway and mock logs."""
        with _current.lock:
            items = list(_current.items)
        for obj in items:
            if isinstance(obj, socket.socket):
                _close_quietly(obj)
        for g in self.gateways:
            if g.proc.poll() is None:
                try:
                    g.proc.send_signal(signal.SIGTERM)
                    g.proc.wait(timeout=budget(3))
                except Exception:
                    pass
        reports = []
        for p in self.gateways + self.mocks:
            if p.proc.poll() is not None:
                p.out.thread.join(2)
            name = os.path.basename(p.out.logfile.name) if \
                p.out.logfile else "process"
            for line in p.out.snapshot():
                if SANITIZER_RX.search(line):
                    reports.append("%s: %s" % (name, line.strip()))
        return reports

    @staticmethod
    def cleanup():
        for obj in reversed(_current.drain()):
            _close_quietly(obj)


SANITIZER_RX = re.compile(r"ERROR: (Address|Leak|Memory)Sanitizer|"
                          r"WARNING: ThreadSanitizer|runtime error: |"
                          r"AddressSanitizer:DEADLYSIGNAL")
