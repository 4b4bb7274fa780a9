#!/usr/bin/env python3
"""check_includes - the module graph of gateway/ must have no cycle.

    python3 test/check_includes.py [ROOT]

A module is a .c/.h pair named alike (handler.h alone is one too).  Module
A depends on module B when a.c or a.h includes "b.h".  DESIGN.md
"Modules, one way" wants

    server -> conn -> route -> proxy -> {coalesce, flight, fanout,
                                         dispatch, reply, tenant, usage}
    dispatch -> {pool, upstream};   {server, conn} -> live -> {health, tls,
                                     pool, upstream}

with everything on common/; so this fails, naming the cycle, when any
chain of includes leads from a module back to itself.  It also fails when
a common/ file includes a gateway/ header (common/ is the bottom layer).
Prints the graph, bottom first, when all is well.
"""

import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(dirpath):
    """{module: set of included header names} for the .c and .h files."""
    out = {}
    for name in sorted(os.listdir(dirpath)):
        base, ext = os.path.splitext(name)
        if ext not in (".c", ".h"):
            continue
        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
            text = f.read()
        out.setdefault(base, set()).update(INCLUDE.findall(text))
    return out


def find_cycle(graph):
    """A list of modules forming a cycle (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph}
    stack = []

    def visit(m):
        colour[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            if colour[n] == GREY:
                return stack[stack.index(n):] + [n]
            if colour[n] == WHITE:
                cyc = visit(n)
                if cyc:
                    return cyc
        stack.pop()
        colour[m] = BLACK
        return None

    for m in sorted(graph):
        if colour[m] == WHITE:
            cyc = visit(m)
            if cyc:
                return cyc
    return None


def layers(graph):
    """Modules in dependency order: each after everything it uses."""
    done, order = set(), []
    while len(done) < len(graph):
        ready = sorted(m for m in graph if m not in done
                       and graph[m] <= done)
        order.append(ready)
        done.update(ready)
    return order


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    gw = os.path.join(root, "gateway")
    common = os.path.join(root, "common")
    gw_mods = modules(gw)
    errors = []

    headers = {m + ".h" for m in gw_mods
               if os.path.exists(os.path.join(gw, m + ".h"))}
    for m, incs in sorted(modules(common).items()):
        bad = sorted(incs & headers - {m + ".h"})
        if bad:
            errors.append("common/%s includes gateway header(s) %s"
                          % (m, ", ".join(bad)))

    graph = {}
    for m, incs in gw_mods.items():
        graph[m] = {h[:-2] for h in incs
                    if h in headers and h[:-2] != m}
    cyc = find_cycle(graph)
    if cyc:
        errors.append("include cycle between gateway modules: "
                      + " -> ".join(cyc))
    if errors:
        for e in errors:
            print("check_includes: " + e, file=sys.stderr)
        return 1
    print("check_includes: gateway modules form no cycle; bottom first:")
    for i, layer in enumerate(layers(graph)):
        print("  %d: %s" % (i, " ".join(layer)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
