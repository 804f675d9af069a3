"""The attribute memo holds every path the mount shows, however many models
the store has (a store of thousands of models is answered from memory, not
recomputed past some count), and a bounded number of paths that do not exist."""

from __future__ import annotations


from compatfs.fuse.paths import Paths


def test_every_existing_path_is_remembered_and_misses_are_bounded():
    memo = Paths()
    computed: list[str] = []

    def attrs(path: str) -> dict | None:
        computed.append(path)
        return None if path.startswith("/missing") else {"st_size": len(path)}

    paths = [f"/model{i:05d}:latest/model.gguf" for i in range(40_000)]  # ~10,000 models' files
    for p in paths:
        memo.attrs(p, attrs)
    computed.clear()
    assert all(memo.attrs(p, attrs) == {"st_size": len(p)} for p in paths)
    assert computed == [], f"{len(computed)} of {len(paths)} answers computed again"
    for i in range(3 * Paths.MISSES_KEPT):
        memo.attrs(f"/missing{i}", attrs)
    assert len(memo._attrs) <= len(paths) + Paths.MISSES_KEPT
