"""One user's folder of a shared folder source holding more folders than a
scan walks (10,001 empty ones) costs only that folder's tree: every other
model stays listed and readable, a fresh mount still takes the source, the
folder is logged and shown left out, with why, in `compatfs ls` (measured
on 0c32945: the mount listed nothing within 4 s, every model.gguf ENOENT, a
fresh mount refused the source as holding no GGUF, nothing logged)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.sources.folder import MAX_FOLDERS, GGUFFolder
from compatfs.testing import gemma3

from conftest import needs_fuse, wait_until


def _crowd(folder: Path) -> None:
    """`folder` with MAX_FOLDERS + 1 empty folders in it."""
    folder.mkdir()
    for i in range(MAX_FOLDERS + 1):
        os.mkdir(folder / f"{i:05d}")


@pytest.fixture
def shared(tmp_path) -> Path:
    """A shared folder: alice's and zed's models around the folder of a user
    named `crowd` (walked between them)."""
    root = tmp_path / "shared"
    for user in ("alice", "zed"):
        (root / user).mkdir(parents=True)
        gemma3.legacy_gemma3_text(root / user / f"{user}.gguf", seed=len(user))
    return root


def test_a_crowded_folder_costs_only_its_own_tree(shared):
    _crowd(shared / "crowd")
    (shared / "crowd" / "00001" / "hidden.gguf").write_bytes(b"")  # below the cap: never scanned
    listing = GGUFFolder(shared).scan()
    assert set(listing.folders) == {"alice", "zed"}
    assert "more than" in listing.skipped[str(shared / "crowd")]


@needs_fuse
def test_a_crowded_folder_leaves_the_mount_serving(shared, mount_store):
    m = mount_store(shared)
    assert {"alice", "zed"} <= set(os.listdir(m.path))
    _crowd(shared / "crowd")
    wait_until(lambda: str(shared / "crowd") in m.log_text(), seconds=10, what="the crowded folder logged")
    assert {"alice", "zed"} <= set(os.listdir(m.path))
    for user in ("alice", "zed"):
        with open(m / user / "model.gguf", "rb") as f:
            assert f.read(4) == b"GGUF"
    assert m.alive


@needs_fuse
def test_a_fresh_mount_and_ls_take_the_source(shared, mount_store):
    _crowd(shared / "aaa")  # walked first
    m = mount_store(shared)
    assert {"alice", "zed"} <= set(os.listdir(m.path))
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", "ls", str(shared), "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {r["name"] for r in doc["models"]} == {"alice", "zed"}
    reasons = {r["name"]: r["reason"] for r in doc["left_out"]}
    assert f"more than {MAX_FOLDERS} folders" in reasons[str(shared / "aaa")]
