"""Gemma 4 as Ollama's converter writes it (one monolithic blob: text, vision
tower, projector): through the mount, `model.gguf` and `mmproj.gguf` equal
llama.cpp's own conversion of the same weights and load in llama.cpp.  Then,
in-process, the two layouts of older converters the fixture lacks: split MoE
gate/up stacks and packed vision clamps."""

import gguf
import numpy as np
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import SourceGGUF
from compatfs.handlers import gemma4
from compatfs.view.opcache import OpCache
from compatfs.translate import plan
from compatfs.view.layout import View

from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from ggufs import write_gguf
from xlc_client import run_job

BLOB = SHARED / "ollama/gemma4_vision.gguf"
UPSTREAM = SHARED / "upstream/gemma4_vision"
NORMAL, USER_DEFINED = 1, 4  # tokenizer.ggml.token_type values


store = one_model_store("gemma4", "vision", BLOB)


@needs_fuse
@needs_shared
def test_text_view_equals_llama_cpp_conversion(store, mount_store):
    """Same KVs as llama.cpp's conversion, bar the types of some added tokens
    (below); same tensors; the vision tower and projector are gone."""
    m = mount_store(store)
    mounted, upstream = m / "gemma4:vision/model.gguf", UPSTREAM / "model.gguf"
    got, want, raw = kvs(mounted), kvs(upstream), kvs(BLOB)
    assert raw["tokenizer.ggml.model"] == "llama" and got["tokenizer.ggml.model"] == "gemma4"
    loose = {"tokenizer.ggml.token_type"}
    assert sorted(got) == sorted(want)
    assert {k: v for k, v in got.items() if k not in loose} == {k: v for k, v in want.items() if k not in loose}

    # Token types: byte tokens and the image/audio markers are typed as
    # llama.cpp's converter types them.  Left loose: tokenizer.json's other
    # added tokens ([multimodal], <unusedN>, <|turn>, <turn|>, <|think|>,
    # <|video|>) stay user-defined, as Ollama wrote them, where llama.cpp's
    # converter says normal; as normal tokens llama.cpp would not match
    # `<|turn>` of the chat template in text, unlike the model's own
    # tokenizer, which matches added tokens whole.
    tokens = want["tokenizer.ggml.tokens"]
    got_t, want_t, raw_t = (
        got["tokenizer.ggml.token_type"],
        want["tokenizer.ggml.token_type"],
        raw["tokenizer.ggml.token_type"],
    )
    fixed = {tokens[i] for i in range(len(tokens)) if got_t[i] != raw_t[i]}
    assert fixed == set(gemma4.BYTE_TOKENS) | set(gemma4.MEDIA_MARKERS)
    kept = [i for i in range(len(tokens)) if got_t[i] != want_t[i]]
    assert {tokens[i] for i in kept} >= {"<|turn>", "<turn|>", "<|think|>"}
    assert all(got_t[i] == raw_t[i] == USER_DEFINED and want_t[i] == NORMAL for i in kept)

    assert_same_tensors(mounted, upstream)

    # Text tokenizes as through llama.cpp's conversion; `<|turn>` is one token here.
    jobs = [{"op": "tokenize", "text": "hello world\n\u00e9\u4e16 ok"}, {"op": "tokenize", "text": "<|turn>user\n"}]
    through, reference = (run_job({"model": str(p), "actions": jobs}) for p in (mounted, upstream))
    assert through["ok"] and reference["ok"]
    assert through["results"][0]["ids"] == reference["results"][0]["ids"]
    assert through["results"][1]["ids"][0] == tokens.index("<|turn>")
    assert len(reference["results"][1]["ids"]) > len(through["results"][1]["ids"])


@needs_fuse
@needs_shared
def test_mmproj_view_equals_llama_cpp_conversion(store, mount_store):
    """The projector view is llama.cpp's mmproj: KVs, tensor names, shapes,
    dtypes and values."""
    m = mount_store(store)
    mounted, upstream = m / "gemma4:vision/mmproj.gguf", UPSTREAM / "mmproj.gguf"
    assert kvs(mounted) == kvs(upstream)
    arch = {p: gguf.GGUFReader(p).fields["general.architecture"].contents() for p in (mounted, upstream)}
    assert arch[mounted] == arch[upstream] == "clip"
    dtypes = [
        {t.name: (t.tensor_type, [int(x) for x in t.shape]) for t in gguf.GGUFReader(p).tensors}
        for p in (mounted, upstream)
    ]
    assert dtypes[0] == dtypes[1]
    assert_same_tensors(mounted, upstream)


