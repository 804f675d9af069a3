"""Hostile headers: every mutated blob is served or refused with GGUFError
(never a handler's crash that the views refuse for it), in bounded time and memory; numbers a handler would loop over are checked
against the tensors the blob holds."""

import math
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from gguf import GGUFValueType as VT

from compatfs.testing import fuzz, fuzz_structure

from conftest import SHARED, needs_fuse, needs_shared
from hostile import refused, served_or_refused


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-seeds")
    extra = sorted((SHARED / "ollama").glob("*.gguf")) if SHARED.is_dir() else []
    return fuzz.seed_blobs(d, extra)


def test_mutated_headers_are_served_or_refused(seeds, tmp_path):
    summary = fuzz.run(seeds, cases=300, seed=20261130, workdir=tmp_path, max_seconds=5.0, max_bytes=64 << 20)
    assert summary.findings == []
    # The run really exercised both outcomes.
    assert summary.by_result["served"] > 30 and summary.by_result["refused"] > 30


def test_a_handler_crash_is_a_finding_not_a_refusal(tmp_path, monkeypatch):
    """A handler that raises KeyError is refused by the views as a
    HandlerFailure, which is a GGUFError: the fuzzer reports it as a
    finding, `views_of` raises it, and `refused` fails on it even where the
    message matches (pytest.raises(GGUFError, match=...) passes it)."""
    import compatfs.view.claims as views_module
    from compatfs.testing import LEGACY

    blob = LEGACY["gemma3"].model(tmp_path / "g.gguf")

    def plan(tr, src):
        raise KeyError("gemma3.block_count")

    monkeypatch.setattr(views_module, "plan", plan)
    summary = fuzz.run({"gemma3": blob.read_bytes()}, cases=20, seed=1, workdir=tmp_path)
    # (Mutations that break the header are refused before any handler plans.)
    assert summary.by_result["KeyError"] >= 5, summary.by_result
    assert all("KeyError: 'gemma3.block_count'" in o.message for o in summary.findings)
    with pytest.raises(views_module.HandlerFailure):
        fuzz.views_of(blob)
    with pytest.raises(AssertionError, match=r"a handler crashed \(KeyError\)"), refused("block_count"):
        fuzz.exercise(blob)
    with pytest.raises(AssertionError, match=r"a handler crashed \(KeyError\)"), served_or_refused():
        fuzz.exercise(blob)


@needs_shared
@pytest.mark.parametrize(
    "key, value",
    [("gemma4.block_count", 2**32 - 1), ("gemma4.vision.block_count", 2**22), ("gemma4.vision.block_count", 2**31 - 1)],
)
def test_block_count_bombs_are_refused_quickly(tmp_path, key, value):
    """Measured on the landed code: `ls -l` hung for hours (2^32-1) or took
    23 s and 5.5 GB (2^31-1)."""
    path = tmp_path / "bomb.gguf"
    path.write_bytes(fuzz.with_u32((SHARED / "ollama/gemma4_vision.gguf").read_bytes(), key, value))
    tracemalloc.start()
    t0 = time.perf_counter()
    with refused(key.replace(".", r"\.")):
        fuzz.exercise(path)
    assert time.perf_counter() - t0 < 2.0
    assert tracemalloc.get_traced_memory()[1] < 64 << 20
    tracemalloc.stop()


@needs_shared
def test_a_count_below_the_blocks_present_is_served(tmp_path):
    """Only counts that exceed what the blob holds are refused."""
    path = tmp_path / "short.gguf"
    path.write_bytes(fuzz.with_u32((SHARED / "ollama/gemma4_vision.gguf").read_bytes(), "gemma4.block_count", 1))
    fuzz.exercise(path)


@needs_shared
@pytest.mark.parametrize("value", [0, 2**31 - 1])
def test_finding_mistral3_vision_head_count(tmp_path, value):
    """A fuzz finding (ValueError from the rope permutation): now a GGUFError
    naming the key."""
    path = tmp_path / "heads.gguf"
    blob = (SHARED / "ollama/mistral3.gguf").read_bytes()
    path.write_bytes(fuzz.with_u32(blob, "mistral3.vision.attention.head_count", value))
    with refused("head_count"):
        fuzz.exercise(path)


def test_finding_a_derived_value_out_of_range(tmp_path):
    """A fuzz finding (struct.error from a KV computed as 4 x the vision head
    count): values a handler computes from a blob's numbers are range-checked
    like the numbers themselves, and the error names the edit."""
    from compatfs.testing import LEGACY

    blob = LEGACY["deepseek-ocr"].model(tmp_path / "ds.gguf").read_bytes()
    path = tmp_path / "heads.gguf"
    path.write_bytes(fuzz.with_u32(blob, "deepseekocr.vision.head_count", 2**32 - 1))
    with refused("feed_forward_length.*does not fit"):
        fuzz.exercise(path)


