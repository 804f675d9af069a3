"""Who may list a folder is decided at every open of it (the kernel keeps
listings, not who may read them).  Where compatfs._accel is built, root's
opens are answered in C (`_accel.opendir_gate`, put in the operations table
libfuse copies): an fh of its own and the flags that keep the listing, as
`CompatFS.opendir` answers root, with no Python callback; every other
caller's open still goes to `CompatFS.opendir`, which decides from the store
itself.  Without compatfs._accel every open goes to Python."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from compatfs.fuse import libfuse
from compatfs.fuse.libfuse import fuse
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.translate import accel
from conftest import Mount, needs_fuse

_OPENDIR = dict(fuse.fuse_operations._fields_)["opendir"]
_GET_CONTEXT = ctypes.CFUNCTYPE(ctypes.c_void_p)


class _Gate:
    """The process's one gate, its context and fallback played by the test."""

    def __init__(self) -> None:
        self.context: fuse.fuse_context | None = fuse.fuse_context()
        self.calls: list[bytes] = []
        self.answer = 0
        self._get = _GET_CONTEXT(lambda: ctypes.addressof(self.context) if self.context is not None else None)
        self._fallback = _OPENDIR(self._python)
        bits = libfuse._listing_bits()
        assert bits is not None and accel.native is not None
        address = accel.native.opendir_gate(
            ctypes.cast(self._fallback, ctypes.c_void_p).value,
            ctypes.cast(self._get, ctypes.c_void_p).value,
            fuse.fuse_context.uid.offset,
            fuse.fuse_file_info.fh.offset,
            *bits,
        )
        self.opendir = _OPENDIR(address)

    def _python(self, path, fip) -> int:
        self.calls.append(path)
        fip.contents.fh = 99
        return self.answer


@pytest.fixture(scope="module")
def gate():
    if accel.native is None:
        pytest.skip("compatfs._accel is not built")
    return _Gate()


def test_root_is_answered_in_c(gate):
    gate.context.uid, gate.context.gid = 0, 0
    fi = fuse.fuse_file_info(fh=77, flags=os.O_RDONLY)
    assert gate.opendir(b"/alpha:1b", ctypes.pointer(fi)) == 0
    assert gate.calls == [] and fi.fh not in (0, 77) and fi.keep_cache == 1 and fi.cache_readdir == 1
    assert fi.flags == os.O_RDONLY and fi.direct_io == 0  # nothing else touched
    again = fuse.fuse_file_info(fh=77)
    assert gate.opendir(b"/alpha:1b", ctypes.pointer(again)) == 0 and again.fh not in (0, 77, fi.fh)
    assert accel.native.dir_handle() not in (0, fi.fh, again.fh)  # (the handles Python's opens take)


@pytest.mark.parametrize("uid", [65534, 1000, 1 << 31])
def test_any_other_caller_is_answered_by_python(gate, uid):
    gate.context.uid, gate.context.gid = uid, 0
    gate.calls.clear()
    gate.answer = -13  # EACCES, as mfusepy's wrapper returns a refusal
    fi = fuse.fuse_file_info(fh=77)
    assert gate.opendir(b"/private:1b", ctypes.pointer(fi)) == -13
    assert gate.calls == [b"/private:1b"] and fi.fh == 99 and fi.keep_cache == 0 and fi.cache_readdir == 0
    gate.answer = 0
    assert gate.opendir(b"/open:1b", ctypes.pointer(fi)) == 0 and gate.calls[-1] == b"/open:1b"


def test_no_context_is_answered_by_python(gate):
    gate.context, saved = None, gate.context
    try:
        gate.calls.clear()
        fi = fuse.fuse_file_info(fh=77)
        assert gate.opendir(b"/alpha:1b", ctypes.pointer(fi)) == 0 and gate.calls == [b"/alpha:1b"]
    finally:
        gate.context = saved


def test_one_gate_per_process(gate):
    other = _OPENDIR(lambda path, fip: 0)
    with pytest.raises(ValueError, match="already gates"):
        accel.native.opendir_gate(
            ctypes.cast(other, ctypes.c_void_p).value,
            ctypes.cast(gate._get, ctypes.c_void_p).value,
            fuse.fuse_context.uid.offset,
            fuse.fuse_file_info.fh.offset,
            *libfuse._listing_bits(),
        )


