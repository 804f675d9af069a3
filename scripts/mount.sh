#!/usr/bin/env bash
# Set up and mount: scripts/mount.sh [MOUNTPOINT] [SOURCE|demo]
#   MOUNTPOINT  default /mnt/compat
#   SOURCE      default $OLLAMA_MODELS, else ~/.ollama/models, else (and with
#               `demo`) a small demo store of tiny legacy models, generated
#               into .cache/demo-store
# Then lists the models the mount shows (`compatfs ls MOUNTPOINT`).  Run again
# while MOUNTPOINT is mounted, it says so and changes nothing.
set -euo pipefail
mnt="$(realpath -m "${1:-/mnt/compat}")"          # paths as given, from where it is run
src="${2:-}"
[ -n "$src" ] && [ "$src" != demo ] && src="$(realpath -m "$src")"
cd "$(dirname "$0")/.."
demo="$PWD/.cache/demo-store"
[ "$src" = demo ] && src="$demo"

# The source of a live compatfs mount at $mnt, if there is one (from the mount
# table, as compatfs reads it; a dead mount does not count: mounting cleans it up).
mounted_source() {
    [ -x .venv/bin/python ] && stat -f "$mnt" >/dev/null 2>&1 || return 0
    .venv/bin/python - "$mnt" <<'EOF'
import sys
from pathlib import Path
from compatfs.files.mounttable import last_at
m = last_at(Path(sys.argv[1]))
print(m.source if m is not None and m.fstype == "fuse.compatfs" else "")
EOF
}

already="$(mounted_source)"
if [ -n "$already" ]; then
    if [ -n "$src" ] && [ "$src" != "$already" ]; then
        echo "mount: $mnt is already a compatfs mount of $already: unmount it first" \
             "(.venv/bin/compatfs umount $mnt) to mount $src there" >&2
        exit 1
    fi
    echo "mount: $mnt is already a compatfs mount of $already: nothing changed" >&2
else
    # Set up when the install is missing or older than what it is made from
    # (setting up again rewrites the compiled kernel under running processes).
    if [ ! -x .venv/bin/compatfs ] || [ -n "$(find pyproject.toml setup.py compatfs/accel_c \
            -newer .venv/bin/compatfs 2>/dev/null)" ]; then
        bash scripts/setup.sh
    fi
    if [ -z "$src" ]; then
        candidate="${OLLAMA_MODELS:-$HOME/.ollama/models}"
        if [ -d "$candidate/manifests" ] && [ -d "$candidate/blobs" ]; then
            src="$candidate"
        else
            echo "mount: no Ollama store at $candidate; using the demo store" >&2
            src="$demo"
        fi
    fi
    if [ "$src" = "$demo" ]; then
        .venv/bin/compatfs demo-store "$src"
    fi
    # A mountpoint left by a daemon that died answers "Transport endpoint is not
    # connected": mkdir fails on it, and compatfs cleans it up before mounting.
    mkdir -p "$mnt" 2>/dev/null || true
    .venv/bin/compatfs mount "$src" "$mnt"
fi
.venv/bin/compatfs ls "$mnt"
echo
echo "Unmount with: .venv/bin/compatfs umount $mnt"
