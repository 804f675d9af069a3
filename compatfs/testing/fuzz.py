"""Hostile headers: seeded mutations of the legacy writers' blobs, each run
through everything the mount does with a blob (parse, classify, plan each
view, render its header, read a few ranges, ops included) in bounded time
and memory.  A case passes when it is served or refused with `GGUFError`;
anything else (another exception, a case over its time or memory bound) is a
finding.  Two modes: `bytes` mutates the file's bytes; `structure` edits the
parsed header (`compatfs.testing.gguf_edit`) at the keys and tensors the
handlers' tables name (`handler_targets`): duplicates, values of another
type, NaN and huge numbers, nested and empty arrays, unknown ggml types,
overflowing and zero-element shapes, overlaps, order.  Used by
`tests/test_fuzz.py` (a few hundred cases, in process and through a mount)
and `scripts/fuzz.py` (tens of thousands).
"""
from __future__ import annotations

import errno
import inspect
import math
import os
import random
import re
import struct
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Callable

from gguf import GGUFValueType as VT

from ..gguf_source import SourceGGUF
from ..gguf_values import GGUFError, Value
from ..opcache import OpCache
from ..views import MMPROJ_FILE, MODEL_FILE, build_view, classify
from .gguf_edit import KV, Blob, TensorEntry, payload

Mutation = Callable[[bytearray, random.Random, int], str]


def _flip(buf: bytearray, rng: random.Random, header: int) -> str:
    at = rng.randrange(header)
    buf[at] ^= 1 << rng.randrange(8)
    return f"bit flip at {at}"


def _bytes(buf: bytearray, rng: random.Random, header: int) -> str:
    at = rng.randrange(header)
    n = rng.randint(1, 8)
    buf[at:at + n] = bytes(rng.randrange(256) for _ in range(n))
    return f"{n} random bytes at {at}"


_BIG = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, 2**22, 10**6)


def _u64(buf: bytearray, rng: random.Random, header: int) -> str:
    """A 64-bit field (count, length, offset or dimension) set to an extreme."""
    at = rng.randrange(max(header - 8, 1))
    value = rng.choice(_BIG)
    struct.pack_into("<Q", buf, at, value)
    return f"u64 {value} at {at}"


def _u32(buf: bytearray, rng: random.Random, header: int) -> str:
    """A 32-bit field (a type tag, a u32 value such as a block count) set to an extreme."""
    at = rng.randrange(max(header - 4, 1))
    value = rng.choice((0, 1, 2**22, 2**31 - 1, 2**32 - 1, 13, 12, 9, 39))
    struct.pack_into("<I", buf, at, value)
    return f"u32 {value} at {at}"


def _count_key(buf: bytearray, rng: random.Random, header: int) -> str:
    """The u32 after a `*count*` or `*length*` key name set to an extreme (a
    valid header otherwise: what a handler would loop over)."""
    starts = [i for n in (b"block_count", b"head_count", b"_length") for i in _find_all(buf, n, header)]
    if not starts:
        return _u32(buf, rng, header)
    at = rng.choice(starts)
    end = at
    while end < header and 32 < buf[end] < 127:   # to the end of the key's name
        end += 1
    vtype = struct.unpack_from("<I", buf, end)[0] if end + 4 <= header else None
    if vtype in (4, 5):   # u32 / i32
        value = rng.choice((2**32 - 1, 2**31 - 1, 2**22, 0))
        struct.pack_into("<I", buf, end + 4, value)
        return f"count key at {at} = {value}"
    return _u32(buf, rng, header)


def _find_all(buf: bytearray, needle: bytes, limit: int) -> list[int]:
    out, at = [], buf.find(needle, 0, limit)
    while at >= 0 and len(out) < 64:
        out.append(at)
        at = buf.find(needle, at + 1, limit)
    return out


def _truncate(buf: bytearray, rng: random.Random, header: int) -> str:
    cut = rng.randrange(len(buf))
    del buf[cut:]
    return f"truncated to {cut}"


def _duplicate_name(buf: bytearray, rng: random.Random, header: int) -> str:
    """Two tensors (or keys) given the same name, lengths kept."""
    names = _find_all(buf, b"blk.0.", header) + _find_all(buf, b"v.blk.0", header)
    if not names:
        return _flip(buf, rng, header)
    at = rng.choice(names)
    buf[at + 4] = ord("1") if buf[at + 4] == ord("0") else ord("0")
    return f"block digit changed at {at}"


MUTATIONS: dict[str, Mutation] = {
    "flip": _flip, "bytes": _bytes, "u64": _u64, "u32": _u32, "count_key": _count_key,
    "truncate": _truncate, "duplicate_name": _duplicate_name,
}


# -- structure: edits of the parsed header, aimed at what the handlers read ----------

