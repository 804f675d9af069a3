"""Structure edits for the fuzzer (`compatfs.testing.fuzz`, mode
"structure"): a blob's parsed header (`compatfs.testing.gguf_edit`) edited
at the names the tables of the translations that claim it hold
(`handler_targets`): duplicate keys and tensors, values of another type
(most often an array of the same length with another element type), NaN,
inf and huge numbers, empty and nested arrays, unknown ggml types, odd
shapes, overlapping offsets, shuffled order."""

from __future__ import annotations

import inspect
import math
import random
import re
import struct
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from gguf import GGUFValueType as VT

from ..format.header import SourceGGUF
from ..format.values import Value
from .gguf_edit import KV, Blob, TensorEntry, payload


def handler_targets(translations) -> frozenset[str]:
    """Every name the `translations`' tables hold: the strings of their
    edits' fields, of their counts, and those their detectors and tensor
    makers close over (keys, tensor names, prefixes, `{}` patterns)."""
    found: set[str] = set()
    seen: dict[int, object] = {}  # the objects walked, kept alive so that no id is reused

    def walk(obj) -> None:
        if isinstance(obj, str):
            found.add(obj)
            return
        if id(obj) in seen or obj is None or isinstance(obj, (int, float, bytes, Value)):
            return
        seen[id(obj)] = obj
        if isinstance(obj, (tuple, list, set, frozenset)):
            for x in obj:
                walk(x)
        elif isinstance(obj, dict):
            for x in obj.values():
                walk(x)
        elif inspect.isfunction(obj):
            for cell in obj.__closure__ or ():
                walk(cell.cell_contents)
            walk(obj.__defaults__)
        elif is_dataclass(obj):
            for f in fields(obj):
                walk(getattr(obj, f.name))

    for tr in translations:
        walk((tr.detect, tr.kv, tr.tensors, tr.counts))
    return frozenset(found)


def _pattern_matches(pattern: str, name: str) -> bool:
    """A table's name `pattern` names `name`: equal, a prefix ending in `.`,
    a leaf starting with `.`, or a `{}` pattern with a block number."""
    if "{}" in pattern:
        return re.fullmatch(re.escape(pattern).replace(r"\{\}", r"\d+") + r"(\..*)?", name) is not None
    return (
        name == pattern
        or (pattern.endswith(".") and name.startswith(pattern))
        or (pattern.startswith(".") and pattern in name)
    )


def _aimed(names: list[str], targets: frozenset[str], rng: random.Random) -> str | None:
    """One of `names`, most often one that a handler's table names exactly
    (a key an edit reads, a tensor a maker takes), else one a prefix or
    pattern of a table covers, else any (`general.*` only by pattern: a
    mangled architecture just turns every detector off)."""
    exact = [n for n in names if n in targets and not n.startswith("general.")]
    covered = [n for n in names if any(_pattern_matches(p, n) for p in targets)]
    for pool, p in ((exact, 0.75), (covered, 0.9)):
        if pool and rng.random() < p:
            return rng.choice(pool)
    return rng.choice(names) if names else None


_NESTED_DEPTH = (2, 8, 64)


def _same_length(like: KV, rng: random.Random) -> tuple[int, bytes, str] | None:
    """An array as long as the array `like` with elements of another type
    (token types as strings, layer counts as floats with NaN, ...)."""
    if like.vtype != VT.ARRAY or len(like.payload) < 12:
        return None
    etype, count = struct.unpack_from("<IQ", like.payload, 0)
    count = min(count, 1 << 18)
    other = rng.choice([t for t in (VT.STRING, VT.STRING, VT.FLOAT32, VT.BOOL, VT.INT64, VT.ARRAY) if t != etype])
    items = {
        VT.STRING: lambda: [str(i % 7) for i in range(count)],
        VT.FLOAT32: lambda: [(math.nan, math.inf, 1.5)[i % 3] for i in range(count)],
        VT.BOOL: lambda: [bool(i % 2) for i in range(count)],
        VT.INT64: lambda: [(-1, 2**62, 0)[i % 3] for i in range(count)],
        VT.ARRAY: lambda: [(VT.INT32, [i]) for i in range(count)],
    }[other]()
    return VT.ARRAY, payload(VT.ARRAY, (other, items)), f"{count} {VT(other).name} elements"


