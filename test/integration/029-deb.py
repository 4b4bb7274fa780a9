# SPDX-License-Identifier: MIT
"""029 - the Debian package (issue 19 item 9): 'make deb' builds
infergw_VERSION_ARCH.deb holding the gateway (built for /etc, stripped),
its man pages, its unit and /etc/infergw/gateway.conf as a conffile, with
the control fields, md5sums and maintainer scripts a package needs;
lintian --pedantic finds nothing but one note (no init.d script); the
maintainer scripts create the system user and leave systemd alone where
it is not running; and the unit's sandbox holds the gateway: every
system call a traced run makes is one its SystemCallFilter= allows, and
it reads no /proc file that ProcSubset= and ProtectProc= hide.

The package is built once, by the first test that needs it, with
'make deb' (its install step left out: -o deps) into a temp dir of its
own, and removed when the run ends.  Nothing is installed on this
machine: the maintainer scripts run against stand-ins for adduser,
chown, deb-systemd-helper and the rest that only log their arguments.
"""

import atexit
import gzip
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile

from gwtest import REPO_ROOT, budget, chat_body, request, tool

from tls_util import TlsConnection, certs, client_ctx, tls_gateway

CHANGELOG = os.path.join(REPO_ROOT, "tools", "deb", "changelog")
UNIT = "lib/systemd/system/infergw.service"
CONF = "etc/infergw/gateway.conf"

# Every file in the package, with its mode (all owned by root).
FILES = {
    "usr/bin/infergw": 0o755,
    CONF: 0o644,
    UNIT: 0o644,
    "usr/share/man/man8/infergw.8.gz": 0o644,
    "usr/share/man/man5/gateway.conf.5.gz": 0o644,
    "usr/share/doc/infergw/copyright": 0o644,
    "usr/share/doc/infergw/changelog.Debian.gz": 0o644,
    "usr/share/lintian/overrides/infergw": 0o644,
}
SCRIPTS = ("postinst", "prerm", "postrm")
# The shared libraries the gateway links, by their Debian 12 packages.
LIBS = ("libc6", "libcurl4", "libjansson4", "libmbedtls14",
        "libmbedx509-1", "libmbedcrypto7", "libssl3")


def run(cmd, timeout=120, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=budget(timeout), **kw)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def changelog_version():
    first = read(CHANGELOG).splitlines()[0]
    m = re.match(r"^infergw \(([^)]+)\) ", first)
    assert m, "tools/deb/changelog starts %r" % first
    return m.group(1)


# --------------------------------------------------------------------------
# The package, built once per run.

_built = {}


class Package:
    """The .deb 'make deb' made: its path, its file name's parts, and its
    contents unpacked (root/, DEBIAN/)."""

    def __init__(self, top):
        out = os.path.join(top, "out")
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL",
                            "MAKEOVERRIDES", "DEBDIR", "DEBWORK")}
        cmd = ["make", "--no-print-directory", "-C", REPO_ROOT, "-j2", "deb",
               "-o", "deps", "DEBDIR=" + out,
               "DEBWORK=" + os.path.join(top, "work")]
        rc, so, se = run(cmd, timeout=300, env=env)
        assert rc == 0, "%s: exit %d\n%s%s" % (" ".join(cmd), rc, so[-3000:],
                                              se[-3000:])
        debs = os.listdir(out)
        assert len(debs) == 1, "make deb made %r" % debs
        self.name = debs[0]
        self.path = os.path.join(out, self.name)
        self.root = os.path.join(top, "root")
        self.control = os.path.join(top, "DEBIAN")
        for flag, d in (("-x", self.root), ("-e", self.control)):
            rc, so, se = run([tool("dpkg-deb", "dpkg"), flag, self.path, d])
            assert rc == 0, "dpkg-deb %s: %s" % (flag, se)

    def field(self, name):
        rc, so, se = run(["dpkg-deb", "-f", self.path, name])
        assert rc == 0, "dpkg-deb -f %s: %s" % (name, se)
        return so.strip()