def handler_targets(translations) -> frozenset[str]:
    """Every name the `translations`' tables hold: the strings of their
    edits' fields, of their counts, and those their detectors and tensor
    makers close over (keys, tensor names, prefixes, `{}` patterns)."""
    found: set[str] = set()
    seen: dict[int, object] = {}    # the objects walked, kept alive so that no id is reused

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
    return name == pattern or (pattern.endswith(".") and name.startswith(pattern)) or \
        (pattern.startswith(".") and pattern in name)


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
    kind = rng.choice((
        "string", "empty string", "u32 max", "u64 huge", "i32 -1", "f32 nan", "f32 inf", "f64 huge", "bool",
        "empty array", "strings", "floats nan/inf", "u64 array", "nested", "bools", "i32 array", "u8 array",
        "unknown value type"))
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
        return VT.ARRAY, payload(VT.ARRAY, (VT.STRING, ["7", "a", ""][:rng.randint(1, 3)])), kind
    if kind == "floats nan/inf":
        return VT.ARRAY, payload(VT.ARRAY, (VT.FLOAT32, [1.0, math.nan, math.inf, -math.inf])), kind
    if kind == "u64 array":
        return VT.ARRAY, payload(VT.ARRAY, (VT.UINT64, [2**64 - 1, 0, 3])), kind
    if kind == "nested":
        depth = rng.choice(_NESTED_DEPTH)
        value = (VT.INT32, [1, 2])
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
_DIMS = ("0-d", "zero-length", "1-d", "overflowing product", "zero elements, huge dims", "huge row",
         "an extra axis", "rows doubled")


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
    arch = next((kv.payload[8:].decode("utf-8", "replace") for kv in b.kvs
                 if kv.key == "general.architecture" and kv.vtype == VT.STRING), "")
    have = {kv.key for kv in b.kvs}
    keys = sorted(t for t in targets if re.fullmatch(r"[a-z0-9_.\-]+[a-z0-9_]", t) and t not in have
                  and t.startswith((f"{arch}.", "tokenizer.", "clip.")))
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
    "duplicate_key": _s_duplicate_key, "duplicate_tensor": _s_duplicate_tensor, "retype": _s_retype,
    "add_key": _s_add_key, "drop": _s_drop, "ggml_type": _s_ggml_type, "dims": _s_dims, "overlap": _s_overlap,
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
        aim = lambda names: _aimed(names, targets, rng)   # noqa: E731
        done = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.choices(kinds, weights)[0]
            edit = STRUCTURE[kind]
            what = edit(blob, rng, aim, targets) if kind == "add_key" else edit(blob, rng, aim)
            done.append(f"{kind}: {what}")
        return blob.serialize(), "; ".join(done)
    return mutate


