#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""soak.py - a bounded fault soak for infergw (loopback only).

Usage:
  python3 tools/soak.py --bin build/soak/bin --seconds 180 [--clients 40]
                        [--mocks 3] [--tls CERTDIR] [--seed N] [--keep]
                        [--eject-after N] [--inject-bug]
  python3 tools/soak.py --self-test [--tls CERTDIR]

Python 3 standard library only; nothing from test/ is imported.

What it does
------------
Starts --mocks (default 3) mock upstreams (BIN/mock_upstream, port 0) and
one gateway (BIN/infergw) with its own temp dir and config: one
[upstream mN] section per mock (so failures fail over), [coalesce]
defaults, [routing] first_byte_timeout = idle_timeout = 2s,
connect_timeout = 2s, health_interval = 1s, eject_time = 2s,
eject_after = --eject-after (10; with the gateway's default 3 this
poison-heavy mix ejects every upstream within seconds, since each poison
request is retried on every upstream, and the run turns into 503s),
[server] send_timeout = 5s.

Then --clients worker threads run for --seconds a weighted mix of request
kinds (see KINDS below): coalesced groups of 3..6 identical streams
started together (some late joiners, some members that hang up, read
slowly or are plain/TLS mixed), distinct streams, /v1/completions
streams, non-streamed chat, embeddings, keep-alive pairs, clients that
hang up mid-stream or before the answer, slow readers of big streams
(1.3 MB through an 8 KiB receive buffer), a reader that stalls past
send_timeout (one at a time, 5 MiB), and requests whose body asks the
mock for each mock_fault (streamed and not), alone and coalesced.  After
a 503 a client waits min(Retry-After, 1 s) before its next request.

A chaos thread meanwhile, one action at a time, on one mock at a time:
POST /control status=503 (Retry-After 1) / status=500 / fault=stall /
fault=die_mid_stream / fault=head_then_die / fault=reset / health=503,
SIGSTOP ... SIGCONT (an upstream that stalls everything, health probes
included), and at most twice a SIGKILL followed, 3 s later, by a restart
on the same port (SO_REUSEADDR; if the port cannot be bound again the
mock stays dead and the run goes on with one upstream fewer, said so in
the report).  Every action is undone after 3..6 s; the last 15 % of the
run has no chaos.

A sampler reads /proc/PID of the gateway every second: VmRSS, Threads,
and its descriptors, split (via /proc/net/tcp and /proc/net/unix) into
client sockets, upstream sockets (remote port = a mock), unix sockets
(the socketpair of each libcurl multi handle: one per upstream session,
idle or not), listeners, other sockets and non-socket descriptors.  The
series goes to TMP/samples.csv; the gateway's and mocks' logs to TMP/;
raw bytes of every BAD response to TMP/bad/.

Bounded in time: every socket has a timeout and every request a hard
deadline (REQ_DEADLINE s), workers are daemon threads, no new request
starts after --seconds, the settle phase is at most SETTLE_MAX s, and a
watchdog kills everything at --seconds + 45 s (a normal run ends about
8 s after --seconds, start-up included).  All children are killed
at the end.  The temp dir is removed unless --keep or something was BAD.

Classification of every client response
---------------------------------------
The response bytes are parsed strictly (HTTP/1.1 status line, header
fields without obs-fold or whitespace before the colon, exactly one of
Content-Length / Transfer-Encoding: chunked, hex chunk sizes with CRLF
after each chunk's data, no 1xx, no close-delimited body, no bytes after
the end of a response).

COMPLETE      2xx with the whole body (Content-Length reached, or the
              last chunk and the end of the trailers seen); a stream is
              text/event-stream, every event is `data: <json>` or
              `data: [DONE]`, [DONE] is the last event and comes once, a
              chunk with a finish_reason comes before it, every chunk has
              the same "id", and no event is an error; a JSON body parses
              and has the right "object".  Identical bodies must give
              identical completion text (the mock's words are a function
              of the body), whichever flight served them.
HONEST ERROR  one of:
              - status 500/502/503/504 with a complete body that is an
                OpenAI error ({"error":{"message":"...", ...}}) and
                Content-Type application/json;
              - a 200 stream whose last event is an SSE error event
                `data: {"error":{...}}`, followed by no byte and by an
                unclean end (connection closed/reset without the last
                chunk);
              - a 200 non-streamed JSON body cut short whose framing
                itself says so (fewer bytes than Content-Length, or a
                chunked body without its last chunk) and then closed.
                A JSON object cannot carry an error event, and every
                HTTP client must treat such a message as incomplete
                (RFC 9112 section 8); it is reported as its own form so
                it can be told apart.
