"""Folders' listings kept for C (`fuse.listings`, `_accel.listings_put`):
the readdir gate answers a listing with attributes of a kept folder from
what was kept, under the generation it was kept under, and sends every
other request to Python; through a mount, what a caller lists and stats
is what the Python readdir answers, a change of the store shows through
it, and most folders listed one after another are answered in C."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.translate import accel
from conftest import needs_fuse, wait_until

compiled = pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")

_GATE = r"""
import ctypes
from compatfs.fuse.libfuse import fuse
from compatfs.translate import accel
n = accel.native
READDIR = dict(fuse.fuse_operations._fields_)["readdir"]
FILLER = READDIR._argtypes_[2]
PLUS = 1
calls, filled, room = [], [], [99]
def python(path, buf, filler, offset, fip, flags):
    calls.append(path)
    return 0
def fill(buf, name, st, offset, flags):
    if len(filled) >= room[0]:
        return 1
    filled.append((name.decode(), st.contents.st_ino, st.contents.st_size, offset, flags))
    return 0
fallback, filler = READDIR(python), FILLER(fill)
gated = READDIR(n.readdir_gate(ctypes.cast(fallback, ctypes.c_void_p).value, fuse.fuse_file_info.fh.offset,
                               ctypes.sizeof(fuse.c_stat), PLUS))

def st(ino, size=0):
    s = fuse.c_stat(st_ino=ino, st_size=size, st_mode=0o100444)
    return ctypes.string_at(ctypes.addressof(s), ctypes.sizeof(s))

def ask(path, offset, fh, flags=PLUS, fits=99):
    calls.clear(); filled.clear(); room[0] = fits
    fi = fuse.fuse_file_info(fh=fh)
    assert gated(path, None, filler, offset, ctypes.pointer(fi), flags) == 0
    return len(calls), list(filled)

out = {}
out["nothing kept"] = ask(b"/a:1b", 0, n.dir_handle())
n.listings_generation(5)
entries = [(b".", st(11), 0), (b"..", st(1), 0), (b"model.gguf", st(42, 1234), 2)]
out["kept"] = n.listings_put(b"/a:1b", 5, entries)
out["has"] = (n.listings_has(b"/a:1b", 5), n.listings_has(b"/a:1b", 4), n.listings_has(b"/b:1b", 5))
fh = n.dir_handle()
out["answered"] = ask(b"/a:1b", 0, fh)
out["then its end"] = ask(b"/a:1b", 3, fh)
out["without attributes"] = ask(b"/a:1b", 0, n.dir_handle(), flags=0)
out["another folder"] = ask(b"/b:1b", 0, n.dir_handle())
fh = n.dir_handle()
out["a full reply"] = ask(b"/a:1b", 0, fh, fits=1)
out["not listed to its end"] = ask(b"/a:1b", 3, fh)
out["the rest"] = ask(b"/a:1b", 1, fh)
n.listings_generation(6)
out["a new generation"] = ask(b"/a:1b", 0, n.dir_handle())
out["kept under an old one"] = n.listings_put(b"/b:1b", 5, entries)
out["kept under the new one"] = (n.listings_put(b"/b:1b", 6, entries), n.listings_has(b"/a:1b", 6))
out["answered again"] = ask(b"/b:1b", 0, n.dir_handle())[0]
bad = {
    "no path": (b"", 6, entries),
    "a NUL in the path": (b"/c\0", 6, entries),
    "a short stat": (b"/c", 6, [(b"x", b"\0" * 8, 2)]),
    "a NUL in a name": (b"/c", 6, [(b"x\0y", st(1), 2)]),
    "no name": (b"/c", 6, [(b"", st(1), 2)]),
    "negative flags": (b"/c", 6, [(b"x", st(1), -1)]),
    "too many": (b"/c", 6, [(b"x%d" % i, st(i + 2), 2) for i in range(257)]),
    "not a tuple": (b"/c", 6, [[b"x", st(1), 2]]),
}
for why, args in bad.items():
    try:
        n.listings_put(*args)
        out[why] = "kept"
    except (TypeError, ValueError) as e:
        out[why] = type(e).__name__
