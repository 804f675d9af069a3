"""Qwen2.5-VL as Ollama's converter writes it (one `qwen25vl` blob, text and
vision): through the mount, `model.gguf` and `mmproj.gguf` equal llama.cpp's
own conversion of the same weights, and load in llama.cpp.  Then the legacy
writer's blob, which needs no ../shared."""

import gguf
import pytest
from gguf import GGUFValueType as VT
from gguf import TokenType as TT

from compatfs.format.header import SourceGGUF
from compatfs.format.values import array, u32
from compatfs.handlers import qwen25vl
from compatfs.handlers.qwen25vl import WindowPattern
from compatfs.testing import qwen25vl as writer
from compatfs.testing.core import form
from compatfs.translate import plan

from compare import assert_same_gguf, assert_same_tensors, kvs, tensors
from chat import assert_only_the_views_load
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job


BLOB = SHARED / "ollama/qwen2_5_vl.gguf"
UPSTREAM = SHARED / "upstream/qwen2_5_vl"
MODEL = "qwen2.5vl:3b"


store = one_model_store("qwen2.5vl", "3b", BLOB)


@needs_fuse
@needs_shared
def test_text_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, want, raw = kvs(mounted), kvs(UPSTREAM / "model.gguf"), kvs(BLOB)
    # Every KV of llama.cpp's conversion, with its value: qwen2vl.* keys and
    # 4 rope sections, BOS, add_bos/add_eos, FIM markers typed control, the
    # filler rows named [PAD<id>] and typed unused.
    assert {k: got.get(k) for k in want} == want
    # Beyond them only two Ollama keys llama.cpp does not read for a BPE
    # vocabulary: per-token scores and the EOS id list.
    assert set(got) - set(want) == {"tokenizer.ggml.scores", "tokenizer.ggml.eos_token_ids"}
    assert raw["tokenizer.ggml.tokens"] != want["tokenizer.ggml.tokens"]  # the fixture needs the fix
    assert raw["tokenizer.ggml.token_type"] != want["tokenizer.ggml.token_type"]
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "qwen2vl"
    assert_same_tensors(mounted, UPSTREAM / "model.gguf")


@needs_fuse
@needs_shared
def test_projector_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted, upstream = m / MODEL / "mmproj.gguf", UPSTREAM / "mmproj.gguf"
    assert_same_gguf(mounted, upstream)  # types too: patch embeddings stay F16, as llama.cpp's converter keeps them
    fields = gguf.GGUFReader(mounted).fields
    assert fields["general.architecture"].contents() == "clip"


@needs_fuse
@needs_shared
def test_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    # The views complete and see; untranslated, the blob loads neither as a
    # model nor as a projector.
    assert_only_the_views_load(m / MODEL, BLOB, "qwen25vl")
    # Text with markers and filler names tokenizes as with llama.cpp's conversion.
    tok = {"actions": [{"op": "tokenize", "text": "<|fim_prefix|>a [PAD3] b<|im_end|>", "special": False}]}
    through, reference = (
        run_job({"model": str(m / MODEL / "model.gguf"), **tok}),
        run_job({"model": str(UPSTREAM / "model.gguf"), **tok}),
    )
    assert through["ok"] and reference["ok"]
    assert through["results"][0]["ids"] == reference["results"][0]["ids"]


def test_window_pattern_from_full_attention_blocks():
    """Full attention every p-th block gives p; an empty list (older Ollama
    converters) the published models' 8; uneven blocks nothing."""
    edit = WindowPattern("idx", "n_wa", default=8)
    for blocks, want in (([7, 15, 23, 31], 8), ([1, 3], 2), ([], 8), (None, 8), ([3, 7, 15], None)):
        kv = {} if blocks is None else {"idx": array(VT.INT32, blocks)}
        edit.apply(kv, None)
        assert kv.get("n_wa") == (None if want is None else u32(want)), blocks


# -- the legacy writer (f63eea3's form): no ../shared needed -------------------------------


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return writer.legacy_qwen25vl(tmp_path_factory.mktemp("qwen25vl-writer") / "qwen25vl.gguf")


