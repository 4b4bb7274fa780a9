# SPDX-License-Identifier: MIT
"""014 - make install / make uninstall (issue 10): every file at its
path with its mode, an operator's gateway.conf never overwritten and kept
on uninstall once edited, man pages that lint clean and render, a systemd
unit that systemd-analyze accepts, and man pages that keep up with the
code (every option, endpoint and setting documented).

Each test installs into its own temp dir (DESTDIR) with the binary of
--bin; make is told not to rebuild it (-o), so a sanitizer build is never
recompiled without its flags.  A missing groff, man or systemd-analyze
skips its test; mandoc is installed by 'make deps' (and its absence fails
make check, run.py's skip rule).
"""

import os
import re
import shutil
import subprocess

from gwtest import REPO_ROOT, run_infergw, tool

MAN8 = os.path.join(REPO_ROOT, "man", "infergw.8")
MAN5 = os.path.join(REPO_ROOT, "man", "gateway.conf.5")
SAMPLE = os.path.join(REPO_ROOT, "etc", "gateway.conf")

# What 'make install PREFIX=/usr SYSCONFDIR=/etc' puts where, and modes.
DEBIAN = {"PREFIX": "/usr", "SYSCONFDIR": "/etc"}
FILES = {
    "usr/bin/infergw": 0o755,
    "etc/infergw/gateway.conf": 0o644,
    "usr/share/man/man8/infergw.8": 0o644,
    "usr/share/man/man5/gateway.conf.5": 0o644,
    "usr/lib/systemd/system/infergw.service": 0o644,
}
CONF = "etc/infergw/gateway.conf"
UNIT = "usr/lib/systemd/system/infergw.service"

# The system user infergw (issue 19: a TLS key 0640 root:infergw), and
# the rest of what systemd-analyze security lists that the gateway allows
# (029-deb.py traces a run against the SystemCallFilter= lines).
HARDENING = ["User=infergw", "Group=infergw", "NoNewPrivileges=yes",
             "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
             "PrivateDevices=yes", "PrivateMounts=yes", "PrivateUsers=yes",
             "ProtectProc=invisible", "ProcSubset=pid", "UMask=0077",
             "RestrictSUIDSGID=yes", "RemoveIPC=yes",
             "SystemCallFilter=~@privileged @resources",
             "SystemCallErrorNumber=EPERM", "ProtectKernelTunables=yes",
             "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
             "ProtectControlGroups=yes",
             "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
             "RestrictNamespaces=yes", "LockPersonality=yes",
             "MemoryDenyWriteExecute=yes",
             "SystemCallFilter=@system-service", "CapabilityBoundingSet=",
             "ExecReload=/bin/kill -HUP $MAINPID", "KillSignal=SIGTERM",
             "Restart=on-failure"]


def make(t, target, destdir, **vars):
    """make TARGET DESTDIR=destdir VAR=... with --bin's build; its output.
    The parent make's flags and any PREFIX-like environment variable are
    left out, so only what this test says counts."""
    binary = os.path.join(t.bin, "infergw")
    assert os.access(binary, os.X_OK), "no %s" % binary
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES",
                        "PREFIX", "BINDIR", "SYSCONFDIR", "MANDIR",
                        "SYSTEMDUNITDIR", "DESTDIR", "BUILD")}
    cmd = ["make", "--no-print-directory", "-C", REPO_ROOT, target,
           "DESTDIR=" + destdir, "BUILD=" + os.path.dirname(t.bin),
           "-o", binary]
    cmd += ["%s=%s" % kv for kv in sorted(vars.items())]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0, "%s: exit %d\n%s" % (" ".join(cmd),
                                                   p.returncode, out)
    return out


def tree(root):
    """Every file under root, relative, with its permission bits."""
    found = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            found[os.path.relpath(p, root)] = os.stat(p).st_mode & 0o7777
    return found


def read(path):
    with open(path, "rb") as f:
        return f.read()


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def test_install_places_every_file(t):
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    got = tree(dest)
    assert got == FILES, "installed %r, want %r" % (got, FILES)
    for d, _, _ in os.walk(dest):
        mode = os.stat(d).st_mode & 0o7777
        assert mode == 0o755, "%s: mode %o, want 755" % (d, mode)
    assert read(os.path.join(dest, "usr/bin/infergw")) == \
        read(os.path.join(t.bin, "infergw")), "another binary installed"
    assert read(os.path.join(dest, CONF)) == read(SAMPLE), \
        "the installed gateway.conf is not etc/gateway.conf"

    unit = read(os.path.join(dest, UNIT)).decode()
    assert not re.search(r"@[A-Z]+@", unit), "unsubstituted: " + unit
    execs = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    assert execs == ["/usr/bin/infergw -c /etc/infergw/gateway.conf"], \
        execs
    lines = set(unit.splitlines())
    for want in HARDENING:
        assert want in lines, "unit lacks %r" % want
    assert not [l for l in lines if l.startswith("AmbientCapabilities=")], \
        "the default port needs no capability"
    assert not [l for l in lines if l.startswith("DynamicUser=")], \
        "a dynamic user cannot be given a key by group"

    # The pages show this install's paths, not the build's defaults.
    for page in ("usr/share/man/man8/infergw.8",
                 "usr/share/man/man5/gateway.conf.5"):
        text = read(os.path.join(dest, page)).decode()
        assert "/etc/infergw/gateway.conf" in text, page
        assert "/usr/local" not in text, page

    # The installed binary accepts the installed configuration.
    rc, out = run_infergw(os.path.join(dest, "usr/bin"),
                          ["-t", "-c", os.path.join(dest, CONF)])
    assert rc == 0, "-t on the installed conf: exit %d %r" % (rc, out)


