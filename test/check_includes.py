#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_includes - the layers and the module graph are the ones written
down here.

    python3 test/check_includes.py [--docs] [ROOT]

gateway/ is a folder per layer (LAYERS, top first) and main.c above
them.  A module is a .c/.h pair named alike in one folder (handler.h
alone is one too); module A uses module B when a.c or a.h includes
"layer/b.h".  GRAPH is the intended graph, module by module: what each
one may include.  This fails

  - on a module in another folder than LAYERS puts it, or in none (a new
    file, or a move, is a deliberate edit of LAYERS);
  - on an include of a gateway header without its folder ("pool.h"), or
    with another folder than the header's;
  - on an include that goes up a layer (a folder includes only itself
    and the folders below it);
  - on an include that GRAPH does not list (a new dependency is a
    deliberate edit of GRAPH, made in the same change, and reviewed), and
    on an edge GRAPH lists that no include uses any more;
  - on a callback slot (a function pointer, or a function type, in a
    gateway header) that CALLBACKS does not list with its reason: a
    callback is how a lower layer calls up into a higher one, which the
    includes do not show, so each one is a deliberate, written-down
    edge; and on a CALLBACKS entry no header has any more;
  - on a cycle in GRAPH, and on a common/ file including a gateway/
    header (common/ is the bottom layer, libinfergw.a);
  - when docs/ARCHITECTURE.md's module graph is not the one GRAPH
    renders to.

