"""The end of a folder's listing is answered in C (`fuse.gates`,
`_accel.readdir_gate`): after `readdir` filled a folder to its end under an
fh (`_accel.listed`), a request for it from an offset at or past that end,
which a caller's last getdents sends after every folder, gets nothing
filled and no Python callback; every other request goes to Python: a first
request, one from an offset before the end, one for another fh or one
whose slot another folder took since.  Run in a process of its own: the gate
and the handles are the process's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compatfs.translate import accel

_GATE = r"""
import ctypes
from compatfs.fuse.libfuse import fuse
from compatfs.translate import accel
n = accel.native
READDIR = dict(fuse.fuse_operations._fields_)["readdir"]
calls = []
def python(path, buf, filler, offset, fip, flags):
    calls.append((path, offset, fip.contents.fh))
    return 0
fallback = READDIR(python)
gated = READDIR(n.readdir_gate(ctypes.cast(fallback, ctypes.c_void_p).value, fuse.fuse_file_info.fh.offset, ctypes.sizeof(fuse.c_stat), 1))
filler = READDIR._argtypes_[2](lambda *args: 0)  # (never called: nothing is filled here)
a, b = n.dir_handle(), n.dir_handle()
assert 0 < a < b

def ask(fh, offset):
    calls.clear()
    fi = fuse.fuse_file_info(fh=fh)
    assert gated(b"/x:1b", None, filler, offset, ctypes.pointer(fi), 1) == 0
    return len(calls)

out = [ask(a, 0), ask(a, 4)]  # (nothing listed yet: both to Python)
n.listed(a, 4)
out += [ask(a, 4), ask(a, 9), ask(a, 3), ask(a, 0), ask(b, 4)]
n.listed(a + 4096, 2)  # (the same slot, another folder)
out += [ask(a, 4), ask(a + 4096, 2)]
n.listed(0, 4); n.listed(1 << 60, 4); n.listed(b, 1 << 21)  # (not kept: no fh, an fh or a count past the slot's bits)
out += [ask(0, 4), ask(1 << 60, 4), ask(b, 1 << 21)]
other = READDIR(lambda *args: 0)
try:
    n.readdir_gate(ctypes.cast(other, ctypes.c_void_p).value, fuse.fuse_file_info.fh.offset, ctypes.sizeof(fuse.c_stat), 1)
except ValueError:
    out.append("one gate")
print(*out)
"""


@pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")
def test_the_end_of_a_listing_is_answered_in_c():
    res = subprocess.run([sys.executable, "-c", _GATE], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "1", "0", "0", "1", "1", "1", "1", "0", "1", "1", "1", "one", "gate"]
