# SPDX-License-Identifier: MIT
"""030 - the other vLLM routes (issue 19 item 6): POST /v1/responses
(streamed or not), /tokenize, /detokenize, the three rerank paths, the
two score paths, /pooling, and the two audio routes (multipart/form-data,
routed by the form's model field).  Each is relayed by the body's model
to an upstream that serves it, never coalesced, under the tenant limits,
billed from its usage where it has one, with errors in OpenAI's shape.

Which upstream answered is read from the mocks' /stats ("requests");
concurrency is made certain with mock_hold, never hoped for.  The last
test drives real clients (js/openai_client.js: the openai npm client and
the Vercel AI SDK) through the gateway when Node and npm are here; it
skips otherwise.
"""

import json
import os
import re
import subprocess

from gwtest import (JSON_HEADERS, REPO_ROOT, assert_error, budget,
                    has_metric, jbody, metric, normalise, request, skip,
                    sse_events, tool, wait_for)

from coalesce_util import finish, finish_all, new_tag, present, send

TOKENS = "infergw_tokens_total"
REQUESTS = "infergw_requests_total"

KEY_A = "sk-a-0123456789abc"
TENANT_A = "[tenant a]\napi_key = %s\n" % KEY_A
AUTH_A = {"Authorization": "Bearer " + KEY_A}

# Every JSON route, with a body for model M and the route's metric label.
JSON_ROUTES = [
    ("/v1/responses", lambda m: {"model": m, "input": "say something"},
     "responses"),
    ("/tokenize", lambda m: {"model": m, "prompt": "one two three"},
     "tokenize"),
    ("/detokenize", lambda m: {"model": m, "tokens": [1, 2, 3]},
     "detokenize"),
    ("/v1/rerank", lambda m: {"model": m, "query": "q",
                              "documents": ["a", "b c", "d"]}, "rerank"),
    ("/rerank", lambda m: {"model": m, "query": "q",
                           "documents": ["a", "b"]}, "rerank"),
    ("/v2/rerank", lambda m: {"model": m, "query": "q", "top_n": 1,
                              "documents": ["a", "b"]}, "rerank"),
    ("/v1/score", lambda m: {"model": m, "text_1": "q",
                             "text_2": ["a", "b"]}, "score"),
    ("/score", lambda m: {"model": m, "text_1": "q", "text_2": "a"},
     "score"),
    ("/pooling", lambda m: {"model": m, "input": "pool me"}, "pooling"),
]
AUDIO_ROUTES = [("/v1/audio/transcriptions", "audio_transcriptions"),
                ("/v1/audio/translations", "audio_translations")]

_CREATED_AT = re.compile(rb'"created_at"\s*:\s*\d+')


def same(body):
    """normalise(), and the Responses API's created_at blanked too."""
    return _CREATED_AT.sub(b'"created_at":0', normalise(body))


def form(fields, boundary="----infergw7MA4YWxkTrZu0gW", audio=b"RIFF\x00\x01"
         b"WAVEfmt \r\n--not-the-boundary\r\n\xff" * 50):
    """A multipart/form-data body as clients send it: the file first, then
    the fields.  Returns (headers, body)."""
    out = b"--%s\r\nContent-Disposition: form-data; name=\"file\"; " \
          b"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n%s\r\n" % (
              boundary.encode(), audio)
    for k, v in fields.items():
        out += b"--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n" \
               b"\r\n%s\r\n" % (boundary.encode(), k.encode(), str(v).encode())
    out += b"--%s--\r\n" % boundary.encode()
    return ({"Content-Type": "multipart/form-data; boundary=%s" % boundary},
            out)


def pool(t, mocks, models, extra=""):
    """A gateway over 'mocks', upstream i serving models[i] only."""
    conf = {}
    for i, m in enumerate(mocks):
        conf["upstream u%d" % i] = {"url": "http://127.0.0.1:%d" % m.port,
                                    "models": models[i]}
    return t.gateway(None, conf, extra=extra)


def requests_of(mocks):
    return [m.stats()["requests"] for m in mocks]


def post(g, path, body, headers=None):
    h = dict(JSON_HEADERS)
    h.update(headers or {})
    return g.post(path, body, h)


def tokens(g, tenant, model, kind):
    gm = g.metrics()
    if not has_metric(gm, TOKENS, tenant=tenant, model=model, kind=kind):
        return 0
    return metric(gm, TOKENS, tenant=tenant, model=model, kind=kind)


