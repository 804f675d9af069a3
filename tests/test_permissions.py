"""As root the mount is shared (allow_other): nobody reads through it what they
could not read from the store itself.  A throwaway unprivileged user reads
through the mount; skipped unless the tests run as root."""
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from compatfs.store import MODEL
from compatfs.testing import gemma3, llama
from compatfs.testing.store import add_model

from conftest import Mount, needs_fuse
from test_hostile_mount import blob_of

pytestmark = [needs_fuse, pytest.mark.skipif(os.getuid() != 0 or not shutil.which("runuser"),
                                             reason="needs root (a throwaway user, allow_other) and runuser")]


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


@pytest.fixture
def base():
    """A folder every user may traverse (pytest's own tmp folders are root-only)."""
    d = Path(tempfile.mkdtemp(prefix="compatfs-perm-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for p in d.iterdir():
        if os.path.ismount(p):
            subprocess.run(["fusermount3", "-u", "-z", str(p)], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", ["translated", "--no-translate"])
def test_nobody_reads_more_than_the_store_lets_them(user, base, mode):
    store = base / "store"
    add_model(store, "open", gemma3.legacy_gemma3_text(base / "g.gguf"), tag="1b")
    add_model(store, "private", llama.plain_llama_text(base / "p.gguf"), tag="1b")
    add_model(store, "group", gemma3.legacy_gemma3_text(base / "g2.gguf", seed=4), tag="1b")
    blob_of(store, "private", "1b").chmod(0o600)
    shutil.chown(blob_of(store, "group", "1b"), "root", user)
    blob_of(store, "group", "1b").chmod(0o640)
    outside = base / "outside"
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

    m = Mount(store, base / "mnt", *([mode] if mode.startswith("--") else []))
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
        for name, blob in (("private:1b", blob_of(store, "private", "1b")), ("shadow:latest", Path("/etc/shadow")),
                           ("group:1b", blob_of(store, "group", "1b"))):
            st, want = (m / f"{name}/model.gguf").stat(), os.stat(blob)
            if name == "shadow:latest" and mode == "translated":   # not GGUF: shown empty, unreadable
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
        assert (m / "open:1b/model.gguf").read_bytes()[:4] == b"GGUF"   # root still can
        assert m.alive
    finally:
        m.close()