def package(t):
    """The Package (built on first use; a failed build fails every test
    that needs it, without building again)."""
    tool("dpkg-deb", "dpkg")
    tool("dpkg-shlibdeps", "dpkg-dev")
    if "pkg" not in _built:
        top = tempfile.mkdtemp(prefix="infergw-deb-")
        atexit.register(shutil.rmtree, top, True)
        try:
            _built["pkg"] = Package(top)
        except Exception as e:
            _built["pkg"] = e
    if isinstance(_built["pkg"], Exception):
        raise AssertionError("make deb failed: %s" % _built["pkg"])
    return _built["pkg"]


# --------------------------------------------------------------------------
# What the package holds.

def test_deb_holds_every_file(t):
    pkg = package(t)
    rc, listing, se = run(["dpkg-deb", "-c", pkg.path])
    assert rc == 0, se
    files = {}
    for line in listing.splitlines():
        # -rw-r--r-- root/root  24149 2026-12-03 07:55 ./etc/infergw/...
        perms, owner, _, _, _, path = line.split(None, 5)
        path = path[2:]
        assert owner == "root/root", "%s owned by %s" % (path, owner)
        if perms[0] == "d":
            assert perms == "drwxr-xr-x", "%s: %s" % (path, perms)
        else:
            assert perms[0] == "-", "not a plain file: " + line
            mode = sum(1 << (8 - i) for i, c in enumerate(perms[1:])
                       if c != "-")
            files[path] = mode
    assert files == FILES, "the package holds %r, want %r" % (files, FILES)

    # The binary: stripped, and built for the package's paths.
    binary = os.path.join(pkg.root, "usr/bin/infergw")
    rc, so, se = run([tool("readelf", "binutils"), "-S", "-W", binary])
    assert rc == 0, se
    assert ".symtab" not in so and ".debug_info" not in so, \
        "usr/bin/infergw is not stripped:\n" + so
    rc, so, se = run([binary, "-h"])
    assert "(default /etc/infergw/gateway.conf)" in so + se, so + se
    rc, so, se = run([binary, "-V"])
    assert rc == 0 and so == "infergw %s\n" % \
        changelog_version().rsplit("-", 1)[0], so
    rc, so, se = run([binary, "-t", "-c", os.path.join(pkg.root, CONF)])
    assert rc == 0, "-t on the packaged conf: exit %d %s" % (rc, so + se)
    assert read(os.path.join(pkg.root, CONF), "rb") == \
        read(os.path.join(REPO_ROOT, "etc", "gateway.conf"), "rb")

    # Man pages and changelog gzipped, showing the package's paths.
    for page in ("usr/share/man/man8/infergw.8.gz",
                 "usr/share/man/man5/gateway.conf.5.gz"):
        with gzip.open(os.path.join(pkg.root, page), "rt") as f:
            text = f.read()
        assert text.startswith(".Dd "), page
        assert "/etc/infergw/gateway.conf" in text, page
        assert "/usr/local" not in text, page
    with gzip.open(os.path.join(
            pkg.root, "usr/share/doc/infergw/changelog.Debian.gz"),
            "rb") as f:
        assert f.read() == read(CHANGELOG, "rb")

    unit = read(os.path.join(pkg.root, UNIT))
    assert "\nExecStart=/usr/bin/infergw -c /etc/infergw/gateway.conf\n" \
        in unit, unit
    for want in ("User=infergw", "Group=infergw"):
        assert want in unit.splitlines(), "unit lacks %r" % want
    assert "DynamicUser" not in unit, unit