def byte_mutator():
    """mutate(raw, rng) -> (bytes, description): one of `MUTATIONS` applied
    to a copy of `raw`, aimed at its header."""
    headers: dict[bytes, int] = {}

    def mutate(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
        if raw not in headers:
            headers[raw] = header_size(raw)
        buf = bytearray(raw)
        kind = rng.choice(sorted(MUTATIONS))
        what = MUTATIONS[kind](buf, rng, headers[raw])
        return bytes(buf), f"{kind}: {what}"
    return mutate


# -- running cases ---------------------------------------------------------------------

@dataclass
class Outcome:
    case: int
    seed_blob: str
    mutation: str
    result: str            # "served", "refused", or the unexpected exception's type
    message: str
    seconds: float
    peak_bytes: int
    blob: bytes | None = field(default=None, repr=False)   # kept for findings only


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def by_result(self) -> Counter:
        return Counter(o.result for o in self.outcomes)

    @property
    def findings(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result not in ("served", "refused")]

    @property
    def slowest(self) -> Outcome:
        return max(self.outcomes, key=lambda o: o.seconds)

    @property
    def hungriest(self) -> Outcome:
        return max(self.outcomes, key=lambda o: o.peak_bytes)


def exercise(path: Path) -> list[bytes]:
    """Everything the mount does with the blob at `path`, on every view it
    has; the bytes read (the first, middle and last 4 KiB of each view)."""
    info = classify(SourceGGUF(path))
    kinds = [MODEL_FILE] + ([MMPROJ_FILE] if info.has_mmproj else [])
    out = []
    for kind in kinds:
        view = build_view(info, kind, OpCache())
        if view.source is None:
            continue
        for offset in (0, view.size // 2, max(view.size - 4096, 0)):
            out.append(view.read(offset, 4096))
    return out


def run(seeds: dict[str, bytes], cases: int, seed: int, workdir: Path, max_seconds: float = 5.0,
        max_bytes: int = 256 << 20, mode: str = "bytes", translations=None) -> Summary:
    """`cases` mutated copies of the `seeds` blobs (name -> bytes), each
    exercised.  `mode` "bytes" mutates bytes; "structure" edits headers at
    the names `translations` (default: every handler's) read."""
    if mode == "structure":
        if translations is None:
            from .. import handlers
            translations = (*handlers.TEXT, *handlers.CLIP)
        mutate = structure_mutator(translations, workdir)
    elif mode == "bytes":
        mutate = byte_mutator()
    else:
        raise ValueError(f"unknown fuzz mode {mode!r}")
    rng = random.Random(seed)
    summary = Summary()
    names = sorted(seeds)
    path = workdir / "case.gguf"
    for case in range(cases):
        name = rng.choice(names)
        data, what = mutate(seeds[name], rng)
        path.write_bytes(data)
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            exercise(path)
            result, message = "served", ""
        except GGUFError as e:
            result, message = "refused", str(e)
        except Exception as e:   # a finding: reported, never raised
            result, message = type(e).__name__, f"{e}"
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if seconds > max_seconds:
            result, message = "too slow", f"{seconds:.1f} s; {message}"
        elif peak > max_bytes:
            result, message = "too much memory", f"{peak >> 20} MiB; {message}"
        finding = result not in ("served", "refused")
        summary.outcomes.append(Outcome(case, name, what, result, message, seconds, peak,
                                        data if finding else None))
    return summary


def views_of(path: Path) -> dict[str, bytes | str]:
    """What the mount should serve for the blob at `path`: each view's whole
    bytes, or the refusal's message (a `GGUFError`) for a view it refuses."""
    try:
        info = classify(SourceGGUF(path))
    except GGUFError as e:
        return {MODEL_FILE: str(e)}
    out: dict[str, bytes | str] = {}
    for kind in [MODEL_FILE] + ([MMPROJ_FILE] if info.has_mmproj else []):
        try:
            view = build_view(info, kind, OpCache())
            out[kind] = path.read_bytes() if view.source is None else view.read(0, view.size)
        except GGUFError as e:
            out[kind] = str(e)
    return out


def check_mounted(folder: Path, expected: dict[str, bytes | str]) -> list[str]:
    """How a mounted model folder departs from `expected` (`views_of` its
    blob): a listing that fails, a view served with other bytes than in
    process, a refused view that opens and reads as anything but empty (or,
    for a projector, is not there at all).
    The empty list when it holds."""
    problems = []
    try:
        listed = set(os.listdir(folder))
    except OSError as e:
        return [f"{folder.name}: listing fails: {e}"]
    for kind, want in expected.items():
        path = folder / kind
        try:
            with open(path, "rb") as f:
                got = f.read()
        except OSError as e:
            if isinstance(want, bytes):
                others = [w for k, w in expected.items() if k != kind and isinstance(w, str)]
                with_other = " (its other view is refused)" if others else ""
                problems.append(f"{folder.name}/{kind}: served in process, {e} through the mount{with_other}")
            elif e.errno != errno.EIO and not (kind == MMPROJ_FILE and e.errno == errno.ENOENT):
                problems.append(f"{folder.name}/{kind}: refused with {e}, not EIO")
            continue
        if isinstance(want, bytes) and got != want:
            problems.append(f"{folder.name}/{kind}: {len(got)} bytes differ from the {len(want)} served in process")
        elif isinstance(want, str) and got:
            problems.append(f"{folder.name}/{kind}: refused in process ({want[:80]}), read {len(got)} bytes")
        if kind == MODEL_FILE and kind not in listed:
            problems.append(f"{folder.name}: {kind} opens but is not listed")
    return problems


def header_size(blob: bytes) -> int:
    """Where the first blob's tensor data starts (mutations aim at the header)."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(blob)
        f.flush()
        return SourceGGUF(f.name).data_offset


def seed_blobs(workdir: Path, extra: list[Path] = (), max_bytes: int = 2_000_000) -> dict[str, bytes]:
    """The blobs mutations start from: every legacy writer's (model and
    projector) under `max_bytes` (a large vocabulary would dominate the run
    time), and the `extra` GGUF files."""
    from . import LEGACY
    blobs = {}
    for name, entry in LEGACY.items():
        for role, writer in (("model", entry.model), ("projector", entry.projector)):
            if writer is not None:
                data = writer(workdir / f"{name}-{role}.gguf").read_bytes()
                if len(data) <= max_bytes:
                    blobs[f"{name}-{role}"] = data
    blobs.update({p.stem: p.read_bytes() for p in extra if p.stat().st_size <= max_bytes})
    return blobs


def with_u32(blob: bytes, key: str, value: int) -> bytes:
    """`blob` with the u32 (or i32) KV `key` set to `value`, all else kept:
    a valid header that lies about one number."""
    name = key.encode()
    at = blob.find(struct.pack("<Q", len(name)) + name)
    if at < 0:
        raise KeyError(key)
    tag = at + 8 + len(name)
    if struct.unpack_from("<I", blob, tag)[0] not in (4, 5):
        raise TypeError(f"{key} is not a 32-bit integer")
    out = bytearray(blob)
    struct.pack_into("<I", out, tag + 4, value)
    return bytes(out)
