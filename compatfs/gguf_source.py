"""A GGUF blob on disk, parsed just far enough to translate it.

The header is walked once over a read-only memory map: every KV is kept as a
byte span (`Value`), every tensor as name, shape, dtype and absolute offset.
Nothing is decoded until a handler asks for it, and tensor data is never read
here.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as DT

from .gguf_values import VT, GGUFError, Value, skip_value, string_starts

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def tensor_nbytes(shape: tuple[int, ...], dtype: DT) -> int:
    """Bytes of a tensor of ggml `shape` (fastest axis first) and `dtype`."""
    block, size = GGML_QUANT_SIZES[dtype]
    n = 1
    for d in shape:
        n *= d
    if shape and shape[0] % block:
        raise GGUFError(f"{dtype.name} row of {shape[0]} is not a whole number of blocks")
    return n // block * size


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the blob stores it; `offset` is absolute in the file."""

    name: str
    shape: tuple[int, ...]
    dtype: DT
    offset: int

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)


class SourceGGUF:
    """The parsed header of one GGUF file, kept open as a memory map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            self.size = st.st_size
            self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if self.size < 24:
                raise GGUFError(f"{self.path}: too short to be GGUF ({self.size} bytes)")
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            self._parse(memoryview(self._map))
        except GGUFError as e:
            raise GGUFError(f"{self.path}: {e}") from None
        except (struct.error, UnicodeDecodeError, ValueError, KeyError, IndexError) as e:
            raise GGUFError(f"{self.path}: malformed GGUF header ({e})") from None

    # -- parsing -------------------------------------------------------------
    def _parse(self, buf: memoryview) -> None:
        end = len(buf)
        if bytes(buf[:4]) != MAGIC:
            raise GGUFError("not a GGUF file (bad magic)")
        version = _U32.unpack_from(buf, 4)[0]
        if version not in (2, 3):
            swapped = struct.unpack(">I", bytes(buf[4:8]))[0]
            if swapped in (2, 3):
                raise GGUFError("big-endian GGUF is not supported")
            raise GGUFError(f"unsupported GGUF version {version}")
        self.version = version
        n_tensors, n_kv = _U64.unpack_from(buf, 8)[0], _U64.unpack_from(buf, 16)[0]
        if n_tensors > end or n_kv > end:
            raise GGUFError("implausible tensor or KV count")
        off = 24
        spans = []   # (key, type, start, end, string offsets)
        for _ in range(n_kv):
            key, off = _read_str(buf, off, end)
            if off + 4 > end:
                raise GGUFError("KV runs past the end of the file")
            try:
                vtype = VT(_U32.unpack_from(buf, off)[0])
            except ValueError:
                raise GGUFError(f"KV {key!r} has an unknown value type") from None
            start, starts = off + 4, None
            if vtype == VT.ARRAY and end >= start + 12 and _U32.unpack_from(buf, start)[0] == VT.STRING:
                count = _U64.unpack_from(buf, start + 4)[0]
                starts, off = string_starts(buf, start + 12, count, end, base=start)
            else:
                off = skip_value(buf, start, vtype, end)
            spans.append((key, vtype, start, off, starts))
        kvs = {key: Value(vtype, buf[a:b], starts) for key, vtype, a, b, starts in spans}
        self.kvs = kvs
        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in kvs:
            self.alignment = int(kvs["general.alignment"].decode())
            if self.alignment <= 0 or self.alignment & (self.alignment - 1):
                raise GGUFError(f"general.alignment {self.alignment} is not a power of two")
        raw_tensors = []
        for _ in range(n_tensors):
            name, off = _read_str(buf, off, end)
            n_dims = _U32.unpack_from(buf, off)[0]
            if n_dims > 8:
                raise GGUFError(f"tensor {name!r} has {n_dims} dimensions")
            shape = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            off += 4 + 8 * n_dims
            raw_type, rel = struct.unpack_from("<IQ", buf, off)
            off += 12
            try:
                dtype = DT(raw_type)
            except ValueError:
                raise GGUFError(f"tensor {name!r} has unknown ggml type {raw_type}") from None
            raw_tensors.append((name, tuple(int(d) for d in shape), dtype, rel))
        self.header_size = off
        self.data_offset = -(-off // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        self._blocks: dict[str, frozenset[int]] = {}
        for name, shape, dtype, rel in raw_tensors:
            t = TensorInfo(name, shape, dtype, self.data_offset + rel)
            if t.offset + t.nbytes > self.size:
                raise GGUFError(f"tensor {name!r} runs past the end of the file (truncated blob?)")
            self.tensors[name] = t

    # -- queries used by handlers -----------------------------------------
    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture")

    def get(self, key: str, default=None):
        """Decoded value of `key`, or `default` when the key is absent."""
        v = self.kvs.get(key)
        return default if v is None else v.decode()

    def has_tensor_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.tensors)

    def block_ids(self, prefix: str = "blk.") -> frozenset[int]:
        """The block numbers i for which the blob holds a tensor `<prefix><i>.*`:
        what a handler loops over, never a count read from a KV."""
        cached = self._blocks.get(prefix)
        if cached is None:
            ids = set()
            for name in self.tensors:
                if name.startswith(prefix):
                    head = name[len(prefix):].partition(".")[0]
                    if head.isdigit():
                        ids.add(int(head))
            cached = self._blocks[prefix] = frozenset(ids)
        return cached

    def read(self, offset: int, size: int) -> memoryview:
        """`size` bytes at absolute `offset` (a view of the memory map)."""
        return memoryview(self._map)[offset:offset + size]

    def release(self, offset: int, size: int) -> None:
        """Drop the pages of [offset, offset+size) from this process's memory
        (they stay in the page cache); done once an op has read its inputs."""
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + size, self.size)
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


def _read_str(buf: memoryview, off: int, end: int) -> tuple[str, int]:
    if off + 8 > end:
        raise GGUFError("header runs past the end of the file")
    n = _U64.unpack_from(buf, off)[0]
    if off + 8 + n > end:
        raise GGUFError("string runs past the end of the file")
    return bytes(buf[off + 8:off + 8 + n]).decode("utf-8"), off + 8 + n