written = one_model_store("qwen2.5vl", "7b")


@needs_shared
def test_writer_writes_the_converters_form(blob):
    assert form(blob) == form(BLOB)


@needs_fuse
def test_legacy_writer_translates_loads_and_sees(blob, written, mount_store):
    m = mount_store(written)
    folder, raw = m / "qwen2.5vl:7b", kvs(blob)
    got = kvs(folder / "model.gguf")
    assert gguf.GGUFReader(folder / "model.gguf").fields["general.architecture"].contents() == "qwen2vl"
    # The text keys under qwen2vl, M-RoPE with llama.cpp's fourth section.
    sections = raw["qwen25vl.rope.mrope_section"]
    assert got["qwen2vl.rope.dimension_sections"] == sections + [0]
    assert {k: v for k, v in got.items() if k.startswith("qwen2vl.") and k != "qwen2vl.rope.dimension_sections"} == {
        k.replace("qwen25vl.", "qwen2vl.", 1): v
        for k, v in raw.items()
        if k.startswith("qwen25vl.") and not k.startswith("qwen25vl.vision.") and "mrope" not in k
    }
    assert not [k for k in got if k.startswith("qwen25vl.")]
    # BOS stated, FIM markers control, the padding rows named by id and unused.
    tokens, types = got["tokenizer.ggml.tokens"], got["tokenizer.ggml.token_type"]
    assert got["tokenizer.ggml.bos_token_id"] == tokens.index("<|endoftext|>")
    assert got["tokenizer.ggml.add_bos_token"] is False
    assert all(types[tokens.index(t)] == TT.CONTROL for t in qwen25vl.FIM_MARKERS)
    first_pad = raw["tokenizer.ggml.tokens"].index("[PAD0]")
    assert tokens[first_pad:] == [f"[PAD{i}]" for i in range(first_pad, len(tokens))]
    assert set(types[first_pad:]) == {TT.UNUSED}
    text, theirs = tensors(folder / "model.gguf"), tensors(blob)
    assert sorted(text) == sorted(n for n in theirs if not n.startswith("v."))

    # The projector: clip keys from the vision keys and the tensors, llama.cpp's names.
    proj = gguf.GGUFReader(folder / "mmproj.gguf")
    fields = {
        k: proj.fields[k].contents()
        for k in (
            "clip.projector_type",
            "clip.vision.n_wa_pattern",
            "clip.vision.feed_forward_length",
            "clip.vision.block_count",
        )
    }
    p = writer.QWEN25VL
    assert fields == {
        "clip.projector_type": "qwen2.5vl_merger",
        "clip.vision.n_wa_pattern": 2,
        "clip.vision.feed_forward_length": p["v_n_ff"],
        "clip.vision.block_count": p["v_n_layer"],
    }
    vision = tensors(folder / "mmproj.gguf")
    for old, new in {
        "v.merger.ln_q.weight": "v.post_ln.weight",
        "v.merger.mlp.0.weight": "mm.0.weight",
        "v.merger.mlp.2.bias": "mm.2.bias",
        "v.patch_embd_0.weight": "v.patch_embd.weight",
        "v.patch_embd_1.weight": "v.patch_embd.weight.1",
        "v.blk.3.attn_out.weight": "v.blk.3.attn_out.weight",
    }.items():
        assert bytes(vision[new].data) == bytes(theirs[old].data), new

    assert_only_the_views_load(folder, blob, "qwen25vl")


def test_legacy_writer_empty_full_attention_list_gets_the_published_period(tmp_path):
    """Converters before 33878e671 kept a config's empty list; the projector
    then has the published models' period 8."""
    src = SourceGGUF(writer.legacy_qwen25vl(tmp_path / "qwen25vl.gguf", fullatt_blocks=()))
    assert len(src.kvs["qwen25vl.vision.fullatt_block_indexes"].decode()) == 0
    assert dict(plan(qwen25vl.CLIP, src).kvs)["clip.vision.n_wa_pattern"] == u32(8)
