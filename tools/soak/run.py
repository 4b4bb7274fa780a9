# SPDX-License-Identifier: MIT
"""A soak run: start the mocks and the gateway, warm up, take the
baseline, run the clients with the chaos thread and the sampler, settle,
and hand everything to report()."""

import os
import random
import re
import shutil
import socket
import tempfile
import threading
import time

from . import limits
from .chaos import Chaos
from .client import CHAT, OPEN_CONNS, Target, chat_body, one_request
from .limits import SEND_TIMEOUT_S, SETTLE_MAX
from .procs import Mock, Proc, client_tls_ctx, ensure_certs, simple_http
from .report import fmt_kb, report
from .response import BAD, COMPLETE
from .sampler import sample
from .selftest import CannedServer
from .workload import Soak


def gw_log_counter():
    counts = {}
    lock = threading.Lock()
    rx = re.compile(r"level=(warn|error)\s+(?:req=\S+\s+)?(.*)$")

    def on_line(line):
        m = rx.search(line)
        if not m:
            return
        msg = m.group(2)
        # keep the message up to the first key=value (or a reason)
        short = re.sub(r'\s+\w+=.*$', "", msg)
        reason = re.search(r'reason="([^"]*)"', msg)
        key = "%s %s%s" % (m.group(1), short,
                           (" reason=" + reason.group(1)) if reason else "")
        with lock:
            counts[key] = counts.get(key, 0) + 1
    return counts, on_line


