#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_includes - the module graph is the one written down here.

    python3 test/check_includes.py [--readme] [ROOT]

A module is a .c/.h pair named alike (handler.h alone is one too).  Module
A uses module B when a.c or a.h includes "b.h".  GRAPH below is the
intended graph, module by module: what each one may include.  This fails

  - on an include that GRAPH does not list (a new dependency is a
    deliberate edit of GRAPH, made in the same change, and reviewed);
  - on an edge GRAPH lists that no include uses any more (so GRAPH, and
    the README drawn from it, stay the graph the code has);
  - on a module GRAPH does not know (a new file is added here too);
  - on a cycle in GRAPH, and on a common/ file including a gateway/
    header (common/ is the bottom layer, libinfergw.a);
  - when README.md's module graph is not the one GRAPH renders to.

With --readme it rewrites that block of README.md from GRAPH instead.
Every gateway/ module may use every common/ module; that edge is not
listed.  A private header (PRIVATE below) is part of the module that owns
it, and only the modules PRIVATE names besides may include it.
"""

import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# What each gateway/ module includes of the others, top of the graph
# first.  DESIGN.md "Modules, one way": server -> conn -> route -> proxy,
# proxy -> {coalesce, flight, fanout, dispatch, reply, tenant, usage},
# dispatch -> {pool, upstream}; generation (the configuration in force
# and its reload) below server and conn; outcome (a call's outcome) at
# the bottom, for upstream, pool, flight and reply.
GATEWAY = {
    "main": "coalesce config generation metrics server tenant",
    "server": "coalesce config conn generation handler metrics reply",
    "conn": "config generation handler reply route status tenant tls",
    "route": "config handler metrics pool proxy reply status tenant",
    "status": "coalesce config generation handler metrics pool tenant",
    "proxy": "coalesce config dispatch fanout flight handler metrics pool"
             " reply tenant upstream usage",
    "generation": "config health metrics pool scrape tls upstream",
    "health": "beat config pool probe upstream",
    "scrape": "beat config engine pool probe",
    "probe": "upstream",
    "beat": "config",
    "coalesce": "config flight metrics upstream",
    "dispatch": "config metrics pool upstream",
    "upstream": "config outcome upstream_request upstream_session",
    "upstream_testcall": "upstream",
    "upstream_request": "config outcome upstream_session",
    "upstream_session": "keepalive",
    "fanout": "flight metrics reply",
    "handler": "metrics",
    "keepalive": "metrics",
    "tls": "metrics",
    "metrics": "config",
    "pool": "config engine metrics outcome",
    "engine": "config",
    "tenant": "config",
    "flight": "outcome",
    "reply": "outcome",
    "config": "",
    "outcome": "",
    "usage": "",
}

# Private headers: the struct definitions a module's own files share
# (like curl's urldata.h), counted as that module's, with the only other
# modules allowed to include them.
PRIVATE = {
    "upstream_call": ("upstream", {"upstream_testcall"}),
    "status_page": ("status", set()),
}

# The same for common/ (libinfergw.a).
COMMON = {
    "http": "buf net util",
    "net": "log util",
    "cfg": "alloc buf util",
    "jsonx": "buf util",
    "multipart": "http util",
    "prom": "buf util",
    "prom_read": "util",
    "buf": "alloc util",
    "log": "util",
    "alloc": "",
    "util": "",
}

README_BEGIN = "<!-- module graph: test/check_includes.py --readme -->"
README_END = "<!-- end of module graph -->"


def parse_graph(table):
    return {m: set(v.split()) for m, v in table.items()}


def sources(dirpath):
    """(file name, base name, its includes) for each .c and .h file."""
    for name in sorted(os.listdir(dirpath)):
        base, ext = os.path.splitext(name)
        if ext not in (".c", ".h"):
            continue
        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
            yield name, base, INCLUDE.findall(f.read())


def modules(dirpath):
    """{module: set of included header names} for the .c and .h files,
    a private header counted as its owner's."""
    out = {}
    for _, base, incs in sources(dirpath):
        owned = {PRIVATE[h[:-2]][0] + ".h" if h[:-2] in PRIVATE else h
                 for h in incs}
        out.setdefault(PRIVATE.get(base, (base,))[0], set()).update(owned)
    return out


def private_errors(dirpath, errors):
    """A private header included outside its module and PRIVATE's list."""
    for name, base, incs in sources(dirpath):
        for h in incs:
            p = PRIVATE.get(h[:-2])
            if p is None or base in (p[0], h[:-2]) or base in p[1]:
                continue
            errors.append("%s includes %s, private to %s (PRIVATE)"
                          % (name, h, p[0]))


