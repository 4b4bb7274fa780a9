# SPDX-License-Identifier: MIT
"""032 - token limits (issue 28 item 1): [tenant] tokens_per_minute, a
bucket charged from each call's usage when it ends (so it may go into
debt), and tokens_per_day / tokens_per_month, budgets per UTC period:
429 rate_limit_exceeded (type "tokens") or insufficient_quota with
Retry-After, OpenAI's x-ratelimit-*-tokens headers, a stream without
usage charged by count, followers charged to their own tenant, and the
settings' FILE:LINE errors.

A call is charged just after it ends, so a test waits for the charge in
/metrics (infergw_tenant_tokens_charged_total) before the next request.
"""

import calendar
import json
import math
import re
import time

from gwtest import (assert_error, chat_body, completion_body, request,
                    wait_for)

from coalesce_util import (CHAT, COMPLETIONS, assert_complete_stream,
                           finish_all, new_tag, present, role, send,
                           wait_state)

CHARGED = "infergw_tenant_tokens_charged_total"
REJECTED = "infergw_tenant_rejected_total"
USED = "infergw_tenant_tokens_used"

KEY_A = "sk-a-0123456789abc"
KEY_B = "sk-b-0123456789abc"
TENANT_A = "[tenant a]\napi_key = %s\n" % KEY_A
TENANT_B = "[tenant b]\napi_key = %s\n" % KEY_B
JSON_A = {"Authorization": "Bearer " + KEY_A,
          "Content-Type": "application/json"}
JSON_B = {"Authorization": "Bearer " + KEY_B,
          "Content-Type": "application/json"}


def charged(g, tenant, source):
    return present(g.metrics(), CHARGED, tenant=tenant, source=source)


def wait_charged(g, tenant, source, want):
    """Poll until the tenant's charge from 'source' is 'want' (it is
    made as the call ends, just after or before its client's last
    byte)."""
    wait_for(lambda: charged(g, tenant, source) == want,
             msg="%s{tenant=%s,source=%s} == %d" % (CHARGED, tenant, source,
                                                    want))


def usage_total(resp):
    """prompt + completion of a JSON body's or a stream's usage."""
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        total = None
        for line in resp.body.decode().split("\n"):
            if line.startswith("data: {") and '"usage":{' in line:
                u = json.loads(line[6:])["usage"]
                total = u["prompt_tokens"] + u["completion_tokens"]
        assert total is not None, "no usage in %r" % resp.body[-300:]
        return total
    u = resp.json()["usage"]
    return u["prompt_tokens"] + u["completion_tokens"]


def retry_after(resp):
    v = resp.headers.get("Retry-After")
    assert v is not None and v.isdigit(), "Retry-After %r" % (v,)
    return int(v)


def reset_s(v):
    """An x-ratelimit-reset-* value (Go's duration) in seconds."""
    f = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?"
                     r"|(\d+)ms", v or "")
    assert f and v, "reset %r" % (v,)
    if f.group(4):
        return int(f.group(4)) / 1000
    return (int(f.group(1) or 0) * 3600 + int(f.group(2) or 0) * 60
            + float(f.group(3) or 0))


def tokens_headers(resp):
    return (resp.headers.get("x-ratelimit-limit-tokens"),
            resp.headers.get("x-ratelimit-remaining-tokens"),
            resp.headers.get("x-ratelimit-reset-tokens"))


def test_tokens_per_minute_from_json_usage(t):
    # 40 a minute; the mock's answers cost more than that (30 chunks),
    # so the first call puts the bucket in debt and the next is refused
    # until the refill has paid it back.
    m = t.mock("-n", "60")
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 40\n" + TENANT_B)
    r1 = g.post(CHAT, chat_body("tpm json"), JSON_A)
    assert r1.status == 200, r1
    # Judged before the call: the bucket full, nothing charged yet.
    assert tokens_headers(r1)[:2] == ("40", "40"), r1.headers
    cost = usage_total(r1)
    assert cost > 40, cost
    wait_charged(g, "a", "usage", cost)
    t0 = time.monotonic()
    r2 = g.post(CHAT, chat_body("tpm json 2"), JSON_A)
    assert_error(r2, 429, "rate_limit_exceeded")
    assert r2.json()["error"]["type"] == "tokens", r2.body
    assert b"tokens_per_minute" in r2.body, r2.body
    # In debt by cost - 40: a whole token is back after (cost - 39)
    # tokens at 40 a minute (1.5 s each), less the time gone by.
    due = (cost - 39) * 1.5
    gone = time.monotonic() - t0 + 1
    assert due - gone - 1 <= retry_after(r2) <= math.ceil(due), \
        (retry_after(r2), due)
    limit, left, reset = tokens_headers(r2)
    assert (limit, left) == ("40", "0"), r2.headers
    # Full again once the whole cost is refilled: cost * 1.5 s.
    assert cost * 1.5 - gone - 1 <= reset_s(reset) <= cost * 1.5, \
        (reset, cost)
    # The refusal took no call upstream, and b is not held back.
    assert m.stats()["completions"] == 1
    r = g.post(CHAT, chat_body("tpm b"), JSON_B)
    assert r.status == 200 and tokens_headers(r) == (None, None, None), r
    gm = g.metrics()
    assert present(gm, REJECTED, tenant="a",
                   limit="tokens_per_minute") == 1
    assert present(gm, REJECTED, tenant="b",
                   limit="tokens_per_minute") == 0
    assert present(gm, "infergw_tenant_tokens_per_minute_limit",
                   tenant="a") == 40


