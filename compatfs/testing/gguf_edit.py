"""A GGUF file as an editable structure, for the structure-aware fuzzer and
tests: its KVs (key, type, encoded payload) and tensor infos (name, dims,
ggml type number, offset in the data section) as lists that can be changed
freely (duplicated, retyped, reordered), and written back with the data
section's bytes as they were.  Nothing is validated on the way out: a
`Blob` can say anything a hostile header can."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from gguf import GGUFValueType as VT

from ..format.values import skip_value

_SCALAR = {
    VT.UINT8: "<B",
    VT.INT8: "<b",
    VT.UINT16: "<H",
    VT.INT16: "<h",
    VT.UINT32: "<I",
    VT.INT32: "<i",
    VT.FLOAT32: "<f",
    VT.BOOL: "<?",
    VT.UINT64: "<Q",
    VT.INT64: "<q",
    VT.FLOAT64: "<d",
}


def payload(vtype: VT, value: Any) -> bytes:
    """The bytes that follow a value's type tag: a scalar packed, a string
    with its u64 length, an array given as (element type, items), whose
    items are encoded the same way (nested arrays included)."""
    if vtype == VT.STRING:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(raw)) + raw
    if vtype == VT.ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(payload(etype, x) for x in items)
    return struct.pack(_SCALAR[vtype], value)


@dataclass
class KV:
    key: str
    vtype: int  # a GGUF value type number (any u32, for hostile headers)
    payload: bytes


@dataclass
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # ggml order, each a u64
    ggml_type: int
    offset: int  # relative to the data section


def _str(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class Blob:
    version: int
    kvs: list[KV]
    tensors: list[TensorEntry]
    data: bytes = field(repr=False)
    alignment: int = 32

    @classmethod
    def parse(cls, raw: bytes) -> Blob:
        """A well-formed GGUF file (such as a legacy writer's) as a `Blob`."""
        buf = memoryview(raw)
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        off, kvs = 24, []
        for _ in range(n_kv):
            n = struct.unpack_from("<Q", buf, off)[0]
            key = bytes(buf[off + 8 : off + 8 + n]).decode("utf-8")
            off += 8 + n
            vtype = VT(struct.unpack_from("<I", buf, off)[0])
            end = skip_value(buf, off + 4, vtype, len(buf))
            kvs.append(KV(key, vtype, bytes(buf[off + 4 : end])))
            off = end
        tensors = []
        for _ in range(n_tensors):
            n = struct.unpack_from("<Q", buf, off)[0]
            name = bytes(buf[off + 8 : off + 8 + n]).decode("utf-8")
            off += 8 + n
            n_dims = struct.unpack_from("<I", buf, off)[0]
            dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            ggml_type, rel = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            tensors.append(TensorEntry(name, tuple(dims), ggml_type, rel))
        alignment = 32
        for kv in kvs:
            if kv.key == "general.alignment" and kv.vtype == VT.UINT32:
                alignment = struct.unpack("<I", kv.payload)[0]
        start = -(-off // alignment) * alignment
        return cls(version, kvs, tensors, bytes(buf[start:]), alignment)

    def serialize(self) -> bytes:
        """The file: header, padding to `alignment`, the data section."""
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs)))
        for kv in self.kvs:
            out += _str(kv.key) + struct.pack("<I", kv.vtype) + kv.payload
        for t in self.tensors:
            out += _str(t.name) + struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims)
            out += struct.pack("<IQ", t.ggml_type, t.offset)
        out += bytes(-len(out) % self.alignment)
        return bytes(out) + self.data

    def kv(self, key: str) -> KV:
        """The first KV `key`; KeyError when there is none."""
        found = next((kv for kv in self.kvs if kv.key == key), None)
        if found is None:
            raise KeyError(key)
        return found

    def tensor(self, name: str) -> TensorEntry:
        """The first tensor info `name`; KeyError when there is none."""
        found = next((t for t in self.tensors if t.name == name), None)
        if found is None:
            raise KeyError(name)
        return found
