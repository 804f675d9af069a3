"""LLaVA 1.5 projectors as Ollama published them (the legacy form of `handlers/llava.py`).

* llama.cpp `tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py` (before it
  wrote `clip.projector_type`): arch `clip`, LLaVA MLP projector `mm.0`/`mm.2`,
  CLIP names with the historical fc1->`ffn_down` / fc2->`ffn_up` swap, the last
  encoder layer and `post_layernorm` dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .llama import PLAIN_LLAMA


LLAVA: Dims = dict(
    # HF CLIP vision tower with 3 layers; the legacy script pops the last one -> 2.
    v_n_layer=2,
    v_n_embd=32,
    v_n_ff=64,
    v_n_head=2,
    v_eps=1e-5,
    image_size=56,
    patch_size=14,
    clip_projection_dim=24,  # CLIP's own visual projection, unused by LLaVA
    mm_hidden=PLAIN_LLAMA["n_embd"],
    n_embd_out=PLAIN_LLAMA["n_embd"],
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)


def legacy_llava_projector(path: Path, seed: int = 0) -> Path:
    """LLaVA-1.5 mmproj as the old ``convert_image_encoder_to_gguf.py --llava-projector``
    wrote it (published by Ollama for llava/bakllava), **without clip.projector_type**.

    arch ``clip``; has_text_encoder false, has_vision_encoder true, has_llava_projector
    true; ``clip.vision.*``: image 56, patch 14 (16 patches + class = 17 positions),
    embedding 32, ff 64, projection_dim 24 (CLIP's own visual projection; LLaVA never
    uses it), block_count 2 (3-layer tower, the last one dropped), 2 heads, eps 1e-5,
    CLIP image_mean/std; ``clip.use_gelu`` false (quick_gelu).  Tensors in script order:
    ``mm.0.{weight F16 [32->64], bias}``, ``mm.2.{weight F16 [64->64], bias}`` (output width 64
    = plain_llama_text n_embd), ``v.class_embd``, ``v.patch_embd.weight`` (F16, no bias),
    ``v.position_embd.weight`` (F16), ``v.pre_ln.*``, ``v.blk.N.{attn_k,attn_v,attn_q,attn_out,
    ln1,ffn_down,ffn_up,ln2}.{weight,bias}`` where ffn_down holds fc1 (32->64) and ffn_up
    fc2 -- the historical swapped naming llama.cpp detects and swaps back for mlp
    projectors; no ``v.post_ln``.  Untranslated llama.cpp: "unknown projector type".
    """
    p = LLAVA
    rng = np.random.default_rng(seed)
    VE, VF, P, C = p["v_n_embd"], p["v_n_ff"], p["patch_size"], 3
    n_pos = (p["image_size"] // P) ** 2 + 1
    kvs: dict[str, Any] = {
        "clip.has_text_encoder": False,
        "clip.has_vision_encoder": True,
        "clip.has_llava_projector": True,
        "general.file_type": 1,
        "general.name": "openai/clip-vit-large-patch14-336",
        "general.description": "image encoder for LLaVA",
        "clip.vision.image_size": p["image_size"],
        "clip.vision.patch_size": P,
        "clip.vision.embedding_length": VE,
        "clip.vision.feed_forward_length": VF,
        "clip.vision.projection_dim": p["clip_projection_dim"],
        "clip.vision.attention.head_count": p["v_n_head"],
        "clip.vision.attention.layer_norm_epsilon": p["v_eps"],
        "clip.vision.block_count": p["v_n_layer"],
        "clip.vision.image_mean": list(p["image_mean"]),
        "clip.vision.image_std": list(p["image_std"]),
        "clip.use_gelu": False,
    }
    H, O = p["mm_hidden"], p["n_embd_out"]
    t: dict[str, tuple[np.ndarray, T]] = {
        "mm.0.weight": (normal(rng, (H, VE), 0.1), T.F16),
        "mm.0.bias": (normal(rng, (H,), 0.02), T.F32),
        "mm.2.weight": (normal(rng, (O, H), 0.1), T.F16),
        "mm.2.bias": (normal(rng, (O,), 0.02), T.F32),
        "v.class_embd": (normal(rng, (VE,), 0.1), T.F32),
        "v.patch_embd.weight": (normal(rng, (VE, C, P, P), 0.05), T.F16),
        "v.position_embd.weight": (normal(rng, (n_pos, VE), 0.1), T.F16),
        "v.pre_ln.weight": (1.0 + normal(rng, (VE,), 0.05), T.F32),
        "v.pre_ln.bias": (normal(rng, (VE,), 0.02), T.F32),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_k", "attn_v", "attn_q", "attn_out"):
            t[b + proj + ".weight"] = (normal(rng, (VE, VE), 0.1), T.F16)
            t[b + proj + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "ln1.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        t[b + "ln1.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "ffn_down.weight"] = (normal(rng, (VF, VE), 0.1), T.F16)  # HF mlp.fc1
        t[b + "ffn_down.bias"] = (normal(rng, (VF,), 0.02), T.F32)
        t[b + "ffn_up.weight"] = (normal(rng, (VE, VF), 0.1), T.F16)  # HF mlp.fc2
        t[b + "ffn_up.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "ln2.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        t[b + "ln2.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    return write(path, "clip", kvs, t, ollama_order=False)
