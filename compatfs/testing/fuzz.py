"""Hostile headers: seeded mutations of the legacy writers' blobs, each run
through everything the mount does with a blob (parse, classify, plan each
view, render its header, read a few ranges, ops included) in bounded time
and memory.  A case passes when it is served or refused with `GGUFError`;
anything else (another exception, a handler's crash that `views` refused as
`HandlerFailure`, a transient fault (`Transient`), a case over its time or
memory bound) is a finding.  Two
modes: `bytes` mutates the file's bytes (`compatfs.testing.fuzz_bytes`);
`structure` edits the parsed header at the keys and tensors the handlers'
tables name (`compatfs.testing.fuzz_structure`).
`views_of` and `check_mounted` compare what a mount serves with what the
process does.  Used by
`tests/test_fuzz.py` (a few hundred cases, in process and through a mount)
and `scripts/fuzz.py` (tens of thousands).
"""

from __future__ import annotations

import errno
import os
import random
import struct
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable

from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..view.opcache import OpCache
from ..files.lookup import Transient
from ..view.catalog import HandlerFailure, build_view, classify
from ..names import MMPROJ_FILE, MODEL_FILE
from .fuzz_bytes import byte_mutator
from .fuzz_structure import structure_mutator


@dataclass
class Outcome:
    case: int
    seed_blob: str
    mutation: str
    result: str  # "served", "refused", or the unexpected exception's type
    message: str
    seconds: float
    peak_bytes: int
    blob: bytes | None = field(default=None, repr=False)  # kept for findings only


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


def run(
    seeds: dict[str, bytes],
    cases: int,
    seed: int,
    workdir: Path,
    max_seconds: float = 5.0,
    max_bytes: int = 256 << 20,
    mode: str = "bytes",
    translations=None,
) -> Summary:
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
        except HandlerFailure as e:  # a finding: a handler crashed (views refused its view for it)
            result, message = type(e.__cause__).__name__, str(e)
        except Transient as e:  # a finding: out of memory or descriptors on one small header
            result, message = f"fault of the system ({type(e.__cause__ or e.__context__ or e).__name__})", str(e)
        except GGUFError as e:
            result, message = "refused", str(e)
        except Exception as e:  # a finding: reported, never raised
            result, message = type(e).__name__, f"{e}"
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if seconds > max_seconds:
            result, message = "too slow", f"{seconds:.1f} s; {message}"
        elif peak > max_bytes:
            result, message = "too much memory", f"{peak >> 20} MiB; {message}"
        finding = result not in ("served", "refused")
        summary.outcomes.append(Outcome(case, name, what, result, message, seconds, peak, data if finding else None))
    return summary


def views_of(path: Path) -> dict[str, bytes | str]:
    """What the mount should serve for the blob at `path`: each view's whole
    bytes, or the refusal's message (a `GGUFError`) for a view it refuses.
    A `HandlerFailure` is raised, not returned: a handler that crashed is a
    bug to report, not a refusal to compare the mount with (so is a
    `Transient`, a transient fault met on the way)."""
    try:
        info = classify(SourceGGUF(path))
    except GGUFError as e:
        return {MODEL_FILE: str(e)}
    out: dict[str, bytes | str] = {}
    for kind in [MODEL_FILE] + ([MMPROJ_FILE] if info.has_mmproj else []):
        try:
            view = build_view(info, kind, OpCache())
            out[kind] = path.read_bytes() if view.source is None else view.read(0, view.size)
        except (HandlerFailure, Transient):
            raise
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


def seed_blobs(workdir: Path, extra: Iterable[Path] = (), max_bytes: int = 2_000_000) -> dict[str, bytes]:
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
