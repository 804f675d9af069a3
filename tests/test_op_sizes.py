"""Op tensors at the sizes real models have: byte-moving ops laid out by
arithmetic past the old 65,536-piece limit, permutations in chunks, a
tensor larger than the op cache computed a bounded number of times, memory
bounded under concurrent computations, listings answered while they run."""

import os
import random
import threading
import time
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT
from gguf import GGUFValueType

from compatfs.format.header import SourceGGUF
from compatfs.handlers.qwen3vl import FrameOfPatchEmbedding
from compatfs.view.opcache import COMPUTING, OpCache
from compatfs.translate.byte_ops import ConcatRows, Split, Strided
from compatfs.translate.ops import CHUNK_BYTES, Permute
from compatfs.testing import qwen3vl
from compatfs.testing.store import add_model
from compatfs.translate import ALWAYS, Produce, Translation, plan
from compatfs.view.layout import View
from compatfs.view.segments import Cached, Computed, InRounds

import wide
from conftest import needs_fuse
from ggufs import bf16, write_gguf

MIB = 1 << 20


def _view(src: SourceGGUF, ops: dict, cache: OpCache) -> View:
    """A view of `src` whose tensors are `ops` (name -> Op), in that order, and nothing else."""
    tr = Translation(
        "t",
        ALWAYS,
        tensors=tuple(Produce(name, lambda s, op=op: op, consumes=tuple(src.tensors)) for name, op in ops.items()),
    )
    return View.translated(src, plan(tr, src), cache, key="k")


def _placed(view: View) -> dict[str, tuple[int, int]]:
    """name -> (offset in the view, size) of its tensors, in data order after the header."""
    out, pos = {}, next(iter(view.segments)).size
    for t in view.spec.tensors:
        out[t.name] = (pos, t.nbytes)
        pos += t.nbytes + -t.nbytes % view.spec.alignment
    return out


def _whole(op, src: SourceGGUF) -> bytes:
    with open(src.path, "rb") as f:
        data = f.read()
    return op.compute(lambda t: memoryview(data)[t.offset : t.offset + t.nbytes])


