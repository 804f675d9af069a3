"""A caller's supplementary groups decide as the kernel's would, in every pid
namespace: with the daemon in the host's, a reader holding group 4242 is
refused a blob whose ACL says `group:4242:---` and `other::r--`, a reader
without it is served; with the daemon in a pid namespace of its own (as in a
container without the host's pids), a caller's pid is 0 to it and its groups
cannot be known: where they would decide, refused (the landed code took them
for none, and served the reader holding 4242); where they would not, served."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import needs_fuse, wait_until
from test_hostile_mount import blob_of

pytestmark = [
    needs_fuse,
    pytest.mark.skipif(
        os.getuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
        reason="needs root (allow_other, another user, namespaces), unshare, setpriv",
    ),
]

_NONE = 0xFFFFFFFF
USER_OBJ, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x04, 0x08, 0x10, 0x20


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def reads(path: Path, groups: list[int]) -> bool:
    """Whether uid/gid 65534 holding `groups` reads `path` whole."""
    flag = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    res = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", *flag, "cat", str(path)], capture_output=True, timeout=30
    )
    assert res.returncode == 0 or b"Permission denied" in res.stderr, res.stderr
    return res.returncode == 0


@contextmanager
def daemon(store: Path, mnt: Path, own_pid_namespace: bool):
    """compatfs serving `store` at `mnt`, in the host's pid namespace or in
    one of its own (`unshare --pid --fork --mount-proc`: a mount namespace
    of its own too, so `mnt` sits in a shared mount that takes its mount back
    to the host's)."""
    share = mnt.parent
    prefix: list[str] = []
    if own_pid_namespace:
        subprocess.run(["mount", "--bind", str(share), str(share)], check=True)
        subprocess.run(["mount", "--make-shared", str(share)], check=True)
        prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "unchanged"]
    mnt.mkdir()
    log = open(share.parent / "daemon.log", "wb")
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "compatfs", "mount", "-f", "-v", str(store), str(mnt)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "COMPATFS_CACHE_DIR": str(share.parent / "cache"),
            "XDG_STATE_HOME": str(share.parent / "state"),
        },
    )
    try:
        wait_until(
            lambda: os.path.ismount(mnt) and (mnt / "plain:1b").exists(),
            20,
            what="the mount coming up",
            tolerate=(OSError,),
        )
        yield (share.parent / "daemon.log")
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        if own_pid_namespace:
            time.sleep(0.1)
            subprocess.run(["umount", "-l", str(share)], capture_output=True)


@pytest.mark.parametrize("own_pid_namespace", [False, True], ids=["host-pid-namespace", "own-pid-namespace"])
def test_groups_decide_or_refuse_in_every_pid_namespace(open_tmp, own_pid_namespace):
    store = open_tmp / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    add_model(store, "acl", blob, tag="1b")
    add_model(store, "plain", llama.plain_llama_text(open_tmp / "p.gguf", seed=3), tag="1b")
    for d in [store, *store.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)
    try:
        os.setxattr(
            blob_of(store, "acl", "1b"),
            "system.posix_acl_access",
            _acl((USER_OBJ, 6, _NONE), (GROUP_OBJ, 4, _NONE), (GROUP, 0, 4242), (MASK, 4, _NONE), (OTHER, 4, _NONE)),
        )
    except OSError as e:
        pytest.skip(f"the store's filesystem takes no POSIX ACLs: {e.strerror}")
    # What the kernel itself decides, outside the mount.
    assert not reads(blob_of(store, "acl", "1b"), [4242]) and reads(blob_of(store, "acl", "1b"), [])
    share = open_tmp / "share"
    share.mkdir(mode=0o755)
    with daemon(store, share / "mnt", own_pid_namespace) as log:
        acl, plain = share / "mnt" / "acl:1b" / "model.gguf", share / "mnt" / "plain:1b" / "model.gguf"
        assert not reads(acl, [4242])  # never fails open
        assert reads(acl, []) == (not own_pid_namespace)  # groups unknown, and they would decide: refused
        assert reads(plain, [4242]) and reads(plain, [])  # they would not decide: served
        if own_pid_namespace:
            assert "supplementary groups cannot be read" in log.read_text()