def test_tokens_per_minute_from_a_streams_usage(t):
    # stream_options.include_usage: the usage chunk is what is charged.
    m = t.mock("-n", "60")
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 40\n")
    body = chat_body("tpm stream", stream=True,
                     stream_options={"include_usage": True})
    r1 = g.post(CHAT, body, JSON_A)
    assert r1.status == 200, r1
    cost = usage_total(r1)
    wait_charged(g, "a", "usage", cost)
    assert charged(g, "a", "counted") == 0
    r2 = g.post(CHAT, body, JSON_A)
    assert_error(r2, 429, "rate_limit_exceeded")
    assert r2.json()["error"]["type"] == "tokens", r2.body
    assert retry_after(r2) >= 1
    assert m.stats()["completions"] == 1


def test_a_stream_without_usage_is_charged_by_count(t):
    # No include_usage, and the mock adds none: the prompt is the
    # request's bytes / 4 (rounded up), the completion one token per
    # event with text (the role chunk's "" and the finish chunk carry
    # none).  For chat and for completions.  Not coalesced: a coalesced
    # stream asks the upstream for its usage (040-stream-usage.py).
    m = t.mock("-n", "12")
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 1000\n"
                  "coalesce = off\n")
    want = 0
    for path, body in ((CHAT, chat_body("count me", stream=True)),
                       (COMPLETIONS, completion_body("count me too",
                                                     stream=True))):
        r = g.post(path, body, JSON_A)
        assert r.status == 200, r
        assert b'"usage":{' not in r.body, r.body[-200:]
        want += (len(body) + 3) // 4 + 12
        wait_charged(g, "a", "counted", want)
    assert charged(g, "a", "usage") == 0
    # The bucket was charged the count too.
    r = g.post(CHAT, chat_body("after"), JSON_A)
    left = int(tokens_headers(r)[1])
    assert 1000 - want <= left <= 1000 - want + 2, (left, want)


def test_day_budget_is_insufficient_quota_until_midnight_utc(t):
    m = t.mock()
    g = t.gateway(m, conf={"admin": {"listen": "127.0.0.1:0"}},
                  extra=TENANT_A + "tokens_per_day = 5\n"
                  "tokens_per_month = 1000000\n")
    r1 = g.post(CHAT, chat_body("budget"), JSON_A)
    assert r1.status == 200, r1
    cost = usage_total(r1)
    wait_charged(g, "a", "usage", cost)
    before = time.time()
    r2 = g.post(CHAT, chat_body("budget 2"), JSON_A)
    after = time.time()
    assert_error(r2, 429, "insufficient_quota")
    assert r2.json()["error"]["type"] == "insufficient_quota", r2.body
    assert b"tokens_per_day" in r2.body, r2.body

    def to_midnight(now):
        day = time.gmtime(now)
        midnight = calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday,
                                    0, 0, 0)) + 86400
        return midnight - now

    assert math.floor(to_midnight(after)) <= retry_after(r2) \
        <= math.ceil(to_midnight(before)) + 1, \
        (retry_after(r2), to_midnight(before))
    assert m.stats()["completions"] == 1
    gm = g.metrics()
    assert present(gm, REJECTED, tenant="a", limit="tokens_per_day") == 1
    assert present(gm, USED, tenant="a", period="day") == cost
    assert present(gm, USED, tenant="a", period="month") == cost
    assert present(gm, "infergw_tenant_tokens_per_day_limit",
                   tenant="a") == 5
    # The status view shows the day against its budget.
    st = request(g.admin_port, "GET", "/status.json", {
        "Authorization": "Bearer %s" % g.admin_key}).json()
    row = [x for x in st["tenants"] if x["name"] == "a"][0]
    assert (row["tokens_today"], row["tokens_per_day"],
            row["tokens_this_month"], row["tokens_per_month"],
            row["tokens_bucket"]) == (cost, 5, cost, 1000000, None), row


