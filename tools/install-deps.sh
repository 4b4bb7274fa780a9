#!/bin/sh
# SPDX-License-Identifier: MIT
# Make sure the Debian packages infergw builds and tests with are present.
# Installs what is missing when run as root (or through sudo); otherwise
# prints the exact command and fails.  Extra package names may be passed
# as arguments (the benchmark scripts add wrk, nginx-light, ...).
set -eu

pkgs="gcc binutils make pkg-config libcurl4-openssl-dev libssl-dev libjansson-dev libmbedtls-dev libhiredis-dev redis-server check python3 python3-prometheus-client mandoc curl haproxy dpkg-dev lintian strace prometheus chromium iproute2 $*"
missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "infergw: missing Debian packages:$missing"
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo"
else
    echo "infergw: run this, then try again:"
    echo "    sudo apt-get update && sudo apt-get install -y$missing"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