With --docs (or its old name, --readme) it rewrites that block of
docs/ARCHITECTURE.md from GRAPH instead.
Every gateway/ module may use every common/ module; that edge is not
listed.  A private header (PRIVATE below) is part of the module that owns
it, and only the owner's files and the modules PRIVATE names besides may
include it.  A module that grew several jobs is several .c files behind
its private header (PARTS below): each part is a file of its module (in
its folder, with its edges), has no header of its own, and is listed, so
a new part is as deliberate an edit as a new module.
"""

import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# The layers of gateway/, top first, and their modules.  A folder may
# include its own modules and those of the folders after it.
LAYERS = [
    ("client", "accept, connection, route, status view; the configuration "
               "in force (generation)",
     "server conn route status generation"),
    ("coalesce", "the proxy's three paths and what a flight shares",
     "proxy coalesce flight fanout usage"),
    ("fleet", "which upstream: dispatch, the pool, the beats and feeds",
     "dispatch pool engine lora health scrape beat probe"),
    ("upstream", "one libcurl call, its request, sessions, keep-alive",
     "upstream upstream_request upstream_session upstream_testcall "
     "keepalive"),
    ("wire", "what a client receives: the reply, TLS",
     "reply tls"),
    ("base", "what every layer shares: config, outcomes, metrics, "
             "tenants, the request context",
     "config outcome metrics tenant handler cluster"),
]
TOP = "main"                    # gateway/main.c, above every layer

# What each gateway/ module includes of the others.  DESIGN.md "Modules,
# one way": server -> conn -> route -> proxy, proxy -> {coalesce, flight,
# fanout, dispatch, reply, tenant, usage}, dispatch -> {pool, upstream};
# generation (the configuration in force and its reload) below server and
# conn; outcome (a call's outcome) at the bottom, for upstream, pool,
# flight and reply.
GATEWAY = {
    "main": "coalesce config generation metrics server tenant",
    "server": "coalesce config conn generation handler metrics reply",
    "conn": "config generation handler reply route status tenant tls",
    "route": "cluster coalesce config handler metrics pool proxy reply status "
             "tenant",
    "status": "cluster coalesce config generation handler metrics pool"
              " tenant",
    "proxy": "coalesce config dispatch fanout flight handler metrics pool"
             " reply tenant upstream usage",
    "generation": "cluster config health metrics pool scrape tenant tls"
                  " upstream",
    "health": "beat config pool probe upstream",
    "scrape": "beat config engine lora pool probe",
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
    "pool": "config engine lora metrics outcome tenant",
    "engine": "config",
    # An upstream's LoRA adapters (issue 29): read from the scrape like
    # the engine's load, kept in the pool's member; they count calls by
    # the engine's own call numbers (engine_mark).
    "lora": "engine",
    "tenant": "cluster config",
    "flight": "outcome",
    "reply": "outcome",
    "cluster": "config",
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
    "config_schema": ("config", set()),
    "tls_server": ("tls", set()),
    "pool_impl": ("pool", set()),
    "tenant_impl": ("tenant", set()),
    "cluster_impl": ("cluster", set()),
}

# The parts of a module split by job (STYLE.md section 1): .c files that
# share the module's private header and are counted as the module's own.
PARTS = {
    "pool": "pool_pick pool_breaker pool_queue pool_share pool_models "
            "pool_report pool_budget pool_lora",
    "tenant": "tenant_tokens tenant_shared tenant_usage tenant_lease",
    "cluster": "cluster_beat",
    "redis": "redis_url",
}
PART_OF = {p: m for m, ps in PARTS.items() for p in ps.split()}

# Every callback slot in a gateway header ("module.name": who fills it,
# and why the call goes that way).  A slot filled from a higher layer is
# an upward edge the includes cannot show.
CALLBACKS = {
    "beat.beat_fn": "health and scrape (same layer) give the beat thread "
                    "their per-upstream work: one thread, two feeds",
    "coalesce.coalescer_each.fn": "coalesce itself wakes every flight at "
                                  "the stop (coalescer_wake_all); "
                                  "test builds walk the map too",
    "dispatch.on_upstream": "proxy (coalesce, up) learns which upstream "
                            "answers, for its access line and status view",
    "fanout.after_append": "the leader's writer policy (fanout itself), "
                           "chosen once from [coalesce] leader_writes",
    "pool.gone": "dispatch (fleet) asks, for a queued call, whether its "
                 "client left; the answer comes from proxy's socket "
                 "(up), so a queue slot is never taken for nobody",
    "upstream.hedge": "dispatch (fleet, up) takes a second upstream "
                      "mid-transfer: only it knows the pool",
    "upstream.attempt_done": "dispatch (fleet, up) settles the pool's "
                             "verdict for each attempt of a hedge",
    "upstream.on_winner": "dispatch (fleet, up) learns which attempt of a "
                          "hedge got the first body byte",
    "upstream.on_resend": "dispatch (fleet, up) counts a resend as an "
                          "attempt, or refuses it (1 + retries)",
    "upstream.on_head": "the sink (coalesce, up): the response head goes "
                        "to the flight or the client as it arrives",
    "upstream.on_data": "the sink (coalesce, up): each body chunk, as it "
                        "arrives, appended to the flight",
    "upstream.on_tick": "the sink (coalesce, up): the leader's own "
                        "writes between reads, never blocking",
    "upstream.on_peer": "the sink (coalesce, up): the leader's client "
                        "socket, watched in the same wait",
    "cluster.after_beat": "generation (client, up) hands the beat the "
                          "tenants' usage flush (tenant, which includes "
                          "cluster): the counts go to Redis from the "
                          "beat, in batches, never from a request",
    "keepalive.keepalive_drop_fn": "upstream_session (same layer) frees a "
                                   "session the cache lets go",
    "usage.usage_piece_fn": "proxy (same layer): the leader appends each "
                            "piece of a stream cut for its usage event "
                            "to the flight, as the split gives it",
}

# The same for common/ (libinfergw.a).
COMMON = {
    "http_read": "buf http http_chunked net util",
    "http_chunked": "buf http util",
    "http_response": "http util",
    "http": "util",
    "net": "log util",
    "cfg": "alloc buf util",
    "jsonx": "buf util",
    "multipart": "http util",
    "prom": "buf util",
    "window": "",
    "prom_read": "util",
    "redis": "alloc util",
    "buf": "alloc util",
    "log": "util",
    "alloc": "",
    "util": "",
}

# The doc that shows the graph, and the markers around its block.
GRAPH_DOC = os.path.join("docs", "ARCHITECTURE.md")
GRAPH_BEGIN = "<!-- module graph: test/check_includes.py --docs -->"
GRAPH_END = "<!-- end of module graph -->"

FN_POINTER = re.compile(r"\(\s*\*\s*(\w+)\s*\)\s*\(")
FN_TYPE = re.compile(r"\btypedef\s+[\w\s\*]*?\b(\w+)\s*\((?!\s*\*)")
PROTO = re.compile(r"\b(\w+)\s*\(([^;{}]*\(\s*\*\s*\w+\s*\)\s*\([^;{}]*)\)"
                   r"\s*;")


def parse_graph(table):
    return {m: set(v.split()) for m, v in table.items()}


def layer_of():
    """{module: its folder}, and the folder order (top first)."""
    where = {TOP: ""}
    for folder, _, mods in LAYERS:
        for m in mods.split():
            where[m] = folder
    return where, [""] + [f for f, _, _ in LAYERS]


def files(dirpath, sub=True):
    """(folder, file name, path) of each .c and .h file of gateway/:
    main.c's folder is "" ; 'sub' takes the layers' folders too."""
    for name in sorted(os.listdir(dirpath)):
        path = os.path.join(dirpath, name)
        if os.path.isdir(path) and sub:
            for inner in sorted(os.listdir(path)):
                if inner.endswith((".c", ".h")):
                    yield name, inner, os.path.join(path, inner)
        elif name.endswith((".c", ".h")):
            yield "", name, path


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def owner(base):
    if base in PART_OF:
        return PART_OF[base]
    return PRIVATE.get(base, (base,))[0]


def scan(dirpath, sub=True):
    """{module: set of included paths}, {module: its folder}, and
    [(file, include)] for every include of the .c and .h files, a
    private header counted as its owner's."""
    incs, folders, each = {}, {}, []
    for folder, name, path in files(dirpath, sub):
        base = name[:-2]
        found = INCLUDE.findall(read(path))
        incs.setdefault(owner(base), set()).update(found)
        folders.setdefault(owner(base), set()).add(folder)
        each += [(os.path.join(folder, name), i) for i in found]
    return incs, folders, each


