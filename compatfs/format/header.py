"""A GGUF blob on disk, parsed just far enough to translate it.

The header is read and walked once: every KV is kept as a byte span of the
header (`Value`), every tensor as name, shape, dtype and absolute offset.
Nothing is decoded until a handler asks for it, and tensor data is read only
when an op needs it.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as DT

from ..files.blobfile import BlobFile
from ..errors import GGUFError
from .values import _SCALAR as _SCALAR_FORMATS, VT, PastTheEnd, Value, skip_value, string_starts

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8  # the most dimensions a tensor info may have
MAX_DIM = 2**63 - 1  # ggml's dimensions are int64
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def tensor_nbytes(shape: tuple[int, ...], dtype: DT | int) -> int:
    """Bytes of a tensor of ggml `shape` (fastest axis first) and `dtype`."""
    if dtype not in GGML_QUANT_SIZES:
        raise GGUFError(f"ggml type {int(dtype)} is unknown to GGUF readers; its size cannot be told")
    dtype = DT(dtype)  # (a plain int of a known type, too)
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
    dtype: DT | int  # an int for a ggml type gguf-py does not know
    offset: int

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)

    def known_dtype(self) -> DT:
        """The ggml type, when gguf-py knows it; GGUFError naming the tensor
        when not (such a tensor has no size an op could work with)."""
        if not isinstance(self.dtype, DT):
            raise GGUFError(f"tensor {self.name} has ggml type {self.dtype}, which GGUF readers do not know")
        return self.dtype

    def part(
        self, name: str, shape: tuple[int, ...], dtype: DT, start: int = 0, *, stored: int | None = None
    ) -> TensorInfo:
        """A tensor `name` of `shape` and `dtype` that stands for its bytes of
        this one from byte `start` (a row of a matrix, a value of a packed
        table, the raw bytes of a type GGUF readers do not know): the one way
        to make a tensor that the blob's header does not list.  `stored` is
        this tensor's size in bytes where its type has none GGUF readers know
        (as a translation's `StoredType` sizes it).  GGUFError naming both
        where the blob's own tensors would be refused: more than `MAX_DIMS`
        dimensions or one outside ggml's int64, a type GGUF readers do not
        know, a row that is not whole blocks, bytes outside this tensor's."""
        if len(shape) > MAX_DIMS or any(not 0 <= d <= MAX_DIM for d in shape):
            raise GGUFError(f"tensor {name} (part of {self.name}) has shape {shape}")
        if not isinstance(dtype, DT):
            raise GGUFError(
                f"tensor {name} (part of {self.name}) has ggml type {dtype}, which GGUF readers do not know"
            )
        try:
            nbytes = tensor_nbytes(shape, dtype)
        except GGUFError as e:
            raise GGUFError(f"tensor {name} (part of {self.name}): {e}") from None
        whole = self.nbytes if stored is None else stored
        if start < 0 or start + nbytes > whole:
            raise GGUFError(
                f"tensor {name}: bytes [{start}, {start + nbytes}) lie outside the {whole} bytes of {self.name}"
            )
        return TensorInfo(name, tuple(shape), dtype, self.offset + start)


class SourceGGUF:
    """The parsed header of one GGUF file.

    Only the header's bytes are kept (read once, no memory map and no open
    descriptor), so a blob that leaves the store leaves the disk once its
    views are dropped, and a blob truncated under us is an error on read,
    never a SIGBUS.  Tensor data is read with `read`, which checks that the
    blob is still the one that was parsed."""

    FIRST_READ = 256 << 10  # a header without a large vocabulary parses in one short read (cold: ~1 ms) ...
    SECOND_READ = 8 << 20  # ... most others (a 262k-token vocabulary: ~6 MiB) in one more
    MAX_HEADER = 64 << 20  # the most a header may take (ten times the largest real one): memory per header

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with BlobFile(path) as f:
            self.identity = f.stamp
            self.size = f.stamp[2]
            if self.size < 24:
                raise GGUFError(f"{self.path}: too short to be GGUF ({self.size} bytes)")
            want = min(self.size, self.FIRST_READ)
            while True:
                buf = f.read(0, want)
                try:
                    self._parse(memoryview(buf))
                    break
                except _Short:
                    if want >= min(self.size, self.MAX_HEADER):
                        raise GGUFError(
                            f"{self.path}: header larger than {self.MAX_HEADER >> 20} MiB (the most compatfs reads)"
                        ) from None
                except GGUFError as e:
                    raise GGUFError(f"{self.path}: {e}") from None
                except (
                    struct.error,
                    UnicodeDecodeError,
                    ValueError,
                    KeyError,
                    IndexError,
                    TypeError,
                    ArithmeticError,
                    RecursionError,
                ) as e:
                    raise GGUFError(f"{self.path}: malformed GGUF header ({e})") from None
                del buf
                want = min(self.size, self.MAX_HEADER, max(want * 4, self.SECOND_READ))

    # -- parsing -------------------------------------------------------------
    def _parse(self, buf: memoryview) -> None:
        """Parse the header in `buf` (the file's first bytes): its KVs and tensor
        infos.  Every length is checked against the blob's size before anything
        is read for it ("past the end of the blob"); `_Short` when the header
        goes on past `buf` (`PastTheEnd` in a buffer shorter than the blob)."""
        try:
            spans, raw_tensors, off = self._walk(buf)
        except PastTheEnd:
            if len(buf) < self.size:
                raise _Short() from None
            raise
        self._build(buf, spans, raw_tensors, off)

    def _walk(self, buf: memoryview) -> tuple[list, list, int]:
        """The KV spans and raw tensor infos in `buf`, and where the header ends."""
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
        spans = []  # (key, type, start, end, string offsets)
        for _ in range(n_kv):
            key, off = _read_str(buf, off, end, self.size)
            if off + 4 > end:
                raise PastTheEnd("KV runs past the end of the file")
            try:
                vtype = VT(_U32.unpack_from(buf, off)[0])
            except ValueError:
                raise GGUFError(f"KV {key!r} has an unknown value type") from None
            start, starts = off + 4, None
            claimed = _claimed(buf, start, vtype, end)
            if start + claimed > self.size:
                raise GGUFError(
                    f"KV {key!r} runs past the end of the blob ({claimed} bytes claimed at "
                    f"offset {start}, the blob has {self.size})"
                )
            if vtype == VT.ARRAY and end >= start + 12 and _U32.unpack_from(buf, start)[0] == VT.STRING:
                count = _U64.unpack_from(buf, start + 4)[0]
                starts, off = string_starts(buf, start + 12, count, end, base=start)
            else:
                off = skip_value(buf, start, vtype, end)
            spans.append((key, vtype, start, off, starts))
        raw_tensors = []
        for _ in range(n_tensors):
            name, off = _read_str(buf, off, end, self.size)
            if off + 4 > end:
                raise PastTheEnd("tensor info runs past the end of the file")
            n_dims = _U32.unpack_from(buf, off)[0]
            if n_dims > MAX_DIMS:
                raise GGUFError(f"tensor {name!r} has {n_dims} dimensions")
            if off + 4 + 8 * n_dims + 12 > end:
                raise PastTheEnd("tensor info runs past the end of the file")
            shape = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            off += 4 + 8 * n_dims
            raw_type, rel = struct.unpack_from("<IQ", buf, off)
            off += 12
            raw_tensors.append((name, tuple(int(d) for d in shape), _dtype(raw_type), rel))
        return spans, raw_tensors, off

    def _build(self, buf: memoryview, spans: list, raw_tensors: list, off: int) -> None:
        """KVs, alignment and tensors from a walked header; GGUFError for one that lies."""
        self.duplicates = _repeated(key for key, *_ in spans)
        # Only the header's bytes are kept: the KVs are slices of this copy.
        header = bytes(buf[:off])
        self.kvs = {key: Value(vtype, memoryview(header)[a:b], starts) for key, vtype, a, b, starts in spans}
        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.kvs:
            alignment = self.kvs["general.alignment"].decode()
            if (
                not isinstance(alignment, int)
                or isinstance(alignment, bool)
                or not 0 < alignment <= 1 << 30
                or alignment & (alignment - 1)
            ):
                raise GGUFError(f"general.alignment {alignment!r} is not a power of two")
            self.alignment = alignment
        self.header_size = off
        self.data_offset = -(-off // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        self._blocks: dict[str, frozenset[int]] = {}
        self.duplicates += [f"tensor {n}" for n in _repeated(name for name, *_ in raw_tensors)]
        for name, shape, dtype, rel in raw_tensors:
            t = TensorInfo(name, shape, dtype, self.data_offset + rel)
            if isinstance(dtype, DT) and t.offset + t.nbytes > self.size:
                raise GGUFError(f"tensor {name!r} runs past the end of the file (truncated blob?)")
            self.tensors[name] = t

    # -- queries used by handlers -----------------------------------------
    @property
    def architecture(self) -> str | None:
        """`general.architecture` when it is a string (a hostile header may hold anything there)."""
        v = self.kvs.get("general.architecture")
        return v.decode() if v is not None and v.vtype == VT.STRING else None

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
                    head = name[len(prefix) :].partition(".")[0]
                    if head.isdigit():
                        ids.add(int(head))
            cached = self._blocks[prefix] = frozenset(ids)
        return cached

    def read(self, offset: int, size: int) -> bytearray:
        """`size` bytes at absolute `offset`, read now from the blob; GGUFError
        when the blob changed since it was parsed or is shorter than that."""
        with BlobFile(self.path, expect=self.identity) as f:
            return f.read(offset, size)


def _repeated(names) -> list[str]:
    """The names that occur more than once, sorted."""
    return sorted(name for name, n in Counter(names).items() if n > 1)


class _Short(Exception):
    """The header goes on past the bytes read so far (and the blob has them)."""


def _dtype(raw: int) -> DT | int:
    """The ggml type, or the raw number of one gguf-py does not know (such a
    tensor can be served only by a handler that knows its layout)."""
    try:
        return DT(raw)
    except ValueError:
        return raw


def _read_str(buf: memoryview, off: int, end: int, size: int) -> tuple[str, int]:
    """A key or tensor name at `off`: its length checked against the blob's
    `size` first (then against `buf`'s `end`: "past the end")."""
    if off + 8 > end:
        raise PastTheEnd("header runs past the end of the file")
    n = _U64.unpack_from(buf, off)[0]
    if off + 8 + n > size:
        raise GGUFError(
            f"a name at offset {off} runs past the end of the blob ({n} bytes claimed, the blob has {size})"
        )
    if off + 8 + n > end:
        raise PastTheEnd("string runs past the end of the file")
    try:
        return bytes(buf[off + 8 : off + 8 + n]).decode("utf-8"), off + 8 + n
    except UnicodeDecodeError:
        raise GGUFError(f"the name at offset {off} is not UTF-8") from None


_LEAST = {VT.STRING: 8, VT.ARRAY: 12}  # the least bytes an array element of these types takes


def _claimed(buf: memoryview, start: int, vtype: VT, end: int) -> int:
    """The least number of bytes the value at `start` says it takes (from its
    length or count, read where `buf` holds them; 0 where it does not)."""
    if vtype == VT.STRING:
        return 8 + _U64.unpack_from(buf, start)[0] if start + 8 <= end else 0
    if vtype == VT.ARRAY:
        if start + 12 > end:
            return 0
        etype, count = _U32.unpack_from(buf, start)[0], _U64.unpack_from(buf, start + 4)[0]
        try:
            each = _LEAST.get(VT(etype)) or struct.calcsize(_SCALAR_FORMATS[VT(etype)])
        except (ValueError, KeyError):
            return 12  # an unknown element type: refused when it is walked
        return 12 + count * each
    return 0