def test_install_paths_follow_prefix_and_overrides(t):
    dest = os.path.join(t.tmp, "plain")
    make(t, "install", dest)
    assert sorted(tree(dest)) == sorted([
        "usr/local/bin/infergw", "usr/local/etc/infergw/gateway.conf",
        "usr/local/share/man/man8/infergw.8",
        "usr/local/share/man/man5/gateway.conf.5",
        "usr/local/lib/systemd/system/infergw.service"]), tree(dest)
    unit = read(os.path.join(
        dest, "usr/local/lib/systemd/system/infergw.service")).decode()
    assert ("ExecStart=/usr/local/bin/infergw -c "
            "/usr/local/etc/infergw/gateway.conf\n") in unit, unit

    dest = os.path.join(t.tmp, "custom")
    make(t, "install", dest, PREFIX="/opt/gw", BINDIR="/opt/gw/sbin",
         SYSCONFDIR="/etc/opt", MANDIR="/opt/gw/man",
         SYSTEMDUNITDIR="/etc/systemd/system")
    assert sorted(tree(dest)) == sorted([
        "opt/gw/sbin/infergw", "etc/opt/infergw/gateway.conf",
        "opt/gw/man/man8/infergw.8", "opt/gw/man/man5/gateway.conf.5",
        "etc/systemd/system/infergw.service"]), tree(dest)
    unit = read(os.path.join(dest,
                             "etc/systemd/system/infergw.service")).decode()
    assert ("ExecStart=/opt/gw/sbin/infergw -c "
            "/etc/opt/infergw/gateway.conf\n") in unit, unit


def test_second_install_keeps_an_edited_conf(t):
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    conf = os.path.join(dest, CONF)
    edited = read(conf).replace(b"listen = 127.0.0.1:8080",
                                b"listen = 127.0.0.1:9090") + \
        b"# edited by the operator\n"
    with open(conf, "wb") as f:
        f.write(edited)
    os.chmod(conf, 0o600)
    # The rest is refreshed: a damaged binary comes back.
    with open(os.path.join(dest, "usr/bin/infergw"), "wb") as f:
        f.write(b"broken")
    out = make(t, "install", dest, **DEBIAN)
    assert read(conf) == edited, "make install changed an existing conf"
    assert os.stat(conf).st_mode & 0o777 == 0o600, "its mode was changed"
    assert "kept the existing %s" % conf in out, out
    assert read(os.path.join(dest, "usr/bin/infergw")) == \
        read(os.path.join(t.bin, "infergw")), "the binary was not replaced"


def test_uninstall_keeps_an_edited_conf(t):
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    conf = os.path.join(dest, CONF)
    edited = read(conf) + b"[tenant acme]\napi_key = sk-acme-1-abcdef\n"
    with open(conf, "wb") as f:
        f.write(edited)
    out = make(t, "uninstall", dest, **DEBIAN)
    assert tree(dest) == {CONF: 0o644}, "left %r" % tree(dest)
    assert read(conf) == edited, "uninstall changed the edited conf"
    assert "kept %s" % conf in out, out


def test_uninstall_removes_an_unedited_conf(t):
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    out = make(t, "uninstall", dest, **DEBIAN)
    assert tree(dest) == {}, "left %r" % tree(dest)
    assert not os.path.exists(os.path.join(dest, "etc/infergw")), \
        "the empty etc/infergw was left behind"
    assert "kept" not in out, out
    # Nothing installed: uninstall is a no-op, not an error.
    make(t, "uninstall", dest, **DEBIAN)


# mandoc -T lint also says whether each .Xr page is installed on this
# machine (STYLE "referenced manual not found", and "outdated mandoc.db"
# for pages it finds outside its database).  Those lines are about the
# machine, not the page, and are the only ones dropped.
MACHINE_RX = re.compile(r"referenced manual not found|outdated mandoc\.db")


def test_man_pages_lint_clean(t):
    tool("mandoc")
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    pages = [MAN8, MAN5, os.path.join(dest, "usr/share/man/man8/infergw.8"),
             os.path.join(dest, "usr/share/man/man5/gateway.conf.5")]
    for page in pages:
        rc, out, err = run(["mandoc", "-T", "lint", "-W", "style", page])
        bad = [l for l in (out + err).splitlines()
               if l.strip() and not MACHINE_RX.search(l)]
        assert not bad, "mandoc -T lint %s:\n%s" % (page, "\n".join(bad))
        # Warnings and worse, where no machine line can come in.
        rc, out, err = run(["mandoc", "-T", "lint", "-W", "warning", page])
        assert rc == 0 and out + err == "", \
            "mandoc -T lint -W warning %s: exit %d\n%s" % (page, rc,
                                                         out + err)


