# SPDX-License-Identifier: MIT
"""The parts of tools/bench_sched.py (its docstring is the
documentation): report, the tables, notes and targets of its runs."""
