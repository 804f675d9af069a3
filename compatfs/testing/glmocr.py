"""GLM-OCR as Ollama's converter wrote it (the legacy form of `handlers/glmocr.py`).

* `convert/convert_glmocr.go` at 8f4a00813 (2026-02-02, "Add GLM-OCR vision model
  support"; unchanged through f63eea3d2, 2026-05-24, the last commit before the
  converters were rewritten for llama-server): one monolithic blob of
  architecture `glmocr`.  Text KVs `glmocr.*` (block_count = the config's
  `num_hidden_layers`: the MTP layer is dropped, no `nextn_predict_layers`),
  `rope.partial_rotary_factor` and a 3-entry `rope.mrope_section`, no
  `rope.dimension_count`; vision KVs `glmocr.vision.*` (block_count,
  embedding_length, attention.head_count, image_size, patch_size,
  spatial_merge_size, temporal_patch_size, out_hidden_size, intermediate_size,
  attention.layer_norm_rms_epsilon, min/max_pixels, image_mean/std) and the
  image/video token ids.  Text tensors: `attn_out`, `post_attn_norm`,
  `post_ffn_norm`, the fused `gate_up_proj` split into `ffn_gate`/`ffn_up`, text
  Q/K permuted to NeoX order for M-RoPE (as llama.cpp's converter does; random
  weights stand for the permuted ones here).  Vision: the Conv3D patch embedding
  split into `v.patch_embd_0`/`v.patch_embd_1`, otherwise llama.cpp's names
  (`v.blk.N.{ln1,attn_qkv,attn_q_norm,attn_k_norm,attn_out,ln2,ffn_gate,ffn_up,
  ffn_down}`, `v.post_ln`, `mm.patch_merger`, `mm.model.fc`, `mm.post_norm`,
  `mm.gate/up/down`).
* dtypes (`convert/reader.go`, `reader_safetensors.go` at 8f4a00813): BF16 text
  matrices (the checkpoint's dtype), F16 `v.*`/`mm.*` matrices, F32 norms and biases.
* tokenizer (`convert/tokenizer.go`): `gpt2`; GLM's split regex is Llama 3's, so
  the digest gives pre-tokenizer `llama-bpe`; scores = token ids; added special
  tokens control; no BOS, unknown or EOT id (tokenizer_config.json names only
  EOS and padding, both `<|endoftext|>`); `eos_token_ids` from
  generation_config.json; the vocabulary padded to the config's `vocab_size`
  with `[PAD<i>]` (user-defined, score -1).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode


GLMOCR: Dims = dict(
    # text_config (2 layers; the checkpoint's MTP layer is not written)
    n_layer=2,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    n_ff=128,
    context_length=131072,
    rms_eps=1e-5,
    rope_theta=10000.0,
    partial_rotary_factor=1.0,
    mrope_section=[2, 3, 3],
    n_pad=6,
    # vision_config
    v_n_layer=2,
    v_n_embd=32,
    v_n_head=2,
    v_n_ff=64,
    v_eps=1e-5,
    image_size=112,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=64,
    merger_ff=96,
    min_pixels=12544,
    max_pixels=9633792,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)

GLM_SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
)

# GLM's chat format, shortened to what these tests render.
GLMOCR_CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- for m in messages %}{{ '<|' + m['role'] + '|>\\n' }}"
    "{%- if m['content'] is string %}{{ m['content'] }}{%- else %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'text' %}{{ c['text'] }}{%- endif %}{%- endfor %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}"
)


@functools.cache
def glm_tokens() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Byte-level BPE vocabulary in GLM's layout (tokens, types, merges): the 256
    byte characters, one token per learned merge, then GLM's special tokens (control)."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(250)
    toks = list(b2u.values())
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
    types = [1] * len(toks) + [3] * len(GLM_SPECIALS)
    return tuple(toks) + GLM_SPECIALS, tuple(types), tuple(f"{a} {b}" for a, b in merges)


def legacy_glmocr(path: Path, seed: int = 0) -> Path:
    """GlmOcrForConditionalGeneration (tiny) as Ollama's converter wrote it.

    Text: 2 layers, hidden 64, heads 4/2 of 16, FFN 128, full rotary head
    (partial factor 1.0) in M-RoPE sections [2, 3, 3].  Vocabulary: :func:`glm_tokens`
    plus 6 ``[PADi]`` rows.  Vision: 2 blocks of 32 (heads 2, SwiGLU 64), 14-pixel
    patches, 2x2 merge to 64, merger FFN 96.  Untranslated, llama.cpp refuses it
    (unknown architecture `glmocr`).
    """
    p = GLMOCR
    rng = np.random.default_rng(seed)
    toks, types, merges = (list(x) for x in glm_tokens())
    scores = [float(i) for i in range(len(toks))]
    for i in range(p["n_pad"]):
        toks.append(f"[PAD{i}]")
        types.append(4)
        scores.append(-1.0)
    special = {t: i for i, t in enumerate(toks) if t in GLM_SPECIALS}
    V, E, H, HKV, hd, F = len(toks), p["n_embd"], p["n_head"], p["n_head_kv"], p["head_dim"], p["n_ff"]
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.chat_template": GLMOCR_CHAT_TEMPLATE,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.eos_token_id": special["<|endoftext|>"],
        "tokenizer.ggml.eos_token_ids": [special["<|endoftext|>"], special["<|user|>"]],
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.ggml.padding_token_id": special["<|endoftext|>"],
        "glmocr.block_count": p["n_layer"],
        "glmocr.embedding_length": E,
        "glmocr.attention.head_count": H,
        "glmocr.attention.head_count_kv": HKV,
        "glmocr.attention.key_length": hd,
        "glmocr.attention.value_length": hd,
        "glmocr.feed_forward_length": F,
        "glmocr.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "glmocr.context_length": p["context_length"],
        "glmocr.rope.freq_base": p["rope_theta"],
        "glmocr.rope.partial_rotary_factor": p["partial_rotary_factor"],
        "glmocr.rope.mrope_section": p["mrope_section"],
        "glmocr.vision.block_count": p["v_n_layer"],
        "glmocr.vision.embedding_length": p["v_n_embd"],
        "glmocr.vision.attention.head_count": p["v_n_head"],
        "glmocr.vision.image_size": p["image_size"],
        "glmocr.vision.patch_size": p["patch_size"],
        "glmocr.vision.spatial_merge_size": p["spatial_merge_size"],
        "glmocr.vision.temporal_patch_size": p["temporal_patch_size"],
        "glmocr.vision.out_hidden_size": p["out_hidden_size"],
        "glmocr.vision.intermediate_size": p["v_n_ff"],
        "glmocr.vision.attention.layer_norm_rms_epsilon": p["v_eps"],
        "glmocr.vision.min_pixels": p["min_pixels"],
        "glmocr.vision.max_pixels": p["max_pixels"],
        "glmocr.vision.image_mean": p["image_mean"],
        "glmocr.vision.image_std": p["image_std"],
        "glmocr.image_token_id": special["<|image|>"],
        "glmocr.image_start_token_id": special["<|begin_of_image|>"],
        "glmocr.image_end_token_id": special["<|end_of_image|>"],
        "glmocr.video_token_id": special["<|video|>"],
        "glmocr.video_start_token_id": special["<|begin_of_video|>"],
        "glmocr.video_end_token_id": special["<|end_of_video|>"],
    }
    ts: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (V, E), 0.05), T.BF16),
        "output.weight": (normal(rng, (V, E), 0.05), T.BF16),
        "output_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        gate_up = normal(rng, (2 * F, E), 0.05)  # HF mlp.gate_up_proj, split on dim 0
        ts[b + "attn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        ts[b + "attn_q.weight"] = (normal(rng, (H * hd, E), 0.05), T.BF16)
        ts[b + "attn_k.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.BF16)
        ts[b + "attn_v.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.BF16)
        ts[b + "attn_out.weight"] = (normal(rng, (E, H * hd), 0.05), T.BF16)
        ts[b + "post_attn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        ts[b + "ffn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        ts[b + "ffn_gate.weight"] = (gate_up[:F], T.BF16)
        ts[b + "ffn_up.weight"] = (gate_up[F:], T.BF16)
        ts[b + "ffn_down.weight"] = (normal(rng, (E, F), 0.05), T.BF16)
        ts[b + "post_ffn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
    ts.update(_vision_tensors(rng, p))
    return write(path, "glmocr", kvs, ts, ollama_order=True)


def _vision_tensors(rng: np.random.Generator, p: Dims) -> dict[str, tuple[np.ndarray, T]]:
    VE, VF, P, OUT, M = p["v_n_embd"], p["v_n_ff"], p["patch_size"], p["out_hidden_size"], p["spatial_merge_size"]
    d_head = VE // p["v_n_head"]
    patch = normal(rng, (VE, 3, p["temporal_patch_size"], P, P), 0.05)  # HF Conv3D [out, C, T, P, P]
    ts: dict[str, tuple[np.ndarray, T]] = {
        "v.patch_embd_0.weight": (patch[:, :, 0], T.F16),
        "v.patch_embd_1.weight": (patch[:, :, 1], T.F16),
        "v.patch_embd.bias": (normal(rng, (VE,), 0.02), T.F32),
        "v.post_ln.weight": (1.0 + normal(rng, (VE,), 0.05), T.F32),
        "mm.patch_merger.weight": (normal(rng, (OUT, VE, M, M), 0.05), T.F16),
        "mm.patch_merger.bias": (normal(rng, (OUT,), 0.02), T.F32),
        "mm.model.fc.weight": (normal(rng, (OUT, OUT), 0.05), T.F16),
        "mm.post_norm.weight": (1.0 + normal(rng, (OUT,), 0.05), T.F32),
        "mm.post_norm.bias": (normal(rng, (OUT,), 0.02), T.F32),
        "mm.gate.weight": (normal(rng, (p["merger_ff"], OUT), 0.05), T.F16),
        "mm.up.weight": (normal(rng, (p["merger_ff"], OUT), 0.05), T.F16),
        "mm.down.weight": (normal(rng, (OUT, p["merger_ff"]), 0.05), T.F16),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        ts[b + "ln1.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        ts[b + "attn_qkv.weight"] = (normal(rng, (3 * VE, VE), 0.05), T.F16)
        ts[b + "attn_qkv.bias"] = (normal(rng, (3 * VE,), 0.02), T.F32)
        ts[b + "attn_q_norm.weight"] = (1.0 + normal(rng, (d_head,), 0.05), T.F32)
        ts[b + "attn_k_norm.weight"] = (1.0 + normal(rng, (d_head,), 0.05), T.F32)
        ts[b + "attn_out.weight"] = (normal(rng, (VE, VE), 0.05), T.F16)
        ts[b + "attn_out.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        ts[b + "ln2.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        for proj, shape in (("ffn_gate", (VF, VE)), ("ffn_up", (VF, VE)), ("ffn_down", (VE, VF))):
            ts[b + proj + ".weight"] = (normal(rng, shape, 0.05), T.F16)
            ts[b + proj + ".bias"] = (normal(rng, shape[:1], 0.02), T.F32)
    return ts
