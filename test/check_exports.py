#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_exports - every global function of the plain build is used by
another object of it: test-only API is built only into test binaries,
and a function only its own file calls is static.

    python3 test/check_exports.py [BUILD]      (default build/default)

Reads, with nm (binutils, which gcc comes with), the objects of the
plain, non-test build in BUILD: gateway/ (BUILD/gateway/**.o, what
BUILD/bin/infergw links) and libinfergw.a's members, with the tools'
objects (BUILD/tools/**.o), which link libinfergw.a too.  Fails naming
every global function (nm's T) defined in a gateway object or in a
member of libinfergw.a that no other of those objects references (nm's
U): an export that only the unit tests use (guard it with #ifdef
INFERGW_UNIT_TEST in header and source, or make it GW_TESTABLE), or one
that only its own file uses (make it static), or one nobody uses
(delete it).  ALLOWED lists the few that are used so without being
either, each with its reason.  Run by 'make unit', after the plain
build (the unit tests' objects are built with -DINFERGW_UNIT_TEST and
would hide the very exports this looks for).
"""

import os
import subprocess
import sys

# name -> why it is global though no other object references it.
ALLOWED = {
    "main": "the program's entry, called by the C runtime (crt1.o)",
}


def objects(root, sub):
    """The objects under root/sub that a source of today's tree makes
    (root/gateway/fleet/pool.o from gateway/fleet/pool.c): a build
    directory may still hold objects of files that moved or went."""
    out = []
    for dirpath, _dirs, files in os.walk(os.path.join(root, sub)):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".o") and os.path.exists(
                    os.path.relpath(path, root)[:-2] + ".c"):
                out.append(path)
    return sorted(out)


def nm(path):
    """{object: (defined functions, undefined symbols)} of a .o or .a."""
    res = subprocess.run(["nm", "-P", "-A", path], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        sys.exit("check_exports: nm %s: %s" % (path, res.stderr.strip()))
    out = {}
    for line in res.stdout.splitlines():
        # "FILE: name type [value size]", FILE "lib.a[member.o]" for an
        # archive's member.
        where, _, rest = line.rpartition(": ")
        fields = rest.split()
        if not where or len(fields) < 2:
            continue
        defined, undefined = out.setdefault(where, (set(), set()))
        if fields[1] == "T":
            defined.add(fields[0])
        elif fields[1] == "U":
            undefined.add(fields[0])
    return out


def main(argv):
    build = argv[1] if len(argv) > 1 else "build/default"
    lib = os.path.join(build, "libinfergw.a")
    gateway = objects(build, "gateway")
    tools = objects(build, "tools")
    if not os.path.exists(lib) or not gateway:
        sys.exit("check_exports: no plain build in %s (make all)" % build)

    table = {}
    for path in gateway + tools + [lib]:
        table.update(nm(path))
    checked = [o for o in table if not o.startswith(
        os.path.join(build, "tools") + os.sep)]

    errors = []
    for obj in sorted(checked):
        for name in sorted(table[obj][0]):
            if name in ALLOWED:
                continue
            used = any(name in und for other, (_d, und) in table.items()
                       if other != obj)
            if not used:
                errors.append("%s: %s() is global, but no other object of "
                              "the build uses it (test-only: #ifdef "
                              "INFERGW_UNIT_TEST or GW_TESTABLE; else "
                              "static, or delete it)" % (obj, name))
    for name in sorted(ALLOWED):
        if not any(name in d for d, _u in table.values()):
            errors.append("check_exports: ALLOWED names %s(), which no "
                          "object defines: drop it" % name)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print("check_exports: %d problem(s)" % len(errors), file=sys.stderr)
        return 1
    print("check_exports: %d global functions in %d objects of %s, each "
          "used by another object" % (sum(len(table[o][0]) for o in checked),
                                      len(checked), build))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