@needs_fuse
@needs_shared
def test_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    model, mmproj = m / "gemma4:vision/model.gguf", m / "gemma4:vision/mmproj.gguf"
    job = {
        "actions": [
            {"op": "complete", "prompt": "hello", "n_predict": 4},
            {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "image_png": True, "n_predict": 4},
        ]
    }
    res = run_job({"model": str(model), "mmproj": str(mmproj), **job})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["ok"] and complete["tokens_predicted"] > 0
    assert chat["ok"] and chat["completion_tokens"] > 0
    # With an image the prompt is longer than without: the projector ran.
    text_only = run_job(
        {
            "model": str(model),
            "actions": [{"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 1}],
        }
    )
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # Untranslated, the blob loads neither as a model nor as a projector.
    raw = run_job({"model": str(BLOB)})
    assert not raw["ok"] and "wrong number of tensors" in str(raw)
    assert not run_job({"model": str(UPSTREAM / "model.gguf"), "mmproj": str(BLOB)})["ok"]


# -- older converters' layouts, in-process ------------------------------------------------

rng = np.random.default_rng(4)
N_EXPERT, N_FF, N_EMBD = 3, 4, 32
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down")


def q8(a: np.ndarray):
    return gguf.quants.quantize(a.astype(np.float32), DT.Q8_0), DT.Q8_0


def render(path, translation) -> dict:
    """The translated file's tensors: name -> (dtype, ggml shape, float32 values numpy-shaped)."""
    src = SourceGGUF(path)
    view = View.translated(src, plan(translation, src), OpCache(), key="k")
    out = path.with_suffix(f".{translation.name}.gguf")
    out.write_bytes(view.read(0, view.size))
    tensors = {}
    for t in gguf.GGUFReader(out).tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        tensors[t.name] = (t.tensor_type, tuple(int(x) for x in t.shape), values.reshape(tuple(reversed(t.shape))))
    return tensors


def test_older_layouts_split_experts_and_packed_clamps(tmp_path):
    """Split expert gate/up stacks become llama.cpp's per-expert fused
    `ffn_gate_up_exps` (any dtype), except in a block with scale sidecars;
    the per-expert scale gets llama.cpp's name; `v.clamp_data` becomes one
    scalar tensor per clamp value, as llama.cpp's converter writes them."""
    gate0, up0 = rng.standard_normal((2, N_EXPERT, N_FF, N_EMBD)).astype(np.float32)
    gate1, up1 = rng.standard_normal((2, N_EXPERT, N_FF, N_EMBD)).astype(np.float16)
    clamps = rng.standard_normal((1 * len(LINEARS) + 1) * 4).astype(np.float32)
    path = write_gguf(
        tmp_path / "moe.gguf",
        "gemma4",
        kvs={
            "gemma4.block_count": 2,
            "gemma4.embedding_length": N_EMBD,
            "gemma4.vision.block_count": 1,
            "tokenizer.ggml.model": "llama",
        },
        tensors={
            "blk.0.ffn_gate_exps.weight": q8(gate0),
            "blk.0.ffn_up_exps.weight": q8(up0),
            "blk.0.ffn_gate_inp.per_expert_scale": np.arange(N_EXPERT, dtype=np.float32),
            "blk.1.ffn_gate_exps.weight": gate1,
            "blk.1.ffn_up_exps.weight": up1,
            "blk.1.ffn_gate_exps.scale": np.ones(N_EXPERT, dtype=np.float32),
            "v.blk.0.attn_q.weight": rng.standard_normal((N_EMBD, N_EMBD)).astype(np.float16),
            "v.clamp_data": clamps,
            "mm.input_projection.weight": rng.standard_normal((N_EMBD, N_EMBD)).astype(np.float16),
        },
    )

    text = render(path, gemma4.TEXT)
    assert sorted(text) == [
        "blk.0.ffn_down_exps.scale",
        "blk.0.ffn_gate_up_exps.weight",
        "blk.1.ffn_gate_exps.scale",
        "blk.1.ffn_gate_exps.weight",
        "blk.1.ffn_up_exps.weight",
    ]
    dtype, shape, fused = text["blk.0.ffn_gate_up_exps.weight"]
    assert dtype == DT.Q8_0 and shape == (N_EMBD, 2 * N_FF, N_EXPERT)
    want = np.concatenate(
        [
            gguf.quants.dequantize(q8(gate0)[0], DT.Q8_0).reshape(gate0.shape),
            gguf.quants.dequantize(q8(up0)[0], DT.Q8_0).reshape(up0.shape),
        ],
        axis=1,
    )
    np.testing.assert_array_equal(fused, want)
    np.testing.assert_array_equal(text["blk.0.ffn_down_exps.scale"][2], np.arange(N_EXPERT))
    np.testing.assert_array_equal(text["blk.1.ffn_up_exps.weight"][2], up1)

    clip = render(path, gemma4.CLIP)
    linears = [f"v.blk.0.{lin}" for lin in LINEARS] + ["mm.input_projection"]
    scalars = [f"{lin}.{c}" for lin in linears for c in ("input_min", "input_max", "output_min", "output_max")]
    assert sorted(clip) == sorted(scalars + ["v.blk.0.attn_q.weight", "mm.input_projection.weight"])
    for j, name in enumerate(scalars):
        assert clip[name][:2] == (DT.F32, (1,)), name
        assert clip[name][2][0] == clamps[j], name
