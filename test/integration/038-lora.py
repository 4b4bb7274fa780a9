# SPDX-License-Identifier: MIT
"""038 - LoRA adapters (issue 29): the mock's adapters (docs/MOCK_UPSTREAM.md
"LoRA adapters") first, each rule of its model shown talking to it
directly; then the gateway's routing of a request for an adapter
(docs/UPSTREAMS.md "LoRA adapters").

Timings are loose (a loaded 2-core machine, sanitizer builds): what a
test depends on is polled for with a deadline, and a bound on time is
one that only the rule under test can reach.  Each gateway test's mutant
is named in its docstring.
"""

import os
import subprocess
import threading
import time

from gwtest import (JSON_HEADERS, Connection, budget, chat_body, jbody,
                    metric, parse_metrics, request, wait_for)

from metrics_check import validate

CHAT = "/v1/chat/completions"
CONTENT = b'"delta":{"content":'    # a content chunk, not the role chunk
INFO = "vllm:lora_requests_info"


def lora_mock(t, max_loras, loras=None, load_ms=None, **engine):
    """A mock in engine mode with LoRA on."""
    args = ["--max-loras", str(max_loras)]
    if loras:
        args += ["--lora", ",".join(loras)]
    if load_ms is not None:
        args += ["--lora-load-ms", str(load_ms)]
    if engine:
        args += ["-E", ",".join("%s=%s" % kv for kv in sorted(engine.items()))]
    return t.mock(*args)


def ask(port, model, tokens=2, **extra):
    """One non-streamed completion for 'model'; the response."""
    return request(port, "POST", CHAT, JSON_HEADERS,
                   chat_body("hi from %s" % model, model=model,
                             max_tokens=tokens, **extra),
                   timeout=budget(30))


def latest_info(port):
    """The labels of the vllm:lora_requests_info sample with the highest
    value (the state now, as a scraper reads it), and how many samples
    the page has."""
    r = request(port, "GET", "/metrics")
    assert r.status == 200, r
    best, n = None, 0
    for (name, labels), value in parse_metrics(r.text).items():
        if name != INFO:
            continue
        n += 1
        if best is None or value > best[1]:
            best = (dict(labels), value)
    assert best is not None, "no %s in %r" % (INFO, r.text)
    return best[0], n


class Held:
    """A streamed completion kept open (its sequence runs) until close()."""

    def __init__(self, port, model, tokens=400):
        self.conn = Connection(port, timeout=budget(60))
        self.s = self.conn.stream("POST", CHAT, JSON_HEADERS, chat_body(
            "held %s" % model, model=model, stream=True, max_tokens=tokens))
        assert self.s.resp.status == 200, self.s.resp.status

    def first_token(self):
        for ev in self.s.events():
            if CONTENT in ev:
                return
        raise AssertionError("no content")

    def close(self):
        self.conn.close()


# ---- the mock ---------------------------------------------------------------

def test_mock_lists_its_adapters_with_their_parent(t):
    m = lora_mock(t, 2, ["sql-lora", "chat-lora"])
    data = m.get("/v1/models").json()["data"]
    by_id = {d["id"]: d for d in data}
    assert [d["id"] for d in data] == ["mock-model", "llama-3-8b",
                                       "sql-lora", "chat-lora"], data
    assert by_id["mock-model"]["parent"] is None
    a = by_id["sql-lora"]
    assert a["parent"] == "mock-model" and a["object"] == "model", a
    assert a["owned_by"] == "vllm" and a["max_model_len"] is None, a
    assert a["root"] == "/adapters/sql-lora", a
    labels, n = latest_info(m.port)
    assert labels == {"max_lora": "2", "running_lora_adapters": "",
                      "waiting_lora_adapters": ""}, labels
    assert n == 1
    assert validate(m.get("/metrics").text).startswith("ok:")
    assert m.stats()["lora_loads"] == 0


def test_mock_without_lora_has_no_gauge(t):
    m = t.mock("-e")
    r = m.get("/metrics")
    assert INFO not in r.text
    assert m.stats()["lora_resident"] == []
    r = request(m.port, "POST", "/v1/load_lora_adapter", JSON_HEADERS,
                jbody(lora_name="x", lora_path="/x"))
    assert r.status == 400, r