# -- structure-aware: edited headers, aimed at what the handlers read --------------------


def test_edited_headers_are_served_or_refused(seeds, tmp_path):
    """Duplicates, retyped values, NaN and huge numbers, nested and empty
    arrays, unknown ggml types, odd shapes, overlaps and reordering, at the
    keys and tensors the handlers' tables name."""
    summary = fuzz.run(
        seeds, cases=150, seed=20261201, workdir=tmp_path, max_seconds=5.0, max_bytes=128 << 20, mode="structure"
    )
    assert [(o.seed_blob, o.mutation, o.result, o.message[:200]) for o in summary.findings] == []
    assert summary.by_result["served"] > 20 and summary.by_result["refused"] > 20
    kinds = {part.split(":")[0] for o in summary.outcomes for part in o.mutation.split("; ")}
    assert kinds == set(fuzz_structure.STRUCTURE)


def test_the_handlers_tables_are_the_targets():
    from compatfs import handlers

    targets = fuzz_structure.handler_targets((*handlers.TEXT, *handlers.CLIP))
    # Read by an edit, a count, a detector's closure and a tensor maker's.
    for name in (
        "qwen25vl.vision.fullatt_block_indexes",
        "gemma4.vision.block_count",
        "lfm2.attention.head_count_kv",
        "tokenizer.ggml.token_type",
        "blk.{}.ffn_gate_exps.weight",
        "v.patch_embed.bias",
        "per_layer_token_embd.weight",
    ):
        assert name in targets, name


@needs_fuse
def test_edited_headers_through_a_mount(seeds, tmp_path, mount_store):
    """The same kind of cases served by a daemon: every folder lists, every
    view the process serves is served with the same bytes, every view it
    refuses opens as EIO or empty, and a good model beside them is intact."""
    import random
    from compatfs import handlers
    from compatfs.testing.store import add_model

    mutate = fuzz_structure.structure_mutator((*handlers.TEXT, *handlers.CLIP), tmp_path)
    rng = random.Random(20261202)
    store, cases = tmp_path / "store", {}
    names = sorted(seeds)
    for i in range(24):
        data, what = mutate(seeds[rng.choice(names)], rng)
        path = tmp_path / f"case{i}.gguf"
        path.write_bytes(data)
        add_model(store, f"case{i}", path)
        cases[f"case{i}"] = (path, what)
    from compatfs.testing import LEGACY

    good = LEGACY["gemma3-vision"].model(tmp_path / "good.gguf")
    add_model(store, "good", good)
    cases["good"] = (good, "none")
    m = mount_store(store)
    folders = {p.name.split(":")[0]: p for p in m.path.iterdir()}
    problems = []
    for name, (path, what) in cases.items():
        expected = fuzz.views_of(path)
        problems += [f"{p} [{what}]" for p in fuzz.check_mounted(folders[name], expected)]
    # (A view refused because its blob's other view is: test_a_refused_projector_leaves_the_text_view.)
    assert [p for p in problems if "(its other view is refused)" not in p] == []
    assert isinstance(fuzz.views_of(good)["mmproj.gguf"], bytes) and m.alive
    assert fuzz.check_mounted(folders["good"], fuzz.views_of(good)) == []


@needs_fuse
def test_a_refused_projector_leaves_the_text_view(tmp_path, mount_store):
    """A blob whose projector cannot be planned (a vision block count that is
    a bool) still serves its text view, with the bytes served in process."""
    from compatfs.testing import LEGACY
    from compatfs.testing.gguf_edit import Blob, payload
    from compatfs.testing.store import add_model
    from gguf import GGUFValueType as VT

    blob = Blob.parse(LEGACY["deepseek-ocr"].model(tmp_path / "ds.gguf").read_bytes())
    kv = blob.kv("deepseekocr.vision.block_count")
    kv.vtype, kv.payload = VT.BOOL, payload(VT.BOOL, True)
    path = tmp_path / "bad-projector.gguf"
    path.write_bytes(blob.serialize())
    expected = fuzz.views_of(path)
    assert isinstance(expected["model.gguf"], bytes) and "block_count is BOOL" in expected["mmproj.gguf"]
    add_model(tmp_path / "store", "ds", path)
    m = mount_store(tmp_path / "store")
    assert fuzz.check_mounted(m / "ds:latest", expected) == []


# -- values of the wrong type where a handler reads a key (issue 17) ---------------------


def _edited(path, tmp_path, change) -> Path:
    from compatfs.testing.gguf_edit import Blob

    blob = Blob.parse(Path(path).read_bytes())
    change(blob)
    out = tmp_path / f"edited-{Path(path).stem}.gguf"
    out.write_bytes(blob.serialize())
    return out


def _same_length_strings(blob, key):
    from compatfs.testing.gguf_edit import payload

    kv = blob.kv(key)
    count = struct.unpack_from("<Q", kv.payload, 4)[0]
    kv.vtype, kv.payload = VT.ARRAY, payload(VT.ARRAY, (VT.STRING, [str(i % 5) for i in range(count)]))


