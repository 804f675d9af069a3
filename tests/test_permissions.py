"""As root the mount is shared (allow_other): nobody reads through it what they
could not read from the store itself.  A throwaway unprivileged user reads
through the mount; skipped unless the tests run as root."""

import hashlib
import json
import os
import pwd
import shutil
import stat
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from compatfs.sources.ollama import MODEL
from compatfs.testing import gemma3, llama
from compatfs.testing.store import add_model

from conftest import Mount, needs_fuse
from test_hostile_mount import blob_of, expected

pytestmark = [
    needs_fuse,
    pytest.mark.skipif(
        os.getuid() != 0 or not shutil.which("runuser"), reason="needs root (a throwaway user, allow_other) and runuser"
    ),
]


@pytest.fixture(scope="module")
def user():
    """A throwaway system user with its own group; removed afterwards."""
    name = f"cfsperm{os.getpid() % 100000}"
    subprocess.run(["useradd", "-r", "-U", "-M", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


def as_user(user: str, *cmd) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *map(str, cmd)], capture_output=True, timeout=30)


def add_link(store: Path, name: str, target: str) -> Path:
    """Model `name` whose blob is a symlink to `target` (blobs linked to another disk)."""
    digest = hashlib.sha256(target.encode()).hexdigest()
    blob = store / "blobs" / f"sha256-{digest}"
    blob.symlink_to(target)
    manifest = store / "manifests/registry.ollama.ai/library" / name / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": MODEL, "digest": f"sha256:{digest}", "size": 0}]}))
    return blob


@pytest.mark.parametrize("mode", ["translated", "--no-translate"])
def test_nobody_reads_more_than_the_store_lets_them(user, open_tmp, mode):
    store = open_tmp / "store"
    add_model(store, "open", gemma3.legacy_gemma3_text(open_tmp / "g.gguf"), tag="1b")
    add_model(store, "private", llama.plain_llama_text(open_tmp / "p.gguf"), tag="1b")
    add_model(store, "group", gemma3.legacy_gemma3_text(open_tmp / "g2.gguf", seed=4), tag="1b")
    blob_of(store, "private", "1b").chmod(0o600)
    shutil.chown(blob_of(store, "group", "1b"), "root", user)
    blob_of(store, "group", "1b").chmod(0o640)
    outside = open_tmp / "outside"
    outside.mkdir(mode=0o755)
    elsewhere = llama.plain_llama_text(outside / "elsewhere.gguf", seed=2)
    elsewhere.chmod(0o644)
    secret = llama.plain_llama_text(outside / "secret.gguf", seed=3)
    secret.chmod(0o600)
    add_link(store, "linked", str(elsewhere))
    add_link(store, "linkedsecret", str(secret))
    add_link(store, "shadow", "/etc/shadow")
    add_link(store, "zero", "/dev/zero")
    for d in [store, *store.rglob("*")]:
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)

    m = Mount(store, open_tmp / "mnt", *([mode] if mode.startswith("--") else []))
    try:
        line = next(x for x in Path("/proc/mounts").read_text().splitlines() if f" {m.path} " in x)
        assert "default_permissions" in line and "allow_other" in line

        def reads(name: str) -> bool:
            res = as_user(user, "cat", m / f"{name}/model.gguf")
            assert res.returncode == 0 or b"Permission denied" in res.stderr, (name, res.stderr)
            if res.returncode == 0:
                assert res.stdout == (m / f"{name}/model.gguf").read_bytes()
            return res.returncode == 0

        assert reads("open:1b") and reads("group:1b") and reads("linked:latest")
        assert not reads("private:1b") and not reads("linkedsecret:latest") and not reads("shadow:latest")
        # Owner and mode come from the blob (through its symlink), minus write bits.
        for name, blob in (
            ("private:1b", blob_of(store, "private", "1b")),
            ("shadow:latest", Path("/etc/shadow")),
            ("group:1b", blob_of(store, "group", "1b")),
        ):
            st, want = (m / f"{name}/model.gguf").stat(), os.stat(blob)
            if name == "shadow:latest" and mode == "translated":  # not GGUF: shown empty, unreadable
                assert stat.S_IMODE(st.st_mode) == 0 and st.st_size == 0
                continue
            assert (st.st_uid, st.st_gid) == (want.st_uid, want.st_gid), name
            assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(want.st_mode) & 0o555, name
        # Only regular files are served, to anyone.
        with pytest.raises(OSError):
            (m / "zero:latest/model.gguf").read_bytes()
        assert (m / "zero:latest/model.gguf").stat().st_size == 0
        # A store the user cannot enter: nothing through the mount either.
        store.chmod(0o700)
        assert not reads("open:1b")
        res = as_user(user, "ls", m.path)
        assert res.returncode != 0 and b"Permission denied" in res.stderr
        assert (m / "open:1b/model.gguf").read_bytes()[:4] == b"GGUF"  # root still can
        assert m.alive
    finally:
        m.close()


# A reader run as the throwaway user: reads `$1` whole again and again for
# `$2` seconds, one line per open: the sha256 of what it read, or the error.
_READER = 'end=$(($(date +%s) + $2)); while [ "$(date +%s)" -lt "$end" ]; do sha256sum "$1" 2>&1; done; true'


