"""A checkout that was never installed imports the handlers by their installed
name: `compatfs/handlers` is a link to the top-level `handlers/` folder, so
`compatfs.handlers` resolves from the source tree alone (and the type checker,
which reads the tree, checks the handlers under that name)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_handlers_import_from_the_tree_alone(tmp_path):
    tree = tmp_path / "checkout"
    tree.mkdir()
    for name in ("compatfs", "handlers"):
        shutil.copytree(ROOT / name, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    code = (
        "import compatfs.handlers, compatfs.handlers.gemma3 as g, compatfs.view.claims as c; "
        "print(compatfs.handlers.__file__); print(g.__file__); print(len(c.handlers.TEXT))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "COMPATFS_NO_ACCEL": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert Path(out[0]).parent == tree / "compatfs" / "handlers"
    assert Path(out[1]) == tree / "compatfs" / "handlers" / "gemma3.py"
    assert int(out[2]) > 0
