#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_licence - infergw is MIT licensed, and every place says so.

    python3 test/check_licence.py [ROOT]

Fails unless
  - LICENSE at the root is the MIT licence (its title, the permission
    grant and the warranty disclaimer, with a copyright line);
  - every source file (C, headers, Python, shell, JavaScript, the
    Makefile and the package's maintainer scripts) names it as
    "SPDX-License-Identifier: MIT" on its first comment line: line 1, or
    line 2 after a "#!" line;
  - README.md names the licence and the LICENSE file;
  - the Debian package's copyright file (tools/deb/copyright, installed
    as /usr/share/doc/infergw/copyright) states it, as Debian's "Expat"
    with the licence's text, and nothing says no licence is stated.
Run by 'make unit'; 029-deb.py runs lintian on the package itself.
"""

import os
import re
import sys

SPDX = "SPDX-License-Identifier: MIT"
SKIP_DIRS = {".git", "build", "node_modules", "__pycache__", "corpus"}
SCRIPTS = {"Makefile", ".ci/run", "tools/deb/postinst", "tools/deb/postrm",
           "tools/deb/prerm"}
SOURCE_EXT = (".c", ".h", ".py", ".sh", ".js")
MIT_PHRASES = [
    "MIT License",
    "Permission is hereby granted, free of charge, to any person obtaining",
    "The above copyright notice and this permission notice shall be "
    "included in",
    'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND',
]


def sources(root):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for f in sorted(files):
            path = os.path.join(top, f)
            rel = os.path.relpath(path, root)
            if rel.endswith(SOURCE_EXT) or rel in SCRIPTS:
                yield rel, path


def first_comment_line(text):
    lines = text.split("\n")
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return lines[0] if lines else ""


def flat(text):
    """Text with its line breaks and indentation folded to single spaces
    (and Debian's " ." paragraph lines dropped), for phrase matching."""
    return " ".join(w for w in text.split() if w != ".")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    errors = []

    path = os.path.join(root, "LICENSE")
    if not os.path.exists(path):
        errors.append("LICENSE: missing")
    else:
        text = flat(open(path, encoding="utf-8").read())
        for p in MIT_PHRASES:
            if flat(p) not in text:
                errors.append("LICENSE: not the MIT licence (no %r)" % p)
        if not re.search(r"Copyright \(c\) \d{4} \S", text):
            errors.append("LICENSE: no copyright line")

    n = 0
    for rel, path in sources(root):
        n += 1
        with open(path, encoding="utf-8") as f:
            line = first_comment_line(f.read(4096))
        if SPDX not in line or not line.lstrip().startswith(("#", "/*",
                                                             "//")):
            errors.append("%s:1: the first comment line is not %r (%r)"
                          % (rel, SPDX, line[:60]))
    if n < 100:
        errors.append("only %d source files found under %s" % (n, root))

    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    if not re.search(r"MIT", readme) or "LICENSE" not in readme:
        errors.append("README.md: does not name the MIT licence and LICENSE")

    deb = open(os.path.join(root, "tools", "deb", "copyright"),
               encoding="utf-8").read()
    if not re.search(r"^License: Expat$", deb, re.M):
        errors.append("tools/deb/copyright: no 'License: Expat' paragraph")
    for p in MIT_PHRASES[1:]:
        if flat(p) not in flat(deb):
            errors.append("tools/deb/copyright: no licence text (%r)" % p)
    if "none-stated" in deb or "no license" in deb.lower():
        errors.append("tools/deb/copyright: still says no licence is stated")

    for e in errors:
        print("check_licence: " + e, file=sys.stderr)
    if errors:
        return 1
    print("check_licence: MIT, named in LICENSE, README, the package and "
          "%d source files" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