def run_soak(args):
    bindir = os.path.abspath(args.bin)
    for exe in ("infergw", "mock_upstream"):
        if not os.access(os.path.join(bindir, exe), os.X_OK):
            print("soak: no %s in %s (make BUILD=build/soak all)"
                  % (exe, bindir))
            return 2
    tmp = tempfile.mkdtemp(prefix="infergw-soak-")
    procs = []
    soak = Soak(args)
    soak.t_start = time.monotonic()
    hard_end = soak.t_start + args.seconds + 45

    def watchdog():
        while time.monotonic() < hard_end:
            time.sleep(1)
        print("soak: WATCHDOG: the run overran; killing everything",
              flush=True)
        for p in procs + [m.proc for m in mocks]:
            p.kill()
        os._exit(3)
    threading.Thread(target=watchdog, daemon=True).start()

    mocks = []
    try:
        for i in range(args.mocks):
            m = Mock(bindir, tmp, "m%d" % i)
            if not m.port:
                print("soak: mock m%d did not start" % i)
                return 2
            mocks.append(m)
            procs.append(m.proc)
        cert_dir = None
        tls_port = None
        conf = ["[server]", "listen = 127.0.0.1:0",
                "send_timeout = %ds" % SEND_TIMEOUT_S, "log_level = info",
                "access_log = on"]
        if args.tls:
            cert_dir = ensure_certs(args)
            ps = socket.socket()
            ps.bind(("127.0.0.1", 0))
            tls_port = ps.getsockname()[1]
            ps.close()
            conf += ["tls_listen = 127.0.0.1:%d" % tls_port,
                     "tls_cert = %s" % os.path.join(cert_dir, "server.pem"),
                     "tls_key = %s" % os.path.join(cert_dir, "server.key")]
        conf += ["", "[routing]", "first_byte_timeout = 2s",
                 "idle_timeout = 2s", "health_interval = 1s",
                 "eject_time = 2s", "connect_timeout = 2s",
                 "eject_after = %d" % args.eject_after, "",
                 "[coalesce]", "enabled = on", ""]
        for m in mocks:
            conf += ["[upstream %s]" % m.name,
                     "url = http://127.0.0.1:%d" % m.port,
                     "models = mock-model", ""]
        conf_path = os.path.join(tmp, "gateway.conf")
        with open(conf_path, "w") as f:
            f.write("\n".join(conf))
        counts, on_line = gw_log_counter()
        gw = Proc([os.path.join(bindir, "infergw"), "-c", conf_path],
                  os.path.join(tmp, "gateway.log"),
                  r"server: listening.*\bport=(\d+)", on_line=on_line)
        procs.append(gw)
        if not gw.ready:
            text = "\n".join(gw.lines_seen[-10:])
            rc = gw.p.poll()
            if args.tls and ("tls" in text.lower() or rc == 2):
                print("soak: this gateway does not accept the TLS settings "
                      "(exit %r):\n%s\nsoak: --tls needs a gateway with TLS "
                      "termination ([server] tls_listen); run without --tls"
                      % (rc, text))
                return 2
            print("soak: the gateway did not start (exit %r):\n%s"
                  % (rc, text))
            return 2
        gw_ports = set()
        time.sleep(0.3)
        for line in gw.lines_seen:
            m_ = re.search(r"server: listening.*\bport=(\d+)", line)
            if m_:
                gw_ports.add(int(m_.group(1)))
        plain_port = int(gw.ready.group(1))
        soak.plain_target = Target(plain_port, None, "plain")
        soak.tls_target = None
        if args.tls:
            ctx = client_tls_ctx(cert_dir)
            ok, err = False, None
            t_end = time.monotonic() + 5
            while time.monotonic() < t_end and not ok:
                try:
                    s = socket.create_connection(("127.0.0.1", tls_port),
                                                 timeout=2)
                    s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
                    s.close()
                    ok = True
                except Exception as e:
                    err = e
                    time.sleep(0.3)
            if not ok:
                print("soak: the gateway started but does not serve TLS on "
                      "tls_listen 127.0.0.1:%d (%r): this infergw has no TLS "
                      "termination yet; run without --tls" % (tls_port, err))
                return 2
            gw_ports.add(tls_port)
            soak.tls_target = Target(tls_port, ctx, "tls")
        if args.inject_bug:
            soak.bad_server = CannedServer()
        mock_ports = {m.port for m in mocks}

        # warm-up requests, then the baseline
        for body, st, route, path in (
                (chat_body("warm stream"), True, "chat", CHAT),
                (chat_body("warm json", stream=False), False, "chat", CHAT)):
            for t in [soak.plain_target] + ([soak.tls_target]
                                             if soak.tls_target else []):
                r = one_request(t, path, body, {"kind": "warm",
                                                "stream": st, "route": route})
                if r["cat"] != COMPLETE:
                    print("soak: warm request failed: %s %s"
                          % (r["cat"], r["why"]))
                    return 2
        time.sleep(2)
        base = sample(gw.pid, gw_ports, mock_ports)
        print("soak: %d mocks %s, gateway pid %d port %d%s, %d clients, "
              "%d s, temp %s" % (
                  len(mocks), sorted(mock_ports), gw.pid, plain_port,
                  (" tls %d" % tls_port) if tls_port else "", args.clients,
                  args.seconds, tmp), flush=True)
        r = simple_http(plain_port, "GET", "/metrics")
        soak.base_metrics = r[1].decode("utf-8", "replace") if r else ""
        print("soak: baseline rss %s fds %d (client %d upstream %d listen %d"
              " unix %d other sockets %d non-socket %d) threads %d" % (
                  fmt_kb(base["rss"]), base["fds"], base["client"],
                  base["upstream"], base["listen"], base["unix"],
                  base["othersock"], base["nonsock"], base["threads"]),
              flush=True)

        # the load
        samples = []
        t_load = time.monotonic()
        soak.t_start = t_load
        soak.stop_at = t_load + args.seconds
        hard_end = soak.stop_at + 45
        stop_sampling = threading.Event()

        def sampler():
            while not stop_sampling.is_set():
                s = sample(gw.pid, gw_ports, mock_ports)
                if s:
                    samples.append(s)
                stop_sampling.wait(1.0)
        threading.Thread(target=sampler, daemon=True).start()
        chaos = Chaos(soak, mocks, random.Random(args.seed + 7))
        ch_t = threading.Thread(target=chaos.run,
                                args=(t_load + 0.85 * args.seconds,),
                                daemon=True)
        ch_t.start()
        workers = [threading.Thread(target=soak.worker, args=(i,),
                                    daemon=True)
                   for i in range(args.clients)]
        for w in workers:
            w.start()
        next_print = t_load + 15
        while time.monotonic() < soak.stop_at:
            time.sleep(0.5)
            if not gw.alive():
                break
            if time.monotonic() >= next_print and samples:
                s = samples[-1]
                with soak.rlock:
                    n = len(soak.results)
                    nb = sum(1 for r in soak.results if r["cat"] == BAD)
                print("soak: t=%3.0fs responses %d bad %d | rss %s fds %d "
                      "threads %d clients-open %d" % (
                          time.monotonic() - t_load, n, nb, fmt_kb(s["rss"]),
                          s["fds"], s["threads"], OPEN_CONNS[0]), flush=True)
                next_print += 15
        # stop: no new requests; wait for the ones under way
        join_end = soak.stop_at + limits.REQ_DEADLINE + 10
        for w in workers:
            w.join(max(0.0, join_end - time.monotonic()))
        stragglers = sum(1 for w in workers if w.is_alive())
        chaos.stop.set()
        ch_t.join(10)
        chaos.undo_all()
        t_clients_done = time.monotonic()
        # settle: poll until back to baseline or SETTLE_MAX
        settle_end = time.monotonic() + SETTLE_MAX
        final = None
        while time.monotonic() < settle_end and gw.alive():
            final = sample(gw.pid, gw_ports, mock_ports)
            if final and final["threads"] <= base["threads"] and \
                    final["client"] == 0 and \
                    final["nonsock"] <= base["nonsock"]:
                break
            time.sleep(0.5)
        settle_s = time.monotonic() - t_clients_done
        stop_sampling.set()
        gw_alive = gw.alive()
        metrics = None
        still_serves = None
        if gw_alive:
            time.sleep(0.2)
            final = sample(gw.pid, gw_ports, mock_ports) or final
            r = simple_http(plain_port, "GET", "/metrics")
            metrics = r[1].decode("utf-8", "replace") if r else None
            r = one_request(soak.plain_target, CHAT, chat_body("after"),
                            {"kind": "after", "stream": True,
                             "route": "chat"})
            still_serves = r["cat"] == COMPLETE
        rc = report(args, soak, base, samples, final, t_load,
                    t_clients_done, settle_s, stragglers, gw, gw_alive,
                    metrics, still_serves, counts, chaos, mocks, tmp)
        return rc
    finally:
        for p in procs:
            p.kill()
        for m in mocks:
            m.proc.kill()
        if not args.keep and not getattr(soak, "keep_tmp", False):
            shutil.rmtree(tmp, ignore_errors=True)
