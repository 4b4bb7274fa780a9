# SPDX-License-Identifier: MIT
"""024 - the mock's engine mode (docs/MOCK_UPSTREAM.md "Engine mode"):
continuous batching over a FIFO, a step time that grows with the batch,
prefill and the prefix cache, KV usage, vLLM's /metrics and its /control
switches, hang-ups.  The tests talk to the mock directly: it is what the
gateway's load-aware scheduling and its benchmark will be tested on, so
each rule of its model is shown here, and each assertion can fail.

Timings are loose on purpose (a loaded 2-core machine, sanitizer builds):
bounds that can only be reached by the rule under test, never by a
slow run, and step times scaled by INFERGW_TEST_SLOW_FACTOR where the
order of events across sockets is what is checked.
"""

import os
import select
import subprocess
import time

from gwtest import (JSON_HEADERS, SLOW, Connection, budget, build_request,
                    chat_body, completion_body, jbody, metric, parse_metrics,
                    request, sse_data, sse_events, wait_for)

from metrics_check import validate

CHAT = "/v1/chat/completions"
MODEL = "mock-model"                # the mock's first -m model by default
CONTENT = b'"delta":{"content":'    # a content chunk, not the role chunk
DONE = b"data: [DONE]"


def metrics(m):
    """The mock's /metrics, parsed."""
    r = request(m.port, "GET", "/metrics")
    assert r.status == 200, "mock /metrics: %r" % r
    return parse_metrics(r.text)


def series(m, name, model=MODEL):
    return metric(metrics(m), name, model_name=model, engine="0")


def load(m):
    """(running, waiting) as /metrics says."""
    ms = metrics(m)
    return (metric(ms, "vllm:num_requests_running", model_name=MODEL),
            metric(ms, "vllm:num_requests_waiting", model_name=MODEL))


def wait_load(m, running, waiting, timeout=10):
    wait_for(lambda: load(m) == (running, waiting), timeout,
             msg="running %d, waiting %d" % (running, waiting))


class Streams:
    """Streamed completions read in one thread with select(), so that what
    arrived on one socket before another's bytes is seen before them.
    Each stream records when each of its content tokens arrived."""

    def __init__(self, port):
        self.port = port
        self.items = []

    def start(self, body, path=CHAT):
        c = Connection(self.port, timeout=60)
        c.send(build_request("POST", path, JSON_HEADERS, body))
        self.items.append({"conn": c, "raw": b"", "times": [],
                           "done": False, "eof": False})
        return len(self.items) - 1

    def __getitem__(self, i):
        return self.items[i]

    def tokens(self, i):
        return len(self.items[i]["times"])

    def _read(self, it):
        data = it["conn"].sock.recv(1 << 16)
        if not data:
            it["eof"] = True
            return
        now = time.monotonic()
        it["raw"] += data
        # An event is one HTTP chunk, written whole: counting in the raw
        # bytes never splits one, bar a read that ends inside it, which
        # the next read completes.
        it["times"] += [now] * (it["raw"].count(CONTENT) - len(it["times"]))
        it["done"] = DONE in it["raw"]

    def poll(self, timeout):
        """Read whatever arrives on any open stream within 'timeout' s."""
        live = [it for it in self.items if not it["done"] and not it["eof"]]
        if not live:
            return
        socks = [it["conn"].sock for it in live]
        ready, _, _ = select.select(socks, [], [], timeout)
        for it in live:
            if it["conn"].sock in ready:
                self._read(it)

    def wait_tokens(self, i, n=1, timeout=10):
        """Read until stream 'i' has 'n' tokens."""
        deadline = time.monotonic() + budget(timeout)
        while self.tokens(i) < n:
            assert time.monotonic() < deadline, \
                "stream %d: %d tokens, want %d" % (i, self.tokens(i), n)
            self.poll(0.1)

    def drain(self):
        """Read everything already here, without waiting."""
        before = None
        while before != [len(it["raw"]) for it in self.items]:
            before = [len(it["raw"]) for it in self.items]
            self.poll(0)

    def finish(self, timeout=60, each=None):
        """Read until every stream is done; 'each' is called after every
        read.  Asserts they all ended with [DONE]."""
        deadline = time.monotonic() + budget(timeout)
        while not all(it["done"] or it["eof"] for it in self.items):
            assert time.monotonic() < deadline, "streams did not end: %r" % [
                (self.tokens(i), it["done"]) for i, it in
                enumerate(self.items)]
            self.poll(0.5)
            if each is not None:
                each()
        for i, it in enumerate(self.items):
            assert it["done"], "stream %d cut: %r" % (i, it["raw"][-200:])

    def close(self, i):
        self.items[i]["conn"].close()
        self.items[i]["eof"] = True


