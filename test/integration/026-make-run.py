# SPDX-License-Identifier: MIT
"""026 - make run (tools/run.sh) for someone who already runs vLLM: a port
that is taken stops it with a message saying how to pick others, and
PORT / UPSTREAM_PORT / ADMIN_PORT move the demo to free ports; a new
SYSCONFDIR rebuilds the binary; and the README's demo logs what the
README says it logs.

The script is run as 'make run' runs it (BIN, and INFERGW for the binary
of --bin), from the repository's root, with RUN_DIR in the test's temp
dir for the config copy it writes."""

import os
import pty
import re
import select
import signal
import socket
import subprocess
import time

from gwtest import (JSON_HEADERS, REPO_ROOT, budget, chat_body, closed_port,
                    kill_process, port_refuses, request, wait_for)

from coalesce_util import held_trio, new_tag, start

RUN = os.path.join(REPO_ROOT, "tools", "run.sh")
README = os.path.join(REPO_ROOT, "README.md")


def env_for(t, **ports):
    env = dict(os.environ, BIN=t.bin, INFERGW=os.path.join(t.bin, "infergw"),
               RUN_DIR=t.tmp)
    env.update({k: str(v) for k, v in ports.items()})
    return env


def test_a_taken_port_stops_it_with_how_to_pick_others(t):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    try:
        p = subprocess.run(["sh", RUN], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=budget(20), env=env_for(
                               t, UPSTREAM_PORT=busy, PORT=closed_port(),
                               ADMIN_PORT=closed_port()))
    finally:
        taken.close()
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "could not listen on 127.0.0.1:%d" % busy in p.stderr, p.stderr
    assert "make run PORT=" in p.stderr and "CONF=FILE" in p.stderr, \
        p.stderr
    assert "starting the gateway" not in p.stdout, p.stdout


def test_ports_change_only_the_ports(t):
    # A path after the port, an IPv6 host's colons: only the ports move.
    # (BIN names no mock, so the run stops once the copy is written.)
    conf = os.path.join(t.tmp, "own.conf")
    with open(conf, "w") as f:
        f.write("[server]\nlisten = 127.0.0.1:8080\n[upstream]\n"
                "url = http://[::1]:8000/v1\n[admin]\n"
                "listen = 127.0.0.1:8081\n")
    env = env_for(t, PORT=9080, UPSTREAM_PORT=9000, ADMIN_PORT=9081)
    env.update(BIN=os.path.join(t.tmp, "no-bin"), CONF=conf)
    p = subprocess.run(["sh", RUN], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=budget(20), env=env)
    assert p.returncode == 1, (p.stdout, p.stderr)
    with open(os.path.join(t.tmp, "run.conf")) as f:
        assert f.read() == ("[server]\nlisten = 127.0.0.1:9080\n"
                            "[upstream]\nurl = http://[::1]:9000/v1\n"
                            "[admin]\nlisten = 127.0.0.1:9081\n")


def test_ports_move_the_demo(t):
    port, up, admin = closed_port(), closed_port(), closed_port()
    out = open(os.path.join(t.tmp, "run.log"), "w")
    proc = subprocess.Popen(["sh", RUN], cwd=REPO_ROOT, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env=env_for(t, PORT=port, UPSTREAM_PORT=up,
                                        ADMIN_PORT=admin))
    try:
        def up_and_ready():
            try:
                return request(port, "GET", "/readyz").status == 200
            except OSError:
                return False
        wait_for(up_and_ready, timeout=10, msg="the gateway on PORT")
        r = request(port, "POST", "/v1/chat/completions", JSON_HEADERS,
                    chat_body("moved", model="llama-3-8b"), timeout=10)
        assert r.status == 200, r
        assert request(up, "GET", "/health").status == 200  # the mock
        assert request(admin, "GET", "/healthz").status == 200
        with open(os.path.join(t.tmp, "run.conf")) as f:
            conf = f.read()
        assert "127.0.0.1:%d" % port in conf and \
            "127.0.0.1:%d" % up in conf, conf
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        kill_process(proc)
        out.close()


def test_a_new_sysconfdir_rebuilds_the_default_config_path(t):
    # The path is compiled in (main.c): building main.o again with the
    # same SYSCONFDIR leaves it alone, with another one rebuilds it.
    build = os.path.join(t.tmp, "build")
    obj = os.path.join(build, "gateway", "main.o")

    def make(sysconfdir):
        p = subprocess.run(["make", "-s", "--no-print-directory",
                            "BUILD=" + build, "SYSCONFDIR=" + sysconfdir,
                            obj], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=budget(120))
        assert p.returncode == 0, (p.stdout, p.stderr)
        with open(obj, "rb") as f:
            return os.stat(obj).st_mtime_ns, f.read()

    first, text = make("/opt/a")
    assert b"/opt/a/infergw/gateway.conf" in text
    again, _ = make("/opt/a")
    assert again == first, "rebuilt with the same SYSCONFDIR"
    changed, text = make("/opt/b")
    assert changed != first and b"/opt/b/infergw/gateway.conf" in text