def gateway_headers(dirpath):
    """{header base name: its folder} of gateway/."""
    return {name[:-2]: folder for folder, name, _ in files(dirpath)
            if name.endswith(".h")}


def check_layers(gw_dir, errors):
    """Folders, include paths and the direction of every include."""
    where, order = layer_of()
    rank = {f: i for i, f in enumerate(order)}
    incs, folders, each = scan(gw_dir)
    headers = gateway_headers(gw_dir)
    for m in sorted(folders):
        if m not in where:
            errors.append("gateway module %s (in %s/) is in no layer: add "
                          "it to LAYERS in test/check_includes.py"
                          % (m, "/".join(sorted(folders[m])) or "."))
        elif folders[m] != {where[m]}:
            errors.append("gateway module %s is in %s/, LAYERS puts it in "
                          "%s/" % (m, "/".join(sorted(folders[m])),
                                   where[m]))
    for m in sorted(set(where) - set(folders)):
        errors.append("LAYERS lists %s, which has no file" % m)
    for f in sorted(set(os.listdir(gw_dir)) - set(order)):
        if os.path.isdir(os.path.join(gw_dir, f)):
            errors.append("gateway/%s/ is a folder LAYERS does not list" % f)
    for src, inc in each:
        folder, _, name = inc.rpartition("/")
        base = name[:-2] if name.endswith(".h") else None
        if base not in headers:
            if folder and folder in rank:
                errors.append("%s includes %s: no such gateway header"
                              % (src, inc))
            continue
        if folder != headers[base]:
            errors.append("%s includes \"%s\": write \"%s/%s\" (gateway "
                          "headers are named by their layer)"
                          % (src, inc, headers[base], name))
            continue
        me = os.path.dirname(src)
        if rank[folder] < rank[me]:
            errors.append("%s includes %s: up a layer (%s/ is above %s/)"
                          % (src, inc, folder, me or "gateway"))


def private_errors(gw_dir, errors):
    """A private header included outside its module and PRIVATE's list."""
    for folder, name, path in files(gw_dir):
        base = name[:-2]
        for inc in INCLUDE.findall(read(path)):
            h = inc.rpartition("/")[2][:-2]
            p = PRIVATE.get(h)
            if p is None or owner(base) == p[0] or base in p[1]:
                continue
            errors.append("%s/%s includes %s, private to %s (PRIVATE)"
                          % (folder, name, inc, p[0]))


def part_errors(gw_dir, common_dir, errors):
    """A part with a header of its own, or a PARTS entry with no file."""
    have = {}
    for folder, name, _ in list(files(gw_dir)) + list(files(common_dir,
                                                             False)):
        have.setdefault(name[:-2], set()).add(name[-1])
    for part, mod in sorted(PART_OF.items()):
        if "h" in have.get(part, ()):
            errors.append("%s.h: a part of %s has no header of its own (a "
                          "header makes it a module: LAYERS and GRAPH)"
                          % (part, mod))
        if "c" not in have.get(part, ()):
            errors.append("PARTS lists %s (of %s), which has no file"
                          % (part, mod))


def callbacks(gw_dir):
    """{"module.slot"} of every function pointer or function type in a
    gateway header; a pointer parameter of a prototype is named
    "module.function.param"."""
    out = set()
    for _, name, path in files(gw_dir):
        if not name.endswith(".h"):
            continue
        m = owner(name[:-2])
        text = strip_comments(read(path))
        params = set()
        for fn, args in PROTO.findall(text):
            for p in FN_POINTER.findall(args):
                out.add("%s.%s.%s" % (m, fn, p))
                params.add(p)
        out.update("%s.%s" % (m, s) for s in FN_POINTER.findall(text)
                   if s not in params)
        out.update("%s.%s" % (m, s) for s in FN_TYPE.findall(text))
    return out