def stream_body(prompt, max_tokens, **extra):
    return chat_body(prompt, stream=True, max_tokens=max_tokens, **extra)


def test_a_batch_of_max_running_and_a_fifo_behind_it(t):
    # Two running at most: the third and fourth wait, and the first token
    # of either comes after the first two's last.  One step is 20 ms
    # (more when slow) plus 1 ms per sequence: the gap between a finished
    # stream's [DONE] and the next one's first token is at least that.
    step = 20 * SLOW
    m = t.mock("-E", "max_running=2,step_ms=%g" % step)
    ss = Streams(m.port)
    first = [ss.start(stream_body("first %d" % i, 25)) for i in range(2)]
    wait_load(m, 2, 0)
    later = [ss.start(stream_body("later %d" % i, 25)) for i in range(2)]
    wait_load(m, 2, 2)
    assert all(ss.tokens(i) == 0 for i in later), "a waiting one streamed"
    seen = set()

    def check_order():
        for i in later:
            if i in seen or ss.tokens(i) == 0:
                continue
            seen.add(i)
            ss.drain()      # whatever was sent before this token is here
            assert any(ss[j]["done"] for j in first), \
                "stream %d got a token while both of the first two ran " \
                "(%r tokens)" % (i, [ss.tokens(j) for j in first])

    ss.finish(each=check_order)
    assert seen == set(later)
    assert [ss.tokens(i) for i in range(4)] == [25] * 4, \
        [ss.tokens(i) for i in range(4)]
    wait_load(m, 0, 0)


def test_the_step_time_grows_with_the_batch(t):
    # 10 ms a step plus 10 ms per running sequence: a lone stream gets a
    # token every 20 ms, each of eight running together one every 90 ms.
    # Measured after the first few tokens, once all eight are admitted
    # (they arrive over a step or two).  A slow machine only stretches
    # both, so the bounds are: at least the model's step, and a ratio
    # well under the model's 4.5.
    m = t.mock("-E", "step_ms=10,step_per_seq_ms=10")
    n, skip = 16, 4

    def interval(ss, i):
        ts = ss[i]["times"]
        return (ts[-1] - ts[skip]) / (n - 1 - skip)

    alone = Streams(m.port)
    alone.start(stream_body("alone", n))
    alone.finish()
    lone = interval(alone, 0)
    eight = Streams(m.port)
    for i in range(8):
        eight.start(stream_body("batch %d" % i, n))
    eight.finish()
    batch = [interval(eight, i) for i in range(8)]
    assert lone >= 0.018, "a lone step took %.1f ms, want >= 20" % (
        lone * 1e3)
    assert min(batch) >= 0.08, "a step of 8 took %.1f ms, want >= 90" % (
        min(batch) * 1e3)
    assert min(batch) >= 2 * lone, \
        "8 running: %.1f ms a token, alone %.1f ms: the step did not grow" \
        % (min(batch) * 1e3, lone * 1e3)


def ttft_and_usage(m, body):
    """Seconds to the first event (it comes with the first token), and
    the usage chunk, of one streamed chat completion."""
    c = Connection(m.port, timeout=30)
    t0 = time.monotonic()
    s = c.stream("POST", CHAT, JSON_HEADERS, body)
    first = s.next_event()
    ttft = time.monotonic() - t0
    assert first is not None and s.resp.status == 200, s.resp
    events = sse_events(s.read_all())
    c.close()
    usage = [sse_data(e) for e in events if e != DONE]
    usage = [d for d in usage if d.get("usage")]
    assert len(usage) == 1, events
    return ttft, usage[0]["usage"]


