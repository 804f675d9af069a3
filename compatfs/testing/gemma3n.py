"""Gemma 3n blobs as Ollama's converter wrote them (the legacy form of
`handlers/gemma3n.py`), shaped like ../shared/fixtures/ollama/gemma3n.gguf
at fewer layers.

* `convert/convert_gemma3n.go` at f63eea3d2 (2026-05-24; what it writes
  unchanged since 73b642e6f, June 2025): the text model of
  Gemma3nForConditionalGeneration, the towers left out; `gemma3n.*` keys
  for the config's sizes, heads, epsilon, sliding window, one bool per
  layer (`sliding_attention`) as `attention.sliding_window_pattern`, the
  KV-shared layer count, the per-layer input width, the head size as
  `head_dim`, the rope bases as `rope.freq_base` and
  `rope.freq_base_local`, the altup settings (`active_idx`,
  `correct_scale`, `lr_multiplier`, `num_inputs`), and
  `activation_sparsity_scale` the standard normal quantile of each layer's
  sparsity (0.95 -> 1.645, 0 -> -inf).  `embed_tokens` holds the whole
  vocabulary (text, then the image/audio slots), `embed_tokens_per_layer`
  the text vocabulary only; the altup projections stacked into
  `altup_proj`/`altup_unembd_proj` (ggml [n_embd, n_embd, num_inputs - 1]).
* `convert/tokenizer_spm.go` and `convert.go` at f63eea3d2: Gemma's
  SentencePiece vocabulary (`gemma3.gemma3_tokens`), then `[PAD<i>]`
  (user-defined, score -1) up to the embedding rows; pre "default", the BPE
  merges tokenizer.json carries, `add_<type>_token` for every special
  token, the generation config's EOS list (`<eos>`, `<end_of_turn>`); no
  `add_space_prefix`.
* Dtypes as Ollama kept the bf16 checkpoint: matrices BF16, norms and the
  altup correction scale F32.

llama.cpp fixes what it does not read: 256-wide per-layer inputs, laurel
rank 64, 4 altup inputs, activation sparsity in the first 10 layers, KV
in the first 20; the widths here are those.
"""

from __future__ import annotations

import functools
from statistics import NormalDist
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, attention, embeddings, ffn, linear, llm_kvs, norm, normal, write
from .gemma3 import GEMMA3_TEXT, _gemma3_tokenizer_kvs, gemma3_tokens

GEMMA3N: Dims = dict(
    n_layer=5,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    context_length=32768,
    rms_eps=1e-6,
    sliding_window=512,
    rope_freq_base=1_000_000.0,
    rope_freq_base_local=10_000.0,
    sliding=[True, True, True, True, False],
    sparsity=[0.95] * 5,
    n_kv_shared=0,
    per_layer=256,
    laurel_rank=64,
    altup=4,
    n_vocab=560,
)

# Gemma's chat format, without the system-prompt and image branches of Gemma 3n's own template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@functools.cache
def gemma3n_tokens() -> tuple[list[str], list[float], list[int], list[str], int]:
    """(tokens, scores, types, merges, text rows): Gemma's vocabulary, then
    `[PAD<i>]` for the image/audio slots up to `GEMMA3N["n_vocab"]`."""
    toks, scores, types, merges = gemma3_tokens()
    n_text = len(toks)
    pads = GEMMA3N["n_vocab"] - n_text
    return (toks + [f"[PAD{i}]" for i in range(pads)], scores + [-1.0] * pads, types + [4] * pads, list(merges), n_text)


def sparsity_scale(sparsity: float) -> float:
    """The standard normal quantile the converter writes for a layer's
    activation sparsity (-inf for 0)."""
    return float("-inf") if sparsity == 0.0 else NormalDist().inv_cdf(sparsity)


def legacy_gemma3n(path: Path, seed: int = 0) -> Path:
    """Gemma 3n E2B-style text model: 5 layers (the last global), n_embd 64,
    heads 4/2, head 16, n_ff 128, 560 embedding rows of which the per-layer
    embedding has the 525 text ones; ~2.4 MB.  Untranslated llama.cpp refuses
    the per-layer embedding's shape."""
    p = GEMMA3N
    rng = np.random.default_rng(seed)
    toks, scores, types, merges, n_text = gemma3n_tokens()
    L, E, F, H, HKV, hd = p["n_layer"], p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"], p["head_dim"]
    PL, R, A = p["per_layer"], p["laurel_rank"], p["altup"]
    a = "gemma3n"
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        f"{a}.embedding_length_per_layer_input": PL,
        f"{a}.head_dim": hd,
        f"{a}.attention.sliding_window": p["sliding_window"],
        f"{a}.attention.sliding_window_pattern": list(p["sliding"]),
        f"{a}.attention.shared_kv_layers": p["n_kv_shared"],
        f"{a}.rope.freq_base_local": p["rope_freq_base_local"],
        f"{a}.activation_sparsity_scale": [sparsity_scale(s) for s in p["sparsity"]],
        f"{a}.altup.active_idx": 0,
        f"{a}.altup.correct_scale": True,
        f"{a}.altup.lr_multiplier": 1.0,
        f"{a}.altup.num_inputs": A,
        **_gemma3_tokenizer_kvs(toks, scores, types, merges),
        "tokenizer.ggml.eos_token_ids": [GEMMA3_TEXT["eos"], toks.index("<end_of_turn>")],
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    tensors = embeddings(rng, len(toks), E, tied=True)
    tensors.update(
        {
            "per_layer_token_embd.weight": (normal(rng, (n_text, L * PL), 0.05), T.BF16),
            "per_layer_model_proj.weight": linear(rng, L * PL, E),
            "per_layer_proj_norm.weight": (norm(rng, PL), T.F32),
            "altup_proj.weight": (normal(rng, (A - 1, E, E), 0.05), T.BF16),
            "altup_unembd_proj.weight": (normal(rng, (A - 1, E, E), 0.05), T.BF16),
        }
    )
    for i in range(L):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(attention(rng, b, E, H * hd, HKV * hd))
        tensors[b + "attn_q_norm.weight"] = (norm(rng, hd), T.F32)
        tensors[b + "attn_k_norm.weight"] = (norm(rng, hd), T.F32)
        tensors[b + "post_attention_norm.weight"] = (norm(rng, E), T.F32)
        tensors[b + "ffn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(ffn(rng, b, E, F))
        tensors[b + "post_ffw_norm.weight"] = (norm(rng, E), T.F32)
        tensors[b + "inp_gate.weight"] = linear(rng, PL, E)
        tensors[b + "proj.weight"] = linear(rng, E, PL)
        tensors[b + "post_norm.weight"] = (norm(rng, E), T.F32)
        tensors[b + "altup_correct_coef.weight"] = linear(rng, A, A)
        tensors[b + "altup_correct_scale.weight"] = (norm(rng, E), T.F32)
        tensors[b + "altup_predict_coef.weight"] = linear(rng, A * A, A)
        tensors[b + "altup_router.weight"] = linear(rng, A, E)
        tensors[b + "altup_router_norm.weight"] = (norm(rng, E), T.F32)
        tensors[b + "laurel_l.weight"] = linear(rng, R, E)
        tensors[b + "laurel_r.weight"] = linear(rng, E, R)
        tensors[b + "laurel_post_norm.weight"] = (norm(rng, E), T.F32)
    return write(path, a, kvs, tensors, ollama_order=True)
