#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Take docs/status.png: the /status page of a gateway with some traffic.

Starts two mocks and a gateway (two upstreams, two tenants, the admin
listener), sends answered, failed and coalesced requests so every table
of the page has rows (a flight is held open with followers while the
picture is taken), and has headless Chromium screenshot the page.

    python3 tools/status_shot.py [--out docs/status.png] [--bin build/default/bin]

Python 3 standard library and Debian's chromium; reuses the integration
tests' helpers (test/integration/gwtest.py).
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "integration"))

import gwtest  # noqa: E402
from coalesce_util import finish_all, new_tag, send  # noqa: E402

KEYS = {"acme": "sk-shot-acme-0123456789ab",
        "lab": "sk-shot-lab-0123456789abcd"}


def auth(tenant):
    return {"Content-Type": "application/json",
            "Authorization": "Bearer " + KEYS[tenant]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "default",
                                                  "bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs",
                                                  "status.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="status-shot-") as tmp:
        mocks = [gwtest.Mock(args.bin) for _ in range(2)]
        conf = {"admin": {"listen": "127.0.0.1:0"}}
        for name, m in zip(("gpu-a", "gpu-b"), mocks):
            conf["upstream " + name] = {"url": "http://127.0.0.1:%d"
                                        % m.port}
        conf["tenant acme"] = {"api_key": KEYS["acme"],
                               "max_inflight": 64}
        conf["tenant lab"] = {"api_key": KEYS["lab"],
                              "requests_per_minute": 600}
        g = gwtest.Gateway(args.bin, tmp, None, conf, admin_key=None)
        try:
            for i in range(12):
                r = g.post("/v1/chat/completions",
                           gwtest.chat_body("question %d" % i, stream=True,
                                            max_tokens=16, stream_options={
                                                "include_usage": True}),
                           auth("acme" if i % 3 else "lab"))
                assert r.status == 200, r
            r = g.post("/v1/chat/completions",
                       gwtest.chat_body("boom", mock_status=500),
                       auth("lab"))
            assert r.status == 500, r
            g.get("/v1/nope")
            # One flight answered (its followers' tokens are the savings),
            # one held open while the picture is taken.
            for held in (False, True):
                tag = new_tag()
                conns = [send(g, gwtest.chat_body(
                    "what is coalescing? %s" % held, temperature=0,
                    stream=True, mock_hold=tag,
                    stream_options={"include_usage": True}),
                    headers=auth("acme")) for _ in range(3)]
                gwtest.wait_for(lambda: any(
                    f["followers"] == 2 for f in gwtest.request(
                        g.admin_port, "GET",
                        "/status.json").json()["flights"]),
                    10, msg="a flight with two followers")
                if held:
                    break
                for m in mocks:
                    m.release(tag)
                finish_all(conns)
            subprocess.run(
                [gwtest.tool("chromium"), "--headless", "--disable-gpu",
                 "--no-sandbox", "--no-first-run",
                 "--user-data-dir=" + os.path.join(tmp, "profile"),
                 "--hide-scrollbars", "--window-size=1280,720",
                 "--virtual-time-budget=3000",
                 "--screenshot=" + os.path.abspath(args.out),
                 "http://127.0.0.1:%d/status" % g.admin_port],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, check=True, timeout=120)
            for m in mocks:
                m.release(tag)
            finish_all(conns)
        finally:
            g.close()
            for m in mocks:
                m.close()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
