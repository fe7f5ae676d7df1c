#!/usr/bin/env bash
# The virtualenv with handhold and its test extras (`make install`). Installed by uv when it can be had (about
# 30 s against pip's minutes on a fresh clone), from the package indexes pip is configured with, under the same
# constraints; by pip otherwise. uv itself is installed once per machine, not per clone (HANDHOLD_TOOLS, by default
# ~/.cache/handhold: 4.5 s a clone). Usage: scripts/install_venv.sh PYTHON VENV
set -euo pipefail
PYTHON=$1
VENV=$2
TOOLS=${HANDHOLD_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/handhold}
UV=$TOOLS/uv/bin/uv

if [ ! -x "$UV" ] && ! "$PYTHON" -m pip install -q --disable-pip-version-check --target "$TOOLS/uv" uv >/dev/null 2>&1; then
    echo "uv could not be installed: installing with pip (slower)."
fi
if [ ! -x "$VENV/bin/pip" ]; then  # pip stays: synthesis builds wheels with it
    rm -rf "$VENV"
    # With uv: the pip and setuptools ensurepip would install, from the wheels Python bundles (0.3 s against 7)
    bundled=$("$PYTHON" -c 'import ensurepip, os; print(os.path.dirname(ensurepip.__file__))')/_bundled
    if ! { [ -x "$UV" ] && "$PYTHON" -m venv --without-pip "$VENV" &&
           "$UV" pip install -q --python "$VENV/bin/python" "$bundled"/*.whl; }; then
        rm -rf "$VENV" && "$PYTHON" -m venv "$VENV"
    fi
fi
if [ -x "$UV" ]; then
    # pip's own settings (pip.conf and PIP_* variables), as uv arguments: local wheel folders and extra indexes.
    mapfile -t pip_indexes < <("$PYTHON" -m pip config list 2>/dev/null | "$PYTHON" -c '
import re, sys
flags = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url"}
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    option = key.rsplit(".", 1)[-1]
    if option in flags:
        for item in value.strip("\x27\"").split():
            print(flags[option]); print(item)
')
    # No bytecode is compiled here (uv leaves it to the first import): `make test`, `make dev` and `make demo` let
    # Python write the bytecode of what their processes import (the Makefile's WRITE_BYTECODE), for less than the
    # ~40 s a full compile of the venv cost here.
    if "$UV" pip install -q --python "$VENV/bin/python" --index-strategy unsafe-best-match \
        "${pip_indexes[@]}" -c constraints.txt -e '.[test]'; then
        installed=1
    else
        echo "uv failed: installing with pip instead."
    fi
fi
if [ -z "${installed:-}" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
fi
