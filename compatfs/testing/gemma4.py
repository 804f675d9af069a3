"""Gemma 4 MoE blobs in the layout of an older Ollama converter (a legacy form
of `handlers/gemma4.py`): one monolithic blob, text model, vision tower and
projector.

* `convert/convert_gemma4.go` at c29932c63 (2026-04-01, "gemma4: add
  per_expert_scale to MoE router and fix moe_intermediate_size config", on
  the branch squashed into 96b202d34 "Add support for gemma4"): the
  checkpoint's fused `experts.gate_up_proj` [n_expert, 2*n_ff_exp, n_embd] is
  split into its contiguous halves `blk.N.ffn_gate_exps.weight` and
  `blk.N.ffn_up_exps.weight` (each ggml [n_embd, n_ff_exp, n_expert]), and
  `router.per_expert_scale` is named `blk.N.ffn_gate_inp.per_expert_scale`.
  The next commit, 1cbe7950d (2026-04-02), writes the stack whole as
  `ffn_gate_up_exps` (gate rows, then up rows, per expert: llama.cpp's
  layout) and the scale as `ffn_down_exps.scale`.
* Everything else as `KV()` (identical at c29932c63 and 96b202d34) and
  `Replacements()` write it, shaped like the genuine blob
  ../shared/fixtures/ollama/gemma4_vision.gguf: `tokenizer.ggml.model`
  "llama" with byte tokens and Gemma 4's added tokens user-defined, scores
  the token ids; BF16 matrices (F32 for `ffn_gate_inp.weight` and every 1-D
  tensor, as `tensorBase.Kind()`), one global `rope_freqs.weight`; the vision
  tower under its mmproj names (`ln1`, `attn_out`, ...), F16, without clamps.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_tokens, spm_pieces


GEMMA4_MOE: Dims = dict(
    n_layer=4,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    head_dim_swa=16,
    head_dim=32,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    context_length=131072,
    sliding_window=512,
    rope_base=1_000_000.0,
    rope_base_swa=10_000.0,
    partial_rotary=0.25,
    softcap=30.0,
    v_n_layer=2,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    v_head_dim=16,
    patch_size=16,
    n_positions=256,
)
# Gemma 4's added tokens as the tokenizer lists them first: control (3) or user-defined (4).
SPECIALS = [
    ("<pad>", 3),
    ("<eos>", 3),
    ("<bos>", 3),
    ("<unk>", 3),
    ("<mask>", 3),
    ("[multimodal]", 4),
    *((f"<unused{i}>", 4) for i in range(4)),
    *(
        (t, 4)
        for t in (
            "<|turn>",
            "<turn|>",
            "<|think|>",
            "<|channel>",
            "<channel|>",
            "<|tool_call>",
            "<tool_call|>",
            "<|tool_response>",
            "<tool_response|>",
            '<|"|>',
            "<|image>",
            "<image|>",
            "<|image|>",
            "<|audio>",
            "<audio|>",
            "<|audio|>",
            "<|video|>",
        )
    ),
]
PAD, EOS, BOS, UNK = 0, 1, 2, 3
TURN_END = 11
CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- for m in messages -%}{{- '<|turn>' + ('model' if m['role'] == 'assistant' "
    "else m['role']) + '\n' -}}{%- if m['content'] is string -%}{{- m['content'] | trim -}}{%- else -%}"
    "{%- for item in m['content'] -%}{%- if item['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] | trim -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}"
)


@functools.cache
def gemma4_tokens() -> tuple[list[str], list[float], list[int], list[str]]:
    """Tokens, scores, types, merges as Ollama's converter writes Gemma 4's
    tokenizer.json: the added tokens, the byte tokens (normal), the
    '\u2581' pieces of the merges, then single characters; scores the ids."""
    pieces, singles, merges = spm_pieces(110)
    toks = [t for t, _ in SPECIALS] + byte_tokens()
    types = [ty for _, ty in SPECIALS] + [1] * 256
    for piece in list(pieces) + [c for c in singles if c not in pieces]:
        toks.append(piece)
        types.append(1)
    return toks, [float(i) for i in range(len(toks))], types, list(merges)


def legacy_gemma4_moe(path: Path, seed: int = 0) -> Path:
    """A tiny Gemma 4 MoE (26B-A4B-like: each layer a dense MLP beside 4
    experts, 2 used) with a vision tower, as the converter at c29932c63 wrote
    it: split `ffn_gate_exps`/`ffn_up_exps` stacks and
    `ffn_gate_inp.per_expert_scale`.  4 layers (the last global), n_embd 64."""
    p, rng = GEMMA4_MOE, np.random.default_rng(seed)
    toks, scores, types, merges = gemma4_tokens()
    E, F, X, FX = p["n_embd"], p["n_ff"], p["n_expert"], p["n_ff_exp"]
    swa = [i < p["n_layer"] - 1 for i in range(p["n_layer"])]
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        "gemma4.block_count": p["n_layer"],
        "gemma4.context_length": p["context_length"],
        "gemma4.embedding_length": E,
        "gemma4.feed_forward_length": F,
        "gemma4.attention.head_count": p["n_head"],
        "gemma4.attention.head_count_kv": p["n_head_kv"],
        "gemma4.attention.key_length": p["head_dim"],
        "gemma4.attention.value_length": p["head_dim"],
        "gemma4.attention.key_length_swa": p["head_dim_swa"],
        "gemma4.attention.value_length_swa": p["head_dim_swa"],
        "gemma4.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma4.attention.sliding_window": p["sliding_window"],
        "gemma4.attention.sliding_window_pattern": swa,
        "gemma4.attention.shared_kv_layers": 0,
        "gemma4.rope.freq_base": p["rope_base"],
        "gemma4.rope.dimension_count": p["head_dim"],
        "gemma4.rope.freq_base_swa": p["rope_base_swa"],
        "gemma4.rope.dimension_count_swa": p["head_dim_swa"],
        "gemma4.final_logit_softcapping": p["softcap"],
        "gemma4.expert_count": X,
        "gemma4.expert_used_count": p["n_expert_used"],
        "gemma4.expert_feed_forward_length": FX,
        "gemma4.embedding_length_per_layer_input": 0,
        "gemma4.vision.block_count": p["v_n_layer"],
        "gemma4.vision.embedding_length": p["v_n_embd"],
        "gemma4.vision.attention.head_count": p["v_n_head"],
        "gemma4.vision.feed_forward_length": p["v_n_ff"],
        "gemma4.vision.patch_size": p["patch_size"],
        "gemma4.vision.num_channels": 3,
        "gemma4.vision.projector.scale_factor": 3,
        "gemma4.vision.attention.layer_norm_epsilon": 1e-6,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "gemma4",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": EOS,
        "tokenizer.ggml.eos_token_ids": [EOS, TURN_END],
        "tokenizer.ggml.padding_token_id": PAD,
        "tokenizer.ggml.unknown_token_id": UNK,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }

    def norm(n: int) -> tuple[np.ndarray, T]:
        return 1.0 + normal(rng, (n,), 0.05), T.F32

    def matrix(rows: int, cols: int, dtype: T = T.BF16) -> tuple[np.ndarray, T]:
        return normal(rng, (rows, cols), 0.05), dtype

    n_rot = int(p["head_dim"] * p["partial_rotary"]) // 2
    tensors: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": matrix(len(toks), E),
        "output_norm.weight": norm(E),
        "rope_freqs.weight": (np.where(np.arange(p["head_dim"] // 2) < n_rot, 1.0, 1e30).astype(np.float32), T.F32),
    }
    for i, sliding in enumerate(swa):
        b, hd = f"blk.{i}.", p["head_dim_swa"] if sliding else p["head_dim"]
        gate_up = normal(rng, (X, 2 * FX, E), 0.05)  # the checkpoint's experts.gate_up_proj
        tensors |= {
            b + "attn_norm.weight": norm(E),
            b + "attn_q.weight": matrix(p["n_head"] * hd, E),
            b + "attn_k.weight": matrix(p["n_head_kv"] * hd, E),
            b + "attn_v.weight": matrix(p["n_head_kv"] * hd, E),
            b + "attn_output.weight": matrix(E, p["n_head"] * hd),
            b + "attn_q_norm.weight": norm(hd),
            b + "attn_k_norm.weight": norm(hd),
            b + "post_attention_norm.weight": norm(E),
            b + "layer_output_scale.weight": (np.ones(1, np.float32), T.F32),
            b + "ffn_norm.weight": norm(E),
            b + "ffn_gate.weight": matrix(F, E),
            b + "ffn_up.weight": matrix(F, E),
            b + "ffn_down.weight": matrix(E, F),
            b + "post_ffw_norm.weight": norm(E),
            b + "ffn_gate_inp.weight": matrix(X, E, T.F32),
            b + "ffn_gate_inp.scale": norm(E),
            b + "ffn_gate_inp.per_expert_scale": (1.0 + normal(rng, (X,), 0.1), T.F32),
            b + "pre_ffw_norm_2.weight": norm(E),
            b + "post_ffw_norm_1.weight": norm(E),
            b + "post_ffw_norm_2.weight": norm(E),
            b + "ffn_gate_exps.weight": (gate_up[:, :FX], T.BF16),
            b + "ffn_up_exps.weight": (gate_up[:, FX:], T.BF16),
            b + "ffn_down_exps.weight": (normal(rng, (X, E, FX), 0.05), T.BF16),
        }
    VE, VF = p["v_n_embd"], p["v_n_ff"]
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        tensors |= {
            b + "ln1.weight": norm(VE),
            b + "ln2.weight": norm(VE),
            b + "attn_q.weight": matrix(VE, VE, T.F16),
            b + "attn_k.weight": matrix(VE, VE, T.F16),
            b + "attn_v.weight": matrix(VE, VE, T.F16),
            b + "attn_out.weight": matrix(VE, VE, T.F16),
            b + "attn_q_norm.weight": norm(p["v_head_dim"]),
            b + "attn_k_norm.weight": norm(p["v_head_dim"]),
            b + "attn_post_norm.weight": norm(VE),
            b + "ffn_post_norm.weight": norm(VE),
            b + "ffn_gate.weight": matrix(VF, VE, T.F16),
            b + "ffn_up.weight": matrix(VF, VE, T.F16),
            b + "ffn_down.weight": matrix(VE, VF, T.F16),
        }
    ps = p["patch_size"]
    tensors |= {
        "v.patch_embd.weight": (normal(rng, (VE, 3, ps, ps), 0.05), T.F16),
        "v.position_embd.weight": (normal(rng, (2, p["n_positions"], VE), 0.05), T.F32),
        "mm.input_projection.weight": matrix(E, VE, T.F16),
    }
    return write(path, "gemma4", kvs, tensors, ollama_order=True)
