"""Hostile store contents for the tests: GGUF blobs with one value swapped
for one of the wrong type, refusals told apart from handlers that crashed,
and mounts whose hangs are detected by bounded waits and cleaned up through
fusectl."""

from __future__ import annotations

import os
import struct
import subprocess
from contextlib import contextmanager, suppress
from pathlib import Path
from collections.abc import Iterator

import pytest

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import VT, Value, skip_value
from compatfs.testing import gemma3
from compatfs.testing.store import add_model
from compatfs.files.lookup import Transient
from compatfs.view.claims import HandlerFailure

_U64 = struct.Struct("<Q")


def vision_and_text_store(tmp_path: Path) -> Path:
    """A store of two legacy models: `vision:4b` (a monolithic Gemma 3 vision
    blob) and `text:1b`."""
    root = tmp_path / "store"
    add_model(root, "vision", gemma3.legacy_gemma3_vision(tmp_path / "gv.gguf"), tag="4b")
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    return root


def with_value(path: Path, key: str, value: Value) -> bytes:
    """The GGUF at `path` with KV `key` set to `value` (of any type), all
    else kept: the header rewritten, the tensor data moved as a whole."""
    src = SourceGGUF(path)
    data = path.read_bytes()
    kvs = dict(src.kvs)
    kvs[key] = value
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(src.tensors), len(kvs)))
    for k, v in kvs.items():
        name = k.encode()
        out += _U64.pack(len(name)) + name + struct.pack("<I", v.vtype) + bytes(v.payload)
    out += data[_kvs_end(data, len(src.kvs)) : src.header_size]  # the tensor infos as they were
    out += bytes(-len(out) % src.alignment)
    return bytes(out) + data[src.data_offset :]


def _not_a_crash(e: GGUFError) -> None:
    """AssertionError when `e` is a `HandlerFailure`: a handler that raised
    KeyError, TypeError, ... on the input, which `views` refuses like a
    GGUFError, but which is a bug rather than the refusal the test wants."""
    if isinstance(e, HandlerFailure):
        raise AssertionError(f"a handler crashed ({type(e.__cause__).__name__}) instead of refusing: {e}") from e
    if isinstance(e, Transient):
        raise AssertionError(f"a fault of the system, not a refusal: {e}") from e


@contextmanager
def refused(match: str | None = None) -> Iterator[pytest.ExceptionInfo]:
    """`pytest.raises(GGUFError, match=match)` that fails when the GGUFError
    is a handler's contained crash (`HandlerFailure`)."""
    with pytest.raises(GGUFError) as info:
        yield info
    _not_a_crash(info.value)
    if match is not None:
        info.match(match)


@contextmanager
def served_or_refused() -> Iterator[None]:
    """The block may end or raise GGUFError, but not a handler's contained
    crash (`HandlerFailure`)."""
    try:
        yield
    except GGUFError as e:
        _not_a_crash(e)


def _kvs_end(data: bytes, n_kv: int) -> int:
    """Where the KVs of the GGUF `data` end (its tensor infos begin)."""
    buf, off = memoryview(data), 24
    for _ in range(n_kv):
        off += 8 + _U64.unpack_from(buf, off)[0]
        vtype = VT(struct.unpack_from("<I", buf, off)[0])
        off = skip_value(buf, off + 4, vtype, len(buf))
    return off


def fifo_writer_release(fifo: Path) -> None:
    """Open `fifo` for writing, without blocking, and close it: a reader
    blocked opening it (code under test that hung) goes on."""
    with suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def fuse_connection(mountpoint: Path) -> str | None:
    """The fusectl connection number of the FUSE mount at `mountpoint` (read
    from /proc/self/mountinfo: stat-ing a hung mount would hang)."""
    want = str(mountpoint)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].replace("\\040", " ") == want and " - fuse" in line:
            return fields[2].split(":")[1]
    return None


def abort_fuse(mountpoint: Path) -> bool:
    """Abort the FUSE connection of `mountpoint` through fusectl (mounted
    first where it is not), then detach the mount; whether it was aborted."""
    conn = fuse_connection(mountpoint)
    if conn is None:
        return False
    base = Path("/sys/fs/fuse/connections")
    if not (base / conn).exists():
        subprocess.run(["mount", "-t", "fusectl", "none", str(base)], capture_output=True)
    try:
        (base / conn / "abort").write_text("1")
    except OSError:
        return False
    # An aborted mount no longer answers stat (the fixture would not see it as mounted): detached here.
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
    return True


def bounded(
    argv: list[str], seconds: float, mountpoint: Path | None = None, stdout_null: bool = False
) -> subprocess.CompletedProcess:
    """Run `argv` (its output as text; with `stdout_null`, none kept);
    AssertionError when it has not ended within `seconds` (a hang: the
    mount's connection is aborted first, so nothing stays stuck)."""
    p = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL if stdout_null else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    try:
        out, err = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        aborted = mountpoint is not None and abort_fuse(mountpoint)
        p.kill()
        with suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=10)
        raise AssertionError(f"{argv} did not end within {seconds} s (hung; connection aborted: {aborted})") from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def ends_within(fn, seconds: float, *args):
    """`fn(*args)` in a thread: its result, or AssertionError when it has not
    returned within `seconds` (a hang; the thread is left to its fate)."""
    import threading

    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__qualname__', fn)} did not return within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]