def test_deb_control_fields(t):
    pkg = package(t)
    version = changelog_version()
    arch = run(["dpkg", "--print-architecture"])[1].strip()
    assert pkg.name == "infergw_%s_%s.deb" % (version, arch), pkg.name
    assert pkg.field("Package") == "infergw"
    assert pkg.field("Version") == version
    assert pkg.field("Architecture") == arch
    for name in ("Maintainer", "Section", "Priority", "Description"):
        assert pkg.field(name), "no %s field" % name
    assert int(pkg.field("Installed-Size")) >= \
        os.path.getsize(os.path.join(pkg.root, "usr/bin/infergw")) // 1024

    # Depends: adduser for the postinst, and every library the binary
    # links (dpkg-shlibdeps), each with a version.
    depends = [d.strip() for d in pkg.field("Depends").split(",")]
    names = [re.match(r"^([a-z0-9.+-]+)", d).group(1) for d in depends]
    assert "adduser" in names, depends
    for lib in LIBS:
        assert lib in names, "Depends lacks %s: %r" % (lib, depends)
        assert re.search(r"\(>= [0-9]", depends[names.index(lib)]), \
            depends

    conffiles = read(os.path.join(pkg.control, "conffiles"))
    assert conffiles == "/etc/infergw/gateway.conf\n", \
        "conffiles: %r" % conffiles
    # md5sums: every file but the conffile (dpkg hashes that itself).
    sums = {}
    for line in read(os.path.join(pkg.control, "md5sums")).splitlines():
        digest, path = line.split("  ", 1)
        sums[path] = digest
    assert sorted(sums) == sorted(f for f in FILES if f != CONF), sums
    for path, digest in sums.items():
        got = hashlib.md5(read(os.path.join(pkg.root, path), "rb"))
        assert got.hexdigest() == digest, "md5sums is wrong for " + path
    for s in SCRIPTS:
        path = os.path.join(pkg.control, s)
        assert os.stat(path).st_mode & 0o777 == 0o755, s
        rc, so, se = run(["sh", "-n", path])
        assert rc == 0, "%s: %s" % (s, se)


def test_deb_lintian_clean(t):
    lintian = tool("lintian")
    pkg = package(t)
    # --pedantic: every tag but the informational ones; --display-info
    # adds those, which may stay (and are shown on failure).
    rc, so, se = run([lintian, "--pedantic", "--display-info",
                      "--fail-on", "error,warning,pedantic", pkg.path],
                     timeout=300)
    tags = [l for l in so.splitlines() if re.match(r"^[A-Z]: ", l)]
    bad = [l for l in tags if not l.startswith(("I: ", "N: "))]
    assert rc == 0 and not bad, "lintian: exit %d\n%s%s" % (rc, so, se)
    # The one info tag expected: a unit and no /etc/init.d script.
    others = [l for l in tags if "package-supports-alternative-init-but-"
              "no-init.d-script" not in l]
    assert not others, "lintian:\n" + so


# --------------------------------------------------------------------------
# The maintainer scripts, run against stand-ins that log their calls.

# Each stand-in logs "program args"; the few whose answer matters answer
# from the STUB_* variables (empty: no), everything else succeeds.
STUB = r"""#!/bin/sh
echo "$(basename "$0") $*" >>"$STUB_LOG"
case "$(basename "$0") $*" in
"getent passwd infergw" | "getent group infergw")
    [ -n "$STUB_USER" ] ;;
"dpkg-statoverride --list /etc/infergw")
    [ -n "$STUB_OVERRIDE" ] ;;
"deb-systemd-helper --quiet was-enabled infergw.service")
    [ -z "$STUB_DISABLED" ] ;;
esac
"""
STUBBED = ("getent", "adduser", "addgroup", "chown", "chmod", "rmdir",
           "dpkg-statoverride", "deb-systemd-helper", "deb-systemd-invoke",
           "systemctl")