out["served"] = n.listings_served()
print(repr(out))
"""


_BAD = ("no path", "a NUL in the path", "a short stat", "a NUL in a name", "no name", "negative flags", "too many")


@compiled
def test_the_gate_answers_a_kept_listing_under_its_generation():
    res = subprocess.run([sys.executable, "-c", _GATE], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = eval(res.stdout)  # (a dict of plain values, printed by repr)
    whole = [(".", 11, 0, 1, 0), ("..", 1, 0, 2, 0), ("model.gguf", 42, 1234, 3, 2)]
    assert out["nothing kept"] == (1, [])
    assert out["kept"] is True and out["has"] == (True, False, False)
    assert out["answered"] == (0, whole)
    assert out["then its end"] == (0, [])
    assert out["without attributes"] == (1, [])
    assert out["another folder"] == (1, [])
    assert out["a full reply"] == (0, whole[:1])
    assert out["not listed to its end"] == (0, [])  # (from offset 3: answered from what is kept, nothing left)
    assert out["the rest"] == (0, whole[1:])
    assert out["a new generation"] == (1, [])
    assert out["kept under an old one"] is False
    assert out["kept under the new one"] == (True, False)  # (a new generation drops what was kept before)
    assert out["answered again"] == 0
    assert {k: v for k, v in out.items() if k in _BAD} == dict.fromkeys(_BAD, "ValueError")
    assert out["not a tuple"] == "TypeError"
    assert out["served"] == 5  # (the end of a listing is not one)


def _listed(mnt) -> dict[str, tuple]:
    """What `ls -l` of every folder of the mount finds: each file's attributes."""
    found = {}
    for name in sorted(os.listdir(mnt)):
        folder = mnt / name
        if not folder.is_dir():
            continue
        for f in sorted(os.listdir(folder)):
            s = os.lstat(folder / f)
            found[f"{name}/{f}"] = (s.st_ino, s.st_mode, s.st_size, s.st_uid, s.st_gid, s.st_mtime_ns, s.st_nlink)
    return found


def _served(m) -> int:
    """The folders' listings the unmounted daemon logged as answered in C (none logged: 0)."""
    m.close()
    got = re.findall(r"(\d+) folders' listings answered in C", m.log.read_text(errors="replace"))
    return int(got[-1]) if got else 0


@compiled
@needs_fuse
def test_listings_through_the_mount_are_pythons(tmp_path, mount_store):
    store = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    other = llama.plain_llama_text(tmp_path / "u.gguf", seed=1)
    manifests = [add_model(store, f"m{i:02d}", other if i == 30 else blob, tag="1b") for i in range(48)]
    plain = mount_store(store, env={"COMPATFS_NO_ACCEL": "1"})
    want = _listed(plain.path)
    assert sum(k.endswith(":1b/model.gguf") for k in want) == 48
    m = mount_store(store)
    assert _listed(m.path) == want
    assert _listed(m.path) == want  # (again: the kernel answers)
    # A change of the store: the folders the rescan drops are listed again,
    # not from what was kept before it.
    seen = m.changes_seen()
    digest = json.loads(manifests[30].read_text())["layers"][0]["digest"]
    (store / "blobs" / digest.replace(":", "-")).chmod(0o600)
    wait_until(lambda: m.changes_seen() > seen, what="the rescan to see the chmod")
    now = _listed(m.path)
    assert stat.S_IMODE(now["m30:1b/model.gguf"][1]) == 0o400
    assert {k: v for k, v in now.items() if k != "m30:1b/model.gguf"} == {
        k: v for k, v in want.items() if k != "m30:1b/model.gguf"
    }
    assert _served(m) > 24
    assert _served(plain) == 0
