"""Each op against a numpy reference, on tensors of a real GGUF file."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT
from gguf import quants

from compatfs.format.header import SourceGGUF
from compatfs.translate.byte_ops import Split, ZeroTensor
from compatfs.translate.ops import AddScalar, Concat, Permute, Promote, to_f32

from ggufs import bf16, write_gguf

rng = np.random.default_rng(0)
A = rng.standard_normal((6, 32)).astype(np.float32)  # numpy shape: 6 rows of 32
B = rng.standard_normal((4, 32)).astype(np.float32)
Q = rng.standard_normal((24, 32)).astype(np.float32)  # 24 rows: 4 heads of 3 pairs


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    q8 = quants.quantize(B, DT.Q8_0)
    path = write_gguf(
        tmp_path_factory.mktemp("ops") / "ops.gguf",
        "test",
        tensors={
            "a32": A,
            "a16": A.astype(np.float16),
            "abf": bf16(A),
            "b32": B,
            "b16": B.astype(np.float16),
            "bq8": (q8, DT.Q8_0),
            "q16": Q.astype(np.float16),
            "qbf": bf16(Q),
        },
    )
    return SourceGGUF(path)


def run(op, src):
    return op.compute(lambda t: src.read(t.offset, t.nbytes))


def arr(op, data):
    dt = {DT.F32: np.float32, DT.F16: np.float16}[op.dtype]
    return np.frombuffer(data, dtype=dt).reshape(tuple(reversed(op.shape)))


def test_promote_f16_and_bf16(src):
    for name in ("a16", "abf"):
        op = Promote.of(src.tensors[name])
        assert op.dtype == DT.F32 and op.shape == (32, 6)
        np.testing.assert_allclose(arr(op, run(op, src)), A, rtol=1e-2, atol=1e-2)
    # F16 promotion is exact.
    op = Promote.of(src.tensors["a16"])
    np.testing.assert_array_equal(arr(op, run(op, src)), A.astype(np.float16).astype(np.float32))


def test_concat_same_dtype_keeps_bytes(src):
    op = Concat.of(src.tensors["a32"], src.tensors["b32"])
    assert op.shape == (32, 10) and op.dtype == DT.F32
    np.testing.assert_array_equal(arr(op, run(op, src)), np.concatenate([A, B]))
    op = Concat.of(src.tensors["a16"], src.tensors["b16"])
    assert op.dtype == DT.F16
    np.testing.assert_array_equal(arr(op, run(op, src)), np.concatenate([A, B]).astype(np.float16))


def test_concat_mixed_dtypes_dequantizes(src):
    op = Concat.of(src.tensors["a16"], src.tensors["bq8"])
    assert op.dtype == DT.F32 and op.shape == (32, 10)
    out = arr(op, run(op, src))
    np.testing.assert_array_equal(out[:6], A.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(out[6:], B, atol=0.05)
    np.testing.assert_array_equal(
        out[6:], to_f32(src.tensors["bq8"], src.read(src.tensors["bq8"].offset, src.tensors["bq8"].nbytes))
    )


def test_split_along_each_axis(src):
    t = src.tensors["a32"]
    op = Split.of(t, axis=1, start=2, length=3)  # rows
    np.testing.assert_array_equal(arr(op, run(op, src)), A[2:5])
    op = Split.of(t, axis=0, start=8, length=16)  # columns
    np.testing.assert_array_equal(arr(op, run(op, src)), A[:, 8:24])


def test_permute_like_llama_cpp_converters(src):
    """llama.cpp's rope permutation of Q/K rows (`LlamaModel.permute`), as
    mistral3 uses it: within each head, HF's [first halves | second halves]
    becomes interleaved pairs; written here row by row, apart from numpy's
    transpose the op uses."""
    heads, half = 4, 3
    t = src.tensors["q16"]
    op = Permute.of(t, view=(heads, 2, half, 32), axes=(0, 2, 1, 3))
    rows = Q.astype(np.float16)
    expect = np.empty_like(rows)
    for h in range(heads):
        for i in range(half):
            for j in range(2):
                expect[h * 2 * half + 2 * i + j] = rows[h * 2 * half + j * half + i]
    got = np.frombuffer(run(op, src), np.float16).reshape(rows.shape)
    np.testing.assert_array_equal(got, expect)
    assert not np.array_equal(got, rows)
    # The slowest axis moved (a transpose of heads and pairs): each output
    # head gathers rows of every input head.
    op = Permute.of(t, view=(heads, 2 * half, 32), axes=(1, 0, 2))
    got = np.frombuffer(run(op, src), np.float16).reshape(2 * half, heads, 32)
    for h in range(heads):
        for r in range(2 * half):
            np.testing.assert_array_equal(got[r, h], rows[h * 2 * half + r])


def test_permute_chunks_equal_the_whole(src, monkeypatch):
    """A permutation that keeps its slowest axes is computed in chunks of
    whole blocks of them (each at the same bytes in input and output); one
    that moves the slowest axis is one chunk.  Chunk sizes that divide the
    tensor and that do not, BF16 and F16."""
    import compatfs.translate.ops as ops

    read = lambda t, start, size: src.read(t.offset + start, size)  # noqa: E731
    cases = [
        ((4, 2, 3, 32), (0, 2, 1, 3)),
        ((4, 2, 3, 32), (0, 1, 3, 2)),
        ((2, 2, 6, 32), (0, 1, 3, 2)),
        ((4, 6, 32), (1, 0, 2)),
        ((4, 2, 3, 32), (0, 1, 2, 3)),
    ]
    for name in ("q16", "qbf"):
        for view, axes in cases:
            op = Permute.of(src.tensors[name], view, axes)
            whole = run(op, src)
            for chunk_bytes in (1, 200, 2 * 3 * 32 * 2 * 3, 1 << 20):
                monkeypatch.setattr(ops, "CHUNK_BYTES", chunk_bytes)
                size = op.chunk_bytes
                if axes[0] != 0:
                    assert size == op.nbytes
                chunks = [op.compute_chunk(read, k) for k in range(-(-op.nbytes // size))]
                assert all(len(c) == size for c in chunks[:-1]), (view, axes, chunk_bytes)
                assert b"".join(chunks) == whole, (name, view, axes, chunk_bytes)


def test_add_scalar_and_zeros(src):
    op = AddScalar.of(src.tensors["b16"], 1.0)
    np.testing.assert_array_equal(arr(op, run(op, src)), B.astype(np.float16).astype(np.float32) + 1)
    z = ZeroTensor.of((32, 2), DT.F16)
    assert run(z, src) == bytes(32 * 2 * 2)


def test_bad_shapes_are_refused(src):
    with pytest.raises(ValueError):
        Concat.of(src.tensors["a32"], src.tensors["a32"].__class__("x", (16, 2), DT.F32, 0))
    with pytest.raises(ValueError):
        Split.of(src.tensors["a32"], axis=1, start=4, length=4)


def from_pieces(op, src) -> bytes:
    """The op's output as its pieces say, run by run (what `Runs` means,
    apart from the view's arithmetic)."""
    from compatfs.translate.runs import Runs

    out = []
    for p in op.pieces():
        if not isinstance(p, Runs):
            out.append(bytes(p))
            continue
        for k in range(p.count):
            for part in p.parts:
                out.append(bytes(src.read(part.tensor.offset + part.start + k * part.stride, part.unit)))
    return b"".join(out)


