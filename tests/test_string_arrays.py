"""`string_starts` (the bulk walk and the remembered layouts) against a plain
reference walk, on random arrays, every truncation of small ones, hostile
lengths, and vocabularies seen twice."""

from __future__ import annotations

import random
import struct
from array import array

import pytest

import compatfs.format.values as gv
from compatfs.errors import GGUFError
from compatfs.format.values import PastTheEnd, string_starts


def reference(buf, off, count, end, base=0):
    """The walk as GGUF defines it: u64 length, then that many bytes."""
    if count > (end - off) // 8:
        raise PastTheEnd("string array runs past the end of the file")
    starts = array("Q")
    try:
        for _ in range(count):
            starts.append(off - base)
            off += 8 + struct.unpack_from("<Q", buf, off)[0]
    except struct.error:
        raise PastTheEnd("string array runs past the end of the file") from None
    if off > end:
        raise PastTheEnd("string array runs past the end of the file")
    return starts, off


def outcome(fn, *args):
    try:
        starts, pos = fn(*args)
    except (GGUFError, OverflowError) as e:
        return type(e), str(e) if isinstance(e, GGUFError) else None
    return list(starts), pos


def encode(strings) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in strings)


PRINTABLE = bytes(33 + b % 94 for b in range(256))
NULLISH = bytes((0, 0, 0, 1, 8, 255)[b % 6] for b in range(256))  # NULs, and bytes like length fields


def text(rng: random.Random, lo: int, hi: int, table: bytes = PRINTABLE) -> bytes:
    return rng.randbytes(rng.randrange(lo, hi)).translate(table)