@needs_fuse
@pytest.mark.skipif(os.getuid() != 0, reason="needs root (allow_other, another user)")
@pytest.mark.parametrize("compiled", [True, False], ids=["accel", "no-accel"])
def test_root_lists_and_a_refused_caller_stays_refused(open_tmp, compiled):
    """The store sits in a folder only root may pass: root lists every
    folder (kept by the kernel from then on), uid 65534 is refused each,
    and lists them once that folder lets it pass; with the gate (accel)
    and without it."""
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built")
    private = open_tmp / "private"
    root = private / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    for name in ("alpha", "beta"):
        add_model(root, name, blob, tag="1b")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    private.chmod(0o700)
    env = {"XDG_STATE_HOME": str(open_tmp / "state"), "COMPATFS_NO_ACCEL": "0" if compiled else "1"}
    m = Mount(root, open_tmp / "mnt", env=env)
    try:
        for _ in range(2):
            assert {"alpha:1b", "beta:1b"} <= set(os.listdir(m.path))
            assert os.listdir(m / "alpha:1b") == os.listdir(m / "beta:1b") == ["model.gguf"]
        assert ("answered in C" in m.log_text()) == compiled, m.log_text()
        for folder in (m.path, m / "alpha:1b", m / "beta:1b"):
            res = subprocess.run(
                ["ls", "-a", str(folder)], user=65534, group=65534, extra_groups=[], capture_output=True, timeout=30
            )
            assert res.returncode != 0 and b"Permission denied" in res.stderr, (folder, res)
        assert os.listdir(m / "alpha:1b") == ["model.gguf"]  # root still
        private.chmod(0o755)  # (decided from the store as it is now)
        res = subprocess.run(
            ["ls", "-a", str(m / "beta:1b")], user=65534, group=65534, extra_groups=[], capture_output=True, timeout=30
        )
        assert res.returncode == 0 and res.stdout.split() == [b".", b"..", b"model.gguf"], res
        assert m.alive
    finally:
        m.close()


_INSTALL = r"""
import ctypes, logging, sys
from compatfs.fuse import libfuse
from compatfs.fuse.libfuse import fuse
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
seen = {}
def real(argc, argv, ops, size, data):
    seen["opendir"] = ctypes.cast(ops.contents.opendir, ctypes.c_void_p).value
    seen["readdir"] = ctypes.cast(ops.contents.readdir, ctypes.c_void_p).value
    return 0
fuse.fuse_main_real = real
native = libfuse.accel.native
if native is not None:
    make = native.opendir_gate
    native.opendir_gate = lambda *args: seen.setdefault("gate", make(*args))
    ends = native.readdir_gate
    native.readdir_gate = lambda *args: seen.setdefault("ends", ends(*args))
class Ops(fuse.Operations):
    use_ns = True
    root_lists_all = ROOT_LISTS_ALL
    def opendir(self, path):
        return 0
    def readdir(self, path, fh):
        return []
if BROKEN:
    def broken(self, ops):
        raise RuntimeError("no gate today")
    libfuse.FUSE._gate_folders = broken
libfuse.FUSE(Ops(), "/nonexistent", foreground=True)
assert fuse.fuse_main_real is real
print(*("gated" if seen.get(g) and seen[op] == seen[g] else "python" for op, g in (("opendir", "gate"), ("readdir", "ends"))))
"""


@pytest.mark.parametrize(
    "root_lists_all, broken, compiled, want",
    [
        (True, False, True, "gated gated"),
        (True, False, False, "python python"),
        (False, False, True, "python python"),
        (True, True, True, "python python"),
    ],
    ids=["accel", "no-accel", "not-root_lists_all", "gate-fails"],
)
def test_the_gate_goes_in_the_table_libfuse_copies(root_lists_all, broken, compiled, want):
    """`libfuse.FUSE` puts the gates (opendir's, readdir's) in the
    operations table mfusepy hands libfuse, where compatfs._accel is built
    and the filesystem lets root list anything; mfusepy's own call is back in place once made; a gate
    that cannot be made leaves the table as mfusepy made it (the mount goes on)."""
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built")
    code = _INSTALL.replace("ROOT_LISTS_ALL", str(root_lists_all)).replace("BROKEN", str(broken))
    env = {**os.environ, "COMPATFS_NO_ACCEL": "0" if compiled else "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == want, res.stdout
    assert ("no gate today" in res.stdout) == broken, res.stdout
