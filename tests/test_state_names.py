"""What a mount keeps beside itself is its own: `/mnt/a_b` and `/mnt/a/b`
have state files of their own (their `models.ini` and log), and a first
mount starts a bounded number of indexing processes, whatever the number
of CPUs.  Measured before: both mountpoints were `mnt_a_b`, and one process
per CPU was started."""

from __future__ import annotations

import time
from pathlib import Path

from compatfs.testing.gemma3 import legacy_gemma3_text
from compatfs.testing.store import add_model
from compatfs.view.catalog import BlobViews
from compatfs.view.index import Index

from conftest import Mount, needs_fuse


def test_mountpoints_have_names_of_their_own():
    from compatfs.files.statedir import mount_name

    points = [
        "/mnt/a_b",
        "/mnt/a/b",
        "/mnt/a%5Fb",
        "/mnt/a%2Fb",
        "/",
        "/root",
        "/_",
        "/mnt/a b",
        "/mnt/a~b",
        "/" + "x" * 300,
        "/" + "x" * 299 + "y",
        "/mnt/ü",
    ]
    names = [mount_name(p) for p in points]
    assert len(set(names)) == len(points), names
    assert mount_name("/mnt/compat") == "mnt_compat" and mount_name("/mnt/compat/") == "mnt_compat"
    assert all("/" not in n and len(n.encode()) <= 255 for n in names)


@needs_fuse
def test_two_mounts_whose_points_differ_by_an_underscore_publish_their_own_preset(tmp_path):
    base = tmp_path / "m"
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    mounts = []
    try:
        for i, point in enumerate((base / "a_b", base / "a" / "b")):
            store = tmp_path / f"store{i}"
            add_model(store, f"model{i}", legacy_gemma3_text(tmp_path / f"g{i}.gguf", seed=i), tag="1b")
            mounts.append(Mount(store, point, env=env))
        for i, m in enumerate(mounts):
            text = (m / "models.ini").read_text()
            assert f"/model{i}:1b/model.gguf" in text and f"model{1 - i}" not in text, (m.path, text)
    finally:
        for m in mounts:
            m.close()


def _children() -> set[int]:
    """This process's children but multiprocessing's resource tracker."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            out |= {
                int(p)
                for p in (task / "children").read_text().split()
                if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()
            }
        except OSError:
            continue
    return out


def test_indexing_starts_a_bounded_number_of_processes(tmp_path):
    blobs = [legacy_gemma3_text(tmp_path / f"g{i}.gguf", seed=i) for i in range(3 * BlobViews.MAX_WORKERS)]
    before = _children()
    views = BlobViews(index=Index(None, True), workers=64)  # as on a 64-core host
    try:
        views.prefetch(blobs)
        most, deadline = 0, time.monotonic() + 120
        while time.monotonic() < deadline and (len(views.index) < len(blobs)):
            most = max(most, len(_children() - before))
            time.sleep(0.01)
        assert len(views.index) == len(blobs)
        assert 0 < most <= BlobViews.MAX_WORKERS, most
    finally:
        views.close()