def installed_pages(t):
    """Install into t.tmp; each installed page and words it must show."""
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    return {os.path.join(dest, "usr/share/man/man8/infergw.8"):
            ["INFERGW(8)", "SYNOPSIS", "SIGHUP", "/readyz",
             "EXIT STATUS", "/etc/infergw/gateway.conf"],
            os.path.join(dest, "usr/share/man/man5/gateway.conf.5"):
            ["GATEWAY.CONF(5)", "ROUTING SECTION", "drain_timeout",
             "api_key_sha256"]}


def test_man_pages_pass_groff_ww(t):
    groff = tool("groff")
    for page in installed_pages(t):
        rc, out, err = run([groff, "-ww", "-z", "-mandoc", page])
        assert rc == 0 and out + err == "", \
            "groff -ww %s: exit %d\n%s" % (page, rc, out + err)


def test_man_pages_render(t):
    man = tool("man", "man-db")
    env = dict(os.environ, MANWIDTH="80", MANPAGER="cat", PAGER="cat")
    for page, words in installed_pages(t).items():
        rc, out, err = run([man, "-l", page], env=env)
        assert rc == 0 and err == "", "man -l %s: exit %d %r" % (page, rc,
                                                                 err)
        text = re.sub(r".\x08", "", out)        # no overstrike in a pipe
        for w in words:
            assert w in text, "man -l %s: no %r in\n%s" % (page, w, text)


def test_systemd_unit_verifies(t):
    analyze = tool("systemd-analyze", "systemd")
    dest = os.path.join(t.tmp, "dest")
    make(t, "install", dest, **DEBIAN)
    # verify wants ExecStart's binary to exist: point it at the DESTDIR
    # copy, in a unit of the same name.  Documentation=man: pages are
    # looked up with man, in the DESTDIR's pages.
    unit = read(os.path.join(dest, UNIT)).decode()
    unit = unit.replace("ExecStart=/usr/bin/infergw",
                        "ExecStart=" + os.path.join(dest, "usr/bin/infergw"))
    vdir = os.path.join(t.tmp, "verify")
    os.mkdir(vdir)
    path = os.path.join(vdir, "infergw.service")
    with open(path, "w") as f:
        f.write(unit)
    env = dict(os.environ, MANPATH=os.path.join(dest, "usr/share/man"))
    if not shutil.which("man"):
        env = None
        cmd = [analyze, "verify", "--man=no", path]
    else:
        cmd = [analyze, "verify", path]
    rc, out, err = run(cmd, env=env)
    assert rc == 0 and "infergw" not in out + err, \
        "%s: exit %d\n%s" % (" ".join(cmd), rc, out + err)


# The pages keep up with the code: every option in main.c's getopt string,
# every route in route.c and every setting in config_schema.c's table.

def _source(rel):
    with open(os.path.join(REPO_ROOT, rel)) as f:
        return f.read()


def test_infergw_8_documents_options_and_endpoints(t):
    page = _source("man/infergw.8")
    opts = re.search(r'getopt\(argc, argv, "([^"]+)"\)',
                     _source("gateway/main.c")).group(1).replace(":", "")
    for o in opts:
        assert re.search(r"^\.It Fl %s\b" % o, page, re.M), \
            "infergw.8 lacks option -%s" % o
    routes = re.findall(r'^\s*\{ "(/[^"]*)", "([A-Z]+)"',
                        _source("gateway/client/route.c"), re.M)
    assert len(routes) >= 7, routes
    for path, method in routes:
        assert ".It Li %s %s\n" % (method, path) in page, \
            "infergw.8 lacks %s %s" % (method, path)
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert sig in page, sig


def test_gateway_conf_5_documents_every_setting(t):
    page = _source("man/gateway.conf.5")
    sections = {}
    for m in re.finditer(r"^\.Sh (\w+) SECTIONS?\n(.*?)(?=^\.Sh )", page,
                         re.M | re.S):
        sections[m.group(1).lower()] = m.group(2)
    settings = re.findall(r'^\s*\{ "(\w+)", "(\w+)", T_',
                          _source("gateway/base/config_schema.c"), re.M)
    assert len(settings) > 40, settings
    for sec, key in settings:
        assert sec in sections, "gateway.conf.5 has no %s section" % sec
        assert re.search(r"^\.It Cm %s Ar " % key, sections[sec], re.M), \
            "gateway.conf.5 lacks [%s] %s" % (sec, key)


def test_gateway_conf_5_example_is_valid(t):
    page = _source("man/gateway.conf.5")
    ex = re.search(r"^\.Sh EXAMPLES\n.*?^\.Bd -literal[^\n]*\n(.*?)^\.Ed",
                   page, re.M | re.S).group(1)
    path = t.write("example.conf", ex.replace("\\e", "\\"))
    rc, out = t.infergw("-t", "-c", path)
    assert rc == 0, "the EXAMPLES config: exit %d %r" % (rc, out)
