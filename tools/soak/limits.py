# SPDX-License-Identifier: MIT
"""The time limits of a soak run.

self_test() lowers REQ_DEADLINE (its hang case waits that long), so every
module reads it as limits.REQ_DEADLINE, never a copy taken at import."""

REQ_DEADLINE = 15.0       # hard deadline of one request (a hang is BAD)
SETTLE_MAX = 15.0         # settle phase after the clients stopped
SEND_TIMEOUT_S = 5        # the gateway's [server] send_timeout
STUCK_PAUSE = 7.0         # stuck reader: no read for this long (> send_timeout)