# ---- relayed by model ------------------------------------------------------

def test_each_route_goes_to_the_upstream_of_its_model(t):
    a, b = t.mock(), t.mock()
    g = pool(t, [a, b], ["model-a", "model-b"])
    for path, make, label in JSON_ROUTES:
        for i, (name, other) in enumerate([("model-a", b),
                                           ("model-b", a)]):
            body = jbody(**make(name))
            want = (a, b)[i]
            before = requests_of([a, b])
            direct = want.call("POST", path, body)
            r = post(g, path, body)
            assert r.status == 200, (path, r)
            assert r.content_type == direct.content_type, (path, r)
            assert same(r.body) == same(direct.body), \
                "%s: %r\n mock: %r" % (path, r.body[:300], direct.body[:300])
            assert r.headers.get("X-Infergw-Coalesce") is None, \
                "%s has a coalescing role: %r" % (path, r.headers)
            after = requests_of([a, b])
            assert after[i] == before[i] + 2 and \
                after[1 - i] == before[1 - i], \
                "%s for %s: requests %r -> %r" % (path, name, before, after)
        wait_for(lambda: metric(g.metrics(), REQUESTS, route=label,
                                status="200") >= 2,
                 msg="%s{route=%s}" % (REQUESTS, label))
    for path, label in AUDIO_ROUTES:
        for i, name in enumerate(["model-a", "model-b"]):
            h, body = form({"model": name, "language": "en"})
            want = (a, b)[i]
            direct = request(want.port, "POST", path, h, body)
            before = requests_of([a, b])
            r = g.request("POST", path, h, body)
            assert r.status == 200, (path, r)
            # The mock's words hash the whole body: the same answer means
            # the same bytes reached it.
            assert same(r.body) == same(direct.body), (r.body, direct.body)
            assert r.json()["usage"]["type"] == "duration", r.body
            after = requests_of([a, b])
            assert after[i] == before[i] + 1 and \
                after[1 - i] == before[1 - i], (path, before, after)
        wait_for(lambda: metric(g.metrics(), REQUESTS, route=label,
                                status="200") >= 2,
                 msg="%s{route=%s}" % (REQUESTS, label))
    # A model no upstream serves: 404 before any upstream call.
    before = requests_of([a, b])
    r = post(g, "/v1/responses", jbody(model="gpt-4", input="x"))
    assert_error(r, 404, "model_not_found", param="model")
    h, body = form({"model": "whisper-9"})
    r = g.request("POST", "/v1/audio/transcriptions", h, body)
    assert_error(r, 404, "model_not_found", param="model")
    assert requests_of([a, b]) == before


def test_audio_upload_reaches_the_upstream_as_sent(t):
    m = t.mock()
    g = t.gateway(m)
    boundary = "b:o(u)n d=a?r,y"        # legal, and no token: quoted
    h, body = form({"model": "mock-model", "response_format": "text"},
                   boundary=boundary)
    h = {"Content-Type": "Multipart/Form-Data; charset=utf-8; "
                         "boundary=\"%s\"" % boundary,
         "User-Agent": "evil/1.0", "X-Stainless-Lang": "js"}
    m.reset()
    direct = request(m.port, "POST", "/v1/audio/transcriptions", h, body)
    r = g.request("POST", "/v1/audio/transcriptions", h, body)
    assert r.status == 200 and r.body == direct.body, (r, direct)
    assert r.content_type.startswith("text/plain"), r
    rec = json.loads(m.get("/recorded").body)["requests"][-1]
    sent = {k.lower(): v for k, v in rec["headers"]}
    # The type the upstream gets is rebuilt from the boundary the gateway
    # split the body at; no other client header goes.
    assert sent["content-type"] == \
        "multipart/form-data; boundary=\"%s\"" % boundary, sent
    assert sent["content-length"] == str(len(body)), sent
    assert "user-agent" not in sent and "x-stainless-lang" not in sent, sent
    # The JSON routes send JSON's type, whatever the client said.
    post(g, "/tokenize", jbody(model="mock-model", prompt="x"),
         {"Content-Type": "text/plain"})
    rec = json.loads(m.get("/recorded").body)["requests"][-1]
    assert rec["target"] == "/tokenize", rec
    assert dict((k.lower(), v) for k, v in rec["headers"])[
        "content-type"] == "application/json", rec