def maintainer_script(t, pkg, name, args, systemd=False, **state):
    """Run DEBIAN/'name' with 'args' against the stand-ins; the calls it
    made, one "program args" string each.  'systemd': as if systemd ran
    (the script's /run/systemd/system is pointed at a directory that
    exists); 'state': user=1 (infergw exists), override=1 (a
    dpkg-statoverride for /etc/infergw), disabled=1 (the unit was
    disabled)."""
    stubs = os.path.join(t.tmp, "stubs")
    if not os.path.isdir(stubs):
        os.mkdir(stubs)
        for prog in STUBBED:
            path = os.path.join(stubs, prog)
            with open(path, "w") as f:
                f.write(STUB)
            os.chmod(path, 0o755)
    running = os.path.join(t.tmp, "run-systemd-system")
    os.makedirs(running, exist_ok=True)
    text = read(os.path.join(pkg.control, name))
    assert text.count("/run/systemd/system") == \
        text.count("[ -d /run/systemd/system ]"), \
        "%s uses /run/systemd/system other than in a [ -d ] test" % name
    if systemd:
        text = text.replace("/run/systemd/system", running)
    else:
        assert not os.path.isdir("/run/systemd/system"), \
            "systemd runs here: the no-systemd case cannot be tried"
    script = t.write(name + ".sh", text)
    log = os.path.join(t.tmp, "calls.log")
    if os.path.exists(log):
        os.unlink(log)
    env = {"PATH": stubs + ":/usr/bin:/bin", "STUB_LOG": log}
    for k, v in state.items():
        env["STUB_" + k.upper()] = "1" if v else ""
    rc, so, se = run(["sh", "-e", script] + list(args), env=env)
    assert rc == 0, "%s %s: exit %d\n%s%s" % (name, " ".join(args), rc,
                                              so, se)
    return read(log).splitlines() if os.path.exists(log) else []


def test_deb_postinst_creates_the_user(t):
    pkg = package(t)
    calls = maintainer_script(t, pkg, "postinst", ["configure"])
    assert "addgroup --system --quiet infergw" in calls, calls
    adduser = [c for c in calls if c.startswith("adduser ")]
    assert len(adduser) == 1, calls
    for word in ("--system", "--ingroup infergw", "--no-create-home",
                 "--home /nonexistent"):
        assert word in adduser[0], adduser
    assert adduser[0].endswith(" infergw"), adduser
    assert "chown root:infergw /etc/infergw" in calls, calls
    assert "chmod 0750 /etc/infergw" in calls, calls
    # No systemd here: the unit is enabled (symlinks only), never started.
    assert "deb-systemd-helper enable infergw.service" in calls, calls
    assert not [c for c in calls if c.startswith(("systemctl",
                                                  "deb-systemd-invoke"))], \
        calls

    # A second configure (an upgrade) with the user there: no new one;
    # an administrator's statoverride keeps the directory as it is.
    calls = maintainer_script(t, pkg, "postinst", ["configure", "0.0.9-1"],
                              user=1, override=1)
    assert not [c for c in calls if c.startswith(("adduser", "addgroup",
                                                  "chown", "chmod"))], calls


def test_deb_maintainer_scripts_drive_systemd_when_it_runs(t):
    pkg = package(t)
    calls = maintainer_script(t, pkg, "postinst", ["configure"],
                              systemd=True)
    assert calls.index("deb-systemd-helper enable infergw.service") < \
        calls.index("systemctl --system daemon-reload") < \
        calls.index("deb-systemd-invoke start infergw.service"), calls
    calls = maintainer_script(t, pkg, "postinst", ["configure", "0.0.9-1"],
                              systemd=True, user=1, disabled=1)
    assert "deb-systemd-invoke restart infergw.service" in calls, calls
    assert "deb-systemd-helper enable infergw.service" not in calls, \
        "a unit the administrator disabled was enabled again: %r" % calls
    assert "deb-systemd-helper update-state infergw.service" in calls

    calls = maintainer_script(t, pkg, "prerm", ["remove"], systemd=True)
    assert calls == ["deb-systemd-invoke stop infergw.service"], calls
    calls = maintainer_script(t, pkg, "prerm", ["upgrade", "0.2.0-1"],
                              systemd=True)
    assert calls == [], "an upgrade stopped the gateway: %r" % calls
    calls = maintainer_script(t, pkg, "prerm", ["remove"])
    assert calls == [], "prerm without systemd: %r" % calls

    calls = maintainer_script(t, pkg, "postrm", ["remove"], systemd=True)
    assert calls == ["systemctl --system daemon-reload",
                     "deb-systemd-helper mask infergw.service"], calls
    calls = maintainer_script(t, pkg, "postrm", ["purge"])
    assert calls == ["deb-systemd-helper purge infergw.service",
                     "deb-systemd-helper unmask infergw.service",
                     "rmdir /etc/infergw"], calls


