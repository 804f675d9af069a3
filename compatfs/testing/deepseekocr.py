"""DeepSeek-OCR as Ollama's converter wrote it (the legacy form of `handlers/deepseekocr.py`).

* `convert/convert_deepseekocr.go` at 92981ae3f (2025-10-31, "deepseekocr"; unchanged in
  substance through f63eea3 and 9db4bdbad): one `deepseekocr` blob with the DeepSeek-V2
  style MoE text model (plain Q/K/V attention, `leading_dense_block_count` dense blocks,
  then routed experts stacked into `ffn_{gate,up,down}_exps` and shared experts as
  `*_shexp`), the SAM ViT-B encoder under `s.*`, the CLIP-L encoder under `v.*` and the
  linear projector under `mm.*`.  Text keys: block/context/embedding/feed-forward
  lengths, head counts, `expert_count`, `expert_used_count`,
  `leading_dense_block_count`; no RMS epsilon, no `expert_feed_forward_length`, no
  `expert_shared_count`.  Vision keys `vision.{block_count, embedding_length,
  head_count, image_size, patch_size}` and `sam.{block_count, embedding_length,
  head_count, global_attention_indexes}`.  Names are the converter's substring
  replacements of the HF names: `s.patch_embd`, `s.position_embd` (no `.weight`),
  `s.blk.N.{norm1, attn.qkv, attn.proj, attn.rel_pos_h, attn.rel_pos_w, norm2,
  mlp.lin1, mlp.lin2}`, `s.neck.N`, `s.net_2`/`s.net_3`; `v.patch_embd`, `v.class_embd`,
  `v.position_embd`, `v.pre_layrnorm`, `v.blk.N.{layer_norm1, self_attn.qkv_proj,
  self_attn.out_proj, layer_norm2, mlp.fc1, mlp.fc2}`; `mm.layers`,
  `mm.image_newline`, `mm.view_seperator`.
* `convert/reader.go` Kind(): 1-D tensors, biases, `ffn_gate_inp`, `s.position_embd`,
  `v.position_embd.weight` and the relative position tables F32; everything else BF16
  (a BF16 checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .nemotron import byte_bpe_tokens


DEEPSEEK_OCR: Dims = dict(
    n_layer=3,
    n_embd=64,
    n_ff=128,
    n_head=4,
    context_length=8192,
    first_dense=1,
    n_expert=4,
    n_expert_used=2,
    n_shared=2,
    moe_ff=32,
    # SAM ViT-B (768 wide, 12 blocks, neck to 256, nets to 512 and 1024 in the real model)
    sam_n_layer=3,
    sam_n_embd=32,
    sam_n_head=2,
    sam_window=14,
    sam_grid=64,
    neck=16,
    sam_global=[2, 5, 8, 11],
    # CLIP-L/14 at 224 pixels (16x16 patches + CLS), fed with SAM's features
    v_n_layer=2,
    v_n_embd=64,
    v_n_head=4,
    image_size=224,
    patch_size=14,
)

SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image>")
BOS, EOS, PAD = 0, 1, 2


def _layer_norm(rng, pre: str, n: int) -> dict[str, tuple[np.ndarray, T]]:
    return {pre + ".weight": (1.0 + normal(rng, (n,), 0.05), T.F32), pre + ".bias": (normal(rng, (n,), 0.02), T.F32)}


def _linear(rng, pre: str, n_out: int, n_in: int, std: float = 0.1) -> dict[str, tuple[np.ndarray, T]]:
    return {
        pre + ".weight": (normal(rng, (n_out, n_in), std), T.BF16),
        pre + ".bias": (normal(rng, (n_out,), 0.02), T.F32),
    }


def _text_tensors(rng, p: Dims, n_vocab: int) -> dict[str, tuple[np.ndarray, T]]:
    E, F, X, f, S = p["n_embd"], p["n_ff"], p["n_expert"], p["moe_ff"], p["n_shared"] * p["moe_ff"]
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[b + proj + ".weight"] = (normal(rng, (E, E), 0.1), T.BF16)
        t[b + "ffn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        if i < p["first_dense"]:
            t[b + "ffn_gate.weight"] = (normal(rng, (F, E), 0.1), T.BF16)
            t[b + "ffn_up.weight"] = (normal(rng, (F, E), 0.1), T.BF16)
            t[b + "ffn_down.weight"] = (normal(rng, (E, F), 0.1), T.BF16)
        else:
            t[b + "ffn_gate_inp.weight"] = (normal(rng, (X, E), 0.1), T.F32)
            t[b + "ffn_gate_exps.weight"] = (normal(rng, (X, f, E), 0.1), T.BF16)
            t[b + "ffn_up_exps.weight"] = (normal(rng, (X, f, E), 0.1), T.BF16)
            t[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, f), 0.1), T.BF16)
            t[b + "ffn_gate_shexp.weight"] = (normal(rng, (S, E), 0.1), T.BF16)
            t[b + "ffn_up_shexp.weight"] = (normal(rng, (S, E), 0.1), T.BF16)
            t[b + "ffn_down_shexp.weight"] = (normal(rng, (E, S), 0.1), T.BF16)
    return t


def _sam_tensors(rng, p: Dims) -> dict[str, tuple[np.ndarray, T]]:
    C, G, N, hd, W = p["sam_n_embd"], p["sam_grid"], p["neck"], p["sam_n_embd"] // p["sam_n_head"], p["sam_window"]
    t: dict[str, tuple[np.ndarray, T]] = {
        "s.patch_embd.weight": (normal(rng, (C, 3, 16, 16), 0.02), T.BF16),
        "s.patch_embd.bias": (normal(rng, (C,), 0.02), T.F32),
        "s.position_embd": (normal(rng, (1, G, G, C), 0.05), T.F32),
        "s.neck.0.weight": (normal(rng, (N, C, 1, 1), 0.1), T.BF16),
        **_layer_norm(rng, "s.neck.1", N),
        "s.neck.2.weight": (normal(rng, (N, N, 3, 3), 0.05), T.BF16),
        **_layer_norm(rng, "s.neck.3", N),
        "s.net_2.weight": (normal(rng, (2 * N, N, 3, 3), 0.05), T.BF16),
        "s.net_3.weight": (normal(rng, (p["v_n_embd"], 2 * N, 3, 3), 0.05), T.BF16),
    }
    for i in range(p["sam_n_layer"]):
        b = f"s.blk.{i}."
        size = G if i in p["sam_global"] else W  # relative positions span the attended grid
        t.update(
            {
                **_layer_norm(rng, b + "norm1", C),
                **_linear(rng, b + "attn.qkv", 3 * C, C),
                **_linear(rng, b + "attn.proj", C, C),
                b + "attn.rel_pos_h": (normal(rng, (2 * size - 1, hd), 0.05), T.F32),
                b + "attn.rel_pos_w": (normal(rng, (2 * size - 1, hd), 0.05), T.F32),
                **_layer_norm(rng, b + "norm2", C),
                **_linear(rng, b + "mlp.lin1", 4 * C, C),
                **_linear(rng, b + "mlp.lin2", C, 4 * C),
            }
        )
    return t


def _clip_tensors(rng, p: Dims) -> dict[str, tuple[np.ndarray, T]]:
    VE, P = p["v_n_embd"], p["patch_size"]
    n_pos = (p["image_size"] // P) ** 2 + 1
    t: dict[str, tuple[np.ndarray, T]] = {
        "v.patch_embd.weight": (normal(rng, (VE, 3, P, P), 0.02), T.BF16),
        "v.class_embd": (normal(rng, (VE,), 0.1), T.F32),
        "v.position_embd.weight": (normal(rng, (n_pos, VE), 0.05), T.F32),
        **_layer_norm(rng, "v.pre_layrnorm", VE),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        t.update(
            {
                **_layer_norm(rng, b + "layer_norm1", VE),
                **_linear(rng, b + "self_attn.qkv_proj", 3 * VE, VE),
                **_linear(rng, b + "self_attn.out_proj", VE, VE),
                **_layer_norm(rng, b + "layer_norm2", VE),
                **_linear(rng, b + "mlp.fc1", 4 * VE, VE),
                **_linear(rng, b + "mlp.fc2", VE, 4 * VE),
            }
        )
    return t


def legacy_deepseekocr(path: Path, seed: int = 0) -> Path:
    """`deepseekocr` as Ollama writes DeepSeek-OCR: 3 text blocks 64 wide (4 heads; block 0
    dense with FFN 128, blocks 1-2 with 4 routed experts of 32, 2 used, and 2 shared ones),
    a 2-block SAM encoder 32 wide on the 64x64 patch grid of a 1024-pixel image
    (windows of 14, neck to 16 channels, nets to 32 and 64), a 2-block CLIP encoder 64 wide
    (224 pixels, patch 14) and the projector from SAM's and CLIP's 128 features to the
    text width.  Untranslated llama.cpp knows neither the architecture nor, as a
    projector, the file."""
    p = DEEPSEEK_OCR
    rng = np.random.default_rng(seed)
    toks, types, merges = byte_bpe_tokens(SPECIALS)
    arch = "deepseekocr"
    text = {
        "block_count": p["n_layer"],
        "context_length": p["context_length"],
        "embedding_length": p["n_embd"],
        "feed_forward_length": p["n_ff"],
        "attention.head_count": p["n_head"],
        "attention.head_count_kv": p["n_head"],
        "expert_count": p["n_expert"],
        "expert_used_count": p["n_expert_used"],
        "leading_dense_block_count": p["first_dense"],
        "vision.block_count": p["v_n_layer"],
        "vision.embedding_length": p["v_n_embd"],
        "vision.head_count": p["v_n_head"],
        "vision.image_size": p["image_size"],
        "vision.patch_size": p["patch_size"],
        "sam.block_count": p["sam_n_layer"],
        "sam.embedding_length": p["sam_n_embd"],
        "sam.head_count": p["sam_n_head"],
        "sam.global_attention_indexes": p["sam_global"],
    }
    kvs: dict[str, Any] = {f"{arch}.{k}": v for k, v in text.items()}
    kvs.update(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": [0.0] * len(toks),
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": BOS,
            "tokenizer.ggml.eos_token_id": EOS,
            "tokenizer.ggml.padding_token_id": PAD,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": False,
            "general.file_type": 1,
            "general.quantization_version": 2,
        }
    )
    E = p["n_embd"]
    tensors = {
        **_text_tensors(rng, p, len(toks)),
        **_sam_tensors(rng, p),
        **_clip_tensors(rng, p),
        **_linear(rng, "mm.layers", E, 2 * p["v_n_embd"], 0.05),
        "mm.image_newline": (normal(rng, (E,), 0.1), T.F32),
        "mm.view_seperator": (normal(rng, (E,), 0.1), T.F32),
    }
    return write(path, arch, kvs, tensors, ollama_order=True)