def random_string(rng: random.Random, long: bool = True) -> bytes:
    kind = rng.random() if long else rng.random() * 0.8
    if kind < 0.55:
        return text(rng, 1, 20)
    if kind < 0.65:
        return b""
    if kind < 0.8:
        return text(rng, 1, 24, NULLISH)
    n = rng.choice((255, 256, 257, 300, 1000) if kind < 0.95 else (65535, 65536, 70000))
    return (rng.randbytes(64) * (n // 64 + 1))[:n]


BOGUS = (2**64 - 1, 2**64 - 7, 2**63, 2**63 - 9, 2**62, 2**40, 1 << 32, 10**6)


def random_case(rng: random.Random):
    strings = [random_string(rng) for _ in range(rng.choice((0, 1, 2, 5, 40, 300, 700)))]
    body = bytearray(encode(strings))
    if strings and rng.random() < 0.3:  # a bogus length somewhere
        at = rng.randrange(len(strings))
        pos = len(encode(strings[:at]))
        body[pos : pos + 8] = struct.pack("<Q", rng.choice(BOGUS))
    prefix = rng.randbytes(rng.randrange(0, 40))
    suffix = rng.randbytes(rng.randrange(0, 40)) if rng.random() < 0.7 else bytes(rng.randrange(0, 40))
    buf = prefix + bytes(body) + suffix
    off = len(prefix)
    count = len(strings) + rng.choice((0, 0, 0, 1, 3, -1)) if strings else rng.choice((0, 1, 2))
    end = rng.choice((len(buf), len(buf), off + len(body), rng.randrange(0, len(buf) + 1), len(buf) + 100))
    base = rng.choice((0, 0, off, max(off - 12, 0), rng.randrange(0, off + 1), off + 1))
    wrap = rng.choice((bytes, bytearray, memoryview, lambda b: memoryview(b"xyz" + b)[3:]))
    return wrap(buf), off, max(count, 0), end, base


@pytest.fixture(params=["default", "small-chunks", "tiny-chunks", "impatient"])
def tuning(request, monkeypatch):
    """The bulk walk also on small arrays, chunk borders everywhere, and a
    bulk walk that hands over to the plain walk early."""
    if request.param != "default":
        monkeypatch.setattr(gv, "_BULK_MIN", 0)
        monkeypatch.setattr(gv, "_CHUNK", 16 if request.param == "tiny-chunks" else 256)
        monkeypatch.setattr(gv, "_PATIENCE", 10**6 if request.param == "impatient" else 0)
    gv._remembered.clear()
    yield request.param
    gv._remembered.clear()


def test_random_arrays_match_the_reference(tuning):
    rng = random.Random(20261130)
    for _ in range(1500):
        args = random_case(rng)
        want = outcome(reference, *args)
        assert outcome(string_starts, *args) == want, args[1:]
        assert outcome(string_starts, *args) == want, args[1:]  # again: maybe remembered


def test_every_truncation_of_small_arrays(tuning):
    rng = random.Random(7)
    for strings in (
        [b"a", b"", b"\0\0\0\0\0\0\0\0\0", b"xyz" * 90, b"q"],
        [bytes([n]) * n for n in range(20)],
        [random_string(rng, long=False) for _ in range(30)],
    ):
        raw = b"GGUF" + encode(strings) + b"\0" * 9
        for count in (len(strings) - 1, len(strings), len(strings) + 1):
            for end in range(0, len(raw) + 1):
                for buf in (raw, bytearray(raw), memoryview(raw)):
                    args = (buf, 4, count, end, 1)
                    assert outcome(string_starts, *args) == outcome(reference, *args), (count, end)


def test_hostile_arguments_match_the_reference(tuning):
    raw = encode([b"ab", b"", b"cde"] * 100)
    cases = [
        (raw, 0, 0, 0, 0),
        (raw, 5, 0, 4, 0),
        (raw, 0, 10**30, len(raw), 0),
        (raw, 0, 300, len(raw), 1),
        (raw, -len(raw), 300, 0, -len(raw)),
        (raw, 0, 300, 10**20, 0),
        (struct.pack("<Q", 2**64 - 1) + raw, 0, 2, 10**30, 0),
        (raw, 2**63, 300, 2**64, 0),
        (raw, 2**64 + 3, 300, 2**66, 5),
        (memoryview(raw), 2**63 - 1, 300, 2**64, 0),
        (raw, len(raw) - 3, 300, 2**40, 0),
    ]
    for args in cases:
        assert outcome(string_starts, *args) == outcome(reference, *args), args[1:]


def test_a_large_vocabulary_in_many_chunks():
    rng = random.Random(3)
    strings = [text(rng, 1, 40) for _ in range(300_000)]
    strings[150_000] = b"\0" * 300  # a long one and NULs in the middle
    strings[200_000] = b""
    buf = b"\1" * 11 + encode(strings) + b"tail"
    gv._remembered.clear()
    assert outcome(string_starts, buf, 11, len(strings), len(buf), 3) == outcome(
        reference, buf, 11, len(strings), len(buf), 3
    )


def vocabulary(rng: random.Random, n: int = 5000) -> list[bytes]:
    return [text(rng, 1, 30) for _ in range(n)]


def test_a_vocabulary_seen_again_is_reused_exactly(monkeypatch):
    words = vocabulary(random.Random(11))
    first = b"A" * 100 + encode(words) + b"end"
    second = bytearray(b"B" * 333 + encode(words))  # the array ends the buffer
    gv._remembered.clear()
    assert outcome(string_starts, first, 100, len(words), len(first), 88) == outcome(
        reference, first, 100, len(words), len(first), 88
    )

    def no_walk(*args):
        raise AssertionError("the remembered layout should have been reused")

    with monkeypatch.context() as m:
        m.setattr(gv, "_bulk_walk", no_walk)
        m.setattr(gv, "_walk", no_walk)
        for base in (321, 0, 333):
            assert outcome(string_starts, second, 333, len(words), len(second), base) == outcome(
                reference, second, 333, len(words), len(second), base
            )
    # The same bytes cut short by `end`: not reused, the walk's own error.
    assert outcome(string_starts, second, 333, len(words), len(second) - 1, 0) == outcome(
        reference, second, 333, len(words), len(second) - 1, 0
    )


def test_a_layout_differing_in_one_length_is_not_reused():
    words = vocabulary(random.Random(12))
    buf = encode(words)
    gv._remembered.clear()
    assert outcome(string_starts, buf, 0, len(words), len(buf)) == outcome(reference, buf, 0, len(words), len(buf))
    # Same head, same count, same total size: two lengths in the middle trade one byte.
    i = next(i for i in range(2500, 5000) if len(words[i + 1]) > 1)
    changed = list(words)
    changed[i], changed[i + 1] = words[i] + words[i + 1][:1], words[i + 1][1:]
    other = b"Z" * 8 + encode(changed)
    assert other[8 : 8 + gv._HEAD] == buf[: gv._HEAD] and len(other) == 8 + len(buf)
    got = outcome(string_starts, other, 8, len(words), len(other))
    assert got == outcome(reference, other, 8, len(words), len(other))
    assert got[0] != [s + 8 for s in outcome(reference, buf, 0, len(words), len(buf))[0]]


def test_remembered_layouts_are_bounded():
    rng = random.Random(13)
    gv._remembered.clear()
    for _ in range(20):
        words = vocabulary(rng, 20_000)
        buf = encode(words)
        string_starts(buf, 0, len(words), len(buf))
    assert 0 < gv._remembered.currsize <= gv._remembered.maxsize
