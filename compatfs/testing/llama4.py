"""Llama 4 as Ollama's converter wrote it (the legacy form of `handlers/llama4.py`).

* `convert/convert_llama4.go` at 7ba9fa9c7 (2025-04-21, "fixes for maverick", the
  converter of the published Llama 4 blobs; later converters, through f63eea3d2 of
  2026-05-24, write the same but for `tokenizer.ggml.eos_token_ids`, added with
  333e36042): one monolithic `llama4` blob.  Text KVs are the
  `llama.*` keys of `convert/convert_llama.go` renamed `llama4.*` (incl.
  `rope.dimension_count` = hidden/heads, `attention.head_dim`/`key_length`/
  `value_length` from `head_dim`, `vocab_size`), `feed_forward_length` the dense
  MLP size, `expert_feed_forward_length`, `expert_count`, `expert_used_count`,
  `interleave_moe_layer_step`, `use_qk_norm`, `attention.chunk_size`, and the
  vision tower's `llama4.vision.*` (block_count, embedding_length,
  feed_forward_length, attention.head_count, image_size, patch_size,
  rope.freq_base, layer_norm_epsilon, pixel_shuffle_ratio).  Text Q/K are not
  permuted (`skipRepack`); the fused expert `gate_up_proj` [E, hidden, 2F] is split
  into `ffn_gate_exps`/`ffn_up_exps` [E, F, hidden] and `down_proj` transposed;
  `rope_freqs.weight` for Llama 3 rope scaling.  The vision tower and projector
  keep HF-ish names (`v.patch_embedding`, `v.class_embedding`,
  `v.positional_embedding_vlm` without `.weight`, `v.layernorm_pre/post`,
  `v.blk.N.{attn_q,..,attn_output,attn_norm,ffn_norm,mlp.fc1,mlp.fc2}`,
  `v.vision_adapter.mlp.fc1/fc2`, `mm.linear_1`).
* dtypes (`convert/reader.go` at 7ba9fa9c7, which converted BF16 checkpoints to
  F16; BF16 text matrices came with fa7776fd2, 2025-08-05): F16 matrices, F32 for
  1-D tensors, `ffn_gate_inp` and `v.positional_embedding_vlm`.
* tokenizer (`convert/tokenizer.go`): `gpt2`, pre-tokenizer `default` (Llama 4's
  split regex is not among the digests it knows), scores = token ids, added
  special tokens typed control, the vocabulary padded to the config's
  `vocab_size` with `[PAD<i>]` (user-defined, score -1); `add_bos_token` false
  because tokenizer_config.json has no `add_bos_token` (Llama 4 adds its BOS
  through tokenizer.json's post-processor, which the converter does not read).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode


LLAMA4: Dims = dict(
    # text_config: 4 layers, every second a MoE layer (interleave step 2, as Maverick); four,
    # because llama.cpp's Llama 4 graph feeds its attention-temperature input only to every
    # fourth layer (the ones without rope) and aborts on a model that has none
    n_layer=4,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    n_ff_mlp=128,
    n_ff_exp=64,
    n_expert=4,
    n_expert_used=1,
    moe_step=2,
    chunk=8192,
    context_length=131072,
    rope_theta=500000.0,
    rms_eps=1e-5,
    n_pad=8,
    # Llama 4 Scout's rope scaling
    rope_scaling=dict(factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0, original=8192),
    # vision_config: 32x32 images of 8x8 patches -> 16 patches, pixel shuffle 0.5 -> 4 tokens
    v_n_layer=2,
    v_n_embd=32,
    v_n_ff=128,
    v_n_head=2,
    image_size=32,
    patch_size=8,
    v_eps=1e-5,
    v_rope_theta=10000.0,
    pixel_shuffle_ratio=0.5,
    projector_dim=48,
)

LLAMA4_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|step|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|finetune_right_pad|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|vision_reply|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
    "<|image|>",
    "<|patch|>",
)

# Llama 4's chat template, shortened to what these tests render (text and image parts).
LLAMA4_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for content in message['content'] %}{%- if content['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|eot|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"
)


@functools.cache
def llama4_tokens() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Byte-level BPE vocabulary in Llama 4's layout (tokens, types, merges): the
    256 byte characters, one token per learned merge, then the special tokens
    (control), as tokenizer.json lists them; no padding."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(300)
    toks = list(b2u.values())
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
    types = [1] * len(toks) + [3] * len(LLAMA4_SPECIALS)
    return tuple(toks) + LLAMA4_SPECIALS, tuple(types), tuple(f"{a} {b}" for a, b in merges)


def llama3_rope_factors(
    head_dim: int, theta: float, factor: float, low: float, high: float, original: int
) -> list[float]:
    """`rope_freqs.weight` as Ollama's llama converter computes it (Llama 3 rope scaling)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def legacy_llama4(path: Path, seed: int = 0) -> Path:
    """Llama4ForConditionalGeneration (Scout/Maverick layout, tiny) as Ollama's converter wrote it.

    Text: 4 layers (0 and 2 dense, 1 and 3 MoE with 4 experts and a shared expert),
    hidden 64, heads 4/2 of 16, dense MLP 128, experts 64, context 131072, rope base 5e5
    with Llama 3 scaling (``rope_freqs.weight``).  Vocabulary: :func:`llama4_tokens`
    plus 8 ``[PADi]`` rows.  Vision: 2 blocks of 32 (heads 2, MLP 128), 32x32 images of
    8x8 patches, pixel-shuffle ratio 0.5, adapter MLP 128 -> 48 -> 48, projector 48 -> 64.
    Untranslated, llama.cpp refuses it: 90 tensors where the text model wants 48.
    """
    p = LLAMA4
    rng = np.random.default_rng(seed)
    toks, types, merges = (list(x) for x in llama4_tokens())
    n_real = len(toks)
    scores = [float(i) for i in range(n_real)]
    for i in range(p["n_pad"]):
        toks.append(f"[PAD{i}]")
        types.append(4)
        scores.append(-1.0)
    V, E, H, HKV, hd = len(toks), p["n_embd"], p["n_head"], p["n_head_kv"], p["head_dim"]
    special = {t: i for i, t in enumerate(toks) if t in LLAMA4_SPECIALS}
    rs = p["rope_scaling"]
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.chat_template": LLAMA4_CHAT_TEMPLATE,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.bos_token_id": special["<|begin_of_text|>"],
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.eos_token_id": special["<|eot|>"],
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.ggml.padding_token_id": special["<|finetune_right_pad|>"],
        "llama4.vocab_size": V,
        "llama4.block_count": p["n_layer"],
        "llama4.context_length": p["context_length"],
        "llama4.embedding_length": E,
        "llama4.feed_forward_length": p["n_ff_mlp"],
        "llama4.attention.head_count": H,
        "llama4.attention.head_count_kv": HKV,
        "llama4.attention.head_dim": hd,
        "llama4.attention.key_length": hd,
        "llama4.attention.value_length": hd,
        "llama4.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "llama4.rope.dimension_count": E // H,
        "llama4.rope.freq_base": p["rope_theta"],
        "llama4.expert_feed_forward_length": p["n_ff_exp"],
        "llama4.expert_count": p["n_expert"],
        "llama4.expert_used_count": p["n_expert_used"],
        "llama4.interleave_moe_layer_step": p["moe_step"],
        "llama4.use_qk_norm": True,
        "llama4.attention.chunk_size": p["chunk"],
        "llama4.vision.block_count": p["v_n_layer"],
        "llama4.vision.embedding_length": p["v_n_embd"],
        "llama4.vision.feed_forward_length": p["v_n_ff"],
        "llama4.vision.attention.head_count": p["v_n_head"],
        "llama4.vision.image_size": p["image_size"],
        "llama4.vision.patch_size": p["patch_size"],
        "llama4.vision.rope.freq_base": p["v_rope_theta"],
        "llama4.vision.layer_norm_epsilon": p["v_eps"],
        "llama4.vision.pixel_shuffle_ratio": p["pixel_shuffle_ratio"],
    }
    factors = llama3_rope_factors(
        hd, p["rope_theta"], rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original"]
    )
    ts: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (V, E), 0.05), T.F16),
        "output.weight": (normal(rng, (V, E), 0.05), T.F16),
        "output_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
        "rope_freqs.weight": (np.asarray(factors, np.float32), T.F32),
    }
    F, X = p["n_ff_exp"], p["n_expert"]
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        ts[b + "attn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        ts[b + "attn_q.weight"] = (normal(rng, (H * hd, E), 0.05), T.F16)
        ts[b + "attn_k.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.F16)
        ts[b + "attn_v.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.F16)
        ts[b + "attn_output.weight"] = (normal(rng, (E, H * hd), 0.05), T.F16)
        ts[b + "ffn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        if (i + 1) % p["moe_step"]:
            ts[b + "ffn_gate.weight"] = (normal(rng, (p["n_ff_mlp"], E), 0.05), T.F16)
            ts[b + "ffn_up.weight"] = (normal(rng, (p["n_ff_mlp"], E), 0.05), T.F16)
            ts[b + "ffn_down.weight"] = (normal(rng, (E, p["n_ff_mlp"]), 0.05), T.F16)
            continue
        # HF experts.gate_up_proj [X, E, 2F] and down_proj [X, F, E], split and transposed.
        gate_up, down = normal(rng, (X, E, 2 * F), 0.05), normal(rng, (X, F, E), 0.05)
        ts[b + "ffn_gate_inp.weight"] = (normal(rng, (X, E), 0.05), T.F32)
        ts[b + "ffn_gate_exps.weight"] = (gate_up[:, :, :F].transpose(0, 2, 1), T.F16)
        ts[b + "ffn_up_exps.weight"] = (gate_up[:, :, F:].transpose(0, 2, 1), T.F16)
        ts[b + "ffn_down_exps.weight"] = (down.transpose(0, 2, 1), T.F16)
        ts[b + "ffn_gate_shexp.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        ts[b + "ffn_up_shexp.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        ts[b + "ffn_down_shexp.weight"] = (normal(rng, (E, F), 0.05), T.F16)
    ts.update(_vision_tensors(rng, p))
    return write(path, "llama4", kvs, ts, ollama_order=True)


def _vision_tensors(rng: np.random.Generator, p: Dims) -> dict[str, tuple[np.ndarray, T]]:
    VE, VF, P, Q = p["v_n_embd"], p["v_n_ff"], p["patch_size"], p["projector_dim"]
    n_pos = (p["image_size"] // P) ** 2 + 1  # patches and the class token
    ts: dict[str, tuple[np.ndarray, T]] = {
        "v.patch_embedding.weight": (normal(rng, (VE, 3 * P * P), 0.05), T.F16),
        "v.class_embedding": (normal(rng, (VE,), 0.05), T.F32),
        "v.positional_embedding_vlm": (normal(rng, (n_pos, VE), 0.05), T.F32),
        "v.layernorm_pre.weight": (1.0 + normal(rng, (VE,), 0.05), T.F32),
        "v.layernorm_pre.bias": (normal(rng, (VE,), 0.02), T.F32),
        "v.layernorm_post.weight": (1.0 + normal(rng, (VE,), 0.05), T.F32),
        "v.layernorm_post.bias": (normal(rng, (VE,), 0.02), T.F32),
        # Llama4VisionPixelShuffleMLP: fc1 takes the shuffled patches (4x the width, = v_n_ff)
        "v.vision_adapter.mlp.fc1.weight": (normal(rng, (Q, VF), 0.05), T.F16),
        "v.vision_adapter.mlp.fc2.weight": (normal(rng, (Q, Q), 0.05), T.F16),
        "mm.linear_1.weight": (normal(rng, (p["n_embd"], Q), 0.05), T.F16),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            ts[b + proj + ".weight"] = (normal(rng, (VE, VE), 0.05), T.F16)
            ts[b + proj + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
        for norm in ("attn_norm", "ffn_norm"):
            ts[b + norm + ".weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
            ts[b + norm + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
        ts[b + "mlp.fc1.weight"] = (normal(rng, (VF, VE), 0.05), T.F16)
        ts[b + "mlp.fc1.bias"] = (normal(rng, (VF,), 0.02), T.F32)
        ts[b + "mlp.fc2.weight"] = (normal(rng, (VE, VF), 0.05), T.F16)
        ts[b + "mlp.fc2.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    return ts