def prefix_counters(m):
    ms = metrics(m)
    return (metric(ms, "vllm:prefix_cache_queries_total", model_name=MODEL),
            metric(ms, "vllm:prefix_cache_hits_total", model_name=MODEL))


def test_the_prefix_cache_hits_whole_blocks_and_saves_prefill(t):
    # 1 ms of prefill per uncached token.  The prompt: 1280 bytes, 320
    # tokens, 20 blocks of 16.  Asked again, 19 blocks hit: vLLM always
    # computes the last token, so a prompt cached whole misses its last
    # block.  A prompt sharing 650 bytes (10 whole blocks and a bit)
    # hits 10 blocks.
    m = t.mock("-E", "prefill_us_per_token=1000")
    text = "".join(chr(ord("a") + i % 26) for i in range(1280))
    other = text[:650] + "Z" * 630
    opts = {"stream_options": {"include_usage": True}}
    q0, h0 = prefix_counters(m)
    ttft1, u1 = ttft_and_usage(m, stream_body(text, 2, **opts))
    q1, h1 = prefix_counters(m)
    ttft2, u2 = ttft_and_usage(m, stream_body(text, 2, **opts))
    q2, h2 = prefix_counters(m)
    _, u3 = ttft_and_usage(m, stream_body(other, 2, **opts))
    q3, h3 = prefix_counters(m)
    assert u1["prompt_tokens"] == u2["prompt_tokens"] == 320, (u1, u2)
    assert u1["completion_tokens"] == 2, u1
    assert (q1 - q0, h1 - h0) == (320, 0), "cold: %r" % ((q1 - q0, h1 - h0),)
    assert (q2 - q1, h2 - h1) == (320, 19 * 16), \
        "warm: queries %d, hits %d, want 320 and 304" % (q2 - q1, h2 - h1)
    assert (q3 - q2, h3 - h2) == (320, 10 * 16), \
        "shared 650 bytes: hits %d, want 160" % (h3 - h2)
    # Cold: 320 ms of prefill in the first step; warm: 16 ms.
    assert ttft1 >= 0.3, "cold TTFT %.0f ms, want >= 320" % (ttft1 * 1e3)
    assert ttft2 < ttft1 / 2, "warm TTFT %.0f ms, cold %.0f ms" % (
        ttft2 * 1e3, ttft1 * 1e3)
    # /stats/reset empties the cache and zeroes the counters.
    m.reset()
    assert prefix_counters(m) == (0, 0)
    ttft_and_usage(m, stream_body(text, 1, **opts))
    assert prefix_counters(m) == (320, 0)


def test_the_prefix_cache_evicts_a_prompts_tail_first(t):
    # A cache of 24 blocks.  Prompt A fills 20, then B's 8 blocks evict 4:
    # the least recently used, which are A's last 4, since a prompt's
    # blocks are entered last first (vLLM frees them in that order, so its
    # free queue evicts a tail before its head).  A again hits 16 blocks.
    m = t.mock("-E", "kv_blocks=24")
    a = "".join(chr(ord("a") + i % 26) for i in range(1280))
    b = "".join(chr(ord("A") + i % 26) for i in range(512))
    for text in (a, b):
        r = m.call("POST", CHAT, chat_body(text, max_tokens=1))
        assert r.status == 200, r
    q0, h0 = prefix_counters(m)
    r = m.call("POST", CHAT, chat_body(a, max_tokens=1))
    assert r.status == 200, r
    q1, h1 = prefix_counters(m)
    assert (q1 - q0, h1 - h0) == (320, 16 * 16), \
        "A after B: hits %d, want 256" % (h1 - h0)