def test_deb_maintainer_scripts_work_without_systemd_tools(t):
    """Without deb-systemd-helper and friends at all (a minimal chroot),
    every script still succeeds, and still makes the user."""
    pkg = package(t)
    stubs = os.path.join(t.tmp, "stubs")
    maintainer_script(t, pkg, "prerm", ["remove"])      # makes the stubs
    for prog in ("deb-systemd-helper", "deb-systemd-invoke", "systemctl"):
        os.unlink(os.path.join(stubs, prog))
    path = "/usr/bin:/bin"
    if [p for p in ("deb-systemd-helper", "deb-systemd-invoke", "systemctl")
            if shutil.which(p, path=path)]:
        # The real ones would be found behind the stand-ins: hide them by
        # giving the scripts a PATH of the stand-ins and the shell only.
        bare = os.path.join(t.tmp, "bare")
        os.mkdir(bare)
        for prog in ("sh", "basename", "cat", "rm", "echo"):
            real = shutil.which(prog, path=path)
            if real:
                os.symlink(real, os.path.join(bare, prog))
        path = bare
    for name, args in (("postinst", ["configure"]), ("prerm", ["remove"]),
                       ("postrm", ["remove"]), ("postrm", ["purge"])):
        script = os.path.join(pkg.control, name)
        log = os.path.join(t.tmp, "calls.log")
        if os.path.exists(log):
            os.unlink(log)
        rc, so, se = run([shutil.which("sh"), "-e", script] + args,
                         env={"PATH": stubs + ":" + path, "STUB_LOG": log})
        assert rc == 0, "%s %s: exit %d\n%s%s" % (name, args, rc, so, se)
        if name == "postinst":
            assert "addgroup --system --quiet infergw" in read(log), \
                read(log)


# --------------------------------------------------------------------------
# The unit's sandbox and the gateway.

def unit_lines(pkg, key):
    return [l.split("=", 1)[1] for l in
            read(os.path.join(pkg.root, UNIT)).splitlines()
            if l.startswith(key + "=")]


def syscall_groups(analyze):
    """systemd-analyze's syscall groups: {"@name": [member, ...]}."""
    rc, so, se = run([analyze, "syscall-filter"])
    assert rc == 0, se
    groups, cur = {}, None
    for line in so.splitlines():
        if line.startswith("@"):
            cur = groups.setdefault(line.strip(), [])
        elif cur is not None and line.strip() and \
                not line.strip().startswith("#"):
            cur.append(line.strip())
        elif not line.strip():
            cur = None
    assert "@system-service" in groups and "@privileged" in groups, groups
    return groups


def expand(groups, names):
    out = set()
    for n in names:
        if n.startswith("@"):
            out |= expand(groups, groups[n])
        else:
            out.add(n)
    return out


def allowed_syscalls(pkg, groups):
    """What the unit's SystemCallFilter= lines allow, in their order."""
    lines = unit_lines(pkg, "SystemCallFilter")
    assert lines, "the unit has no SystemCallFilter="
    allowed = set()
    for line in lines:
        if line.startswith("~"):
            allowed -= expand(groups, line[1:].split())
        else:
            allowed |= expand(groups, line.split())
    return allowed