def hostile_value(rng: random.Random, like: KV | None = None) -> tuple[int, bytes, str]:
    """A value of some kind (type number, payload, what it is); for an
    array `like`, most often one of its length with another element type."""
    if like is not None and rng.random() < 0.7:
        same = _same_length(like, rng)
        if same is not None:
            return same
    kind = rng.choice(
        (
            "string",
            "empty string",
            "u32 max",
            "u64 huge",
            "i32 -1",
            "f32 nan",
            "f32 inf",
            "f64 huge",
            "bool",
            "empty array",
            "strings",
            "floats nan/inf",
            "u64 array",
            "nested",
            "bools",
            "i32 array",
            "u8 array",
            "unknown value type",
        )
    )
    if kind == "string":
        return VT.STRING, payload(VT.STRING, "x" * rng.choice((1, 7))), kind
    if kind == "empty string":
        return VT.STRING, payload(VT.STRING, ""), kind
    if kind == "u32 max":
        return VT.UINT32, payload(VT.UINT32, 2**32 - 1), kind
    if kind == "u64 huge":
        return VT.UINT64, payload(VT.UINT64, rng.choice((2**63, 2**64 - 1))), kind
    if kind == "i32 -1":
        return VT.INT32, payload(VT.INT32, -1), kind
    if kind == "f32 nan":
        return VT.FLOAT32, payload(VT.FLOAT32, math.nan), kind
    if kind == "f32 inf":
        return VT.FLOAT32, payload(VT.FLOAT32, rng.choice((math.inf, -math.inf))), kind
    if kind == "f64 huge":
        return VT.FLOAT64, payload(VT.FLOAT64, 1e308), kind
    if kind == "bool":
        return VT.BOOL, payload(VT.BOOL, rng.random() < 0.5), kind
    if kind == "empty array":
        return VT.ARRAY, payload(VT.ARRAY, (rng.choice((VT.INT32, VT.STRING, VT.FLOAT32)), [])), kind
    if kind == "strings":
        return VT.ARRAY, payload(VT.ARRAY, (VT.STRING, ["7", "a", ""][: rng.randint(1, 3)])), kind
    if kind == "floats nan/inf":
        return VT.ARRAY, payload(VT.ARRAY, (VT.FLOAT32, [1.0, math.nan, math.inf, -math.inf])), kind
    if kind == "u64 array":
        return VT.ARRAY, payload(VT.ARRAY, (VT.UINT64, [2**64 - 1, 0, 3])), kind
    if kind == "nested":
        depth = rng.choice(_NESTED_DEPTH)
        value: tuple[VT, list[Any]] = (VT.INT32, [1, 2])
        for _ in range(depth - 1):
            value = (VT.ARRAY, [value])
        return VT.ARRAY, payload(VT.ARRAY, value), f"nested {depth} deep"
    if kind == "bools":
        return VT.ARRAY, payload(VT.ARRAY, (VT.BOOL, [True, False, True])), kind
    if kind == "i32 array":
        return VT.ARRAY, payload(VT.ARRAY, (VT.INT32, [rng.choice((0, 1, 7, 2**31 - 1)), -1, 0])), kind
    if kind == "u8 array":
        return VT.ARRAY, payload(VT.ARRAY, (VT.UINT8, [1, 2, 3])), kind
    return rng.choice((13, 2**31)), payload(VT.UINT32, 1), kind


_UNKNOWN_TYPES = (4, 5, 40, 2**31, 2**32 - 1)
_DIMS = (
    "0-d",
    "zero-length",
    "1-d",
    "overflowing product",
    "zero elements, huge dims",
    "huge row",
    "an extra axis",
    "rows doubled",
)


def _s_duplicate_key(b: Blob, rng: random.Random, aim) -> str:
    kv = aim([kv.key for kv in b.kvs])
    if kv is None:
        return "no KVs"
    original = b.kv(kv)
    if rng.random() < 0.5:
        vtype, raw, what = hostile_value(rng, original)
        copy, desc = KV(kv, vtype, raw), f"as {what}"
    else:
        copy, desc = KV(kv, original.vtype, original.payload), "unchanged"
    b.kvs.insert(rng.randrange(len(b.kvs) + 1), copy)
    return f"{kv} duplicated ({desc})"


def _s_duplicate_tensor(b: Blob, rng: random.Random, aim) -> str:
    name = aim([t.name for t in b.tensors])
    if name is None:
        return "no tensors"
    t = b.tensor(name)
    b.tensors.insert(rng.randrange(len(b.tensors) + 1), TensorEntry(t.name, t.dims, t.ggml_type, t.offset))
    return f"tensor {name} duplicated"


def _s_retype(b: Blob, rng: random.Random, aim) -> str:
    key = aim([kv.key for kv in b.kvs])
    if key is None:
        return "no KVs"
    kv = b.kv(key)
    kv.vtype, kv.payload, what = hostile_value(rng, kv)
    return f"{key} is now {what}"


