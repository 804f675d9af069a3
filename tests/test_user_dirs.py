"""The suite never touches the user's own cache or state: a mount started
as a user starts it (the CLI, in the background) indexes and logs into the
folders conftest gives every test and every process a test starts.
Measured before: `~/.cache/compatfs/index.sqlite3` held rows of
`/tmp/pytest-of-root/...` after a run."""

from __future__ import annotations

import os
import pwd
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from compatfs.testing.gemma3 import legacy_gemma3_text
from compatfs.testing.store import add_model

from conftest import needs_fuse


def _home() -> Path:
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def _rows_under(index: Path, prefix: str) -> int:
    """Rows of the index file `index` about paths under `prefix` (0 if there is no such file)."""
    if not index.exists():
        return 0
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return sum(
            db.execute(f"SELECT COUNT(*) FROM {t} WHERE path LIKE ?", (prefix + "%",)).fetchone()[0] for t in tables
        )
    finally:
        db.close()


@needs_fuse
def test_a_mount_started_by_a_test_writes_nothing_of_the_users(tmp_path):
    token = uuid.uuid4().hex
    root = tmp_path / token
    store = root / "store"
    add_model(store, "g", legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    mnt = root / "mnt"
    mnt.mkdir()
    run = [sys.executable, "-m", "compatfs"]
    res = subprocess.run([*run, "mount", str(store), str(mnt)], capture_output=True, text=True, timeout=60)
    try:
        assert res.returncode == 0, res.stderr
        assert os.stat(mnt / "g:1b/model.gguf").st_size > 0  # indexed: the index was written somewhere
    finally:
        subprocess.run([*run, "umount", str(mnt)], capture_output=True, timeout=60)
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    # The defaults compatfs falls back to without the environment conftest sets.
    cache, state = _home() / ".cache" / "compatfs", _home() / ".local" / "state" / "compatfs"
    assert _rows_under(cache / "index.sqlite3", str(root)) == 0, f"{cache} was written"
    assert not [p.name for p in (state.iterdir() if state.is_dir() else ()) if token in p.name], f"{state} was written"
    # ... and what it wrote is in this test's own folders.
    assert _rows_under(Path(os.environ["COMPATFS_CACHE_DIR"]) / "index.sqlite3", str(root)) > 0
    assert any(token in p.name for p in (Path(os.environ["XDG_STATE_HOME"]) / "compatfs").iterdir())
