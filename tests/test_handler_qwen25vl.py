"""Qwen2.5-VL as Ollama's converter writes it (one `qwen25vl` blob, text and
vision): through the mount, `model.gguf` and `mmproj.gguf` equal llama.cpp's
own conversion of the same weights, and load in llama.cpp."""
import gguf
from gguf import GGUFValueType as VT

from compatfs.gguf_values import array, u32
from compatfs.handlers.qwen25vl import WindowPattern

from compare import assert_same_gguf, assert_same_tensors, kvs
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
    assert raw["tokenizer.ggml.tokens"] != want["tokenizer.ggml.tokens"]      # the fixture needs the fix
    assert raw["tokenizer.ggml.token_type"] != want["tokenizer.ggml.token_type"]
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "qwen2vl"
    assert_same_tensors(mounted, UPSTREAM / "model.gguf")


@needs_fuse
@needs_shared
def test_projector_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted, upstream = m / MODEL / "mmproj.gguf", UPSTREAM / "mmproj.gguf"
    assert_same_gguf(mounted, upstream)     # types too: patch embeddings stay F16, as llama.cpp's converter keeps them
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
    through, reference = run_job({"model": str(m / MODEL / "model.gguf"), **tok}), run_job({"model": str(UPSTREAM / "model.gguf"), **tok})
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


