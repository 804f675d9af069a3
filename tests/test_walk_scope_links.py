"""A `walkscope.scope` keeps the folders path prefixes resolve to through
symlinks (relative, absolute, with "..", chains of them) and walks on from
them, and still changes no outcome: the same statuses, errors, refusals
(Denied, the keep-out mount, the 40-link limit), `Recorder` chains and hang
guards asked (`probe.reach`) as walks from "/"; a symlink changed between
two scopes is seen by the second; descriptors stay bounded and all close."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from test_walk_scope import NOBODY, _NONE, _acl, _every, _fds, _key, _outcome

from compatfs.files import lookup, walkscope
from compatfs.files.access import READ, BadACL, Caller, Recorder
from compatfs.files.lookup import status
from compatfs.files.walkscope import Link, scope


@pytest.fixture
def store(monkeypatch):
    """`real/m/b/c` (two files) reached through symlinks of every kind; a
    0700 folder and one whose ACL refuses `NOBODY`, each behind a symlink;
    chains of 39, 40 and 41 symlinks; a symlink into the keep-out mount."""
    base = Path(tempfile.mkdtemp(prefix="walk-links-", dir="/tmp"))
    os.chmod(base, 0o755)
    real = base / "real"
    (real / "m" / "b" / "c").mkdir(parents=True)
    for name in ("file", "other"):
        (real / "m" / "b" / "c" / name).write_text(name)
    (base / "x").mkdir()
    (base / "link").symlink_to("real")
    (base / "abs").symlink_to(real)
    (base / "chain").symlink_to("chain2")
    (base / "chain2").symlink_to(base / "chain3")
    (base / "chain3").symlink_to("x/../real/m")
    (base / "x" / "up").symlink_to("../real/m/b")  # (relative, with "..")
    (base / "dot").symlink_to(".")
    (base / "root").symlink_to("/")
    (base / "swap").symlink_to("real/m/b")
    (base / "filelink").symlink_to("real/m/b/c/file")
    (real / "m" / "b" / "back").symlink_to("../../m")  # (a symlink below a kept symlinked prefix)
    for name in ("locked", "acl"):
        (base / name / "in").mkdir(parents=True)
        (base / name / "in" / "file").write_text("z")
        (base / f"to-{name}").symlink_to(name)
        (base / f"via-{name}").symlink_to(f"{name}/in")
    os.chmod(base / "locked", 0o700)
    os.setxattr(  # user::rwx, user:NOBODY:---, group::r-x, mask::r-x, other::r-x
        base / "acl",
        "system.posix_acl_access",
        _acl((0x01, 7, _NONE), (0x02, 0, NOBODY), (0x04, 5, _NONE), (0x10, 5, _NONE), (0x20, 5, _NONE)),
    )
    for length in (39, 40, 41):
        (base / f"n{length}-{length}").symlink_to("real")
        for i in range(length - 1, 0, -1):
            (base / f"n{length}-{i}").symlink_to(f"n{length}-{i + 1}")
    (real / "m" / "one").symlink_to("b")  # (after 39: the 40th symlink)
    (real / "m" / "two").symlink_to("one")  # (after 39: the 41st)
    (base / "mnt" / "inside").mkdir(parents=True)
    (base / "in").symlink_to("mnt/inside")
    monkeypatch.setenv(lookup.KEEP_OUT_ENV, "[]")
    lookup.keep_out(base / "mnt")
    yield base
    shutil.rmtree(base)


def _paths(base: Path) -> list[Path]:
    inner = ("m", "b", "c", "file")
    return [
        *(base.joinpath(top, *inner) for top in ("link", "abs", "root" + str(base / "link"))),
        base / "link" / "m" / "b" / "c" / "other",
        base / "link" / "m" / "b" / "c" / "file" / "x",  # (not a folder)
        base / "link" / "m" / "b" / "missing",
        base / "link" / "m" / "b" / "back" / "b" / "c" / "file",
        base / "chain" / "b" / "c" / "file",
        base / "x" / "up" / "c" / "file",
        base / "dot" / "link" / "m" / "b" / "c" / "file",
        base / "swap" / "c" / "file",
        base / "filelink",
        base / "filelink" / "x",
        *(base / f"{how}-{name}" / rest for how in ("to", "via") for name in ("locked", "acl") for rest in ("", "in")),
        base / "to-locked" / "in" / "file",
        base / "via-acl" / "file",
        *(base / f"n{n}-1" / "m" / "b" / "c" / "file" for n in (39, 40, 41)),
        *(base / "n39-1" / "m" / via / "c" / "file" for via in ("one", "two")),
        base / "in" / "x",
        base / "in",
    ]


def test_symlinked_prefixes_are_kept_and_give_what_walks_from_the_root_give(store):
    plain = _every(_paths(store))
    before = _fds()
    with scope() as held:
        scoped = _every(_paths(store))
        linked = {key: node.path for key, node in held.folders.items() if key != node.path}
    assert scoped == plain
    assert _fds() == before
    for key in ("link", "link/m/b", "abs/m", "chain", "x/up/c", "to-acl", "n39-1", "n39-1/m/one"):
        assert str(store / key) in linked, key
    assert linked[str(store / "chain")] == str(store / "real" / "m")
    assert not any(key.startswith(str(store / "dot")) for key in linked)  # ("." is the folder it is in)
    said = str(plain)
    for refusal in ("may not search", "too many levels", "compatfs's own mount", "is not a folder", "ACL"):
        assert refusal in said, refusal
    ok = [o for o in plain if o[0] == str(store / "n39-1" / "m" / "one" / "c" / "file") and o[1] == "None"]
    assert ok[0][3][0] == "ok"  # (40 symlinks: the limit, not past it)


def test_a_symlinked_prefix_is_resolved_once(store, monkeypatch):
    opened: list[str] = []
    read: list[int] = []
    real_open, real_readlink = os.open, os.readlink

    def counted(path, *args, **kwargs):
        opened.append(path)
        return real_open(path, *args, **kwargs)

    def counted_link(*args, **kwargs):
        read.append(1)
        return real_readlink(*args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    monkeypatch.setattr(os, "readlink", counted_link)
    folder = store / "chain" / "b" / "c"
    with scope():
        status(folder / "file", Recorder(), READ)
        opened.clear()
        read.clear()
        rec = Recorder()
        status(folder / "other", rec, READ)
    assert opened == ["other"] and not read  # (the file's own name only)
    plain = Recorder()
    status(folder / "other", plain, READ)
    assert rec.chain == plain.chain and len(plain.chain) > len(folder.parts)


def test_a_symlink_changed_between_two_scopes_is_seen_by_the_second(store):
    path = store / "swap" / "c" / "file"
    nobody = Caller(NOBODY, NOBODY, 0)
    with scope():
        first = [_outcome(lambda: _key(status(path, who))) for who in (None, nobody)]  # noqa: B023
    (store / "swap").unlink()
    (store / "swap").symlink_to("locked/in")
    (store / "locked" / "in" / "c").mkdir()
    (store / "locked" / "in" / "c" / "file").write_text("elsewhere")
    with scope() as held:
        second = [_outcome(lambda: _key(status(path, who))) for who in (None, nobody)]  # noqa: B023
        assert held.folders[str(store / "swap")].path == str(store / "locked" / "in")
    plain = [_outcome(lambda: _key(status(path, who))) for who in (None, nobody)]  # noqa: B023
    assert second == plain != first
    assert second[1][:2] == ("error", "Denied")


def test_the_keep_out_mount_is_refused_below_a_kept_symlinked_prefix(store):
    path = store / "link" / "m" / "b" / "c" / "file"
    with scope():
        status(path)
        lookup.keep_out(store / "real" / "m")  # (after the prefixes were kept)
        with pytest.raises(OSError) as e:
            status(path)
    assert e.value.errno == errno.ELOOP and f"{store / 'real' / 'm'}, compatfs's own mount" in str(e.value)


def test_the_hang_guard_is_asked_as_from_the_root(store, monkeypatch):
    """Each symlink onto another mount has the rest of the walk's own path
    looked up first, in the same order, and a hung lookup fails the same."""
    other = str(store / "real")
    asked: list[tuple[str, str]] = []

    def reach(rest: str, mount: str) -> None:
        asked.append((rest, mount))
        if "other" in rest:
            raise OSError(errno.ETIMEDOUT, f"{rest}: a lookup on {mount} did not end")

    monkeypatch.setattr(lookup, "leaves", lambda start, rest: other if rest.startswith(other) else None)
    monkeypatch.setattr(lookup, "reach", reach)
    paths = _paths(store)
    plain = _every(paths)
    plain_asked = asked[:]
    asked.clear()
    with scope() as held:
        scoped = _every(paths)
        assert any(isinstance(s, Link) for node in held.folders.values() for s in node.steps)
    assert scoped == plain and asked == plain_asked
    assert "did not end" in str(plain) and len(plain_asked) > 100


def test_a_bounded_scope_of_symlinked_prefixes(store, monkeypatch):
    monkeypatch.setattr(walkscope, "SCOPE_FOLDERS", 12)
    paths = _paths(store)
    plain = [_outcome(lambda: _key(status(p, Recorder()))) for p in paths]  # noqa: B023
    before = _fds()
    with scope() as held:
        for _ in range(2):
            assert [_outcome(lambda: _key(status(p, Recorder()))) for p in paths] == plain  # noqa: B023
        assert len(held.folders) <= 12 and len(_fds() - before) <= 12
        for node in held.folders.values():  # (every kept folder's chain up to "/" is kept)
            assert all(held.folders.get(up.key) is up for up in node.chain())
    assert _fds() == before


def test_descriptors_close_after_an_exception_with_symlinked_prefixes_kept(store):
    before = _fds()
    with pytest.raises(RuntimeError), scope() as held:
        for path in _paths(store):
            _outcome(lambda: status(path, Recorder()))  # noqa: B023
        assert any(key != node.path for key, node in held.folders.items())
        assert len(_fds() - before) == len(held.folders)
        raise RuntimeError("the scan failed")
    assert _fds() == before


def test_a_resolution_too_long_or_past_an_unreadable_acl_is_not_kept(store, monkeypatch):
    """Walked afresh each time instead, with the same outcomes."""
    real_acl = walkscope.read_acl

    def read_acl(path: str):
        if os.readlink(path) == str(store / "real" / "m"):
            raise BadACL("cannot read: no")
        return real_acl(path)

    monkeypatch.setattr(walkscope, "read_acl", read_acl)
    monkeypatch.setattr(lookup, "ENTRY_STEPS", 3)
    paths = _paths(store)
    plain = _every(paths)
    with scope() as held:
        assert _every(paths) == plain
        linked = {key for key, node in held.folders.items() if key != node.path}
    assert "its access ACL is unreadable (cannot read: no)" in str(plain)
    assert str(store / "link") in linked and str(store / "link" / "m") in linked  # (its own ACL: read when asked)
    for key in ("link/m/b/back", "x/up", "chain", "n39-1"):
        assert str(store / key) not in linked, key