def check_callbacks(gw_dir, errors):
    have = callbacks(gw_dir)
    for c in sorted(have - set(CALLBACKS)):
        errors.append("callback slot %s is not in CALLBACKS: say there who "
                      "fills it and why the call goes that way" % c)
    for c in sorted(set(CALLBACKS) - have):
        errors.append("CALLBACKS lists %s, which no header has any more"
                      % c)


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


def actual_graph(incs, known):
    """{module: modules of 'known' it includes}, from the includes."""
    graph = {}
    for m, found in incs.items():
        names = {i.rpartition("/")[2] for i in found}
        graph[m] = {owner(h[:-2]) for h in names
                    if h.endswith(".h") and owner(h[:-2]) in known
                    and owner(h[:-2]) != m}
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
    """The doc's text of the graph: a layer a block, top first; in a
    layer, a module a line, the ones that use the others first."""
    order = [m for layer in reversed(layers(gateway)) for m in layer]
    lines = ["gateway/  (a folder is a layer and includes only downward;",
             "          each line: a module -> the modules it uses)",
             "  main.c",
             "    %-18s -> %s" % (TOP, " ".join(sorted(gateway[TOP])))]
    for folder, what, mods in LAYERS:
        lines.append("  %s/  %s" % (folder, what))
        mine = set(mods.split())
        for m in [m for m in order if m in mine]:
            uses = " ".join(sorted(gateway[m])) or "-"
            lines.append("    %-18s -> %s" % (m, uses))
    lines.append("")
    lines.append("common/  (libinfergw.a; every gateway module may use it)")
    for layer in reversed(layers(common)):
        for m in layer:
            uses = " ".join(sorted(common[m])) or "-"
            lines.append("    %-18s -> %s" % (m, uses))
    return "\n".join(lines)


def graph_block(text):
    """(start, end) of the text between the markers, or None."""
    b = text.find(GRAPH_BEGIN)
    e = text.find(GRAPH_END)
    if b < 0 or e < b:
        return None
    return b + len(GRAPH_BEGIN), e


def graph_want(gateway, common):
    return "\n```\n" + render(gateway, common) + "\n```\n"


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    write = "--docs" in argv[1:] or "--readme" in argv[1:]
    root = args[0] if args else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    gw_dir = os.path.join(root, "gateway")
    common_dir = os.path.join(root, "common")
    gateway, common = parse_graph(GATEWAY), parse_graph(COMMON)
    errors = []

    check_layers(gw_dir, errors)
    gw_incs, _, _ = scan(gw_dir)
    common_incs, _, _ = scan(common_dir, sub=False)
    gw_actual = actual_graph(gw_incs, set(gw_incs))
    common_actual = actual_graph(common_incs, set(common_incs))
    headers = set(gateway_headers(gw_dir))
    for m, incs in sorted(common_incs.items()):
        bad = sorted(i for i in incs
                     if i.rpartition("/")[2][:-2] in headers
                     and i.rpartition("/")[2][:-2] != m)
        if bad:
            errors.append("common/%s includes gateway header(s) %s"
                          % (m, ", ".join(bad)))
    private_errors(gw_dir, errors)
    part_errors(gw_dir, common_dir, errors)
    check_callbacks(gw_dir, errors)
    compare("gateway", gateway, gw_actual, errors)
    compare("common", common, common_actual, errors)

    doc_path = os.path.join(root, GRAPH_DOC)
    doc = read(doc_path)
    span = graph_block(doc)
    if not errors:
        want = graph_want(gateway, common)
        if span is None:
            errors.append("%s has no module graph block (%s ... %s)"
                          % (GRAPH_DOC, GRAPH_BEGIN, GRAPH_END))
        elif write:
            doc = doc[:span[0]] + want + doc[span[1]:]
            with open(doc_path, "w", encoding="utf-8") as f:
                f.write(doc)
        elif doc[span[0]:span[1]] != want:
            errors.append("%s's module graph is not GRAPH's: run "
                          "python3 test/check_includes.py --docs" % GRAPH_DOC)
    if errors:
        for e in errors:
            print("check_includes: " + e, file=sys.stderr)
        return 1
    print("check_includes: %d layers, includes only downward; the includes "
          "are GRAPH's (%d gateway modules, %d edges), acyclic; %d "
          "callbacks, each with its reason; %s agrees"
          % (len(LAYERS), len(gateway), sum(len(v) for v in gateway.values()),
             len(CALLBACKS), GRAPH_DOC))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