def test_bad_forms_are_refused_in_openai_shape(t):
    m = t.mock()
    g = t.gateway(m, {"server": {"max_request_body": "4k"}})
    path = "/v1/audio/transcriptions"
    h, body = form({"model": "mock-model"})
    cases = [
        ({}, body, 400, "invalid_multipart", None),
        ({"Content-Type": "application/json"}, b'{"model":"mock-model"}',
         400, "invalid_multipart", None),
        ({"Content-Type": "multipart/form-data"}, body, 400,
         "invalid_multipart", None),
        ({"Content-Type": "multipart/form-data; boundary=a; boundary=b"},
         body, 400, "invalid_multipart", None),
        (h, form({"language": "en"})[1], 400, "missing_model", "model"),
        (h, body.replace(b"--\r\n", b"\r\n"), 400, "invalid_multipart",
         None),
        (h, form({"model": "a", "x": 1})[1].replace(b'"x"', b'"model"'),
         400, "invalid_multipart", None),
        (h, form({"model": "has space"})[1], 400, "invalid_model", "model"),
    ]
    for headers, b, status, code, param in cases:
        r = g.request("POST", path, headers, b)
        assert_error(r, status, code, param=param)
    # Bounded by max_request_body like every body.
    big = form({"model": "mock-model"}, audio=b"x" * 5000)[1]
    r = g.request("POST", path, h, big)
    assert_error(r, 413, "request_too_large")
    assert m.stats()["requests"] == 0, "a refused upload went upstream"


# ---- the Responses API ---------------------------------------------------

def test_responses_streamed_in_vllm_events_and_billed(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    body = jbody(model="mock-model", input="tell me", stream=True,
                 mock_chunks=4)
    p0 = tokens(g, "a", "mock-model", "prompt")
    c0 = tokens(g, "a", "mock-model", "completion")
    s = finish(send(g, body, "/v1/responses", AUTH_A))
    assert s.resp.status == 200 and s.clean_end, s.resp
    assert s.resp.content_type.startswith("text/event-stream"), s.resp
    types, last = [], None
    for ev in sse_events(s.body):
        lines = ev.split(b"\n")
        assert lines[0].startswith(b"event: ") and \
            lines[1].startswith(b"data: "), ev
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:].decode(), ev
        types.append(data["type"])
        last = data
    assert types[0] == "response.created" and \
        types[-1] == "response.completed", types
    assert types.count("response.output_text.delta") == 4, types
    usage = last["response"]["usage"]
    # Billed from response.completed's usage, under the Responses names.
    wait_for(lambda: tokens(g, "a", "mock-model", "prompt")
             == p0 + usage["input_tokens"]
             and tokens(g, "a", "mock-model", "completion")
             == c0 + usage["output_tokens"],
             msg="tokens billed from response.completed")
    # Not streamed: the body's usage.
    r = post(g, "/v1/responses", jbody(model="mock-model", input="a b c",
                                       max_output_tokens=3), AUTH_A)
    assert r.status == 200, r
    u = r.json()["usage"]
    assert u["input_tokens"] == 3 and u["output_tokens"] == 3, u
    wait_for(lambda: tokens(g, "a", "mock-model", "completion")
             == c0 + usage["output_tokens"] + 3,
             msg="tokens billed from the body's usage")
    line = g.wait_log(r"access.*path=/v1/responses.*prompt_tokens=3")
    assert "completion_tokens=3" in line, line


def test_responses_state_stays_upstream(t):
    m = t.mock()
    g = t.gateway(m)
    r = post(g, "/v1/responses", jbody(model="mock-model", input="first"))
    assert r.status == 200, r
    rid = r.json()["id"]
    r2 = post(g, "/v1/responses", jbody(model="mock-model", input="more",
                                        previous_response_id=rid))
    assert r2.status == 200 and \
        r2.json()["previous_response_id"] == rid, r2.body
    # An unknown id: the upstream's 404 reaches the client as it is.
    r3 = post(g, "/v1/responses", jbody(model="mock-model", input="x",
                                        previous_response_id="resp_nope"))
    assert r3.status == 404, r3
    assert r3.json()["error"]["param"] == "previous_response_id", r3.body


# ---- never coalesced -------------------------------------------------------

