"""What the mount's start makes is left out of every later pass of Python's
collector (`fuse.daemon.kept_for_good`: `gc.freeze`), and a cycle frozen
there that is dropped later is never collected.  So the start (the tree's
first scan, the filesystem made over it), and what the daemon drops after
it (a rescan's old snapshot, remembered listings and attributes), must
make no cyclic garbage.  Run in a process of its own: the store, index and
collector are its own."""

from __future__ import annotations

import subprocess
import sys

from compatfs.testing import llama
from compatfs.testing.store import add_model

_COUNT = r"""
import gc, os, sys
from pathlib import Path
store_root, mnt = Path(sys.argv[1]), sys.argv[2]
from compatfs.fuse.operations import CompatFS
from compatfs.sources.ollama import OllamaStore
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from compatfs.view.index import Index
from compatfs.view.opcache import OpCache
gc.disable()
views = BlobViews(translate=True, op_cache=OpCache(16 << 20), index=Index(Path(sys.argv[3]), True), workers=0)
tree = Tree(OllamaStore(store_root), views)
fs = CompatFS(tree, mnt)
counts, files = [gc.collect()], 0
for _ in range(2):
    tree.rescan()
    counts.append(gc.collect())
for name, _, _ in fs.readdir("/", 0):
    if name.endswith(":1b"):
        for entry, _, _ in fs.readdir(f"/{name}", 0):
            if entry not in (".", ".."):
                fs.getattr(f"/{name}/{entry}")
                files += 1
counts.append(gc.collect())
fs._paths.forget()
tree.rescan()
counts.append(gc.collect())
print(files, *counts)
"""


def test_the_start_and_what_is_dropped_after_it_make_no_cyclic_garbage(open_tmp):
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    for i in range(5):
        add_model(open_tmp / "store", f"m{i}", blob, tag="1b")
    (open_tmp / "mnt").mkdir()
    res = subprocess.run(
        [sys.executable, "-c", _COUNT, str(open_tmp / "store"), str(open_tmp / "mnt"), str(open_tmp / "index.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["5"] + ["0"] * 5, res.stdout  # (each model's model.gguf stat'ed)
