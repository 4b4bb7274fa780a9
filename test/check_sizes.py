#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_sizes - no source file passes 1,000 lines (STYLE.md section 1:
past that, a file holds more than one idea).

    python3 test/check_sizes.py [ROOT]

Fails naming each source file (.c, .h, .py, .sh) of gateway/, common/ or
tools/ that has more than MAX_LINES lines, with its count; such a file
is split by job behind a private header (C) or into a package (Python),
as tools/mock/ and tools/soak/ were.  Run by 'make unit'.
"""

import os
import sys

MAX_LINES = 1000
TOPS = ("gateway", "common", "tools")
SOURCE_EXT = (".c", ".h", ".py", ".sh")
SKIP_DIRS = {"__pycache__"}


def sources(root):
    for top in TOPS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.join(d, f)


def count_lines(path):
    with open(path, "rb") as f:
        return len(f.read().splitlines())


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    sizes = [(count_lines(p), os.path.relpath(p, root))
             for p in sources(root)]
    if not sizes:
        print("check_sizes: no source file under %s" % ", ".join(TOPS),
              file=sys.stderr)
        return 1
    over = [(n, rel) for n, rel in sizes if n > MAX_LINES]
    for n, rel in over:
        print("check_sizes: %s has %d lines, more than %d: split it by job"
              % (rel, n, MAX_LINES), file=sys.stderr)
    if over:
        return 1
    n, rel = max(sizes)
    print("check_sizes: %d source files in %s, all at most %d lines (the "
          "longest: %s, %d)" % (len(sizes), ", ".join(t + "/" for t in TOPS),
                                MAX_LINES, rel, n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