def test_identical_concurrent_requests_each_go_upstream(t):
    m = t.mock()
    g = t.gateway(m)
    cases = [(path, jbody(temperature=0, **make("mock-model")), JSON_HEADERS)
             for path, make, _ in JSON_ROUTES[:1]]
    cases += [(path, jbody(**make("mock-model")), JSON_HEADERS)
              for path, make, _ in JSON_ROUTES[1:]]
    for path, _ in AUDIO_ROUTES:
        h, body = form({"model": "mock-model"})
        cases.append((path, body, h))
    for path, body, headers in cases:
        tag = new_tag()
        if headers is JSON_HEADERS:
            d = json.loads(body)
            d["mock_hold"] = tag
            body = jbody(**d)
        else:
            headers, body = form({"model": "mock-model", "mock_hold": tag})
        before = m.stats()["requests"]
        conns = [send(g, body, path, headers) for _ in range(2)]
        # Both are held at the mock at once: two upstream calls.
        wait_for(lambda: m.stats()["held"] == 2,
                 msg="%s: two calls held upstream" % path)
        assert m.release(tag) == 2
        streams = finish_all(conns)
        for s in streams:
            assert s.resp.status == 200 and s.clean_end, (path, s.resp)
            assert s.resp.headers.get("X-Infergw-Coalesce") is None, path
        assert m.stats()["requests"] == before + 2, path


# ---- tenants ---------------------------------------------------------------