CLIENT GAVE UP the client closed the connection itself (hang-up kinds),
              or stalled past send_timeout and was dropped (the
              stuck-reader kind: then a cut without an error event is
              the documented outcome).  What was received until then must
              still parse.
BAD           anything else, for instance: a framing error; a stream
              cut without an error event; an error event followed by a
              clean end; a clean end without [DONE]; a 4xx (nothing the
              soak sends is invalid, and no tenant limits are configured)
              or another unexpected status; an error status whose body
              is not an OpenAI error or is cut; no end within
              REQ_DEADLINE s (a hang); the connection closed or reset
              before a single byte (the gateway must always answer, a
              fault in the body or not); a connect error; a COMPLETE
              answer to a body that cannot succeed (below); different
              text for identical bodies; mixed ids inside one stream.

What is honest for each fault asked in the body (every upstream gets the
same body, so retries fail the same way):

  fault              stream                      not streamed
  reset              502 (after retries)         502
  stall              504 (first_byte_timeout)    504
  die_mid_stream     SSE error event, cut        200 body cut (framing)
  stall_mid_stream   SSE error event, cut        200 body cut (framing)
  head_then_die      502                         - (the mock ignores it)
  head_then_stall    504                         - (the mock ignores it)
  big_headers        502                         502
  chunked_json       - (a normal stream)         COMPLETE (chunked JSON)
  chunked_json_die   - (a normal stream)         200 body cut (framing)

Entries with a status may also be 503 (every upstream ejected) or any
honest form; a COMPLETE answer where the table says it must fail is BAD.
Requests without a fault may be COMPLETE or any honest error, since the
chaos thread makes upstreams fail under them.

Resources
---------
baseline: after start-up, one warm stream and one warm non-stream request
and 2 s of quiet.  warm-up ends at 20 % of the run; "steady" is from there
to the moment the last client stopped.  Verdicts:
  flat after warm-up (judged for runs of 120 s or more): RSS max over
    the second half of the steady part
    <= 1.2 x the RSS max of its first quarter, and threads / descriptors
    never above baseline + (peak concurrent client connections) x 1 / x 3
    + a constant (each client connection costs the gateway one thread and
    one socket, an upstream call one or two more);
  back to baseline: once the clients have stopped, polled up to SETTLE_MAX
    s: threads == baseline, no client socket left, non-socket descriptors
    == baseline; idle upstream keep-alive sockets (libcurl's cache) are
    reported apart.  RSS is reported but not judged: glibc keeps freed
    arenas and heap tops mapped, so RSS above baseline after a burst is
    expected.

Exit status: 0 all good, 1 any BAD response (or the gateway died, or a
resource verdict failed), 2 setup problem (e.g. --tls with a gateway
that has no TLS yet), 3 watchdog.

--self-test runs the classifier, through the same socket client code,
against a raw TCP server (soak/selftest.py) that sends canned good and
bad responses (truncated streams, garbage framing, a hang, a reset...),
and checks each lands in the expected category.  --inject-bug adds a
request kind to a real soak that talks to that canned server's truncated
stream, to show that a soak run fails (exit 1) when BAD appears.
"""

import argparse
import os
import sys

# The parts live in the soak/ package beside this file (soak/__init__.py
# maps them).  Put this directory first on the path so that they are
# found from any working directory, and under "python3 -P" too.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from soak.run import run_soak  # noqa: E402
from soak.selftest import self_test  # noqa: E402


def main():
    ap = argparse.ArgumentParser(
        description="bounded fault soak of infergw (loopback only)")
    ap.add_argument("--bin", default="build/soak/bin",
                    help="directory with infergw and mock_upstream")
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--mocks", type=int, default=3)
    ap.add_argument("--tls", metavar="CERTDIR",
                    help="half the clients over TLS (ca.pem, server.pem, "
                    "server.key; made with BIN/mkcert when missing)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eject-after", type=int, default=10,
                    help="[routing] eject_after (default 10; the gateway's "
                    "own default 3 ejects the whole fleet under this "
                    "poison-heavy mix and the run turns into 503s)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (logs, config)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the classifier against canned responses")
    ap.add_argument("--inject-bug", action="store_true",
                    help="test only: add a client kind whose server sends "
                    "a truncated stream (the run must end with BAD)")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(self_test(args))
    if args.seconds < 10 or args.clients < 1 or args.mocks < 2:
        ap.error("need --seconds >= 10, --clients >= 1, --mocks >= 2")
    sys.exit(run_soak(args))


if __name__ == "__main__":
    main()
