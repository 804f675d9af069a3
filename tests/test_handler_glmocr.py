"""GLM-OCR as Ollama's converter writes it (one monolithic `glmocr` blob: text,
vision tower, merger; no genuine fixture, so the legacy writer's blob): through
the mount `model.gguf` is llama.cpp's `glm4` text model and `mmproj.gguf` its
`glm4v` projector, and both load and run."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import f32, u32
from compatfs.handlers.glmocr import RotaryWidth, gate_up
from compatfs.testing.glmocr import GLM_SPECIALS, GLMOCR, glm_tokens, legacy_glmocr

from chat import assert_only_the_views_load
from compare import kvs, shapes, tensors
from conftest import needs_fuse, one_model_store
from ggufs import write_gguf
from xlc_client import run_job

MODEL = "glm-ocr:latest"
UNUSED = gguf.TokenType.UNUSED


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return legacy_glmocr(tmp_path_factory.mktemp("glmocr") / "glmocr.gguf")


store = one_model_store("glm-ocr", "latest")


def token_id(text: str) -> int:
    return glm_tokens()[0].index(text)


def vocab_gguf(mounted, path, pre: str, ids: dict[str, str]):
    """A vocabulary-only `glm4` GGUF (the view's hyperparameters) of this
    checkpoint's tokenizer with pre-tokenizer `pre` and the special ids `ids`
    (kind -> token text).  llama.cpp's GLM converter (`Glm4Model.set_vocab`)
    writes `chatglm-bpe`, BOS/unknown/EOS/padding `<|endoftext|>`, EOT
    `<|user|>` and the rows past the tokenizer as `[PAD<id>]`, unused."""
    tokens, types, merges = glm_tokens()
    n_rows = len(tokens) + GLMOCR["n_pad"]
    w = gguf.GGUFWriter(str(path), "glm4")
    for key, field in gguf.GGUFReader(mounted).fields.items():
        if not key.startswith("glm4."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, [int(x) for x in field.contents()])
        elif field.types[0] == gguf.GGUFValueType.FLOAT32:
            w.add_float32(key, field.contents())
        else:
            w.add_uint32(key, field.contents())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens) + [f"[PAD{i}]" for i in range(len(tokens), n_rows)])
    w.add_token_types(list(types) + [UNUSED] * (n_rows - len(tokens)))
    w.add_token_merges(list(merges))
    for kind, text in ids.items():
        getattr(w, f"add_{kind}_token_id")(token_id(text))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


LLAMA_CPP_IDS = {
    "bos": "<|endoftext|>",
    "eos": "<|endoftext|>",
    "unk": "<|endoftext|>",
    "pad": "<|endoftext|>",
    "eot": "<|user|>",
}
OLLAMA_IDS = {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}


@needs_fuse
def test_text_view(blob, store, mount_store):
    """Architecture `glm4` with its keys, four rope sections and the rotary
    width; llama.cpp's tokenizer ids; the fused MLP and llama.cpp's tensor names."""
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "glm4"
    assert not [k for k in got if k.startswith("glmocr.")]
    assert got["glm4.rope.dimension_sections"] == [2, 3, 3, 0]  # Ollama's 3 sections, padded
    assert {
        k: v for k, v in got.items() if k.startswith("glm4.") and k != "glm4.rope.dimension_sections"
    } == pytest.approx(
        {
            "glm4.block_count": 2,
            "glm4.context_length": 131072,
            "glm4.embedding_length": 64,
            "glm4.feed_forward_length": 128,
            "glm4.attention.head_count": 4,
            "glm4.attention.head_count_kv": 2,
            "glm4.attention.key_length": 16,
            "glm4.attention.value_length": 16,
            "glm4.attention.layer_norm_rms_epsilon": 1e-5,
            "glm4.rope.freq_base": 10000.0,
            "glm4.rope.dimension_count": 16,  # key_length x partial_rotary_factor 1.0
        }
    )
    assert raw["tokenizer.ggml.pre"] == "llama-bpe" and got["tokenizer.ggml.pre"] == "chatglm-bpe"
    assert "tokenizer.ggml.bos_token_id" not in raw
    assert got["tokenizer.ggml.bos_token_id"] == got["tokenizer.ggml.unknown_token_id"] == token_id("<|endoftext|>")
    assert got["tokenizer.ggml.eot_token_id"] == token_id("<|user|>")
    n_real = len(glm_tokens()[0])
    assert got["tokenizer.ggml.tokens"][n_real:] == [f"[PAD{i}]" for i in range(n_real, n_real + GLMOCR["n_pad"])]
    assert set(got["tokenizer.ggml.token_type"][n_real:]) == {UNUSED}
    changed = {
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.eot_token_id",
    }
    assert {k: v for k, v in got.items() if k.startswith("tokenizer.") and k not in changed} == {
        k: v for k, v in raw.items() if k.startswith("tokenizer.") and k not in changed
    }

    # The tensors llama.cpp's glm4 loader creates, with its shapes; nothing else.
    E, V, F, hd = 64, n_real + GLMOCR["n_pad"], GLMOCR["n_ff"], GLMOCR["head_dim"]
    want = {"token_embd.weight": (E, V), "output.weight": (E, V), "output_norm.weight": (E,)}
    for i in range(2):
        b = f"blk.{i}."
        want.update(
            {
                b + n: (E,)
                for n in ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight")
            }
        )
        want.update(
            {
                b + "attn_q.weight": (E, 4 * hd),
                b + "attn_k.weight": (E, 2 * hd),
                b + "attn_v.weight": (E, 2 * hd),
                b + "attn_output.weight": (4 * hd, E),
                b + "ffn_up.weight": (E, 2 * F),
                b + "ffn_down.weight": (F, E),
            }
        )
    assert shapes(mounted) == want
    served, source = tensors(mounted), tensors(blob)
    # The fused MLP: gate rows first, then up, bytes kept (BF16).
    for i in range(2):
        fused = served[f"blk.{i}.ffn_up.weight"]
        assert fused.tensor_type == DT.BF16
        halves = [np.asarray(source[f"blk.{i}.ffn_{h}.weight"].data) for h in ("gate", "up")]
        assert np.array_equal(np.asarray(fused.data), np.concatenate(halves))
    for new, old in {
        "blk.1.attn_output.weight": "blk.1.attn_out.weight",
        "blk.0.post_attention_norm.weight": "blk.0.post_attn_norm.weight",
        "blk.0.post_ffw_norm.weight": "blk.0.post_ffn_norm.weight",
    }.items():
        assert np.array_equal(np.asarray(served[new].data), np.asarray(source[old].data)), new


@needs_fuse
def test_projector_view(blob, store, mount_store):
    """llama.cpp's `glm4v` clip file: its KVs, tensor names and shapes; the
    patch embedding's temporal halves under llama.cpp's names, F16 as its converter keeps them."""
    m = mount_store(store)
    mounted = m / MODEL / "mmproj.gguf"
    fields = gguf.GGUFReader(mounted).fields
    assert fields["general.architecture"].contents() == "clip"
    assert fields["general.type"].contents() == "mmproj"
    got = kvs(mounted)
    assert got.pop("clip.vision.image_mean") == pytest.approx(GLMOCR["image_mean"])
    assert got.pop("clip.vision.image_std") == pytest.approx(GLMOCR["image_std"])
    assert got == pytest.approx(
        {
            "clip.has_vision_encoder": True,
            "clip.projector_type": "glm4v",
            "clip.use_silu": True,
            "clip.vision.block_count": 2,
            "clip.vision.embedding_length": 32,
            "clip.vision.feed_forward_length": 64,
            "clip.vision.attention.head_count": 2,
            "clip.vision.attention.layer_norm_epsilon": 1e-5,
            "clip.vision.image_size": 112,
            "clip.vision.patch_size": 14,
            "clip.vision.projection_dim": 64,  # the text model's width
        }
    )
    VE, VF, P, OUT, FF = 32, 64, 14, 64, GLMOCR["merger_ff"]
    want = {
        "v.patch_embd.weight": (P, P, 3, VE),
        "v.patch_embd.weight.1": (P, P, 3, VE),
        "v.patch_embd.bias": (VE,),
        "v.post_ln.weight": (VE,),
        "mm.patch_merger.weight": (2, 2, VE, OUT),
        "mm.patch_merger.bias": (OUT,),
        "mm.model.fc.weight": (OUT, OUT),
        "mm.post_norm.weight": (OUT,),
        "mm.post_norm.bias": (OUT,),
        "mm.gate.weight": (OUT, FF),
        "mm.up.weight": (OUT, FF),
        "mm.down.weight": (FF, OUT),
    }
    for i in range(2):
        b = f"v.blk.{i}."
        want.update(
            {
                b + "ln1.weight": (VE,),
                b + "ln2.weight": (VE,),
                b + "attn_qkv.weight": (VE, 3 * VE),
                b + "attn_qkv.bias": (3 * VE,),
                b + "attn_q_norm.weight": (16,),
                b + "attn_k_norm.weight": (16,),
                b + "attn_out.weight": (VE, VE),
                b + "attn_out.bias": (VE,),
                b + "ffn_gate.weight": (VE, VF),
                b + "ffn_gate.bias": (VF,),
                b + "ffn_up.weight": (VE, VF),
                b + "ffn_up.bias": (VF,),
                b + "ffn_down.weight": (VF, VE),
                b + "ffn_down.bias": (VE,),
            }
        )
    assert shapes(mounted) == want
    served, source = tensors(mounted), tensors(blob)
    for new, old in {
        "v.patch_embd.weight": "v.patch_embd_0.weight",
        "v.patch_embd.weight.1": "v.patch_embd_1.weight",
    }.items():
        assert served[new].tensor_type == DT.F16
        assert np.array_equal(np.asarray(served[new].data), np.asarray(source[old].data)), new


@needs_fuse
def test_loads_and_runs_in_llama_cpp(blob, store, mount_store):
    assert_only_the_views_load(mount_store(store) / MODEL, blob, "unknown model architecture: 'glmocr'")


@needs_fuse
def test_tokenizes_as_llama_cpp_conversion(blob, store, mount_store, tmp_path):
    """Through the mount text tokenizes to the ids of llama.cpp's conversion,
    no BOS added; with the blob's metadata (`llama-bpe`, no BOS id) llama.cpp
    would prepend a BOS GLM never adds."""
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    reference = vocab_gguf(mounted, tmp_path / "llama_cpp.gguf", "chatglm-bpe", LLAMA_CPP_IDS)
    # The blob's tokenizer metadata as it is (its architecture is unknown to llama.cpp).
    as_written = vocab_gguf(mounted, tmp_path / "ollama.gguf", "llama-bpe", OLLAMA_IDS)
    lines = [
        "Hello world, hello there!",
        "I'M SURE IT'S FINE. x.get(y)",
        "Numbers like 12345 and 3.14159",
        "[gMASK]<sop><|user|>\nok<|assistant|>",
    ]
    jobs = [{"op": "tokenize", "text": t, "add_special": True, "special": True} for t in lines]
    through, want, raw = (run_job({"model": str(p), "actions": jobs}) for p in (mounted, reference, as_written))
    assert through["ok"] and want["ok"] and raw["ok"], (through.get("error"), want.get("error"), raw.get("error"))
    got_ids = [r["ids"] for r in through["results"]]
    assert got_ids == [r["ids"] for r in want["results"]]
    assert got_ids[3][:3] == [token_id(t) for t in ("[gMASK]", "<sop>", "<|user|>")]
    raw_ids = [r["ids"] for r in raw["results"]]
    assert all(len(r) == len(g) + 1 and r[1:] == g for r, g in zip(raw_ids, got_ids, strict=True))
    assert set(GLM_SPECIALS) <= set(glm_tokens()[0])


def test_rotary_width_from_partial_factor():
    edit = RotaryWidth("head", "factor", "rot")
    for factor, want in ((None, 128), (1.0, 128), (0.5, 64), (0.0, None), (2.0, None)):
        kv = {"head": u32(128), **({} if factor is None else {"factor": f32(factor)})}
        edit.apply(kv, None)
        assert kv.get("rot") == (None if want is None else u32(want)), factor
    kv = {"head": u32(128), "rot": u32(32)}
    edit.apply(kv, None)
    assert kv["rot"] == u32(32)


def test_gate_up_halves_must_match(tmp_path):
    path = write_gguf(
        tmp_path / "mlp.gguf",
        "glmocr",
        {},
        {
            "blk.0.ffn_gate.weight": np.zeros((8, 4), np.float16),
            "blk.0.ffn_up.weight": np.zeros((6, 4), np.float16),
            "blk.1.ffn_gate.weight": np.zeros((8, 4), np.float16),
            "blk.1.ffn_up.weight": np.zeros((8, 4), np.float16),
            "blk.2.ffn_up.weight": np.zeros((8, 4), np.float16),
        },
    )
    src = SourceGGUF(path)
    with pytest.raises(GGUFError, match="blk.0.ffn_gate.weight"):
        gate_up(src, 0)
    assert gate_up(src, 1).shape == (4, 16)
    assert gate_up(src, 2) is None
