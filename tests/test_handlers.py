"""gguf-py reading the mounted files of legacy blobs (written as Ollama's
converters wrote them) finds exactly the KVs and tensors each handler promises."""

import re

import gguf
import numpy as np

from compatfs.handlers.gemma3 import CHAT_TEMPLATE

from conftest import SHARED, needs_fuse

pytestmark = needs_fuse


def kvs(path) -> dict:
    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        v = f.contents()
        out[k] = [round(x, 6) for x in v] if isinstance(v, list) and v and isinstance(v[0], float) else v
        if isinstance(v, float):
            out[k] = round(v, 6)
    return out


def tensors(path) -> dict:
    return {
        t.name: (t.tensor_type, [int(x) for x in t.shape], np.asarray(t.data)) for t in gguf.GGUFReader(path).tensors
    }


def assert_passthrough(mounted: dict, blob: dict, names) -> None:
    for name in names:
        assert mounted[name][0] == blob[name][0] and mounted[name][1] == blob[name][1], name
        assert np.array_equal(mounted[name][2], blob[name][2]), name


def test_gemma3_text(legacy, mount_store):
    store, files = legacy
    m = mount_store(store)
    blob_kv, got = kvs(files["gemma3"]), kvs(m / "gemma3:1b/model.gguf")
    rows = tensors(files["gemma3"])["token_embd.weight"][1][1]
    tokens, types = blob_kv["tokenizer.ggml.tokens"][:rows], blob_kv["tokenizer.ggml.token_type"][:rows]
    for marker in ("<start_of_image>", "<end_of_image>"):  # typed as text by Ollama
        assert types[tokens.index(marker)] == 1
        types[tokens.index(marker)] = 3
    expect = dict(blob_kv)
    expect.update(
        {
            "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma3.rope.freq_base": blob_kv["gemma3.rope.global.freq_base"],
            "gemma3.rope.freq_base_swa": blob_kv["gemma3.rope.local.freq_base"],
            "tokenizer.chat_template": CHAT_TEMPLATE,
            "tokenizer.ggml.add_space_prefix": False,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": blob_kv["tokenizer.ggml.scores"][:rows],
            "tokenizer.ggml.token_type": types,
        }
    )
    assert len(blob_kv["tokenizer.ggml.tokens"]) > rows  # the fixture is really legacy
    assert got == expect
    assert "gemma3.rope.scaling.type" not in got  # a 32k model is not rope-scaled
    blob_t, got_t = tensors(files["gemma3"]), tensors(m / "gemma3:1b/model.gguf")
    assert sorted(got_t) == sorted(blob_t)
    assert_passthrough(got_t, blob_t, blob_t)
    assert "mmproj.gguf" not in {p.name for p in (m / "gemma3:1b").iterdir()}


def test_gemma3_vision_text_and_clip(legacy, mount_store):
    store, files = legacy
    m = mount_store(store)
    blob_kv, blob_t = kvs(files["gemma3v"]), tensors(files["gemma3v"])

    got = kvs(m / "gemma3:4b/model.gguf")
    assert got["gemma3.rope.scaling.type"] == "linear" and got["gemma3.rope.scaling.factor"] == 8.0
    assert got["gemma3.attention.layer_norm_rms_epsilon"] == 1e-6
    assert got["gemma3.rope.freq_base"] == 1e6 and got["gemma3.rope.freq_base_swa"] == 1e4
    text_t = tensors(m / "gemma3:4b/model.gguf")
    assert sorted(text_t) == sorted(n for n in blob_t if not n.startswith(("v.", "mm.")))
    assert_passthrough(text_t, blob_t, text_t)

    clip = kvs(m / "gemma3:4b/mmproj.gguf")
    v = "gemma3.vision."
    assert clip == {
        **{k: val for k, val in blob_kv.items() if k.startswith("general.") and k != "general.architecture"},
        "general.architecture": "clip",
        "general.type": "mmproj",
        "clip.vision.block_count": blob_kv[v + "block_count"],
        "clip.vision.embedding_length": blob_kv[v + "embedding_length"],
        "clip.vision.feed_forward_length": blob_kv[v + "feed_forward_length"],
        "clip.vision.image_size": blob_kv[v + "image_size"],
        "clip.vision.patch_size": blob_kv[v + "patch_size"],
        "clip.vision.attention.head_count": blob_kv[v + "attention.head_count"],
        "clip.vision.attention.layer_norm_epsilon": blob_kv[v + "attention.layer_norm_epsilon"],
        "clip.vision.projection_dim": blob_kv["gemma3.embedding_length"],
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        "clip.has_vision_encoder": True,
        "clip.use_gelu": True,
        "clip.projector_type": "gemma3",
    }
    # The tensor names are llama.cpp's: those of its own conversion of a Gemma 3
    # vision tower (block numbers aside: its tower is deeper than the writer's).
    clip_t = tensors(m / "gemma3:4b/mmproj.gguf")
    blocks = lambda names: {re.sub(r"\.\d+\.", ".N.", n) for n in names}  # noqa: E731
    if SHARED.is_dir():
        assert blocks(clip_t) == blocks(tensors(SHARED / "upstream/gemma3_vision/mmproj.gguf"))
    # Each tensor is one of the blob's vision tensors, bytes kept, the patch
    # and position embeddings as F32 (llama.cpp's converter keeps them so).
    vision = {n: t for n, t in blob_t.items() if n.startswith(("v.", "mm."))}
    assert len(clip_t) == len(vision)
    by_data = {(tuple(t[1]), t[2].astype(np.float32).tobytes()): t for t in vision.values()}
    for name, (dtype, shape, data) in clip_t.items():
        src = by_data.get((tuple(shape), data.astype(np.float32).tobytes()))
        assert src is not None, name
        promoted = name in ("v.patch_embd.weight", "v.position_embd.weight")
        assert dtype == (gguf.GGMLQuantizationType.F32 if promoted else src[0]), name
        if promoted:
            assert src[0] == gguf.GGMLQuantizationType.F16, name


def test_llama3_tokenizer_metadata(legacy, mount_store):
    store, files = legacy
    m = mount_store(store)
    blob_kv = kvs(files["llama3"])
    assert "tokenizer.ggml.pre" not in blob_kv and blob_kv["tokenizer.ggml.eos_token_id"] == 128001
    expect = {
        **blob_kv,
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.eos_token_id": 128009,
        "tokenizer.ggml.eot_token_id": 128009,
        "tokenizer.ggml.eos_token_ids": [128009],
    }
    assert kvs(m / "llama3:8b/model.gguf") == expect
    blob_t = tensors(files["llama3"])
    assert_passthrough(tensors(m / "llama3:8b/model.gguf"), blob_t, blob_t)


def test_llava_projector_gets_its_type(legacy, mount_store):
    store, files = legacy
    m = mount_store(store)
    blob_kv = kvs(files["llava-proj"])
    assert "clip.projector_type" not in blob_kv
    assert kvs(m / "llava:7b/mmproj.gguf") == {**blob_kv, "clip.projector_type": "mlp"}
    blob_t = tensors(files["llava-proj"])
    assert_passthrough(tensors(m / "llava:7b/mmproj.gguf"), blob_t, blob_t)
    # The text model is claimed by no handler: served as is.
    assert (m / "llava:7b/model.gguf").read_bytes() == files["llava"].read_bytes()
