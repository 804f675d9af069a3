#!/usr/bin/env bash
# Set up and mount: scripts/mount.sh [MOUNTPOINT] [SOURCE]
#   MOUNTPOINT  default /mnt/compat
#   SOURCE      default $OLLAMA_MODELS, else ~/.ollama/models, else a small
#               demo store of tiny legacy models generated into .cache/demo-store
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

mnt="${1:-/mnt/compat}"
src="${2:-}"
if [ -z "$src" ]; then
    candidate="${OLLAMA_MODELS:-$HOME/.ollama/models}"
    if [ -d "$candidate/manifests" ] && [ -d "$candidate/blobs" ]; then
        src="$candidate"
    else
        echo "mount: no Ollama store at $candidate; using the demo store" >&2
        src=.cache/demo-store
        .venv/bin/compatfs demo-store "$src"
    fi
fi
# A mountpoint left by a daemon that died answers "Transport endpoint is not
# connected": mkdir fails on it, and compatfs cleans it up before mounting.
mkdir -p "$mnt" 2>/dev/null || true
.venv/bin/compatfs mount "$src" "$mnt"
.venv/bin/compatfs ls "$src"
echo
echo "Unmount with: .venv/bin/compatfs umount $mnt"
