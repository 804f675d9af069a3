"""Hostile headers: seeded mutations of the legacy writers' blobs, each run
through everything the mount does with a blob (parse, classify, plan each
view, render its header, read a few ranges, ops included) in bounded time
and memory.  A case passes when it is served or refused with `GGUFError`;
anything else (another exception, a case over its time or memory bound) is a
finding.  Used by `tests/test_fuzz.py` (a few hundred cases) and
`scripts/fuzz.py` (tens of thousands).
"""
from __future__ import annotations

import random
import struct
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..gguf_source import SourceGGUF
from ..gguf_values import GGUFError
from ..opcache import OpCache
from ..views import MMPROJ_FILE, MODEL_FILE, build_view, classify

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


@dataclass
class Outcome:
    case: int
    seed_blob: str
    mutation: str
    result: str            # "served", "refused", or the unexpected exception's type
    message: str
    seconds: float
    peak_bytes: int


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


def exercise(path: Path) -> None:
    """Everything the mount does with the blob at `path`, on every view it has."""
    info = classify(SourceGGUF(path))
    kinds = [MODEL_FILE] + ([MMPROJ_FILE] if info.has_mmproj else [])
    for kind in kinds:
        view = build_view(info, kind, OpCache())
        if view.source is None:
            continue
        for offset in (0, view.size // 2, max(view.size - 4096, 0)):
            view.read(offset, 4096)


def run(seeds: dict[str, bytes], cases: int, seed: int, workdir: Path,
        max_seconds: float = 5.0, max_bytes: int = 256 << 20) -> Summary:
    """`cases` mutated copies of the `seeds` blobs (name -> bytes), each exercised."""
    rng = random.Random(seed)
    summary = Summary()
    names = sorted(seeds)
    path = workdir / "case.gguf"
    headers = {name: header_size(blob) for name, blob in seeds.items()}
    for case in range(cases):
        name = rng.choice(names)
        original = seeds[name]
        header = headers[name]
        buf = bytearray(original)
        kind = rng.choice(sorted(MUTATIONS))
        what = f"{kind}: " + MUTATIONS[kind](buf, rng, header)
        path.write_bytes(buf)
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
        summary.outcomes.append(Outcome(case, name, what, result, message, seconds, peak))
    return summary


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