def test_tokens_headers_on_every_answer(t):
    # OpenAI's three, beside the -requests ones, on answers to a tenant
    # with tokens_per_minute: remaining goes down by each charge.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 6000\n"
                  "requests_per_minute = 100\n")
    r1 = g.post(CHAT, chat_body("h1"), JSON_A)
    assert r1.status == 200, r1
    assert r1.headers.get("x-ratelimit-limit-requests") == "100"
    assert tokens_headers(r1) == ("6000", "6000", "0s"), r1.headers
    cost = usage_total(r1)
    wait_charged(g, "a", "usage", cost)
    r2 = g.post(CHAT, chat_body("h2"), JSON_A)
    limit, left, reset = tokens_headers(r2)
    # 100 a second refill: a few may be back already.
    assert limit == "6000" and 6000 - cost <= int(left) < 6000, r2.headers
    assert 0 < reset_s(reset) <= cost / 100 + 0.001, (reset, cost)


def test_followers_are_charged_to_their_own_tenant(t):
    # A leader and its follower: one upstream call, both requests
    # charged its usage (as both are billed), each to its own tenant
    # (the flight is one tenant's: the key holds it); a's is not b's.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n"
                  + TENANT_B)
    tag = new_tag()
    body = chat_body("shared", stream=True, mock_hold=tag,
                     stream_options={"include_usage": True})
    c1 = send(g, body, headers={"Authorization": "Bearer " + KEY_A})
    wait_state(g, m, held=1, leaders=1)
    c2 = send(g, body, headers={"Authorization": "Bearer " + KEY_A})
    wait_state(g, m, held=1, followers=1)
    c3 = send(g, body, headers={"Authorization": "Bearer " + KEY_B})
    wait_state(g, m, held=2, leaders=2)
    m.release(tag)
    lead, follow, other = finish_all([c1, c2, c3])
    assert (role(lead), role(follow)) == ("leader", "follower")
    for s in (lead, follow, other):
        assert_complete_stream(s)
    cost = None
    for line in follow.body.decode().split("\n"):
        if '"usage":{' in line:
            u = json.loads(line[6:])["usage"]
            cost = u["prompt_tokens"] + u["completion_tokens"]
    assert cost, follow.body
    wait_charged(g, "a", "usage", 2 * cost)
    wait_charged(g, "b", "usage", cost)
    assert m.stats()["completions"] == 2


def test_settings_errors_name_file_and_line(t):
    for i, (line, bad) in enumerate([
            ("tokens_per_minute", "-1"),
            ("tokens_per_minute", "1000000001"),
            ("tokens_per_day", "lots"),
            ("tokens_per_month", "1000000000000001"),
            ("tokens_per_day", "1.5")]):
        text = ("[server]\nlisten = 127.0.0.1:0\n[upstream]\n"
                "url = http://127.0.0.1:9\n" + TENANT_A
                + "%s = %s\n" % (line, bad))
        path = t.write("tok%d.conf" % i, text)
        rc, out = t.infergw("-t", "-c", path)
        assert rc == 2, (line, bad, rc, out)
        assert "%s:7:" % path in out and line in out, (line, bad, out)
    ok = t.write("tok-ok.conf", "[server]\nlisten = 127.0.0.1:0\n"
                 "[upstream]\nurl = http://127.0.0.1:9\n" + TENANT_A
                 + "tokens_per_minute = 1000000000\n"
                 "tokens_per_day = 1000000000000000\n"
                 "tokens_per_month = 0\n")
    rc, out = t.infergw("-t", "-c", ok)
    assert rc == 0, out


