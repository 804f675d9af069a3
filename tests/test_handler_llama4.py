"""Llama 4 as Ollama's converter writes it (one monolithic `llama4` blob: text,
vision tower, projector; no genuine fixture, so the legacy writer's blob):
through the mount `model.gguf` is the text model with llama.cpp's tokenizer
metadata and `mmproj.gguf` llama.cpp's `llama4` projector, and both load and run."""

import gguf
import numpy as np
import pytest

from compatfs.testing.llama4 import LLAMA4, LLAMA4_SPECIALS, legacy_llama4, llama4_tokens

from chat import assert_only_the_views_load
from compare import kvs, shapes, tensors
from conftest import needs_fuse, one_model_store
from xlc_client import run_job

MODEL = "llama4:scout"
UNUSED = gguf.TokenType.UNUSED


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return legacy_llama4(tmp_path_factory.mktemp("llama4") / "llama4.gguf")


store = one_model_store("llama4", "scout")


def llama_cpp_vocab(blob, path):
    """A vocabulary-only GGUF of this checkpoint's tokenizer as llama.cpp's converter
    writes it (`_set_vocab_gpt2` and `SpecialVocab`): pre-tokenizer `llama4`, BOS
    added (tokenizer.json's post-processor), the rows past the tokenizer named
    `[PAD<id>]` and typed unused; the hyperparameters are the blob's."""
    tokens, types, merges = llama4_tokens()
    n_rows = len(tokens) + LLAMA4["n_pad"]
    ids = {t: tokens.index(t) for t in LLAMA4_SPECIALS}
    w = gguf.GGUFWriter(str(path), "llama4")
    for key, field in gguf.GGUFReader(blob).fields.items():
        if key.startswith("llama4.") and not key.startswith("llama4.vision."):
            value = field.contents()
            if field.types[0] == gguf.GGUFValueType.FLOAT32:
                w.add_float32(key, value)
            elif field.types[0] == gguf.GGUFValueType.BOOL:
                w.add_bool(key, value)
            else:
                w.add_uint32(key, value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama4")
    w.add_token_list(list(tokens) + [f"[PAD{i}]" for i in range(len(tokens), n_rows)])
    w.add_token_types(list(types) + [UNUSED] * (n_rows - len(tokens)))
    w.add_token_merges(list(merges))
    w.add_bos_token_id(ids["<|begin_of_text|>"])
    w.add_eos_token_id(ids["<|eot|>"])
    w.add_pad_token_id(ids["<|finetune_right_pad|>"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_fuse
def test_text_view(blob, store, mount_store):
    """llama.cpp's tokenizer metadata; the tower's keys and tensors gone; every
    other KV and tensor as the blob has it (llama.cpp reads them as they are)."""
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "llama4"
    assert (raw["tokenizer.ggml.pre"], got["tokenizer.ggml.pre"]) == ("default", "llama4")
    assert (raw["tokenizer.ggml.add_bos_token"], got["tokenizer.ggml.add_bos_token"]) == (False, True)
    # The padding rows: named by id and unused, as llama.cpp's converter writes them.
    n_real = len(llama4_tokens()[0])
    assert raw["tokenizer.ggml.tokens"][n_real:] == [f"[PAD{i}]" for i in range(LLAMA4["n_pad"])]
    assert got["tokenizer.ggml.tokens"][n_real:] == [f"[PAD{i}]" for i in range(n_real, n_real + LLAMA4["n_pad"])]
    assert set(got["tokenizer.ggml.token_type"][n_real:]) == {UNUSED}
    changed = {
        "tokenizer.ggml.pre",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
    }
    assert {k: v for k, v in got.items() if k not in changed} == {
        k: v for k, v in raw.items() if k not in changed and not k.startswith("llama4.vision.")
    }

    # The tensors llama.cpp's Llama 4 loader creates, with its shapes; nothing else.
    E, hd, V = LLAMA4["n_embd"], LLAMA4["head_dim"], n_real + LLAMA4["n_pad"]
    F, FE, X = LLAMA4["n_ff_mlp"], LLAMA4["n_ff_exp"], LLAMA4["n_expert"]
    want = {
        "token_embd.weight": (E, V),
        "output.weight": (E, V),
        "output_norm.weight": (E,),
        "rope_freqs.weight": (hd // 2,),
    }
    for i in range(LLAMA4["n_layer"]):
        b = f"blk.{i}."
        want.update(
            {
                b + "attn_norm.weight": (E,),
                b + "ffn_norm.weight": (E,),
                b + "attn_q.weight": (E, 4 * hd),
                b + "attn_k.weight": (E, 2 * hd),
                b + "attn_v.weight": (E, 2 * hd),
                b + "attn_output.weight": (4 * hd, E),
            }
        )
        if (i + 1) % LLAMA4["moe_step"]:
            want.update({b + "ffn_gate.weight": (E, F), b + "ffn_up.weight": (E, F), b + "ffn_down.weight": (F, E)})
        else:
            want.update(
                {
                    b + "ffn_gate_inp.weight": (E, X),
                    b + "ffn_gate_exps.weight": (E, FE, X),
                    b + "ffn_up_exps.weight": (E, FE, X),
                    b + "ffn_down_exps.weight": (FE, E, X),
                    b + "ffn_gate_shexp.weight": (E, FE),
                    b + "ffn_up_shexp.weight": (E, FE),
                    b + "ffn_down_shexp.weight": (FE, E),
                }
            )
    assert shapes(mounted) == want
    served, source = tensors(mounted), tensors(blob)
    for name in want:
        assert np.array_equal(np.asarray(served[name].data), np.asarray(source[name].data)), name


@needs_fuse
def test_projector_view(blob, store, mount_store):
    """llama.cpp's `llama4` clip file: its KVs, its tensor names and shapes, the blob's values."""
    m = mount_store(store)
    mounted = m / MODEL / "mmproj.gguf"
    fields = gguf.GGUFReader(mounted).fields
    assert fields["general.architecture"].contents() == "clip"
    assert fields["general.type"].contents() == "mmproj"
    got = kvs(mounted)
    assert got.pop("clip.vision.image_mean") == got.pop("clip.vision.image_std") == [0.5, 0.5, 0.5]
    assert got == pytest.approx(
        {
            "clip.has_vision_encoder": True,
            "clip.projector_type": "llama4",
            "clip.use_gelu": True,
            "clip.vision.block_count": 2,
            "clip.vision.embedding_length": 32,
            "clip.vision.feed_forward_length": 128,
            "clip.vision.attention.head_count": 2,
            "clip.vision.attention.layer_norm_epsilon": 1e-5,
            "clip.vision.image_size": 32,
            "clip.vision.patch_size": 8,
            "clip.vision.projection_dim": 64,  # the text model's width
            "clip.vision.projector.scale_factor": 2,  # 1 / pixel_shuffle_ratio
        }
    )
    VE, VF, P, Q = 32, 128, 8, LLAMA4["projector_dim"]
    want = {
        "v.patch_embd.weight": (3 * P * P, VE),
        "v.class_embd": (VE,),
        "v.position_embd.weight": (VE, 17),
        "v.pre_ln.weight": (VE,),
        "v.pre_ln.bias": (VE,),
        "v.post_ln.weight": (VE,),
        "v.post_ln.bias": (VE,),
        "mm.model.mlp.1.weight": (VF, Q),
        "mm.model.mlp.2.weight": (Q, Q),
        "mm.model.fc.weight": (Q, 64),
    }
    for i in range(2):
        b = f"v.blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            want.update({b + t + ".weight": (VE, VE), b + t + ".bias": (VE,)})
        for t in ("ln1", "ln2"):
            want.update({b + t + ".weight": (VE,), b + t + ".bias": (VE,)})
        want.update(
            {
                b + "ffn_up.weight": (VE, VF),
                b + "ffn_up.bias": (VF,),
                b + "ffn_down.weight": (VF, VE),
                b + "ffn_down.bias": (VE,),
            }
        )
    assert shapes(mounted) == want
    # Renamed, not recomputed: each is the blob tensor it comes from.
    served, source = tensors(mounted), tensors(blob)
    for new, old in {
        "v.position_embd.weight": "v.positional_embedding_vlm",
        "mm.model.mlp.1.weight": "v.vision_adapter.mlp.fc1.weight",
        "mm.model.fc.weight": "mm.linear_1.weight",
        "v.blk.1.ln2.weight": "v.blk.1.ffn_norm.weight",
        "v.blk.0.ffn_up.weight": "v.blk.0.mlp.fc1.weight",
    }.items():
        assert np.array_equal(np.asarray(served[new].data), np.asarray(source[old].data)), new


@needs_fuse
def test_loads_and_runs_in_llama_cpp(blob, store, mount_store):
    assert_only_the_views_load(mount_store(store) / MODEL, blob, "wrong number of tensors")


@needs_fuse
def test_tokenizes_as_llama_cpp_conversion(blob, store, mount_store, tmp_path):
    """Through the mount a small corpus tokenizes to the ids of llama.cpp's
    conversion, BOS first; the blob as it is adds none and splits text otherwise."""
    m = mount_store(store)
    reference = llama_cpp_vocab(blob, tmp_path / "vocab.gguf")
    bos = llama4_tokens()[0].index("<|begin_of_text|>")
    lines = [
        "Hello world, hello there!",
        "I'M SURE IT'S FINE. x.get(y)",
        "Numbers like 12345 and 3.14159",
        "  two  spaces\n\nand lines",
        "<|header_start|>user<|header_end|> [PAD3] ok",
    ]
    jobs = [{"op": "tokenize", "text": t, "add_special": True, "special": s} for t in lines for s in (False, True)]
    through, want, raw = (
        run_job({"model": str(p), "actions": jobs}) for p in (m / MODEL / "model.gguf", reference, blob)
    )
    assert through["ok"] and want["ok"] and raw["ok"], (through.get("error"), want.get("error"), raw.get("error"))
    got_ids = [r["ids"] for r in through["results"]]
    assert got_ids == [r["ids"] for r in want["results"]]
    assert all(ids[0] == bos for ids in got_ids)
    raw_ids = [r["ids"] for r in raw["results"]]
    assert not any(ids[0] == bos for ids in raw_ids)
    assert any(ids[1:] != r for ids, r in zip(got_ids, raw_ids, strict=True))  # the pre-tokenizer matters too