def test_kv_usage_follows_the_running_sequences(t):
    # 64 blocks of 16 tokens.  A 1280-byte prompt is 20 blocks, and with
    # 40 tokens of output holds 20 to 23 while it runs.  Admission
    # reserves prompt and output: two 40-block sequences do not fit
    # together, so the second waits though a slot is free.
    m = t.mock("-E", "kv_blocks=64,step_ms=20")
    kv = "vllm:kv_cache_usage_perc"
    assert series(m, kv) == 0
    ss = Streams(m.port)
    ss.start(stream_body("x" * 1280, 40))
    used = wait_for(lambda: series(m, kv), msg="KV usage above 0")
    assert 20 / 64 <= used <= 23 / 64, "KV usage %r" % used
    ss.finish()
    wait_for(lambda: series(m, kv) == 0, msg="KV usage back to 0")
    big = [ss.start(stream_body("0" + "y" * 2399, 40))]
    ss.wait_tokens(big[0])
    big.append(ss.start(stream_body("1" + "y" * 2399, 40)))
    wait_load(m, 1, 1)
    # Any arrival waits for a step's end, so (1, 1) must last for steps.
    ss.wait_tokens(big[0], ss.tokens(big[0]) + 5)
    assert load(m) == (1, 1), "a sequence was admitted past kv_blocks"
    assert 38 / 64 <= series(m, kv) <= 40 / 64
    ss.finish()
    assert all(ss.tokens(i) == 40 for i in big)
    wait_load(m, 0, 0)
    assert series(m, kv) == 0
    # More than the whole cache could ever hold is refused.
    r = m.call("POST", CHAT, chat_body("z" * 4000, max_tokens=100))
    assert r.status == 400 and \
        r.json()["error"]["code"] == "context_length_exceeded", r


def test_tokens_usage_and_finish_reason(t):
    # -n, -d and mock_chunks do not apply: max_tokens (or
    # default_max_tokens) is the length; ceil(bytes / 4) the prompt.
    m = t.mock("-n", "3", "-d", "5000", "-E",
               "step_ms=1,step_per_seq_ms=0,default_max_tokens=5")
    t0 = time.monotonic()
    r = m.call("POST", "/v1/completions",
               completion_body("abcdefghij", mock_chunks=9))
    d = r.json()
    assert d["usage"] == {"prompt_tokens": 3, "total_tokens": 8,
                          "completion_tokens": 5}, d
    assert d["choices"][0]["finish_reason"] == "stop", d
    assert len(d["choices"][0]["text"].split()) == 5, d
    r = m.call("POST", CHAT, chat_body("abcd", max_completion_tokens=7))
    d = r.json()
    assert d["usage"]["completion_tokens"] == 7, d
    assert d["usage"]["prompt_tokens"] == 1, d
    assert d["choices"][0]["finish_reason"] == "length", d
    # Chat counts the messages' contents, joined.
    r = m.call("POST", CHAT, jbody(model=MODEL, messages=[
        {"role": "user", "content": c} for c in ("abcd", "efgh", "i")]))
    assert r.json()["usage"]["prompt_tokens"] == 3, r.json()
    r = m.call("POST", CHAT, chat_body("a", max_tokens=0))
    assert r.status == 400 and r.json()["error"]["param"] == "max_tokens", r
    # -d would have made that last a 25 s wait.
    assert time.monotonic() - t0 < budget(2), "-d applied in engine mode"


