"""Laguna blobs as Ollama's converter writes them (the legacy form of
`handlers/laguna.py`), from a tiny LagunaForCausalLM checkpoint shaped like
Laguna-XS.2 (hybrid full/sliding attention, per-head output gate, one leading
dense layer, sigmoid-routed experts with a shared expert).

* `convert/convert_laguna.go` at 87288ced4 (2026-04-28, "New models"; unchanged
  through f63eea3 and fb3076099): `tokenizer.ggml.pre` "laguna",
  `add_bos_token` false, no chat template; per-layer `attention.head_count`
  (UINT32 array), `attention.layer_types`, `sliding_window_pattern`,
  `gating_type`, `qk_norm`, `expert_*`, `leading_dense_block_count`,
  `dense_layers`, the full layers' YaRN under `rope.scaling.{type, factor,
  original_context_length, beta_fast, beta_slow, attn_factor}` (the attention
  factor computed as 0.1 ln(factor) + 1 when the config gives none), and the
  sliding layers' rope under `rope.swa.*`; tensors under the converter's
  replacements, the gate `self_attn.g_proj` as `attn_g`, the score-correction
  bias as `exp_probs_b.bias`, routed experts stacked.

KVs sorted, tensors in WriteGGUF's order (core.write); matrices BF16, vectors
F32.  The core writer stores integer lists as INT32 arrays where Ollama wrote
UINT32; llama.cpp reads both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .qwen3next import small_bpe_tokens


LAGUNA: Dims = dict(
    n_layer=4,
    n_embd=64,
    n_ff=128,
    heads=(4, 8, 8, 8),
    n_head_kv=2,
    head_dim=16,
    rms_eps=1e-6,
    context_length=4096,
    sliding_window=64,
    layer_types=("full_attention",) + ("sliding_attention",) * 3,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    n_ff_shexp=32,
    routed_scaling=2.5,
    rope_theta=500_000.0,
    rope_factor=4.0,
    rope_original_context=1024,
    rope_partial=0.5,
    swa_rope_theta=10_000.0,
)
SPECIALS = ("<|endoftext|>", "<|pad|>", "<assistant>", "</assistant>")


def legacy_laguna(path: Path, seed: int = 0) -> Path:
    """Laguna as Ollama's converter writes it: 4 layers (full, then 3 sliding
    with window 64), n_embd 64, heads 4 (full) / 8 (sliding), 2 KV heads of 16,
    rope over 8 dims (YaRN x4) on full layers and 16 on sliding ones, 4
    experts (2 used) of 32 plus a shared one after a dense first layer, a
    ~440-token byte-level BPE vocabulary.  Untranslated llama.cpp fails:
    tensor `blk.0.attn_gate.weight` not found."""
    p = LAGUNA
    rng = np.random.default_rng(seed)
    toks, types, merges = small_bpe_tokens(SPECIALS)
    eos, eot = toks.index("<|endoftext|>"), toks.index("</assistant>")
    E, hd, HKV, X = p["n_embd"], p["head_dim"], p["n_head_kv"], p["n_expert"]
    a = "laguna."
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "laguna",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": eos,
        "tokenizer.ggml.eos_token_id": eos,
        "tokenizer.ggml.eos_token_ids": [eos, eot],
        "tokenizer.ggml.padding_token_id": toks.index("<|pad|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        a + "block_count": p["n_layer"],
        a + "context_length": p["context_length"],
        a + "embedding_length": E,
        a + "feed_forward_length": p["n_ff"],
        a + "attention.head_count": list(p["heads"]),
        a + "attention.head_count_kv": HKV,
        a + "attention.key_length": hd,
        a + "attention.value_length": hd,
        a + "attention.layer_norm_rms_epsilon": p["rms_eps"],
        a + "attention.sliding_window": p["sliding_window"],
        a + "attention.sink_enabled": False,
        a + "attention.layer_types": [int(t == "sliding_attention") for t in p["layer_types"]],
        a + "attention.sliding_window_pattern": [t == "sliding_attention" for t in p["layer_types"]],
        a + "attention.gating_type": 1,
        a + "attention.qk_norm": True,
        a + "expert_count": X,
        a + "expert_used_count": p["n_expert_used"],
        a + "expert_feed_forward_length": p["n_ff_exp"],
        a + "expert_shared_feed_forward_length": p["n_ff_shexp"],
        a + "expert_shared_count": 1,
        a + "expert_weights_norm": True,
        a + "expert_weights_scale": p["routed_scaling"],
        a + "expert_gating_func": 2,
        a + "decoder_sparse_step": 1,
        a + "leading_dense_block_count": 1,
        a + "dense_layers": [0],
        a + "rope.freq_base": p["rope_theta"],
        a + "rope.scaling.type": "yarn",
        a + "rope.scaling.factor": p["rope_factor"],
        a + "rope.scaling.original_context_length": p["rope_original_context"],
        a + "rope.scaling.beta_fast": 32.0,
        a + "rope.scaling.beta_slow": 1.0,
        a + "rope.scaling.attn_factor": 0.1 * math.log(p["rope_factor"]) + 1.0,
        a + "rope.partial_rotary_factor": p["rope_partial"],
        a + "rope.swa.freq_base": p["swa_rope_theta"],
        a + "rope.swa.scaling.type": "linear",
        a + "rope.swa.scaling.factor": 1.0,
        a + "rope.swa.partial_rotary_factor": 1.0,
        a + "rope.dimension_count": int(hd * p["rope_partial"]),
        a + "rope.swa.dimension_count": hd,
    }

    def norm(n):
        return (1.0 + normal(rng, (n,), 0.05), T.F32)

    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (len(toks), E), 0.05), T.BF16),
        "output_norm.weight": norm(E),
        "output.weight": (normal(rng, (len(toks), E), 0.05), T.BF16),
    }
    for i, H in enumerate(p["heads"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = norm(E)
        t[b + "attn_q.weight"] = (normal(rng, (H * hd, E), 0.05), T.BF16)
        t[b + "attn_k.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.BF16)
        t[b + "attn_v.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.BF16)
        t[b + "attn_output.weight"] = (normal(rng, (E, H * hd), 0.05), T.BF16)
        t[b + "attn_g.weight"] = (normal(rng, (H, E), 0.05), T.BF16)  # per-head gate
        t[b + "attn_q_norm.weight"] = norm(hd)
        t[b + "attn_k_norm.weight"] = norm(hd)
        t[b + "ffn_norm.weight"] = norm(E)
        if i == 0:
            t[b + "ffn_gate.weight"] = (normal(rng, (p["n_ff"], E), 0.05), T.BF16)
            t[b + "ffn_up.weight"] = (normal(rng, (p["n_ff"], E), 0.05), T.BF16)
            t[b + "ffn_down.weight"] = (normal(rng, (E, p["n_ff"]), 0.05), T.BF16)
            continue
        t[b + "ffn_gate_inp.weight"] = (normal(rng, (X, E), 0.1), T.BF16)
        t[b + "exp_probs_b.bias"] = (normal(rng, (X,), 0.01), T.F32)
        t[b + "ffn_gate_exps.weight"] = (normal(rng, (X, p["n_ff_exp"], E), 0.05), T.BF16)
        t[b + "ffn_up_exps.weight"] = (normal(rng, (X, p["n_ff_exp"], E), 0.05), T.BF16)
        t[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, p["n_ff_exp"]), 0.05), T.BF16)
        t[b + "ffn_gate_shexp.weight"] = (normal(rng, (p["n_ff_shexp"], E), 0.05), T.BF16)
        t[b + "ffn_up_shexp.weight"] = (normal(rng, (p["n_ff_shexp"], E), 0.05), T.BF16)
        t[b + "ffn_down_shexp.weight"] = (normal(rng, (E, p["n_ff_shexp"]), 0.05), T.BF16)
    return write(path, "laguna", kvs, t, ollama_order=True)
