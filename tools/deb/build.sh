#!/bin/sh
# SPDX-License-Identifier: MIT
# make deb: the Debian package infergw_VERSION_ARCH.deb, from a staged
# 'make install'.
#
#   sh tools/deb/build.sh [OUTDIR [WORKDIR]]
#
# OUTDIR (default .) receives the package; WORKDIR (default build/deb)
# holds the build and the staged tree, made afresh each time.  The
# gateway is built there with Debian's build flags (dpkg-buildflags, all
# hardening) and Debian's paths (PREFIX=/usr SYSCONFDIR=/etc, so -c
# defaults to /etc/infergw/gateway.conf; the unit in /lib/systemd/system,
# where Debian 12 keeps units), installed with 'make install DESTDIR=',
# and stripped.  Then comes what a Debian binary package holds besides:
# man pages and changelog gzipped, the copyright file, lintian's
# overrides (tools/deb/lintian-overrides says why), DEBIAN/ with the
# conffiles, the maintainer scripts, md5sums, and a control file made by
# dpkg-gencontrol with the library dependencies dpkg-shlibdeps finds.
# dpkg-deb packs it with every file owned by root (no fakeroot needed).
#
# The version is tools/deb/changelog's newest entry, whose upstream part
# must be INFERGW_VERSION in gateway/base/config.h: a new version needs a new
# changelog entry.  Its date is SOURCE_DATE_EPOCH unless that is set:
# dpkg-deb clamps every file's time in the package to it.
set -eu
umask 022

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=${1:-.}
work=${2:-$top/build/deb}

die() {
    echo "make deb: $*" >&2
    exit 1
}

version=$(dpkg-parsechangelog -l "$here/changelog" -S Version)
upstream=${version%-*}
code=$(sed -n 's/^#define INFERGW_VERSION "\(.*\)"$/\1/p' \
    "$top/gateway/base/config.h")
[ "$upstream" = "$code" ] || die "tools/deb/changelog is at $version," \
    "gateway/base/config.h at $code: add a changelog entry for $code-1"
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
: "${SOURCE_DATE_EPOCH:=$(dpkg-parsechangelog -l "$here/changelog" \
    -S Timestamp)}"
export SOURCE_DATE_EPOCH

# Only what this script makes there goes: WORKDIR may be anything.
mkdir -p "$work" "$out"
work=$(cd "$work" && pwd)
rm -rf "$work/build" "$work/root" "$work/debian"
mkdir "$work/debian"
root=$work/root
deb=$(cd "$out" && pwd)/infergw_${version}_${arch}.deb

# Every path and flag on the command line, so that neither the caller's
# environment nor a parent make's variables (SANITIZE, PREFIX, ...) can
# change what is packaged; WERROR passes through.
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
cd "$top"
cflags="$(dpkg-buildflags --get CPPFLAGS) $(dpkg-buildflags --get CFLAGS)"
"${MAKE:-make}" --no-print-directory install \
    BUILD="$work/build" DESTDIR="$root" PREFIX=/usr BINDIR=/usr/bin \
    SYSCONFDIR=/etc MANDIR=/usr/share/man \
    SYSTEMDUNITDIR=/lib/systemd/system SANITIZE= \
    CFLAGS="$cflags" LDFLAGS="$(dpkg-buildflags --get LDFLAGS)"

# What dh_strip, dh_compress and dh_installdocs would do.
strip --remove-section=.comment --remove-section=.note \
    "$root/usr/bin/infergw"
gzip -9n "$root/usr/share/man/man5/gateway.conf.5" \
    "$root/usr/share/man/man8/infergw.8"
doc=$root/usr/share/doc/infergw
install -d "$doc"
install -m 644 "$here/copyright" "$doc/copyright"
gzip -9n -c "$here/changelog" >"$doc/changelog.Debian.gz"
chmod 644 "$doc/changelog.Debian.gz"
install -d "$root/usr/share/lintian/overrides"
install -m 644 "$here/lintian-overrides" \
    "$root/usr/share/lintian/overrides/infergw"

install -d "$root/DEBIAN"
install -m 644 "$here/conffiles" "$root/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    install -m 755 "$here/$s" "$root/DEBIAN/$s"
done
# dpkg checks conffiles itself: md5sums lists the other files.
(cd "$root" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' \
    -printf '%P\n' | LC_ALL=C sort | xargs md5sum) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/md5sums"

# dpkg-shlibdeps reads debian/control from the directory it runs in.
cp "$here/control" "$work/debian/control"
(cd "$work" && dpkg-shlibdeps -Tdebian/substvars root/usr/bin/infergw &&
    dpkg-gencontrol -l"$here/changelog" -Tdebian/substvars -Proot \
        -fdebian/files)

dpkg-deb --root-owner-group -Zxz --build "$root" "$deb"
