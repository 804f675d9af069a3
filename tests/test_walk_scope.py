"""A `walkscope.scope` (the folders one scan's walks share) changes no outcome:
the same statuses, errors, refusals (Denied, the keep-out mount, symlink
loops) and `Recorder` chains as walks from "/", every folder still checked;
its descriptors are bounded and all closed as it ends, however it ends; a
folder is seen as of the moment the scope first reached it, by the walks of
the thread that opened it only."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import tempfile
import threading
from pathlib import Path

import pytest

from compatfs.errors import GGUFError
from compatfs.files import lookup, walkscope
from compatfs.files.access import READ, Caller, Recorder
from compatfs.files.lookup import Denied, open_regular, resolved, status
from compatfs.files.walkscope import scope

NOBODY = 65534
_NONE = 0xFFFFFFFF


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


@pytest.fixture
def tree(monkeypatch):
    """A tree searchable by others (pytest's own folders are not), with a
    0700 folder, one whose ACL refuses `NOBODY`, one whose ACL is malformed,
    symlinks (relative, absolute, a loop, dangling, into the keep-out mount)."""
    base = Path(tempfile.mkdtemp(prefix="walk-scope-", dir="/tmp"))
    os.chmod(base, 0o755)
    deep = base / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "file").write_text("x")
    (deep / "other").write_text("y")
    for name in ("locked", "acl"):
        (base / "a" / name).mkdir()
        (base / "a" / name / "file").write_text("z")
    os.chmod(base / "a" / "locked", 0o700)
    os.setxattr(  # user::rwx, user:NOBODY:---, group::r-x, mask::r-x, other::r-x
        base / "a" / "acl",
        "system.posix_acl_access",
        _acl((0x01, 7, _NONE), (0x02, 0, NOBODY), (0x04, 5, _NONE), (0x10, 5, _NONE), (0x20, 5, _NONE)),
    )
    (base / "a" / "rel").symlink_to("b/c")
    (base / "a" / "abs").symlink_to(base / "a" / "b")
    (base / "a" / "loop").symlink_to("loop")
    (base / "a" / "gone").symlink_to("nowhere")
    (base / "mnt" / "inside").mkdir(parents=True)
    (base / "a" / "in").symlink_to("../mnt/inside")
    monkeypatch.setenv(lookup.KEEP_OUT_ENV, "[]")
    lookup.keep_out(base / "mnt")
    yield base
    shutil.rmtree(base)


def _paths(base: Path) -> list[Path]:
    a = base / "a"
    return [
        base,
        a / "b" / "c",
        a / "b" / "c" / "file",
        a / "b" / "c" / "other",
        a / "b" / "c" / "file" / "x",  # (not a folder)
        a / "b" / "missing",
        a / "rel" / "file",
        a / "abs" / "c" / "file",
        a / "abs" / ".." / "b" / "c",
        a / "loop" / "file",
        a / "gone",
        a / "in" / "x",
        base / "mnt" / "inside",
        a / "locked" / "file",
        a / "locked",
        a / "acl" / "file",
        a / "acl",
    ]


def _callers() -> list[Caller | None]:
    return [None, Caller(0, 0, 0), Caller(NOBODY, NOBODY, 0), Caller(1000, 1000, 0), Recorder()]


def _key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _outcome(call) -> tuple:
    try:
        return ("ok", call())
    except (OSError, GGUFError) as e:
        return ("error", type(e).__name__, getattr(e, "errno", None), str(e))


def _opened(path: Path, caller: Caller | None) -> tuple:
    fd, st = open_regular(path, caller)
    os.close(fd)
    return _key(st)


def _resolved(path: Path) -> tuple:
    fd = resolved(path)
    try:
        return _key(os.fstat(fd))
    finally:
        os.close(fd)


def _every(paths: list[Path]) -> list[tuple]:
    """Every outcome for `paths`: status (a Recorder's chain with it), open_regular
    and resolved, by each caller, walked twice."""
    out = []
    for _ in range(2):
        for caller in _callers():
            for path in paths:
                for need in (0, READ):
                    who = Recorder() if isinstance(caller, Recorder) else caller
                    got = _outcome(lambda: _key(status(path, who, need)))  # noqa: B023
                    chain = [(_key(st), acl, bit) for st, acl, bit in who.chain] if isinstance(who, Recorder) else None
                    out.append((str(path), repr(caller), need, got, chain))
                out.append((str(path), repr(caller), "open", _outcome(lambda: _opened(path, caller))))  # noqa: B023
        out.extend((str(p), "resolved", _outcome(lambda: _resolved(p))) for p in paths)  # noqa: B023
    return out


def _all(base: Path) -> list[tuple]:
    """Every outcome over the tree (`_every` of its paths)."""
    return _every(_paths(base))


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_scope_gives_what_walks_from_the_root_give(tree):
    plain = _all(tree)
    before = _fds()
    with scope() as held:
        scoped = _all(tree)
        assert held.folders  # (folders were shared)
    assert scoped == plain
    assert _fds() == before
    # The refusals are there to compare: a 0700 folder, an ACL, a loop, the mount.
    said = str(plain)
    for refusal in ("may not search", "too many levels", "compatfs's own mount", "is not a folder"):
        assert refusal in said, refusal


def test_a_scope_spares_the_shared_folders_lookups(tree, monkeypatch):
    opened: list[str] = []
    real = os.open

    def counted(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    path = tree / "a" / "b" / "c" / "file"
    status(path)
    from_root = len(opened)
    with scope():
        status(path)
        opened.clear()
        status(path, Recorder(), READ)
        status(tree / "a" / "b" / "c" / "other")
    assert len(opened) == 2 < from_root  # (each file's own name only)


def test_a_recorder_records_every_folder_on_the_way_in_a_scope(tree):
    path = tree / "a" / "b" / "c" / "file"
    rec = Recorder()
    status(path, rec, READ)
    with scope():
        status(path)
        again = Recorder()
        status(path, again, READ)
    assert len(again.chain) == len(path.parts) and again.chain == rec.chain


def test_a_denied_folder_is_denied_from_a_kept_one_below_it(tree):
    inside = tree / "a" / "locked" / "file"
    nobody = Caller(NOBODY, NOBODY, 0)
    with pytest.raises(Denied) as plain:
        status(inside, nobody)
    with scope() as held:
        status(inside)  # (the root's walk keeps the 0700 folder)
        assert str(tree / "a" / "locked") in held.folders
        with pytest.raises(Denied) as scoped:
            status(inside, nobody)
    assert str(scoped.value) == str(plain.value)


def test_the_keep_out_mount_is_refused_below_a_kept_folder(tree):
    path = tree / "a" / "b" / "c" / "file"
    with scope():
        status(path)
        lookup.keep_out(tree / "a" / "b")  # (after the folders were kept)
        with pytest.raises(OSError) as e:
            status(path)
    assert e.value.errno == errno.ELOOP and "compatfs's own mount" in str(e.value)


def test_descriptors_are_closed_after_an_exception_inside_the_scope(tree):
    before = _fds()
    with pytest.raises(RuntimeError), scope() as held:
        status(tree / "a" / "b" / "c" / "file")
        with pytest.raises(OSError):
            status(tree / "a" / "loop" / "file")
        assert len(_fds() - before) == len(held.folders) > 0
        raise RuntimeError("the scan failed")
    assert _fds() == before
    assert getattr(walkscope._thread, "scope", None) is None


def test_a_nested_scope_shares_the_outer_one(tree):
    with scope() as outer:
        with scope() as inner:
            status(tree / "a" / "b" / "c" / "file")
        assert inner is outer and outer.folders  # (still held)


def test_a_scope_keeps_at_most_its_bound_of_descriptors(tree, monkeypatch):
    monkeypatch.setattr(walkscope, "SCOPE_FOLDERS", 4)
    many = tree / "many"
    for i in range(12):
        (many / f"d{i}" / "e").mkdir(parents=True)
    deep = tree.joinpath(*"abcdefghij")
    deep.mkdir(parents=True)
    paths = [*(many / f"d{i}" / "e" for i in range(12)), deep, *_paths(tree)]
    plain = [_outcome(lambda: _key(status(p, Recorder()))) for p in paths]  # noqa: B023
    before = _fds()
    with scope() as held:
        for _ in range(2):
            scoped = [_outcome(lambda: _key(status(p, Recorder()))) for p in paths]  # noqa: B023
            assert scoped == plain
        assert len(held.folders) <= 4 and len(_fds() - before) <= 4
        for node in held.folders.values():  # (every kept folder's folders up to "/" are kept)
            assert all(held.folders.get(up.key) is up for up in node.chain())
    assert _fds() == before


def test_another_threads_walks_start_from_the_root(tree):
    folder = tree / "a" / "b"
    path = folder / "c" / "file"
    nobody = Caller(NOBODY, NOBODY, 0)
    seen: list[tuple] = []

    def walk() -> None:
        seen.append(_outcome(lambda: _key(status(path, nobody))))

    with scope():
        status(path, nobody)
        os.chmod(folder, 0o700)  # (after the scope first reached it)
        try:
            helper = threading.Thread(target=walk)
            helper.start()
            helper.join()
            walk()  # (this thread: the folder as the scope first found it)
        finally:
            os.chmod(folder, 0o755)
        os.chmod(folder, 0o700)
        try:
            with scope():  # (shared: still as first found)
                walk()
        finally:
            os.chmod(folder, 0o755)
    assert seen[0][:2] == ("error", "Denied")
    assert seen[1][0] == "ok" and seen[2][0] == "ok"
    os.chmod(folder, 0o700)
    try:
        with scope():  # (a new scope: as the folder is now)
            walk()
    finally:
        os.chmod(folder, 0o755)
    assert seen[3][:2] == ("error", "Denied")


def test_a_kept_folders_status_is_the_one_first_read(tree):
    folder = tree / "a" / "b"
    with scope():
        first = status(folder)
        os.chmod(folder, 0o750)
        assert status(folder) == first  # (what marks a change: seen by the next scan)
    assert status(folder).st_mode != first.st_mode