def test_ops_that_move_bytes_are_served_as_pieces_equal_to_the_computation(src):
    from compatfs.translate.byte_ops import ConcatRows, PadRows, Strided

    e = rng.standard_normal((3, 4, 32)).astype(np.float32)
    path = write_gguf(
        src.path.with_name("experts.gguf"),
        "test",
        tensors={"g": e, "u": e[:, :2] + 1, "gq": (quants.quantize(e, DT.Q8_0), DT.Q8_0)},
    )
    exp = SourceGGUF(path)
    cases = [
        (src, Concat.of(src.tensors["a16"], src.tensors["b16"])),
        (src, Split.of(src.tensors["a32"], axis=1, start=2, length=3)),
        (src, Split.of(src.tensors["a16"], axis=0, start=8, length=16)),
        (src, ZeroTensor.of((32, 2), DT.F16)),
        (src, PadRows.of(src.tensors["b16"], 7)),
        (exp, ConcatRows.of(exp.tensors["g"], exp.tensors["u"])),
        (exp, Split.of(exp.tensors["g"], axis=1, start=1, length=2)),
        (exp, Strided.of(exp.tensors["g"], 0, 1, 2)),
        (exp, Strided.of(exp.tensors["g"], 1, 0, 2)),
        (exp, Strided.of(exp.tensors["gq"], 2, 2, 3)),
    ]
    for s, op in cases:
        assert op.pieces() is not None, op.description
        assert from_pieces(op, s) == run(op, s), op.description
        assert len(op.pieces()) <= len(op.inputs) + 1, op.description  # laid out by arithmetic
    # Quantized rows are whole blocks: a split of rows or slabs is their bytes.
    gq = exp.tensors["gq"]
    raw = bytes(exp.read(gq.offset, gq.nbytes))
    slab = gq.nbytes // 3
    assert from_pieces(Split.of(gq, axis=2, start=1, length=2), exp) == raw[slab:]
    assert from_pieces(Split.of(gq, axis=1, start=1, length=2), exp) == b"".join(
        raw[k * slab + slab // 4 : k * slab + 3 * slab // 4] for k in range(3)
    )
    # Not whole quantization blocks: computed, not pieced.
    assert Permute.of(src.tensors["a32"], (3, 2, 1, 32), (0, 2, 1, 3)).pieces() is None


def test_elementwise_ops_compute_any_range_from_the_blocks_it_needs(src):
    read = lambda t, start, size: bytes(src.read(t.offset + start, size))
    ops = [Promote.of(src.tensors[n]) for n in ("a16", "abf", "bq8", "a32")]
    ops += [AddScalar.of(src.tensors["b16"], 1.0), Concat.of(src.tensors["a16"], src.tensors["bq8"])]
    r = np.random.default_rng(5)
    for op in ops:
        assert op.ranged, op.description
        whole = run(op, src)
        for lo, hi in [(0, op.nbytes), (1, 3), (100, 300), (op.nbytes - 5, op.nbytes)] + [
            tuple(sorted(r.integers(0, op.nbytes + 1, 2))) for _ in range(20)
        ]:
            assert op.compute_range(read, int(lo), int(hi)) == whole[lo:hi], (op.description, lo, hi)
    # An op that needs its whole input is neither.
    perm = Permute.of(src.tensors["a32"], (3, 2, 1, 32), (0, 2, 1, 3))
    assert not perm.ranged and perm.pieces() is None


def test_f16_and_bf16_promotion_is_bit_exact_for_every_value(tmp_path):
    """Every 16-bit pattern (zeros, subnormals, infinities, NaN payloads) comes
    out as numpy's astype makes it, across chunk boundaries and into a caller's
    buffer without touching a byte around the range."""
    from compatfs.translate.ops import CHUNK

    bits = np.tile(np.arange(65536, dtype=np.uint16), (2 * CHUNK) // 65536 + 1)
    path = write_gguf(
        tmp_path / "all.gguf", "test", tensors={"h": bits.view(np.float16), "b": (bits.view(np.uint16), DT.BF16)}
    )
    s = SourceGGUF(path)
    read = lambda t, start, size: s.read(t.offset + start, size)  # noqa: E731
    expect = {"h": bits.view(np.float16).astype(np.float32), "b": (bits.astype(np.uint32) << 16).view(np.float32)}
    for name, want in expect.items():
        op = Promote.of(s.tensors[name])
        assert bytes(op.compute_range(read, 0, op.nbytes)) == want.tobytes()
        for lo, hi in [(4 * CHUNK - 8, 4 * CHUNK + 12), (6, 4 * CHUNK + 2), (op.nbytes - 4 * CHUNK - 3, op.nbytes)]:
            out = bytearray(b"\xaa" * (hi - lo + 8))
            op.compute_range_into(read, lo, hi, memoryview(out)[4 : 4 + hi - lo])
            assert out[4:-4] == want.tobytes()[lo:hi] and out[:4] == out[-4:] == b"\xaa" * 4, (name, lo, hi)


def test_the_op_contract_is_checked_when_an_op_class_is_made(src):
    """An op without `_compute` cannot be made; a ranged op without
    `compute_range_into`, or one overriding the derived `compute_range`, is
    refused at class creation (neither falls back on the other)."""
    from compatfs.translate.ops import Op

    class Whole(Op):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Whole((), (4,), DT.F32)
    with pytest.raises(TypeError, match="compute_range_into"):

        class Ranged(Op):
            ranged = True

            def _compute(self, data):
                return b""

    with pytest.raises(TypeError, match="compute_range"):

        class Overriding(Op):
            def _compute(self, data):
                return b""

            def compute_range(self, read, lo, hi):
                return b""

    with pytest.raises(Exception, match="not computed by range"):
        Permute.of(src.tensors["a32"], (3, 2, 1, 32), (0, 2, 1, 3)).compute_range(lambda t, a, n: b"", 0, 4)