def test_tenant_limits_apply(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    for path, make, _ in JSON_ROUTES:
        r = post(g, path, jbody(**make("mock-model")))
        assert_error(r, 401, "invalid_api_key")
        r = post(g, path, jbody(**make("mock-model")), AUTH_A)
        assert r.status == 200, (path, r)
    for path, _ in AUDIO_ROUTES:
        h, body = form({"model": "mock-model"})
        assert_error(g.request("POST", path, h, body), 401, "invalid_api_key")
        h.update(AUTH_A)
        assert g.request("POST", path, h, body).status == 200, path
    # One under way: the next is over max_inflight, on any route.  (A
    # gateway of its own: a request counts as under way until its thread
    # is done with it, a moment after its client has the answer, so
    # back-to-back requests could meet a limit of 1.)
    g = t.gateway(m, extra=TENANT_A + "max_inflight = 1\n")
    tag = new_tag()
    held = send(g, jbody(model="mock-model", input="x", mock_hold=tag),
                "/v1/responses", AUTH_A)
    wait_for(lambda: m.stats()["held"] == 1, msg="one held")
    r = post(g, "/tokenize", jbody(model="mock-model", prompt="x"), AUTH_A)
    assert_error(r, 429, "rate_limit_exceeded")
    h, body = form({"model": "mock-model"})
    h.update(AUTH_A)
    assert_error(g.request("POST", "/v1/audio/translations", h, body), 429,
                 "rate_limit_exceeded")
    m.release(tag)
    assert finish(held).resp.status == 200


def test_billing_of_the_other_usages(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    # A rerank's usage is total_tokens alone: all input.
    p0 = tokens(g, "a", "mock-model", "prompt")
    r = post(g, "/v1/rerank", jbody(model="mock-model", query="q w",
                                    documents=["a", "b c"]), AUTH_A)
    total = r.json()["usage"]["total_tokens"]
    assert total == 5, r.body
    wait_for(lambda: tokens(g, "a", "mock-model", "prompt") == p0 + total,
             msg="rerank billed")
    # Score: prompt_tokens.
    r = post(g, "/v1/score", jbody(model="mock-model", text_1="a",
                                   text_2=["b", "c"]), AUTH_A)
    wait_for(lambda: tokens(g, "a", "mock-model", "prompt")
             == p0 + total + r.json()["usage"]["prompt_tokens"],
             msg="score billed")
    # A streamed transcription with its usage chunk is billed; a plain
    # one's usage is a duration, no tokens.
    h, body = form({"model": "mock-model", "stream": "true",
                    "stream_include_usage": "true", "mock_chunks": 3})
    h.update(AUTH_A)
    c0 = tokens(g, "a", "mock-model", "completion")
    s = g.request("POST", "/v1/audio/transcriptions", h, body)
    assert s.status == 200 and s.content_type.startswith(
        "text/event-stream"), s
    wait_for(lambda: tokens(g, "a", "mock-model", "completion") == c0 + 3,
             msg="streamed transcription billed")
    h, body = form({"model": "mock-model"})
    h.update(AUTH_A)
    r = g.request("POST", "/v1/audio/transcriptions", h, body)
    assert r.status == 200, r
    lines = wait_for(lambda: (lambda ls: len(ls) == 2 and ls)(
        [ln for ln in g.access_lines()
         if "path=/v1/audio/transcriptions " in ln]),
        msg="two access lines")
    assert "prompt_tokens=" in lines[0] and \
        "prompt_tokens=" not in lines[1], lines
    assert tokens(g, "a", "mock-model", "completion") == c0 + 3


def test_upstream_errors_relayed(t):
    m = t.mock()
    g = t.gateway(m)
    r = post(g, "/pooling", jbody(model="mock-model", input="x",
                                  mock_status=400))
    assert r.status == 400 and r.json()["error"]["code"] == "mock_status", r
    r = post(g, "/detokenize", jbody(model="mock-model", tokens="nope"))
    assert r.status == 400 and r.json()["error"]["param"] == "tokens", r
    h, body = form({"model": "mock-model", "mock_status": 503})
    r = g.request("POST", "/v1/audio/translations", h, body)
    # A 503 is retried on another upstream; with one, the client gets it.
    assert r.status == 503, r
    r = post(g, "/v1/responses", b"{not json")
    assert_error(r, 400, "invalid_json")


# ---- a real client ---------------------------------------------------------

# The clients, pinned: the openai npm client, and the Vercel AI SDK with
# its OpenAI provider (whose openai(model) calls the Responses API).
NPM_PACKAGES = ["openai@5.12.0", "ai@5.0.277", "@ai-sdk/openai@2.0.131",
                "zod@3.25.76"]
NPM_DIR = os.path.join(REPO_ROOT, "build", "npm")


def npm_packages():
    """NPM_PACKAGES, installed once into build/npm (kept there for the
    next run).  Skips without npm or its registry: this test is the
    optional one, the others need no network."""
    def installed(spec):
        name, version = spec.rsplit("@", 1)
        try:
            with open(os.path.join(NPM_DIR, "node_modules", name,
                                   "package.json")) as f:
                return json.load(f)["version"] == version
        except (OSError, ValueError, KeyError):
            return False

    if all(installed(p) for p in NPM_PACKAGES):
        return NPM_DIR
    npm = tool("npm")
    os.makedirs(NPM_DIR, exist_ok=True)
    try:
        p = subprocess.run([npm, "install", "--no-audit", "--no-fund",
                            "--no-package-lock", "--prefix", NPM_DIR]
                           + NPM_PACKAGES, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=budget(40))
    except subprocess.TimeoutExpired:
        skip("npm install took too long (no registry here?)")
    if p.returncode != 0 or not all(installed(p) for p in NPM_PACKAGES):
        skip("npm install failed (no registry here?): %s"
             % p.stdout.decode("utf-8", "replace")[-200:])
    return NPM_DIR


def test_the_openai_npm_client(t):
    node = tool("node", "nodejs")
    npm_dir = npm_packages()
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A)
    p = subprocess.run([node, os.path.join(os.path.dirname(__file__), "js",
                                           "openai_client.js"),
                        npm_dir, "http://127.0.0.1:%d/v1" % g.port, KEY_A],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=budget(30))
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]
    out = json.loads(p.stdout)
    assert out["plain"]["id"].startswith("resp_") and out["plain"]["text"], \
        out
    assert out["plain"]["usage"]["input_tokens"] == 2, out
    s = out["stream"]
    assert s["types"][0] == "response.created" and \
        s["types"][-1] == "response.completed", s
    assert s["text"] and s["text"] == s["final_text"], s
    assert out["chained"]["previous"] == out["plain"]["id"], out
    assert out["transcription"]["text"], out
    # The Vercel AI SDK's openai(model): the Responses API, both ways.
    for k in ("ai_generate", "ai_stream"):
        assert out[k]["text"] and out[k]["usage"]["outputTokens"] == 8, out
    # Counted after each client has its answer: wait for the fifth.
    gm = wait_for(lambda: (lambda gm: gm if has_metric(
        gm, REQUESTS, route="responses", status="200") and metric(
        gm, REQUESTS, route="responses", status="200") >= 5 else None)(
        g.metrics()), msg="the SDKs' five calls counted")
    assert present(gm, REQUESTS, route="responses", status="200") == 5, \
        "the SDKs' calls did not all go to /v1/responses"
    # Billed: every response's usage, streamed or not (8 tokens each but
    # the two the openai client's own made, whose counts it saw).
    want = out["plain"]["usage"]["output_tokens"] + \
        s["usage"]["output_tokens"] + 3 * 8
    wait_for(lambda: tokens(g, "a", "mock-model", "completion") == want,
             msg="the clients' responses billed")