def _s_add_key(b: Blob, rng: random.Random, aim, targets: frozenset[str]) -> str:
    arch = next(
        (
            kv.payload[8:].decode("utf-8", "replace")
            for kv in b.kvs
            if kv.key == "general.architecture" and kv.vtype == VT.STRING
        ),
        "",
    )
    have = {kv.key for kv in b.kvs}
    keys = sorted(
        t
        for t in targets
        if re.fullmatch(r"[a-z0-9_.\-]+[a-z0-9_]", t)
        and t not in have
        and t.startswith((f"{arch}.", "tokenizer.", "clip."))
    )
    if not keys:
        return _s_retype(b, rng, aim)
    key = rng.choice(keys)
    vtype, raw, what = hostile_value(rng)
    b.kvs.insert(rng.randrange(len(b.kvs) + 1), KV(key, vtype, raw))
    return f"{key} added as {what}"


def _s_drop(b: Blob, rng: random.Random, aim) -> str:
    if rng.random() < 0.5 and b.kvs:
        key = aim([kv.key for kv in b.kvs])
        b.kvs.remove(b.kv(key))
        return f"{key} removed"
    name = aim([t.name for t in b.tensors])
    if name is None:
        return "no tensors"
    b.tensors.remove(b.tensor(name))
    return f"tensor {name} removed"


def _s_ggml_type(b: Blob, rng: random.Random, aim) -> str:
    name = aim([t.name for t in b.tensors])
    if name is None:
        return "no tensors"
    t = b.tensor(name)
    t.ggml_type = rng.choice(_UNKNOWN_TYPES + (0, 1, 8, 30, 39))
    return f"tensor {name} has ggml type {t.ggml_type}"


def _s_dims(b: Blob, rng: random.Random, aim) -> str:
    name = aim([t.name for t in b.tensors])
    if name is None:
        return "no tensors"
    t = b.tensor(name)
    kind = rng.choice(_DIMS)
    first = t.dims[0] if t.dims else 32
    t.dims = {
        "0-d": (),
        "zero-length": (0,) + t.dims[1:],
        "1-d": (first,),
        "overflowing product": (first, 2**32, 2**32, 2**32),
        "zero elements, huge dims": (first, 0, 2**63 - 1),
        "huge row": (2**63,) + t.dims[1:],
        "an extra axis": t.dims + (1,),
        "rows doubled": (first, 2 * (t.dims[1] if len(t.dims) > 1 else 1)) + t.dims[2:],
    }[kind]
    return f"tensor {name} dims {kind}: {t.dims}"


def _s_overlap(b: Blob, rng: random.Random, aim) -> str:
    name = aim([t.name for t in b.tensors])
    if name is None or len(b.tensors) < 2:
        return "too few tensors"
    t = b.tensor(name)
    other = rng.choice([o for o in b.tensors if o is not t])
    t.offset = rng.choice((other.offset, other.offset + b.alignment, len(b.data) + b.alignment, 2**63))
    return f"tensor {name} moved to offset {t.offset} ({other.name} is at {other.offset})"


def _s_order(b: Blob, rng: random.Random, aim) -> str:
    if rng.random() < 0.5:
        rng.shuffle(b.kvs)
        return "KVs shuffled"
    rng.shuffle(b.tensors)
    return "tensor infos shuffled (offsets kept)"


STRUCTURE: dict[str, Callable] = {
    "duplicate_key": _s_duplicate_key,
    "duplicate_tensor": _s_duplicate_tensor,
    "retype": _s_retype,
    "add_key": _s_add_key,
    "drop": _s_drop,
    "ggml_type": _s_ggml_type,
    "dims": _s_dims,
    "overlap": _s_overlap,
    "order": _s_order,
}


# How often each edit is drawn: values of the wrong type most.
WEIGHTS = {"retype": 4, "add_key": 2, "duplicate_key": 2, "dims": 2}


def structure_mutator(translations, workdir: Path):
    """mutate(raw, rng) -> (bytes, description): one to three `STRUCTURE`
    edits of the parsed header, aimed at the names that the tables of the
    `translations` claiming the unmutated blob hold (of all of them when
    none claims it).  `workdir` holds a scratch file."""
    everything = handler_targets(translations)
    aimed_at: dict[bytes, frozenset[str]] = {}
    kinds = sorted(STRUCTURE)
    weights = [WEIGHTS.get(k, 1) for k in kinds]

    def targets_of(raw: bytes) -> frozenset[str]:
        if raw not in aimed_at:
            scratch = workdir / "claims.gguf"
            scratch.write_bytes(raw)
            src = SourceGGUF(scratch)
            claimers = [tr for tr in translations if tr.claims(src)]
            aimed_at[raw] = handler_targets(claimers) if claimers else everything
        return aimed_at[raw]

    def mutate(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
        blob, targets = Blob.parse(raw), targets_of(raw)
        aim = lambda names: _aimed(names, targets, rng)  # noqa: E731
        done = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.choices(kinds, weights)[0]
            edit = STRUCTURE[kind]
            what = edit(blob, rng, aim, targets) if kind == "add_key" else edit(blob, rng, aim)
            done.append(f"{kind}: {what}")
        return blob.serialize(), "; ".join(done)

    return mutate