def read_repeatedly(user: str, path: Path, seconds: int) -> list[str]:
    res = subprocess.run(
        ["runuser", "-u", user, "--", "/bin/sh", "-c", _READER, "reader", str(path), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    )
    assert res.returncode == 0, res.stderr
    return [line.split()[0] if line[64:65] == " " else line for line in res.stdout.splitlines()]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("mode,denial", [("translated", "file"), ("translated", "folder"), ("--no-translate", "file")])
def test_a_flipped_symlink_never_serves_what_the_caller_may_not_read(user, open_tmp, mode, denial):
    """The store's owner flips its blob's symlink between its own GGUF and a
    file it may not read (0600 root's, or 0644 in a 0700 folder), while it
    reads through the root mount: the landed code served the secret 17-22
    times in 20 s.  Decided on the descriptor served: never, in 8 s; and
    every read is the whole of the view it opened (size and bytes of one blob)."""
    store = open_tmp / "store"
    own = gemma3.legacy_gemma3_text(open_tmp / "own.gguf")
    own.chmod(0o644)
    secret_dir = open_tmp / "secret"
    secret_dir.mkdir(mode=0o755)
    secret = llama.plain_llama_text(secret_dir / "secret.gguf", seed=3)
    if denial == "file":
        secret.chmod(0o600)
    else:
        secret.chmod(0o644)
        secret_dir.chmod(0o700)
    (store / "blobs").mkdir(parents=True)
    blob = add_link(store, "flip", str(own))
    for d in [store, *store.rglob("*")]:
        if d.is_dir():
            d.chmod(0o755)
    translate = () if mode == "translated" else (mode,)
    m = Mount(store, open_tmp / "mnt", *translate)
    try:
        path = m / "flip:latest/model.gguf"
        own_view = path.read_bytes()
        assert sha(own_view) in read_repeatedly(user, path, 1)
        secret_views = {sha(expected(secret))} if mode == "translated" else {sha(secret.read_bytes())}
        stop = threading.Event()

        def flip():
            tmp = blob.with_name(blob.name + ".tmp")
            while not stop.is_set():
                for target in (secret, own):
                    tmp.symlink_to(target)
                    os.replace(tmp, blob)

        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            lines = read_repeatedly(user, path, 8)
        finally:
            stop.set()
            flipper.join(timeout=10)
        leaked = [x for x in lines if x in secret_views]
        other = [x for x in lines if "sha256sum:" not in x and x != sha(own_view) and x not in secret_views]
        served = [x for x in lines if x == sha(own_view)]
        assert not leaked, f"{len(leaked)} of {len(lines)} reads served the file the user may not read"
        assert not other, f"{len(other)} of {len(lines)} reads served other bytes (one view's size, another's bytes)"
        assert served, "the user's own model was never served"
        assert m.alive
    finally:
        m.close()


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX access ACL in the kernel's layout: (tag, permission bits, id)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


_NONE = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20


@pytest.mark.parametrize("mode", ["translated", "--no-translate"])
def test_acls_that_deny_are_honoured(user, open_tmp, mode):
    """A blob 0644 whose ACL says user:<user>:---, one whose ACL denies the
    user's group, and a folder on the way whose ACL denies the user search:
    the landed code checked mode bits only, and served all three."""
    store = open_tmp / "store"
    names = ("named", "group", "folder", "plain")
    for i, name in enumerate(names):
        add_model(store, name, gemma3.legacy_gemma3_text(open_tmp / f"{name}.gguf", seed=20 + i), tag="1b")
    for d in [store, *store.rglob("*")]:
        if d.is_dir():
            d.chmod(0o755)
    uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
    try:
        os.setxattr(
            blob_of(store, "named", "1b"),
            "system.posix_acl_access",
            _acl((USER_OBJ, 6, _NONE), (USER, 0, uid), (GROUP_OBJ, 4, _NONE), (MASK, 4, _NONE), (OTHER, 4, _NONE)),
        )
    except OSError as e:
        pytest.skip(f"the store's filesystem takes no POSIX ACLs: {e.strerror}")
    os.setxattr(
        blob_of(store, "group", "1b"),
        "system.posix_acl_access",
        _acl((USER_OBJ, 6, _NONE), (GROUP_OBJ, 4, _NONE), (GROUP, 0, gid), (MASK, 4, _NONE), (OTHER, 4, _NONE)),
    )
    # The "folder" model's blob is reached through a folder the user may not search.
    hidden = open_tmp / "hidden"
    hidden.mkdir(mode=0o755)
    os.setxattr(
        hidden,
        "system.posix_acl_access",
        _acl((USER_OBJ, 7, _NONE), (USER, 4, uid), (GROUP_OBJ, 5, _NONE), (MASK, 5, _NONE), (OTHER, 5, _NONE)),
    )
    blob = blob_of(store, "folder", "1b")
    shutil.move(blob, hidden / blob.name)
    blob.symlink_to(hidden / blob.name)
    for name in names:  # what the kernel itself decides, outside the mount
        res = as_user(user, "cat", blob_of(store, name, "1b"))
        assert (res.returncode == 0) == (name == "plain"), (name, res.stderr)

    m = Mount(store, open_tmp / "mnt", *([mode] if mode.startswith("--") else []))
    try:
        for name in names:
            res = as_user(user, "cat", m / f"{name}:1b/model.gguf")
            if name == "plain":
                assert res.returncode == 0 and res.stdout == (m / f"{name}:1b/model.gguf").read_bytes()
            else:
                assert res.returncode != 0 and b"Permission denied" in res.stderr, (name, res.stderr)
        # Root still reads them all; nobody else is denied by the named entries.
        assert all((m / f"{name}:1b/model.gguf").read_bytes()[:4] == b"GGUF" for name in names)
        assert m.alive
    finally:
        m.close()
