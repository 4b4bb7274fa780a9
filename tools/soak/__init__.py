# SPDX-License-Identifier: MIT
"""The parts of tools/soak.py, the bounded fault soak (its docstring is
the documentation), one job a module:

  limits    the time limits of a run (REQ_DEADLINE, SETTLE_MAX, ...)
  response  strict HTTP/1.1 response parsing and the classifier (CATS,
            MUST_FAIL, classify)
  client    connections, requests, reading a response, request bodies
  workload  class Soak: the worker threads and their request kinds
  procs     the child processes (Proc, Mock), simple_http, certificates
  sampler   the gateway's RSS, threads and descriptors from /proc
  chaos     the chaos thread
  selftest  the canned server and --self-test
  run       a run, from start-up to settle (run_soak)
  report    the report and its verdicts
"""
