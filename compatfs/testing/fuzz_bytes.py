"""Byte mutations for the fuzzer (`compatfs.testing.fuzz`, mode "bytes"):
bit flips, random bytes, extreme 32- and 64-bit fields, counts set to
extremes, truncation, block digits changed, aimed at a blob's header."""

from __future__ import annotations

import random
import struct
import tempfile
from collections.abc import Callable

from ..format.header import SourceGGUF

Mutation = Callable[[bytearray, random.Random, int], str]


def _flip(buf: bytearray, rng: random.Random, header: int) -> str:
    at = rng.randrange(header)
    buf[at] ^= 1 << rng.randrange(8)
    return f"bit flip at {at}"


def _bytes(buf: bytearray, rng: random.Random, header: int) -> str:
    at = rng.randrange(header)
    n = rng.randint(1, 8)
    buf[at : at + n] = bytes(rng.randrange(256) for _ in range(n))
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
    while end < header and 32 < buf[end] < 127:  # to the end of the key's name
        end += 1
    vtype = struct.unpack_from("<I", buf, end)[0] if end + 4 <= header else None
    if vtype in (4, 5):  # u32 / i32
        value = rng.choice((2**32 - 1, 2**31 - 1, 2**22, 0))
        struct.pack_into("<I", buf, end + 4, value)
        return f"count key at {at} = {value}"
    return _u32(buf, rng, header)


def _find_all(buf: bytearray, needle: bytes, limit: int) -> list[int]:
    out: list[int] = []
    at = buf.find(needle, 0, limit)
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
    "flip": _flip,
    "bytes": _bytes,
    "u64": _u64,
    "u32": _u32,
    "count_key": _count_key,
    "truncate": _truncate,
    "duplicate_name": _duplicate_name,
}


def byte_mutator() -> Callable[[bytes, random.Random], tuple[bytes, str]]:
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


def header_size(blob: bytes) -> int:
    """Where the first blob's tensor data starts (mutations aim at the header)."""
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(blob)
        f.flush()
        return SourceGGUF(f.name).data_offset