def test_make_build_builds(t):
    # 'make build' is 'make all' (build/ is only a directory): in a fresh
    # BUILD both would make the same things, the gateway among them.
    build = os.path.join(t.tmp, "fresh")

    def dry(target):
        p = subprocess.run(["make", "-n", "--no-print-directory",
                            "BUILD=" + build, target], cwd=REPO_ROOT,
                           capture_output=True, text=True,
                           timeout=budget(60))
        assert p.returncode == 0, (target, p.stdout, p.stderr)
        return p.stdout

    plan = dry("build")
    assert "-o %s/bin/infergw " % build in plan, plan[-2000:]
    assert plan == dry("all")


def test_ctrl_c_in_a_terminal_ends_make_run_with_status_0(t):
    """Ctrl-C in a terminal: the real 'make run' (its install step left
    out, and the binaries of this build) in a pseudo-terminal, ^C typed
    once the gateway listens.  The gateway drains and exits 0, and so
    does make: not "make: *** [run] Interrupt" or "Error 1"; the mock is
    gone too.  The Makefile runs in a tree of links to the repository,
    so that its 'all' (up to date) writes nothing in the repository."""
    tree = os.path.join(t.tmp, "tree")
    os.mkdir(tree)
    for name in ("Makefile", "common", "gateway", "tools", "etc", "test"):
        os.symlink(os.path.join(REPO_ROOT, name), os.path.join(tree, name))
    port, up, admin = closed_port(), closed_port(), closed_port()
    argv = ["make", "-o", "deps", "run",
            "BUILD=" + os.path.dirname(t.bin), "PORT=%d" % port,
            "UPSTREAM_PORT=%d" % up, "ADMIN_PORT=%d" % admin]
    env = dict(os.environ, INFERGW=os.path.join(t.bin, "infergw"),
               RUN_DIR=t.tmp)
    env.pop("MAKEFLAGS", None)          # make check's own
    env.pop("MAKELEVEL", None)
    pid, fd = pty.fork()
    if pid == 0:                        # the child: make, on the terminal
        try:
            os.chdir(tree)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out = bytearray()
    status = None

    def read_some(wait):
        r, _, _ = select.select([fd], [], [], wait)
        if not r:
            return False
        try:
            data = os.read(fd, 65536)
        except OSError:                 # EIO: the terminal's last user left
            return None
        out.extend(data)
        return bool(data)

    try:
        deadline = time.monotonic() + budget(60)
        while b"server: listening" not in out:
            assert time.monotonic() < deadline, out.decode(errors="replace")
            if read_some(0.1) is None:
                break
        assert b"server: listening" in out, out.decode(errors="replace")
        os.write(fd, b"\x03")            # ^C, as a terminal sends it
        while status is None:
            assert time.monotonic() < deadline, out.decode(errors="replace")
            read_some(0.1)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        while read_some(0) is True:
            pass
    finally:
        if status is None:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        "make run ended with %s:\n%s" % (
            "status %d" % os.WEXITSTATUS(status) if os.WIFEXITED(status)
            else "signal %d" % os.WTERMSIG(status), text[-2000:]))
    assert "main: exit status=0" in text, text[-2000:]
    assert "make: ***" not in text, text[-2000:]
    wait_for(lambda: port_refuses(up), msg="the mock gone")


def sample_rx(sample):
    """A README sample log line as a regex for a whole line's end: '...'
    stands for the rest of a token (the hex digits before it too), or
    alone for the rest of the line; a hex value for any."""
    out = []
    for tok in sample.split(" "):
        key, eq, val = tok.partition("=")
        if tok == "...":
            out.append(".*")            # the rest of the line
        elif "..." in tok:
            head = re.sub(r"[0-9a-f]*$", "", tok.split("...")[0])
            out.append(re.escape(head) + r"\S*")
        elif eq and re.fullmatch(r"[0-9a-f]{8,}", val):
            out.append(re.escape(key) + "=[0-9a-f]+")
        else:
            out.append(re.escape(tok))
    return re.compile(" ".join(out) + "$")


def test_the_readmes_demo_logs_what_the_readme_shows(t):
    text = open(README).read()
    block = text.split("The gateway's log shows one leader and two "
                       "followers")[1].split("```")[1]
    samples = [l for l in block.splitlines() if l.startswith("ts=")]
    samples += re.findall(r"`(upstream: call stopped[^`]*)`", text)
    assert len(samples) == 4, samples
    m = t.mock()
    g = t.gateway(m)
    # Three identical streams, each client gone after its first bytes
    # (the demo's '| head -c 200').  Past the role chunk the mock sends
    # nothing (its gate stays shut): the stream is still running when
    # the last client goes, on any machine.
    tag = new_tag()
    body = chat_body("identical", stream=True, mock_chunks=40,
                     mock_hold=tag, mock_gate=tag)
    for c in held_trio(g, m, body):
        s = start(c)
        assert s.next_event() is not None
        s.close()
    g.wait_log(r"upstream: call stopped")
    lines = g.log_lines()
    for sample in samples:
        rx = sample_rx(sample)
        assert any(rx.search(l) for l in lines), \
            "README: %r is in no log line:\n%s" % (sample,
                                                  "\n".join(lines[-12:]))