def find_cycle(graph):
    """A list of modules forming a cycle (first == last), or None."""
    white, grey, black = 0, 1, 2
    colour = {m: white for m in graph}
    stack = []

    def visit(m):
        colour[m] = grey
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if colour.get(n) == grey:
                return stack[stack.index(n):] + [n]
            if colour.get(n) == white:
                cyc = visit(n)
                if cyc:
                    return cyc
        stack.pop()
        colour[m] = black
        return None

    for m in sorted(graph):
        if colour[m] == white:
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


def actual_graph(dirpath, known):
    """{module: modules of 'known' it includes}, from the files."""
    graph = {}
    for m, incs in modules(dirpath).items():
        graph[m] = {h[:-2] for h in incs
                    if h.endswith(".h") and h[:-2] in known and h[:-2] != m}
    return graph


def compare(where, intended, actual, errors):
    for m in sorted(set(actual) - set(intended)):
        errors.append("%s/%s is a module GRAPH does not list: add it to "
                      "test/check_includes.py with what it includes (%s)"
                      % (where, m, " ".join(sorted(actual[m])) or "nothing"))
    for m in sorted(set(intended) - set(actual)):
        errors.append("%s/%s is listed in GRAPH but has no file" % (where, m))
    for m in sorted(set(intended) & set(actual)):
        for n in sorted(actual[m] - intended[m]):
            errors.append("%s/%s includes %s.h, an edge GRAPH does not "
                          "allow (%s -> %s)" % (where, m, n, m, n))
        for n in sorted(intended[m] - actual[m]):
            errors.append("GRAPH allows %s -> %s, which no include uses "
                          "any more: remove it" % (m, n))
    cyc = find_cycle(intended)
    if cyc:
        errors.append("GRAPH has a cycle: " + " -> ".join(cyc))


def render(gateway, common):
    """The README's text of the graph: top first, one line a module."""
    lines = ["gateway/ (each line: a module -> what it uses; top first)"]
    for layer in reversed(layers(gateway)):
        for m in layer:
            uses = " ".join(sorted(gateway[m])) or "-"
            lines.append("  %-16s -> %s" % (m, uses))
    lines.append("")
    lines.append("common/ (libinfergw.a; every gateway module may use it)")
    for layer in reversed(layers(common)):
        for m in layer:
            uses = " ".join(sorted(common[m])) or "-"
            lines.append("  %-16s -> %s" % (m, uses))
    return "\n".join(lines)


def readme_block(text):
    """(start, end) of the text between the markers, or None."""
    b = text.find(README_BEGIN)
    e = text.find(README_END)
    if b < 0 or e < b:
        return None
    return b + len(README_BEGIN), e


def readme_want(gateway, common):
    return "\n```\n" + render(gateway, common) + "\n```\n"


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    write = "--readme" in argv[1:]
    root = args[0] if args else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    gw_dir = os.path.join(root, "gateway")
    common_dir = os.path.join(root, "common")
    gateway, common = parse_graph(GATEWAY), parse_graph(COMMON)
    errors = []

    gw_actual = actual_graph(gw_dir, set(modules(gw_dir)))
    common_actual = actual_graph(common_dir, set(modules(common_dir)))
    gw_headers = {m + ".h" for m in gw_actual
                  if os.path.exists(os.path.join(gw_dir, m + ".h"))}
    for m, incs in sorted(modules(common_dir).items()):
        bad = sorted(incs & gw_headers - {m + ".h"})
        if bad:
            errors.append("common/%s includes gateway header(s) %s"
                          % (m, ", ".join(bad)))
    private_errors(gw_dir, errors)
    compare("gateway", gateway, gw_actual, errors)
    compare("common", common, common_actual, errors)

    readme_path = os.path.join(root, "README.md")
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    span = readme_block(readme)
    if not errors:
        want = readme_want(gateway, common)
        if span is None:
            errors.append("README.md has no module graph block (%s ... %s)"
                          % (README_BEGIN, README_END))
        elif write:
            readme = readme[:span[0]] + want + readme[span[1]:]
            with open(readme_path, "w", encoding="utf-8") as f:
                f.write(readme)
        elif readme[span[0]:span[1]] != want:
            errors.append("README.md's module graph is not GRAPH's: run "
                          "python3 test/check_includes.py --readme")
    if errors:
        for e in errors:
            print("check_includes: " + e, file=sys.stderr)
        return 1
    print("check_includes: the includes are GRAPH's (%d gateway modules, "
          "%d edges), acyclic; README agrees"
          % (len(gateway), sum(len(v) for v in gateway.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
