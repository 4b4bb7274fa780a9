# SPDX-License-Identifier: MIT
"""The sampler: the gateway's RSS, threads and descriptors from /proc, its
sockets split by kind through /proc/net/tcp and /proc/net/unix."""

import os
import time

from .client import OPEN_CONNS


def _inode_map():
    """socket inode -> (local port, remote port, state); unix sockets map
    to (None, None, "unix")."""
    m = {}
    try:
        with open("/proc/net/unix") as fh:
            next(fh)
            for line in fh:
                a = line.split()
                if len(a) >= 7:
                    m[a[6]] = (None, None, "unix")
    except (OSError, StopIteration):
        pass
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(f) as fh:
                next(fh)
                for line in fh:
                    a = line.split()
                    lp = int(a[1].rsplit(":", 1)[1], 16)
                    rp = int(a[2].rsplit(":", 1)[1], 16)
                    m[a[9]] = (lp, rp, a[3])
        except (OSError, StopIteration, IndexError, ValueError):
            pass
    return m


TCP_STATES = {"01": "ESTABLISHED", "08": "CLOSE_WAIT", "0A": "LISTEN",
              "06": "TIME_WAIT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "07": "CLOSE", "09": "LAST_ACK", "0B": "CLOSING",
              "02": "SYN_SENT", "03": "SYN_RECV"}


def sample(pid, gw_ports, mock_ports):
    s = {"t": time.monotonic()}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    s["rss"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    s["threads"] = int(line.split()[1])
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    inodes = _inode_map()
    s.update(fds=len(fds), client=0, upstream=0, listen=0, unix=0,
             othersock=0, nonsock=0, up_states={})
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if not link.startswith("socket:["):
            s["nonsock"] += 1
            continue
        info = inodes.get(link[8:-1])
        if info is None:
            s["othersock"] += 1
        elif info[2] == "unix":
            s["unix"] += 1
        elif info[2] == "0A":
            s["listen"] += 1
        elif info[0] in gw_ports:
            s["client"] += 1
        elif info[1] in mock_ports:
            s["upstream"] += 1
            st = TCP_STATES.get(info[2], info[2])
            s["up_states"][st] = s["up_states"].get(st, 0) + 1
        else:
            s["othersock"] += 1
    s["conns_client_side"] = OPEN_CONNS[0]
    return s