def test_metrics_text_and_control_switches(t):
    m = t.mock("-e", "-m", "served-one,other")
    r = request(m.port, "GET", "/metrics")
    assert r.status == 200, r
    assert r.headers.get("Content-Type", "").startswith(
        "text/plain; version=0.0.4"), r
    assert validate(r.text).startswith("ok:")
    ms = parse_metrics(r.text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total"):
        labels = [dict(ls) for (n, ls) in ms if n == name]
        assert labels == [{"engine": "0", "model_name": "served-one"}], \
            (name, labels)
    # vLLM writes Python floats, and HELP/TYPE lines as its client does.
    assert 'vllm:num_requests_running{engine="0",model_name="served-one"} ' \
           '0.0\n' in r.text, r.text
    assert "# TYPE vllm:prefix_cache_hits_total counter\n" in r.text

    def control(q):
        resp = request(m.port, "POST", "/control?" + q)
        assert resp.status == 200, resp
        return resp.json()

    assert control("metrics=off")["metrics"] == "off"
    assert request(m.port, "GET", "/metrics").status == 404
    control("metrics=old")
    text = request(m.port, "GET", "/metrics").text
    assert "vllm:gpu_cache_usage_perc{" in text, text
    assert "vllm:kv_cache_usage_perc" not in text, text
    assert "vllm:gpu_prefix_cache_queries_total{" in text, text
    assert validate(text).startswith("ok:")
    assert control("metrics=on&metrics_delay_ms=400")["metrics_delay_ms"] \
        == 400
    t0 = time.monotonic()
    r = request(m.port, "GET", "/metrics")
    assert r.status == 200 and time.monotonic() - t0 >= 0.4, r
    assert "vllm:kv_cache_usage_perc{" in r.text
    control("metrics_delay_ms=0")
    for bad in ("metrics=new", "metrics_delay_ms=-1", "metrics=onnnnnnnnn"):
        assert request(m.port, "POST", "/control?" + bad).status == 400, bad


def test_a_hang_up_frees_its_slot_or_its_place(t):
    m = t.mock("-E", "max_running=1,step_ms=20")
    ss = Streams(m.port)
    a = ss.start(stream_body("a", 4000))
    ss.wait_tokens(a)
    b = ss.start(stream_body("b", 4000))
    wait_load(m, 1, 1)          # b is the FIFO's head, c behind it
    c = ss.start(stream_body("c", 4000))
    wait_load(m, 1, 2)
    ss.close(a)                 # running: its slot goes to b at once
    wait_load(m, 1, 1)
    ss.wait_tokens(b)
    ss.close(c)                 # waiting: it leaves the FIFO unrun
    wait_load(m, 1, 0)
    ss.close(b)
    wait_load(m, 0, 0)
    assert ss.tokens(c) == 0
    wait_for(lambda: m.stats()["aborted"] == 3, msg="3 aborted")


def test_metrics_without_the_engine(t):
    # The simple mode serves the same series: running is the completions
    # being answered (holds included), the rest 0.  Its answers are as
    # they always were (the other tests' business): -n chunks here.
    m = t.mock("-n", "3")
    assert load(m) == (0, 0)
    assert series(m, "vllm:kv_cache_usage_perc") == 0
    tag = "engine-off-%d" % os.getpid()
    c = Connection(m.port)
    c.send(build_request("POST", CHAT, JSON_HEADERS,
                         chat_body("held", mock_hold=tag)))
    wait_load(m, 1, 0)
    assert m.release(tag) == 1
    r = c.read_response("POST")
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 3
    wait_load(m, 0, 0)
    assert validate(request(m.port, "GET", "/metrics").text).startswith(
        "ok:")


def test_bad_engine_flags_exit_2(t):
    exe = os.path.join(t.bin, "mock_upstream")
    for arg in ("max_running=0", "step_ms=0", "step_ms=1e3", "kv_blocks=x",
                "nope=1", "block_tokens", "prefill_us_per_token=-1",
                "max_running=2,,step_ms=1"):
        p = subprocess.run([exe, "-l", "127.0.0.1:0", "-E", arg],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=budget(10))
        assert p.returncode == 2, (arg, p.returncode, p.stderr)
        assert b"-E" in p.stderr, (arg, p.stderr)


def test_streams_end_like_vllm_and_a_client_may_pipeline(t):
    # The engine's stream has the simple mode's shape: role chunk with
    # the first token, content chunks, finish, usage, [DONE].
    m = t.mock("-E", "step_ms=2,step_per_seq_ms=0")
    c = Connection(m.port)
    for _ in range(2):          # keep-alive: the second on the same socket
        s = c.stream("POST", CHAT, JSON_HEADERS, stream_body(
            "shape", 3, stream_options={"include_usage": True}))
        docs = [sse_data(e) for e in sse_events(s.read_all())]
        assert s.clean_end
        assert docs[-1] == "[DONE]"
        assert docs[0]["choices"][0]["delta"] == {"role": "assistant",
                                                  "content": ""}, docs[0]
        assert all("content" in d["choices"][0]["delta"]
                   for d in docs[1:4]), docs
        assert docs[4]["choices"][0]["finish_reason"] == "length", docs[4]
        assert docs[5]["usage"]["completion_tokens"] == 3, docs[5]
        assert len(docs) == 7, docs