@needs_shared
@pytest.mark.parametrize("fixture", ["gemma3", "gemma3n", "gemma4_vision", "qwen2_5_vl", "qwen3_vl_legacy"])
def test_token_types_as_strings_are_refused_naming_the_key(tmp_path, fixture):
    """Was a TypeError (list indices must be integers) on every stat."""
    path = _edited(
        SHARED / f"ollama/{fixture}.gguf", tmp_path, lambda b: _same_length_strings(b, "tokenizer.ggml.token_type")
    )
    with refused(r"tokenizer\.ggml\.token_type is an array of \d+ STRING"):
        fuzz.exercise(path)


@needs_shared
def test_lfm2_kv_heads_as_strings_are_no_match(tmp_path):
    """Strings are no per-layer counts: the detector does not claim the blob
    (it did, and the edit then died with an AttributeError writing an int
    into a string array), so it is served as stored."""
    from compatfs.format.header import SourceGGUF
    from compatfs.view.claims import classify

    path = _edited(
        SHARED / "ollama/lfm2.gguf", tmp_path, lambda b: _same_length_strings(b, "lfm2.attention.head_count_kv")
    )
    assert classify(SourceGGUF(path)).text is None
    assert fuzz.exercise(path) == []


@needs_shared
@pytest.mark.parametrize("items", [["7", "15"], [7.0, math.nan], [math.inf, 15.0]])
def test_vision_block_indexes_of_another_type_are_refused(tmp_path, items):
    """Qwen2.5-VL's full-attention block indexes as strings, NaN or inf: was
    a ValueError or OverflowError from int()."""
    from compatfs.testing.gguf_edit import payload

    def change(b):
        kv = b.kv("qwen25vl.vision.fullatt_block_indexes")
        etype = VT.STRING if isinstance(items[0], str) else VT.FLOAT32
        kv.vtype, kv.payload = VT.ARRAY, payload(VT.ARRAY, (etype, items))

    path = _edited(SHARED / "ollama/qwen2_5_vl.gguf", tmp_path, change)
    with refused(r"fullatt_block_indexes is an array of 2"):
        fuzz.exercise(path)


@pytest.mark.parametrize(
    "writer, tensor, dims",
    [
        ("gemma3n", "per_layer_token_embd.weight", ()),
        ("mistral3", "token_embd.weight", (64,)),
        ("nemotron3", "v.position_embd", (0,)),
        ("qwen3-vl", "v.patch_embed.bias", ()),
        ("mistral3", "v.blk.0.attn_q.weight", ()),
        ("nemotron3", "v.blk.1.attn_q.bias", ()),  # a structure-fuzz finding: IndexError merging Q, K, V
    ],
)
def test_a_shape_of_too_few_axes_is_refused_or_served(tmp_path, writer, tensor, dims):
    """0-d, 1-d and zero-length tensors where a handler reads a shape: were
    IndexErrors."""
    from compatfs.testing import LEGACY

    if writer in LEGACY:
        path = LEGACY[writer].model(tmp_path / f"{writer}.gguf")
    else:
        if not SHARED.is_dir():
            pytest.skip("../shared/fixtures is not present")
        path = SHARED / f"ollama/{writer}.gguf"

    def change(b):
        t = b.tensor(tensor)
        t.dims = dims

    edited = _edited(path, tmp_path, change)
    with served_or_refused():
        fuzz.exercise(edited)


def test_deeply_nested_arrays_and_an_architecture_that_is_an_array(tmp_path):
    """A 64-deep nested array where a count is read, and a duplicated
    architecture reaching the detectors as an array: was a ValueError
    (the truth value of an array) on every stat."""
    from compatfs.testing import LEGACY
    from compatfs.testing.gguf_edit import KV, payload

    path = LEGACY["gemma4-moe"].model(tmp_path / "g4.gguf")

    def nested_count(depth: int):
        nested = (VT.INT32, [1])
        for _ in range(depth - 1):
            nested = (VT.ARRAY, [nested])

        def edit(b):
            kv = b.kv("gemma4.block_count")
            kv.vtype, kv.payload = VT.ARRAY, payload(VT.ARRAY, nested)

        return edit

    # Nested within what the parser reads, the count refuses it; 64 deep, the parser does.
    with refused(r"gemma4\.block_count is a nested array"):
        fuzz.exercise(_edited(path, tmp_path, nested_count(4)))
    with refused(r"arrays nested more than 8 deep"):
        fuzz.exercise(_edited(path, tmp_path, nested_count(64)))

    def twice(b):
        b.kvs.append(KV("general.architecture", VT.ARRAY, payload(VT.ARRAY, (VT.UINT8, [1, 2, 3]))))

    fuzz.exercise(_edited(path, tmp_path, twice))  # no translation claims it: served as it is
