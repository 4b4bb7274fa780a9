# SPDX-License-Identifier: MIT
"""016 - SIGHUP reloads the configuration file (issue 10): new requests
use the new settings; open streams and flights finish on the old ones; an
invalid file is reported with FILE:LINE and the old configuration stays;
settings that need a restart are named in the log; a reload during the
drain changes nothing.
"""

import signal

from gwtest import assert_error, chat_body, request, wait_for

from coalesce_util import (CHAT, assert_complete_stream, finish, finish_all,
                           new_tag, role, send, wait_state)

JSON = {"Content-Type": "application/json"}


def auth(key):
    return dict(JSON, Authorization="Bearer %s" % key)


def rewrite(g, text):
    with open(g.conf_path, "w") as f:
        f.write(text)
    g.conf_text = text


def reload(g, generation):
    """SIGHUP, and wait until 'generation' is in force."""
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"reload: configuration generation=%d in force" % generation)


def test_new_requests_new_settings_open_streams_old(t):
    m = t.mock()
    g = t.gateway(m, extra="[tenant a]\napi_key = sk-old-012345678\n")
    tag = new_tag()
    held = send(g, chat_body("across a reload", stream=True, mock_hold=tag),
                headers={"Authorization": "Bearer sk-old-012345678"})
    wait_state(g, m, held=1)
    rewrite(g, g.conf_text.replace("sk-old-012345678", "sk-new-012345678"))
    reload(g, 2)
    assert_error(g.post(CHAT, chat_body("x"), auth("sk-old-012345678")), 401,
                 "invalid_api_key")
    r = g.post(CHAT, chat_body("x"), auth("sk-new-012345678"))
    assert r.status == 200, r
    # The stream that started on generation 1 ends on it, whole.
    m.release(tag)
    assert_complete_stream(finish(held))
    g.wait_log(r"generation: configuration generation=1 freed")


def test_invalid_file_keeps_the_old_configuration(t):
    m = t.mock()
    g = t.gateway(m, extra="[tenant a]\napi_key = sk-a-0123456789a\n")
    good = g.conf_text
    rewrite(g, good + "[coalesce]\nmax_followers = lots\n")
    lines = good.count("\n") + 2
    g.send_signal(signal.SIGHUP)
    line = g.wait_log(r"reload: .*gw\d*\.conf:%d: max_followers: expected"
                      % lines)
    assert "stays generation=1" in line, line
    r = g.post(CHAT, chat_body("still here"), auth("sk-a-0123456789a"))
    assert r.status == 200, r
    # A later good file is taken as generation 2.
    rewrite(g, good.replace("sk-a-0123456789a", "sk-b-0123456789a"))
    reload(g, 2)
    r = g.post(CHAT, chat_body("x"), auth("sk-b-0123456789a"))
    assert r.status == 200, r


def test_startup_settings_are_named_and_kept(t):
    m = t.mock()
    g = t.gateway(m)
    rewrite(g, g.conf_text.replace("listen = 127.0.0.1:0",
                                   "listen = 127.0.0.1:1\n"
                                   "thread_stack_size = 1m"))
    reload(g, 2)
    g.wait_log(r"reload: listen changed to '127\.0\.0\.1:1': that needs a "
               r"restart, still '127\.0\.0\.1:0'")
    g.wait_log(r"reload: thread_stack_size changed to 1048576: that needs "
               r"a restart")
    r = g.post(CHAT, chat_body("same port"), JSON)
    assert r.status == 200, r


def test_new_upstream_for_new_requests(t):
    a, b = t.mock(), t.mock()
    g = t.gateway(a)
    tag = new_tag()
    held = send(g, chat_body("on a", stream=True, mock_hold=tag))
    wait_state(g, a, held=1)
    rewrite(g, g.conf_text.replace("127.0.0.1:%d" % a.port,
                                   "127.0.0.1:%d" % b.port))
    reload(g, 2)
    r = g.post(CHAT, chat_body("on b"), JSON)
    assert r.status == 200, r
    assert b.stats()["completions"] == 1
    assert a.stats()["completions"] == 1        # the held one only
    a.release(tag)
    assert_complete_stream(finish(held))
    assert a.stats()["completions"] == 1