def traced_run(t, pkg, strace):
    """Run the packaged gateway under strace -f through what it serves:
    plain and TLS requests, a stream, the admin listener, a reload and a
    drain.  Returns strace's output lines."""
    trace = os.path.join(t.tmp, "trace")
    wrapped = os.path.join(t.tmp, "wrapped")
    os.mkdir(wrapped)
    wrapper = os.path.join(wrapped, "infergw")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec %s -f -qq -o %s %s "$@"\n'
                % (strace, trace, os.path.join(pkg.root, "usr/bin/infergw")))
    os.chmod(wrapper, 0o755)
    m = t.mock()
    d = certs(t)
    saved = t.bin
    t.bin = wrapped
    try:
        g = tls_gateway(t, m, d, conf={"admin": {"listen": "127.0.0.1:0"}},
                        admin_key=None)
    finally:
        t.bin = saved
    tracee = [int(p) for p in read("/proc/%d/task/%d/children"
                                   % (g.proc.pid, g.proc.pid)).split()]
    assert len(tracee) == 1, tracee
    try:
        r = g.post("/v1/chat/completions", chat_body("plain"))
        assert r.status == 200, r
        s = g.stream("/v1/chat/completions", chat_body("s", stream=True))
        s.read_all()
        assert s.clean_end
        c = TlsConnection(g.tls_port, client_ctx(d))
        r = c.request("GET", "/v1/models")
        assert r.status == 200, r
        c.close()
        for path in ("/metrics", "/healthz", "/readyz"):
            r = request(g.admin_port, "GET", path)
            assert r.status == 200, (path, r)
        os.kill(tracee[0], signal.SIGHUP)
        g.wait_log(r"reload: configuration generation=2 in force",
                   timeout=10)
        assert g.post("/v1/chat/completions", chat_body("after")).status \
            == 200
        os.kill(tracee[0], signal.SIGTERM)
        assert g.wait_exit(20) == 0, g.log_tail()
    finally:
        try:
            os.kill(tracee[0], signal.SIGKILL)
        except ProcessLookupError:
            pass
    return read(trace).splitlines(), tracee[0]


def test_unit_sandbox_holds_the_gateway(t):
    strace = tool("strace")
    analyze = tool("systemd-analyze", "systemd")
    pkg = package(t)
    allowed = allowed_syscalls(pkg, syscall_groups(analyze))
    lines, pid = traced_run(t, pkg, strace)

    used = {}
    for line in lines:
        m = re.match(r"^\d+ +(?:<\.\.\. )?([a-z_0-9]+)[( ]", line)
        if m and m.group(1) not in ("exited", "killed"):
            used.setdefault(m.group(1), line)
    assert "execve" in used and ("accept4" in used or "accept" in used), \
        "the trace saw no run:\n" + "\n".join(lines[:20])
    refused = sorted(set(used) - allowed)
    assert not refused, "the unit's SystemCallFilter= refuses %s:\n%s" % (
        refused, "\n".join(used[n] for n in refused))

    # ProcSubset=pid leaves /proc/PID (and self) only; ProtectProc= hides
    # every other process.
    proc = re.compile(r'"/proc/(?!self/|self"|thread-self/|%d/|%d")[^"]*"'
                      % (pid, pid))
    bad = [l for l in lines if proc.search(l) and "ENOENT" not in l]
    assert not bad, "reads /proc beyond its own process:\n" + \
        "\n".join(bad[:10])


def test_unit_security_exposure(t):
    """systemd-analyze security: every directive issue 19 names is
    counted as set, and the exposure is docs/OPERATIONS.md's."""
    analyze = tool("systemd-analyze", "systemd")
    pkg = package(t)
    rc, so, se = run([analyze, "security", "--offline=yes", "--no-pager",
                      os.path.join(pkg.root, UNIT)])
    assert rc == 0, so + se
    for name in ("ProtectProc=", "ProcSubset=", "PrivateUsers=", "UMask=",
                 "SystemCallFilter=~@privileged",
                 "SystemCallFilter=~@resources", "RestrictSUIDSGID=",
                 "PrivateMounts="):
        row = [l for l in so.splitlines() if l[2:].startswith(name)]
        assert row and row[0].startswith("\u2713"), \
            "%s not counted as set; what is not:\n%s" % (name, "\n".join(
                l for l in so.splitlines() if not l.startswith("\u2713")))
    m = re.search(r"Overall exposure level for infergw\.service: "
                  r"([0-9.]+)", so)
    assert m, so
    doc = read(os.path.join(REPO_ROOT, "docs", "OPERATIONS.md"))
    assert "exposure level of %s" % m.group(1) in doc, \
        "docs/OPERATIONS.md does not give the exposure %s" % m.group(1)
