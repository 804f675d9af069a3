#!/usr/bin/env bash
# Installs what compatfs needs on a fresh Debian/Ubuntu machine: libfuse 3
# (the fuse3 package, with fusermount3) and compatfs itself in .venv.
#   scripts/setup.sh          the package
#   scripts/setup.sh test     the package and its test extras
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v fusermount3 >/dev/null || ! ldconfig -p | grep 'libfuse3\.so' >/dev/null; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "setup: installing fuse3 (libfuse 3, fusermount3)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fuse3 >/dev/null
fi

# The template tests render Ollama's templates with Go's own text/template
# (tests/gotmpl): with `test`, Debian's golang-go, where it can be installed.
if [ "${1:-}" = test ] && ! command -v go >/dev/null; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    if command -v apt-get >/dev/null && { [ -z "$sudo" ] || command -v sudo >/dev/null; }; then
        echo "setup: installing golang-go (the template tests' reference renderer)" >&2
        { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq golang-go; } \
            >/dev/null 2>&1 || echo "setup: golang-go not installed; the template tests will skip" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
extras=""
[ -n "${1:-}" ] && extras="[$1]"
.venv/bin/pip install -q --disable-pip-version-check -e ".${extras}"
