"""A GGUF blob on disk, parsed just far enough to translate it.

The header is read and walked once: every KV is kept as a byte span of the
header (`Value`), every tensor as name, shape, dtype and absolute offset.
Nothing is decoded until a handler asks for it, and tensor data is read only
when an op needs it.
"""
from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as DT

from .blobfile import identity as blob_identity, open_regular
from .gguf_values import VT, GGUFError, Value, skip_value, string_starts

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def tensor_nbytes(shape: tuple[int, ...], dtype: DT | int) -> int:
    """Bytes of a tensor of ggml `shape` (fastest axis first) and `dtype`."""
    if dtype not in GGML_QUANT_SIZES:
        raise GGUFError(f"ggml type {int(dtype)} is unknown to GGUF readers; its size cannot be told")
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
    dtype: DT | int       # an int for a ggml type gguf-py does not know
    offset: int

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)


class SourceGGUF:
    """The parsed header of one GGUF file.

    Only the header's bytes are kept (read once, no memory map and no open
    descriptor), so a blob that leaves the store leaves the disk once its
    views are dropped, and a blob truncated under us is an error on read,
    never a SIGBUS.  Tensor data is read with `read`, which checks that the
    blob is still the one that was parsed."""

    FIRST_READ = 8 << 20   # most headers (a 262k-token vocabulary: ~6 MiB) parse in one read

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        fd = self._open()
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise GGUFError(f"{self.path}: not a regular file")
            self.size = st.st_size
            self.identity = blob_identity(st)
            if self.size < 24:
                raise GGUFError(f"{self.path}: too short to be GGUF ({self.size} bytes)")
            want = min(self.size, self.FIRST_READ)
            while True:
                buf = _pread_exact(fd, want, 0)
                try:
                    self._parse(memoryview(buf))
                    break
                except GGUFError as e:
                    if want == self.size or "past the end" not in str(e):
                        raise GGUFError(f"{self.path}: {e}") from None
                except (struct.error, UnicodeDecodeError, ValueError, KeyError, IndexError, OverflowError) as e:
                    if want == self.size:
                        raise GGUFError(f"{self.path}: malformed GGUF header ({e})") from None
                want = min(self.size, want * 4)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror}") from None
        finally:
            os.close(fd)

    # -- parsing -------------------------------------------------------------
    def _parse(self, buf: memoryview) -> None:
        """Parse the header in `buf` (the file's first bytes): its KVs and tensor
        infos; "past the end" errors mean `buf` was too short (or the file is)."""
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
        # Each KV takes at least 12 bytes and each tensor info at least 24.
        if 12 * n_kv + 24 * n_tensors > self.size:
            raise GGUFError(f"implausible counts: {n_kv} KVs and {n_tensors} tensors in {self.size} bytes")
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
        keys = [key for key, *_ in spans]
        if len(set(keys)) != len(keys):
            self.duplicates = sorted({k for k in keys if keys.count(k) > 1})
        else:
            self.duplicates = []
        raw_tensors = []
        for _ in range(n_tensors):
            name, off = _read_str(buf, off, end)
            if off + 4 > end:
                raise GGUFError("tensor info runs past the end of the file")
            n_dims = _U32.unpack_from(buf, off)[0]
            if n_dims > 8:
                raise GGUFError(f"tensor {name!r} has {n_dims} dimensions")
            if off + 4 + 8 * n_dims + 12 > end:
                raise GGUFError("tensor info runs past the end of the file")
            shape = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            off += 4 + 8 * n_dims
            raw_type, rel = struct.unpack_from("<IQ", buf, off)
            off += 12
            raw_tensors.append((name, tuple(int(d) for d in shape), _dtype(raw_type), rel))
        # Only the header's bytes are kept: the KVs are slices of this copy.
        header = bytes(buf[:off])
        self.kvs = {key: Value(vtype, memoryview(header)[a:b], starts) for key, vtype, a, b, starts in spans}
        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.kvs:
            alignment = self.kvs["general.alignment"].decode()
            if not isinstance(alignment, int) or isinstance(alignment, bool) or not 0 < alignment <= 1 << 30 \
                    or alignment & (alignment - 1):
                raise GGUFError(f"general.alignment {alignment!r} is not a power of two")
            self.alignment = alignment
        self.header_size = off
        self.data_offset = -(-off // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        self._blocks: dict[str, frozenset[int]] = {}
        names = [name for name, *_ in raw_tensors]
        if len(set(names)) != len(names):
            self.duplicates += sorted({f"tensor {n}" for n in names if names.count(n) > 1})
        for name, shape, dtype, rel in raw_tensors:
            t = TensorInfo(name, shape, dtype, self.data_offset + rel)
            if isinstance(dtype, DT) and t.offset + t.nbytes > self.size:
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

    def _open(self) -> int:
        return open_regular(self.path)[0]

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes at absolute `offset`, read now from the blob; GGUFError
        when the blob changed since it was parsed or is shorter than that."""
        fd = self._open()
        try:
            if blob_identity(os.fstat(fd)) != self.identity:
                raise GGUFError(f"{self.path}: the blob changed since it was read (size, modification or change time)")
            return _pread_exact(fd, size, offset)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror}") from None
        finally:
            os.close(fd)


def _dtype(raw: int) -> DT | int:
    """The ggml type, or the raw number of one gguf-py does not know (such a
    tensor can be served only by a handler that knows its layout)."""
    try:
        return DT(raw)
    except ValueError:
        return raw


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    """Exactly `size` bytes at `offset`; GGUFError when the file ends first."""
    buf = bytearray(size)
    view, done = memoryview(buf), 0
    while done < size:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise GGUFError(f"file ends at {offset + done}, before {offset + size} (truncated?)")
        done += n
    return bytes(buf) if size < (1 << 20) else buf


def _read_str(buf: memoryview, off: int, end: int) -> tuple[str, int]:
    if off + 8 > end:
        raise GGUFError("header runs past the end of the file")
    n = _U64.unpack_from(buf, off)[0]
    if off + 8 + n > end:
        raise GGUFError("string runs past the end of the file")
    return bytes(buf[off + 8:off + 8 + n]).decode("utf-8"), off + 8 + n
