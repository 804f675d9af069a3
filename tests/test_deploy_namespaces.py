"""The container sidecar pattern without a container engine: compatfs mounts
in one mount namespace (the sidecar's, `unshare --mount --propagation
shared`), and a process in another namespace (the llama-server container's,
receiving mounts as a slave, as HostToContainer/rslave do) reads the files.
Both hang off a private "host" namespace holding the shared directory, so
nothing reaches the namespace the tests run in.  As root only."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import fuse_available

BIN = Path(sys.executable).parent


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not fuse_available():
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare and FUSE")
def test_sidecar_mount_is_read_from_another_namespace(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "gemma3", gemma3.legacy_gemma3_vision(tmp_path / "g.gguf"), tag="4b")
    shared = tmp_path / "shared"  # the directory both "containers" bind
    shared.mkdir()
    out = tmp_path / "consumer.sha256"
    model = "gemma3:4b/mmproj.gguf"
    # host: a private namespace in which `shared` is a shared mount (as Docker
    # requires of an rshared bind source); consumer: started first, a slave of
    # it, waits for the file; sidecar: its own namespace with shared
    # propagation, runs the mount in the foreground until the host unmounts it.
    host = f"""
set -u
mount --bind {shared} {shared}
mount --make-shared {shared}
mkdir -p {shared}/compat
unshare --mount --propagation slave sh -c '
  i=0; while [ ! -e {shared}/compat/{model} ]; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.05; done
  sha256sum {shared}/compat/{model} > {out}
  grep -c " {shared}/compat fuse.compatfs " /proc/self/mounts >> {out}' &
consumer=$!
unshare --mount --propagation shared {BIN}/compatfs mount -f {store} {shared}/compat &
sidecar=$!
wait $consumer; status=$?
mountpoint -q {shared}/compat && echo "host sees the mount"
fusermount3 -u {shared}/compat 2>/dev/null || umount -l {shared}/compat
wait $sidecar
exit $status
"""
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", host],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "host sees the mount" in res.stdout
    digest, path, count = out.read_text().split()
    assert path == f"{shared}/compat/{model}" and count == "1"
    # The namespace the tests run in never saw it.
    assert not os.path.ismount(shared / "compat")
    # What the consumer read is the projector view the mount serves.
    m = mount_store(store)
    assert digest == hashlib.sha256((m / model).read_bytes()).hexdigest()
