#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_docs - the README stays a front door, and the docs it opens say
what the code does: a move, a rename or a split that forgets the docs
fails here, not in a reader's hands.

    python3 test/check_docs.py [ROOT]

Fails unless
  - README.md has at most README_MAX_LINES lines;
  - every relative link in README.md and docs/*.md names a file that
    exists, and every #anchor one names a heading of its file (GitHub's
    slugs);
  - every docs/*.md is linked from README.md's map (its MAP section);
  - docs/ROUTES.md's table lists every route of the route table
    (gateway/client/route.c), as "METHOD /path";
  - docs/CONFIGURATION.md's table has a row for every setting of the
    configuration's schema (the { "section", "key", T_... } lines in
    gateway/), and no row for a setting the schema does not have;
  - every gateway/ .c file has its row in docs/ARCHITECTURE.md's table
    of files;
  - every file the docs name exists (a path in backquotes that starts
    with gateway/, common/, tools/, test/, etc/ or man/, or, in
    docs/ARCHITECTURE.md, with a layer's folder), and every function
    they name as `name()` is defined in gateway/, common/, tools/ or
    test/ (the return type on its own line, so "^name(" finds it),
    but for the system's and the libraries' (EXTERNAL);
  - every infergw_* metric the docs name is a string in the sources.
Run by 'make unit'.  docs/BENCHMARKS.md is a record of past runs (old
commits, old names) and is held to its links only.
"""

import os
import re
import sys

README_MAX_LINES = 300
MAP = "Where to read on"
ROUTES_DOC = "docs/ROUTES.md"
CONFIG_DOC = "docs/CONFIGURATION.md"
ARCH_DOC = "docs/ARCHITECTURE.md"
RECORDS = {"docs/BENCHMARKS.md"}         # links only
PATH_TOPS = ("gateway/", "common/", "tools/", "test/", "etc/", "man/")
# The functions docs may name that are not ours: libc and the system's,
# and the libraries' (by prefix).
EXTERNAL = {"poll", "writev", "read", "write", "accept", "sendmsg",
            "recvfrom", "malloc", "free", "close", "socket", "exit",
            "getpeername", "epoll_wait", "sendfile", "abort",
            "rate"}                     # PromQL's
EXTERNAL_PREFIXES = ("curl_", "pthread_", "mbedtls_", "json_", "SSL_")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_fences(text):
    """The text with its fenced code blocks blanked (lines kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for line in strip_fences(text).split("\n"):
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def links(text):
    """The relative link targets of a markdown text, images included."""
    out = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", strip_fences(text)):
        target = m.group(1)
        if not re.match(r"[a-z]+:", target):
            out.append(target)
    return out


def section(text, title):
    """The text of the '## title' section, or None."""
    m = re.search(r"^## %s\n(.*?)(?=^## |\Z)" % re.escape(title),
                  strip_fences(text), re.M | re.S)
    return m.group(1) if m else None


def check_links(root, rel, text, errors):
    here = os.path.dirname(rel)
    for target in links(text):
        path, _, frag = target.partition("#")
        dest = os.path.normpath(os.path.join(here, path)) if path else rel
        if not os.path.exists(os.path.join(root, dest)):
            errors.append("%s: link to %s, which does not exist"
                          % (rel, target))
        elif frag and dest.endswith(".md") and frag not in anchors(
                read(os.path.join(root, dest))):
            errors.append("%s: link to %s, which has no heading #%s"
                          % (rel, target, frag))


def sources(root, tops=("gateway", "common", "tools")):
    for top in tops:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield os.path.join(d, f)


def check_map(root, readme, docs, errors):
    part = section(readme, MAP)
    if part is None:
        errors.append("README.md has no '## %s' section (the map of the "
                      "docs)" % MAP)
        return
    linked = {os.path.normpath(t.partition("#")[0]) for t in links(part)}
    for doc in docs:
        if doc not in linked:
            errors.append("README.md's map does not link %s" % doc)


def check_routes(root, errors):
    table = read(os.path.join(root, "gateway", "client", "route.c"))
    routes = re.findall(r'^\s*\{ "(/[^"]*)", "([A-Z]+)"', table, re.M)
    if len(routes) < 7:
        errors.append("route.c: found %d routes, expected the table"
                      % len(routes))
    doc = section(read(os.path.join(root, ROUTES_DOC)), "Routes") or ""
    rows = [l for l in doc.split("\n") if l.startswith("| `")]
    listed = set()
    for row in rows:
        listed |= set(re.findall(r"`([A-Z]+) (/[^`]*)`",
                                 row.split("|")[1]))
    for path, method in routes:
        if (method, path) not in listed:
            errors.append("%s: the route table does not list %s %s"
                          % (ROUTES_DOC, method, path))


def check_settings(root, errors):
    schema = set()
    for path in sources(root, ("gateway",)):
        schema |= set(re.findall(r'^\s*\{ "(\w+)", "(\w+)", T_',
                                 read(path), re.M))
    if len(schema) < 40:
        errors.append("found %d settings in gateway/, expected the "
                      "schema" % len(schema))
    rows = set()
    for line in read(os.path.join(root, CONFIG_DOC)).split("\n"):
        cells = line.split("|")
        if len(cells) < 4 or not cells[2].strip().startswith("`"):
            continue
        for sec in re.findall(r"\b[a-z]+\b", cells[1]):
            for key in re.findall(r"`(\w+)`", cells[2]):
                rows.add((sec, key))
    for sec, key in sorted(schema - rows):
        errors.append("%s: no row for [%s] %s" % (CONFIG_DOC, sec, key))
    for sec, key in sorted(rows - schema):
        errors.append("%s: a row for [%s] %s, which is no setting"
                      % (CONFIG_DOC, sec, key))


def check_files_table(root, errors):
    text = read(os.path.join(root, ARCH_DOC))
    rows = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))
    for path in sources(root, ("gateway",)):
        rel = os.path.relpath(path, root)
        if rel.endswith(".c") and rel not in rows:
            errors.append("%s: no row for %s in the table of files"
                          % (ARCH_DOC, rel))


def check_names(root, rel, text, defined, errors):
    text = strip_fences(text)
    layers = sorted(d for d in os.listdir(os.path.join(root, "gateway"))
                    if os.path.isdir(os.path.join(root, "gateway", d)))
    for tok in re.findall(r"`([^`\s]+)`", text):
        if "*" in tok or "<" in tok or "NNN" in tok:
            continue                    # a pattern, not a file
        path = None
        if tok.startswith(PATH_TOPS):
            path = tok
        elif rel == ARCH_DOC and tok.split("/")[0] in layers \
                and re.fullmatch(r"\w+/\w+\.[ch]", tok):
            path = "gateway/" + tok
        if path and not any(os.path.exists(os.path.join(root, p))
                            for p in (path.rstrip("/"), path + ".c")):
            errors.append("%s: names %s, which does not exist" % (rel, tok))
    for name in sorted(set(re.findall(r"`(\w+)\(\)`", text))):
        if name in EXTERNAL or name.startswith(EXTERNAL_PREFIXES):
            continue
        if name not in defined:
            errors.append("%s: names %s(), which nothing defines"
                          % (rel, name))


def check_metrics(rel, text, strings, errors):
    for name in sorted(set(re.findall(r"\binfergw_[a-z_]*[a-z](?![\w*])",
                                      text))):
        if name not in strings:
            errors.append("%s: names the metric %s, which no source has"
                          % (rel, name))


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    errors = []
    readme = read(os.path.join(root, "README.md"))
    n = len(readme.split("\n")) - (1 if readme.endswith("\n") else 0)
    if n > README_MAX_LINES:
        errors.append("README.md has %d lines, more than %d: the reference "
                      "goes in docs/" % (n, README_MAX_LINES))
    docs = sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs"))
                  if f.endswith(".md"))
    check_map(root, readme, docs, errors)

    defined, strings = set(), set()
    for path in sources(root, ("gateway", "common", "tools", "test")):
        src = read(path)
        defined |= set(re.findall(r"^(\w+)\(", src, re.M))
        strings |= set(re.findall(r'"(infergw_[a-z_]+)', src))
    for rel in ["README.md"] + docs:
        text = read(os.path.join(root, rel))
        check_links(root, rel, text, errors)
        if rel not in RECORDS:
            check_names(root, rel, text, defined, errors)
            check_metrics(rel, text, strings, errors)
    check_routes(root, errors)
    check_settings(root, errors)
    check_files_table(root, errors)
    if errors:
        for e in errors:
            print("check_docs: " + e, file=sys.stderr)
        return 1
    print("check_docs: README.md %d lines (at most %d), maps all %d docs; "
          "links, routes, settings, files, functions and metrics agree"
          % (n, README_MAX_LINES, len(docs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
