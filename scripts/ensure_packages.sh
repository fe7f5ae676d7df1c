#!/usr/bin/env bash
# Make sure some commands exist: on Debian as root, install the packages of the missing ones in one apt
# transaction; elsewhere, say what to install. Usage: scripts/ensure_packages.sh WHY COMMAND=PACKAGE ...
# (COMMAND|OTHER=PACKAGE: present when either command is; PACKAGE installed when neither is).
# One transaction, not one a package: a fresh machine's `make test` paid an apt-get update and a scan of its
# services (needrestart, which docker.io recommends) for each of its four packages.
set -euo pipefail
why=$1
shift
missing=()
for pair in "$@"; do
    commands=${pair%%=*}
    found=
    for command in ${commands//|/ }; do
        if command -v "$command" >/dev/null; then found=1; fi
    done
    if [ -z "$found" ]; then missing+=("${pair#*=}"); fi
done
if [ ${#missing[@]} = 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "$why needs ${missing[*]}: install them (Debian: apt-get install ${missing[*]}), then run this again." >&2
    exit 1
fi
echo "Installing ${missing[*]} from Debian's packages ($why)..."
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