def test_mock_loads_an_adapter_once_and_evicts_the_least_recent(t):
    """Two slots: a1, a2 load; a1 again is resident; a3 evicts a2 (the
    least recently used), a2 then evicts a1.  The load's cost is paid by
    the request that needs it."""
    m = lora_mock(t, 2, ["a1", "a2", "a3"], load_ms=400, step_ms=5,
                  step_per_seq_ms=0)
    t0 = time.monotonic()
    assert ask(m.port, "a1").status == 200
    assert time.monotonic() - t0 >= 0.4, "a1's load cost nothing"
    assert ask(m.port, "a2").status == 200
    assert m.stats()["lora_loads"] == 2
    assert ask(m.port, "a1").status == 200
    assert ask(m.port, "mock-model").status == 200      # the base: no load
    st = m.stats()
    assert st["lora_loads"] == 2, st
    assert st["lora_resident"] == ["a2", "a1"], st
    assert ask(m.port, "a3").status == 200
    st = m.stats()
    assert st["lora_loads"] == 3 and st["lora_resident"] == ["a1", "a3"], st
    assert ask(m.port, "a2").status == 200
    st = m.stats()
    assert st["lora_loads"] == 4 and st["lora_resident"] == ["a3", "a2"], st
    m.reset()
    assert m.stats()["lora_loads"] == 0


def test_mock_a_request_waits_while_every_slot_runs(t):
    """One slot, held by a1's running stream: a2's request waits in the
    FIFO although the batch has room (waiting 1), a base-model request
    behind it runs at once (vLLM skips a2, it does not block the
    queue), and a2 runs once a1's stream is gone."""
    m = lora_mock(t, 1, ["a1", "a2"], load_ms=0, step_ms=20)
    held = Held(m.port, "a1")
    held.first_token()
    labels, _ = latest_info(m.port)
    assert labels["running_lora_adapters"] == "a1", labels
    assert labels["waiting_lora_adapters"] == "", labels
    result = {}

    def second():
        result["r"] = ask(m.port, "a2")
    th = threading.Thread(target=second, daemon=True)
    th.start()
    wait_for(lambda: latest_info(m.port)[0]["waiting_lora_adapters"]
             == "a2", budget(5), msg="a2 waits")
    labels, n = latest_info(m.port)
    assert labels["running_lora_adapters"] == "a1", labels
    assert n == 2, "the earlier label set is kept too"
    assert ask(m.port, "mock-model").status == 200, "the base waited"
    assert th.is_alive() and "r" not in result, "a2 ran beside a1"
    held.close()
    th.join(budget(10))
    assert result["r"].status == 200, result
    assert m.stats()["lora_loads"] == 2


def test_mock_loads_and_unloads_at_run_time(t):
    m = lora_mock(t, 2)
    load = (lambda **kw: request(m.port, "POST", "/v1/load_lora_adapter",
                                 JSON_HEADERS, jbody(**kw)))
    r = load(lora_name="late", lora_path="/srv/late")
    assert r.status == 200, r
    assert r.body == b"Success: LoRA adapter 'late' added successfully."
    ids = {d["id"]: d for d in m.get("/v1/models").json()["data"]}
    assert ids["late"]["parent"] == "mock-model"
    assert ids["late"]["root"] == "/srv/late"
    r = load(lora_name="late", lora_path="/srv/late")
    assert r.status == 400 and b"has already been loaded" in r.body, r
    assert load(lora_name="nopath").status == 400
    assert load(lora_name="a,b", lora_path="/x").status == 400
    assert ask(m.port, "late").status == 200
    assert m.stats()["lora_loads"] == 1
    r = request(m.port, "POST", "/v1/unload_lora_adapter", JSON_HEADERS,
                jbody(lora_name="late"))
    assert r.status == 200, r
    assert "late" not in [d["id"] for d in
                          m.get("/v1/models").json()["data"]]
    r = request(m.port, "POST", "/v1/unload_lora_adapter", JSON_HEADERS,
                jbody(lora_name="late"))
    assert r.status == 404, r
    assert m.stats()["requests"] == 1, "a load is a control request"


def test_mock_bad_lora_flags_exit_2(t):
    exe = os.path.join(t.bin, "mock_upstream")
    for args in (["--lora", "a"], ["--max-loras", "257"],
                 ["--max-loras", "x"], ["--max-loras", "1", "--lora", ","],
                 ["--max-loras", "1", "--lora-load-ms", "-1"],
                 ["--max-loras", "1", "--lora", "a,a"]):
        p = subprocess.run([exe, "-l", "127.0.0.1:0"] + args,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=budget(10))
        assert p.returncode == 2, (args, p.returncode, p.stderr)