def test_flights_do_not_cross_a_reload(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    body = chat_body("one flight per generation", stream=True,
                     mock_hold=tag)
    first = send(g, body)
    wait_state(g, m, held=1, leaders=1)
    reload(g, 2)                    # the same file: a new generation
    second = send(g, body)
    # Generation 2's request leads its own flight; a third one follows it.
    wait_state(g, m, held=2, leaders=2)
    third = send(g, body)
    wait_state(g, m, held=2, followers=1)
    m.release(tag)
    streams = finish_all([first, second, third])
    for s in streams:
        assert_complete_stream(s)
    assert [role(s) for s in streams] == ["leader", "leader", "follower"]
    wait_state(g, m, completions=2, upstream=2)


def test_sighup_during_the_drain_changes_nothing(t):
    m = t.mock()
    g = t.gateway(m)
    tag = new_tag()
    held = send(g, chat_body("draining", stream=True, mock_hold=tag))
    wait_state(g, m, held=1)
    g.send_signal(signal.SIGTERM)
    g.wait_log(r"server: draining")
    g.send_signal(signal.SIGHUP)
    g.wait_log(r"server: SIGHUP while draining: nothing is reloaded")
    assert g.proc.poll() is None, "a SIGHUP ended the drain"
    m.release(tag)
    assert_complete_stream(finish(held))
    assert g.wait_exit(10) == 0
    assert not any("generation=2" in l for l in g.log_lines())


def test_reload_under_load_loses_nothing(t):
    """Requests keep coming while the file is reloaded ten times: every
    one is answered whole (each on the generation it started on)."""
    m = t.mock()
    g = t.gateway(m, {"routing": {"health_interval": "50ms"}})
    tag = new_tag()
    conns = []
    for i in range(10):
        conns.append(send(g, chat_body("load %d" % i, stream=True,
                                       mock_hold=tag)))
        reload(g, i + 2)
    wait_state(g, m, held=10)
    m.release(tag)
    for s in finish_all(conns):
        assert_complete_stream(s)
    # Every old generation is freed once its request is over.
    wait_for(lambda: sum("generation: configuration generation=" in l
                         and "freed" in l for l in g.log_lines()) == 10,
             msg="10 generations freed")
    r = request(g.port, "GET", "/readyz")
    assert r.status == 200, r


def test_an_idle_connection_gets_the_new_configuration(t):
    """A keep-alive connection that waited through a reload serves its
    next request on the new configuration: a revoked key is refused, and
    the request never joins a flight of the old one."""
    from gwtest import Connection, Stream, build_request
    m = t.mock()
    g = t.gateway(m, extra="[tenant a]\napi_key = sk-old-012345678\n")
    idle = Connection(g.port)
    assert idle.request("POST", CHAT, auth("sk-old-012345678"),
                        chat_body("before")).status == 200
    tag = new_tag()
    body = chat_body("old flight", stream=True, mock_hold=tag)
    old = send(g, body, headers={"Authorization": "Bearer sk-old-012345678"})
    wait_state(g, m, held=1, leaders=2)     # "before" led one too
    rewrite(g, g.conf_text.replace("sk-old-012345678", "sk-new-012345678")
            + "api_key = sk-old-012345678\n")   # both keys in generation 2
    reload(g, 2)
    idle.send(build_request("POST", CHAT, auth("sk-old-012345678"), body))
    wait_state(g, m, held=2, leaders=3)
    m.release(tag)
    s = Stream(idle, "POST")
    s.read_all()
    assert_complete_stream(s)
    assert role(s) == "leader", "joined a flight of the old configuration"
    assert_complete_stream(finish(old))
    # And a key the reload removed is refused on an idle connection.
    rewrite(g, g.conf_text.replace("api_key = sk-old-012345678\n", ""))
    reload(g, 3)
    assert_error(idle.request("POST", CHAT, auth("sk-old-012345678"),
                              chat_body("after")), 401, "invalid_api_key")
