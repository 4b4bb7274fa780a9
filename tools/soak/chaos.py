# SPDX-License-Identifier: MIT
"""The chaos thread: one action at a time on one mock at a time
(/control faults, SIGSTOP and SIGCONT, SIGKILL and a restart), each
undone after a few seconds."""

import os
import signal
import threading
import time


class Chaos:
    def __init__(self, soak, mocks, rng):
        self.soak, self.mocks, self.rng = soak, mocks, rng
        self.log = []
        self.kills = 0
        self.dead = set()
        self.stop = threading.Event()

    def note(self, msg):
        self.log.append((time.monotonic() - self.soak.t_start, msg))

    def run(self, until):
        actions = ["status503", "status500", "fault_stall", "fault_die",
                   "fault_head_then_die", "fault_reset", "health503",
                   "sigstop", "sigstop", "kill"]
        last = None
        time.sleep(3)
        while not self.stop.is_set() and time.monotonic() < until:
            live = [m for m in self.mocks if m.name not in self.dead]
            cands = [m for m in live if m is not last] or live
            if not cands:
                break
            m = self.rng.choice(cands)
            last = m
            a = self.rng.choice(actions)
            if a == "kill" and (self.kills >= 2 or
                                time.monotonic() > until - 15):
                a = "sigstop"
            hold = self.rng.uniform(3, 6)
            try:
                self.do(m, a, hold)
            except Exception as e:       # never leave the chaos thread
                self.note("%s %s raised %r" % (m.name, a, e))
            self.stop.wait(self.rng.uniform(1, 4))

    def do(self, m, a, hold):
        q = {"status503": ("status=503&retry_after=1", "status=0"),
             "status500": ("status=500", "status=0"),
             "fault_stall": ("fault=stall", "fault=none"),
             "fault_die": ("fault=die_mid_stream", "fault=none"),
             "fault_head_then_die": ("fault=head_then_die", "fault=none"),
             "fault_reset": ("fault=reset", "fault=none"),
             "health503": ("health=503", "health=0")}
        if a in q:
            on, off = q[a]
            r = m.control(on)
            self.note("%s %s %s" % (m.name, on, "ok" if r and r[0] == 200
                                    else "FAILED %r" % (r,)))
            self.stop.wait(hold)
            r = m.control(off)
            if not r or r[0] != 200:
                time.sleep(0.5)
                r = m.control(off)
            self.note("%s %s %s" % (m.name, off, "ok" if r and r[0] == 200
                                    else "FAILED %r" % (r,)))
        elif a == "sigstop":
            os.kill(m.proc.pid, signal.SIGSTOP)
            m.stopped = True
            self.note("%s SIGSTOP" % m.name)
            self.stop.wait(hold)
            os.kill(m.proc.pid, signal.SIGCONT)
            m.stopped = False
            self.note("%s SIGCONT" % m.name)
        elif a == "kill":
            self.kills += 1
            port = m.port
            m.proc.kill()
            self.note("%s SIGKILL (port %d)" % (m.name, port))
            self.stop.wait(3)
            t_end = time.monotonic() + 5
            while True:
                if m.start(port):
                    self.note("%s restarted on port %d" % (m.name, port))
                    break
                if time.monotonic() > t_end:
                    self.dead.add(m.name)
                    self.note("%s could not be restarted on port %d; "
                              "left dead" % (m.name, port))
                    break
                time.sleep(0.5)

    def undo_all(self):
        for m in self.mocks:
            if m.name in self.dead or not m.proc.alive():
                continue
            try:
                os.kill(m.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            m.control("status=0&fault=none&health=0")