def test_a_client_gone_before_the_head_pays_its_prompt(t):
    # The upstream took the request (it may have done the whole
    # prefill): a client that hangs up before the first byte is charged
    # its prompt, counted, alone (b: coalesce off) and as a leader (a).
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n"
                  + TENANT_B + "coalesce = off\n")
    for key, tenant in ((KEY_A, "a"), (KEY_B, "b")):
        tag = new_tag()
        body = chat_body("gone early " * 40, stream=True, mock_hold=tag)
        c = send(g, body, headers={"Authorization": "Bearer " + key})
        wait_state(g, m, held=1)
        c.close()
        wait_charged(g, tenant, "counted", (len(body) + 3) // 4)
        m.release(tag)
        wait_state(g, m, held=0)
        assert charged(g, tenant, "usage") == 0


def test_a_leader_whose_client_left_is_charged(t):
    # The leader's client leaves before the head; its follower keeps
    # the flight going: both are charged its usage, the leader too.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n")
    tag = new_tag()
    body = chat_body("left", stream=True, mock_hold=tag,
                     stream_options={"include_usage": True})
    hdr = {"Authorization": "Bearer " + KEY_A}
    c1 = send(g, body, headers=hdr)
    wait_state(g, m, held=1, leaders=1)
    c2 = send(g, body, headers=hdr)
    wait_state(g, m, held=1, followers=1)
    c1.close()
    m.release(tag)
    (follow,) = finish_all([c2])
    assert_complete_stream(follow)
    cost = None
    for line in follow.body.decode().split("\n"):
        if '"usage":{' in line:
            u = json.loads(line[6:])["usage"]
            cost = u["prompt_tokens"] + u["completion_tokens"]
    assert cost, follow.body
    wait_charged(g, "a", "usage", 2 * cost)


def test_a_direct_call_cut_mid_stream_is_charged_what_came(t):
    # The upstream dies after the role chunk and 2 content chunks: the
    # prompt counted plus one token per event with text.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n"
                  "coalesce = off\n")
    body = chat_body("cut", stream=True, mock_fault="die_mid_stream")
    r = g.post(CHAT, body, JSON_A)
    assert r.status == 200, r
    wait_charged(g, "a", "counted", (len(body) + 3) // 4 + 2)


def test_an_audio_form_is_charged_its_events_not_its_bytes(t):
    # A form's bytes are audio: no prompt counted, only the events.
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n")
    boundary = "----infergw032"
    body = b"--%s\r\nContent-Disposition: form-data; name=\"file\"; " \
           b"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n%s\r\n" \
           % (boundary.encode(), b"RIFF" + b"\x01" * 4000)
    for k, v in (("model", "mock-model"), ("stream", "true"),
                 ("mock_chunks", "5")):
        body += b"--%s\r\nContent-Disposition: form-data; name=\"%s\"" \
                b"\r\n\r\n%s\r\n" % (boundary.encode(), k.encode(),
                                     v.encode())
    body += b"--%s--\r\n" % boundary.encode()
    r = g.request("POST", "/v1/audio/transcriptions", {
        "Authorization": "Bearer " + KEY_A,
        "Content-Type": "multipart/form-data; boundary=%s" % boundary}, body)
    assert r.status == 200, r
    wait_charged(g, "a", "counted", 5)


def test_a_non_2xx_answer_costs_nothing(t):
    # The upstream refused (400): nothing charged.  A 200 after it, on
    # the same connection, is then the whole charge (counted: not
    # coalesced, the stream has no usage).
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_minute = 100000\n"
                  "coalesce = off\n")
    r = g.post(CHAT, chat_body("refused", mock_status=400), JSON_A)
    assert r.status == 400, r
    ok = chat_body("after the refusal", stream=True)
    r = g.post(CHAT, ok, JSON_A)
    assert r.status == 200, r
    wait_charged(g, "a", "counted", (len(ok) + 3) // 4 + 8)
    assert charged(g, "a", "usage") == 0


def test_month_budget_is_insufficient_quota_until_the_first(t):
    m = t.mock()
    g = t.gateway(m, extra=TENANT_A + "tokens_per_month = 5\n")
    r1 = g.post(CHAT, chat_body("month"), JSON_A)
    assert r1.status == 200, r1
    wait_charged(g, "a", "usage", usage_total(r1))
    before = time.time()
    r2 = g.post(CHAT, chat_body("month 2"), JSON_A)
    after = time.time()
    assert_error(r2, 429, "insufficient_quota")
    assert b"tokens_per_month" in r2.body, r2.body

    def to_first(now):
        d = time.gmtime(now)
        y, mo = (d.tm_year + 1, 1) if d.tm_mon == 12 else (d.tm_year,
                                                           d.tm_mon + 1)
        return calendar.timegm((y, mo, 1, 0, 0, 0)) - now

    assert math.floor(to_first(after)) <= retry_after(r2) \
        <= math.ceil(to_first(before)) + 1, (retry_after(r2),
                                              to_first(before))
    assert m.stats()["completions"] == 1
    assert present(g.metrics(), REJECTED, tenant="a",
                   limit="tokens_per_month") == 1