@pytest.fixture(scope="module")
def wide_src(tmp_path_factory):
    """Stacks of gpt-oss-20b's row count (2 x 92,160 rows of 32 experts; rows
    narrowed to one MXFP4 block), and more slabs than the old piece limit."""
    rng = np.random.default_rng(7)
    rows, experts = 2 * wide.GPTOSS_20B["n_ff"], wide.GPTOSS_20B["n_expert"]

    def q8(shape):  # random Q8_0 blocks of ggml `shape`
        return rng.integers(0, 256, (*reversed(shape[1:]), shape[0] // 32 * 34), dtype=np.uint8), DT.Q8_0

    path = write_gguf(
        tmp_path_factory.mktemp("wide") / "wide.gguf",
        "test",
        tensors={
            "fused": (wide.mxfp4_blocks(rng, rows * experts).reshape(experts, rows, 17), DT.MXFP4),
            "bias": rng.standard_normal((experts, rows)).astype(np.float32),
            "cols": rng.standard_normal((70000, 48)).astype(np.float16),
            "g": q8((32, 4, 70000)),
            "u": q8((32, 2, 70000)),
            "big_g": rng.standard_normal((6, 40, 1024)).astype(np.float16),  # 80 KiB rows of a slab: read in place
            "big_u": rng.standard_normal((6, 24, 1024)).astype(np.float16),  # 48 KiB: gathered
            "long_rows": rng.standard_normal((300, 1024)).astype(np.float16),
        },
    )
    return SourceGGUF(path)


def test_runs_equal_the_computation_past_the_old_piece_limit(wide_src):
    """Every byte-moving op is laid out as a handful of segments (no piece
    per row), and reads of any size and place -- one byte either side of
    run boundaries, odd sizes straddling every boundary, whole tensors --
    give the bytes the numpy computation gives."""
    s = wide_src
    ops = {
        "gate": Strided.of(s.tensors["fused"], 1, 0, 2),
        "up": Strided.of(s.tensors["fused"], 1, 1, 2),
        "gate_bias": Strided.of(s.tensors["bias"], 0, 0, 2),
        "up_bias": Strided.of(s.tensors["bias"], 0, 1, 2),
        "col_split": Split.of(s.tensors["cols"], 0, 16, 16),
        "row_split": Split.of(s.tensors["cols"], 1, 3, 69990),
        "experts": ConcatRows.of(s.tensors["g"], s.tensors["u"]),
        "slab_split": Split.of(s.tensors["g"], 2, 1, 69998),
        "big_experts": ConcatRows.of(s.tensors["big_g"], s.tensors["big_u"]),
        "sparse_cols": Split.of(s.tensors["long_rows"], 0, 16, 16),  # 32 of each 2048 bytes
    }
    assert ops["gate"].shape[1] * ops["gate"].shape[2] == 92160 > 65536
    view = _view(s, ops, OpCache(0))
    assert len(list(view.segments)) <= 2 * len(ops) + 1  # header, one segment per op, padding
    assert not any(isinstance(seg, (Cached, Computed)) for seg in view.segments)
    placed = _placed(view)
    r = random.Random(3)
    with view.open() as blob:
        for name, op in ops.items():
            at, size = placed[name]
            assert size == op.nbytes
            if name == "slab_split":  # numpy cannot shape Q8_0: slabs 1..69998 are bytes of the blob
                g = s.tensors["g"]
                slab = g.nbytes // 70000
                want = bytes(s.read(g.offset + slab, 69998 * slab))
            else:
                want = _whole(op, s)
            assert view.read(at, size, blob) == want, name
            rounds = next((seg.rounds for seg in view.segments if isinstance(seg, InRounds) and seg.at == at), None)
            unit = min(p[2] for p in rounds.parts) if rounds else 4096
            edges = [k * unit for k in range(0, size // unit, max(1, size // unit // 50))] + [size - unit, size]
            for e in edges:
                for lo, hi in ((e - 1, e + 1), (e - unit - 1, e + 2), (e, e + 3 * unit + 5)):
                    lo, hi = max(lo, 0), min(hi, size)
                    if lo < hi:
                        assert view.read(at + lo, hi - lo, blob) == want[lo:hi], (name, lo, hi)
            for step in (7, 4093, MIB + 7):
                region = min(size, 40 * step) if step < 4096 else size
                got = b"".join(view.read(at + o, min(step, region - o), blob) for o in range(0, region, step))
                assert got == want[:region], (name, step)
            for _ in range(50):
                lo = r.randrange(size)
                hi = min(size, lo + r.choice([1, 17, 33, 4096, 65537, MIB]))
                assert view.read(at + lo, hi - lo, blob) == want[lo:hi], (name, lo, hi)


@pytest.fixture(scope="module")
def heads_src(tmp_path_factory):
    """Two 16 MiB F16 tensors: rope-permuted per head (llama.cpp's Q/K
    permutation, computed in chunks) and one whose slowest axis moves (one
    chunk, the whole tensor); and six 16 MiB tensors for the memory test."""
    rng = np.random.default_rng(11)
    mats = {f"m{i}": rng.integers(0, 1 << 15, (2048, 4096), dtype=np.uint16).view(np.float16) for i in range(6)}
    return SourceGGUF(write_gguf(tmp_path_factory.mktemp("heads") / "heads.gguf", "test", tensors=mats))


def _rope(t):
    return Permute.of(t, (32, 2, 32, 4096), (0, 2, 1, 3))


def test_an_op_tensor_larger_than_the_cache_is_computed_a_bounded_number_of_times(heads_src):
    """A 4 MiB op cache, 16 MiB op tensors read through in 1 MiB reads: the
    per-head permutation is computed once a chunk, the one that moves its
    slowest axis once (kept in the cache's own slot), not once a read."""
    s = heads_src
    ops = {"rope": _rope(s.tensors["m0"]), "transposed": Permute.of(s.tensors["m1"], (8, 256, 4096), (1, 0, 2))}
    cache = OpCache(4 * MIB)
    view = _view(s, ops, cache)
    placed = _placed(view)
    with view.open() as blob:
        for name, op in ops.items():
            at, size = placed[name]
            before = cache.computations
            got = b"".join(view.read(at + o, MIB, blob) for o in range(0, size, MIB))
            assert got == _whole(op, s), name
            assert cache.computations - before == (size // CHUNK_BYTES if name == "rope" else 1), name
            assert cache.bytes_held <= cache.max_bytes + (size if name == "transposed" else 0)


def test_a_sequential_reader_has_op_cache_chunks_computed_ahead(heads_src, monkeypatch):
    """With room in the cache for the chunk being read and those after it,
    a reader reading on finds the next chunks computed on the ahead workers:
    the same bytes, each chunk still computed once; with a cache of one
    chunk, nothing is computed ahead (it would push out the chunk being read)."""
    from compatfs.view import ahead, pool, assemble

    monkeypatch.setattr(ahead, "_pool", pool.Pool(2))  # two workers, whatever the machine's default
    monkeypatch.setattr(ahead, "enabled", True)
    on_workers = []
    chunk = assemble._chunk

    def counting(op, read, k, n):
        on_workers.append(threading.current_thread().name.startswith("compatfs-ahead"))
        return chunk(op, read, k, n)

    monkeypatch.setattr(assemble, "_chunk", counting)
    s = heads_src
    ops = {f"r{i}": _rope(s.tensors[f"m{i}"]) for i in range(6)}  # 96 MiB of op tensors, one after another
    for mib, expect_ahead in ((64, True), (4, False)):
        on_workers.clear()
        cache = OpCache(mib * MIB)
        view = _view(s, ops, cache)
        placed = _placed(view)
        at, end = placed["r0"][0], sum(placed["r5"])
        got = []
        with view.open() as blob:
            for o in range(at, end, MIB):
                got.append(view.read(o, MIB, blob))
                state = ahead.of(blob)
                deadline = time.monotonic() + 10  # the workers done before the reader reads on
                while state is not None and state.running and time.monotonic() < deadline:
                    time.sleep(0.001)
        for name, op in ops.items():
            lo, size = placed[name]
            assert b"".join(got)[lo - at : lo - at + size] == _whole(op, s), name
        assert cache.computations == sum(size for _, size in placed.values()) // CHUNK_BYTES
        assert any(on_workers) == expect_ahead, mib


def test_concurrent_computations_stay_under_the_memory_bound(heads_src):
    """Six readers of six 16 MiB permuted tensors at once (an 8 MiB cache):
    what the reads allocate stays under the stated bound -- the cache, plus
    `COMPUTING` computations of a chunk (about three times it each), plus
    the readers' own 1 MiB buffers -- where computing each whole at once
    takes over 250 MiB."""
    s = heads_src
    ops = {f"r{i}": _rope(s.tensors[f"m{i}"]) for i in range(6)}
    cache = OpCache(8 * MIB)
    view = _view(s, ops, cache)
    placed = _placed(view)
    wants = {name: _whole(op, s) for name, op in ops.items()}
    errors = []

    def reader(name):
        try:
            at, size = placed[name]
            want = memoryview(wants[name])
            with view.open() as blob:
                for o in range(0, size, MIB):
                    if view.read(at + o, MIB, blob) != want[o : o + MIB]:
                        errors.append(f"{name} differs at {o}")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    tracemalloc.start()
    try:
        threads = [threading.Thread(target=reader, args=(n,)) for n in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not errors, errors
    bound = cache.max_bytes + COMPUTING * 3 * CHUNK_BYTES + len(ops) * 3 * MIB + 4 * MIB
    assert peak <= bound, f"peak {peak / MIB:.0f} MiB over the bound {bound / MIB:.0f} MiB"


# -- Qwen3-VL's patch frames -----------------------------------------------------------------------


def test_patch_frames_are_strided_runs_of_the_blob(tmp_path):
    """Each temporal frame of a Conv3D patch embedding (2 and 3 frames; F16,
    BF16, F32) is one strided run of the blob, and the view's bytes are the
    frame as numpy takes it."""
    rng = np.random.default_rng(9)
    convs = {  # numpy [out*in, frames, h, w]
        "f16": rng.standard_normal((3 * 40, 2, 16, 16)).astype(np.float16),
        "f32": rng.standard_normal((3 * 6, 3, 14, 14)).astype(np.float32),
        "bf16": bf16(rng.standard_normal((3 * 8, 2, 16, 16))),
    }
    src = SourceGGUF(write_gguf(tmp_path / "conv.gguf", "test", tensors=convs))
    ops = {
        f"{name}.{frame}": FrameOfPatchEmbedding.of(src.tensors[name], src.tensors[name].shape[3] // 3, frame)
        for name in convs
        for frame in range(src.tensors[name].shape[2])
    }
    view = _view(src, ops, OpCache(MIB))
    placed = _placed(view)
    with view.open() as blob:
        for name, op in ops.items():
            assert [type(p).__name__ for p in op.pieces()] == ["Runs"], name
            at, size = placed[name]
            data = convs[name.split(".")[0]]
            frame = (data[0] if isinstance(data, tuple) else data)[:, int(name.split(".")[1])]
            assert view.read(at, size, blob) == frame.tobytes() == _whole(op, src), name
            assert view.read(at + 3, size - 5, blob) == frame.tobytes()[3:-2], name


# -- through a mount -------------------------------------------------------------------------------

CHANNELS = 21760  # a patch embedding of 2 x 32 MiB frames (Qwen3-VL's is 1152 channels, 3.5 MB)


def _read_while_listing(m, path, readers: int = 2) -> tuple[list[bytes], float]:
    """`path` read through in 1 MiB reads by `readers` threads at once while
    another folder is listed and a file in it stat'ed every 20 ms: what each
    reader got, and the slowest listing."""
    results, errors = {}, []

    def reader(i):
        try:
            with open(path, "rb", buffering=0) as f:
                results[i] = b"".join(iter(lambda: f.read(MIB), b""))
        except OSError as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    slowest = 0.0
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        t0 = time.monotonic()
        os.listdir(m / "other:latest")
        os.stat(m / "other:latest/model.gguf")
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.02)  # on purpose: a listing and a stat every 20 ms while the readers run
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a reader did not finish within two minutes"
    assert not errors, errors
    return [results[i] for i in range(readers)], slowest


@pytest.fixture(scope="module")
def big_frame_store(tmp_path_factory):
    """A Qwen3-VL projector whose Conv3D patch embedding (split into its two
    frames) is 64 MiB, and a second model to list."""
    d = tmp_path_factory.mktemp("frames")
    tiny = qwen3vl.legacy_qwen3vl_moe(d / "tiny.gguf")
    rng = np.random.default_rng(5)
    shape = (16, 16, 2, 3 * CHANNELS)
    blob = wide.rewritten(
        tiny,
        d / "big.gguf",
        {
            "v.patch_embed.weight": (shape, DT.F16, rng.integers(0, 256, 2 * int(np.prod(shape)), dtype=np.uint8)),
            "v.patch_embed.bias": ((CHANNELS,), DT.F32, rng.standard_normal(CHANNELS, dtype=np.float32).view(np.uint8)),
        },
    )
    store = d / "store"
    add_model(store, "big", blob)
    add_model(store, "other", tiny)
    return store, blob


@needs_fuse
def test_frames_over_the_cache_are_served_from_the_blob_through_the_mount(big_frame_store, mount_store):
    """--op-cache-mb 8, two 32 MiB frames read through in 1 MiB reads by two
    readers at once: nothing computed (the frames are strided runs of the
    blob), the bytes those of the view in-process, and a listing and a stat
    of another folder answered within a second all the while."""
    from compatfs.view.catalog import BlobViews
    from compatfs.names import MMPROJ_FILE

    store, blob = big_frame_store
    want = BlobViews().view(blob, MMPROJ_FILE).read(0, 1 << 40)
    m = mount_store(store, "-v", "--op-cache-mb", "8")
    results, slowest = _read_while_listing(m, m / "big:latest/mmproj.gguf")
    assert results[0] == want and results[1] == want
    assert slowest < 1.0, f"a listing took {slowest:.2f} s"
    computed = [line for line in m.log_text().splitlines() if "computed " in line]
    assert computed == [], computed


SIDE = 200  # a 200 x 200 position grid of width 64, resampled whole: 10 MB of F32


@pytest.fixture(scope="module")
def big_grid_store(tmp_path_factory):
    """A Nemotron omni projector whose position table is resampled (an op
    computed whole) into a 10 MB tensor, and a second model to list."""
    from compatfs.testing import nemotron

    d = tmp_path_factory.mktemp("grid")
    tiny = nemotron.legacy_nemotron_h_omni(d / "tiny.gguf")
    width, patch = nemotron.RADIO["v_n_embd"], nemotron.RADIO["patch_size"]
    table = np.random.default_rng(6).standard_normal(SIDE * SIDE * width, dtype=np.float32)
    blob = wide.rewritten(
        tiny,
        d / "big.gguf",
        {"v.position_embd": ((width, SIDE * SIDE), DT.BF16, bf16(table)[0].view(np.uint8))},
        kvs={"nemotron_h_omni.vision.image_size": (SIDE * patch, GGUFValueType.UINT32, None)},
    )
    store = d / "store"
    add_model(store, "big", blob)
    add_model(store, "other", tiny)
    return store, blob


@needs_fuse
def test_a_whole_op_over_the_cache_through_the_mount(big_grid_store, mount_store):
    """--op-cache-mb 8, a 10 MB op tensor computed whole read through in
    1 MiB reads by two readers at once: computed once (counted in the debug
    log), the bytes those of the view in-process, and a listing and a stat
    of another folder answered within a second all the while."""
    from compatfs.view.catalog import BlobViews
    from compatfs.names import MMPROJ_FILE

    store, blob = big_grid_store
    view = BlobViews().view(blob, MMPROJ_FILE)
    assert any(
        t.op is not None and t.op.nbytes > 8 * MIB and type(t.op).__name__ == "ResampleGrid" for t in view.spec.tensors
    )
    want = view.read(0, 1 << 40)
    m = mount_store(store, "-v", "--op-cache-mb", "8")
    results, slowest = _read_while_listing(m, m / "big:latest/mmproj.gguf")
    assert results[0] == want and results[1] == want
    assert slowest < 1.0, f"a listing took {slowest:.2f} s"
    computed = [line for line in m.log_text().splitlines() if "computed ResampleGrid" in line]
    assert len(computed) == 1, computed
