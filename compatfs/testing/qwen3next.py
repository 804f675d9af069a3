"""Qwen3-Next blobs as Ollama's converter wrote them (the legacy forms of
`handlers/qwen3next.py`), from a tiny Qwen3NextForCausalLM checkpoint.

* `legacy_qwen3next`: `convert/convert_qwen3next.go` at 77eb2ca61 (2026-02-03,
  "model: add qwen3-next architecture"): architecture `qwen3next`, pre-tokenizer
  `qwen2`, `attention.head_count_kv` a per-layer UINT32 array (0 on the
  delta-net layers, full attention every `full_attention_interval` layers),
  `norm_top_k_prob`, `ssm.*` sizes; tensors `in_proj_qkvz` split into
  `attn_qkv`/`attn_gate`, `in_proj_ba` kept whole as `ssm_ba`, `dt_bias` named
  `ssm_dt` (no `.bias`), `A_log` as `ssm_a` = -exp(A_log), conv1d squeezed to
  2-D, norms (but `ssm_norm`) stored as 1 + w, the shared-expert gate squeezed
  to 1-D, experts stacked.
* `qwen35moe_qwen3next`: the same converter at fb3076099 (2026-08-21, the
  commit the shared fixtures were written with; since da70c3222 it writes the
  whole family as Qwen3.5): architecture `qwen35moe`, pre-tokenizer `qwen35`,
  `head_count_kv` one number (the largest), no `rope.dimension_sections` (the
  checkpoint has no M-RoPE sections), `dt_bias` named `ssm_dt.bias`, the
  shared-expert gate kept as HF's [1, hidden], Qwen3-Next's tensors otherwise
  (`ssm_ba`; Qwen3.5 has `ssm_alpha`/`ssm_beta`), no V-head reordering
  (`model_type` qwen3_next).

Both: KVs sorted, tensors in WriteGGUF's order (core.write); matrices BF16,
vectors and the conv kernel F32.  The core writer stores integer lists as
INT32 arrays where Ollama wrote UINT32 (`head_count_kv`); llama.cpp reads both.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
from gguf import quants

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode


QWEN3NEXT: Dims = dict(
    n_layer=4,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    partial_rotary=0.25,
    context_length=4096,
    rope_theta=10_000_000.0,
    rms_eps=1e-6,
    full_attention_interval=4,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    n_ff_shexp=32,
    conv_kernel=4,
    k_head_dim=16,
    n_k_heads=2,
    n_v_heads=4,
    v_head_dim=16,
)
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@functools.cache
def small_bpe_tokens(specials: tuple[str, ...], n_merges: int = 200) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary (GPT-2 byte characters, then one token per
    merge learned on the corpus, then `specials` typed control): tokens,
    token types, merges."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(n_merges)
    toks = list(b2u.values())
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
    types = [1] * len(toks) + [3] * len(specials)
    return toks + list(specials), types, [f"{a} {b}" for a, b in merges]


def _tokenizer_kvs(pre: str) -> dict[str, Any]:
    toks, types, merges = small_bpe_tokens(QWEN_SPECIALS)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": toks.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": toks.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def _hparams(arch: str, p: Dims) -> dict[str, Any]:
    a = arch + "."
    kvs = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        a + "block_count": p["n_layer"],
        a + "context_length": p["context_length"],
        a + "embedding_length": p["n_embd"],
        a + "feed_forward_length": p["n_ff"],
        a + "attention.head_count": p["n_head"],
        a + "attention.key_length": p["head_dim"],
        a + "attention.value_length": p["head_dim"],
        a + "attention.layer_norm_rms_epsilon": p["rms_eps"],
        a + "rope.freq_base": p["rope_theta"],
        a + "rope.dimension_count": int(p["head_dim"] * p["partial_rotary"]),
        a + "expert_count": p["n_expert"],
        a + "expert_used_count": p["n_expert_used"],
        a + "norm_top_k_prob": True,
        a + "expert_feed_forward_length": p["n_ff_exp"],
        a + "expert_shared_feed_forward_length": p["n_ff_shexp"],
        a + "ssm.inner_size": p["v_head_dim"] * p["n_v_heads"],
        a + "ssm.state_size": p["k_head_dim"],
        a + "ssm.group_count": p["n_k_heads"],
        a + "ssm.time_step_rank": p["n_v_heads"],
        a + "ssm.conv_kernel": p["conv_kernel"],
        a + "full_attention_interval": p["full_attention_interval"],
    }
    return kvs


def _is_attention(p: Dims, i: int) -> bool:
    return (i + 1) % p["full_attention_interval"] == 0


def bf16_values(a: np.ndarray) -> np.ndarray:
    return quants.dequantize(quants.quantize(a, T.BF16), T.BF16).reshape(a.shape)


def _tensors(rng: np.random.Generator, p: Dims, n_vocab: int, *, dt: str, shexp_gate_2d: bool) -> dict:
    E, hd = p["n_embd"], p["head_dim"]
    key_dim, value_dim = p["k_head_dim"] * p["n_k_heads"], p["v_head_dim"] * p["n_v_heads"]
    X, FX, FS = p["n_expert"], p["n_ff_exp"], p["n_ff_shexp"]

    def norm(n):  # HF RMSNorm weight w stored as 1 + w
        return (1.0 + normal(rng, (n,), 0.05), T.F32)

    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output_norm.weight": norm(E),
        "output.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = norm(E)
        t[b + "post_attention_norm.weight"] = norm(E)
        if _is_attention(p, i):
            t[b + "attn_q.weight"] = (normal(rng, (2 * p["n_head"] * hd, E), 0.05), T.BF16)  # query and gate
            t[b + "attn_k.weight"] = (normal(rng, (p["n_head_kv"] * hd, E), 0.05), T.BF16)
            t[b + "attn_v.weight"] = (normal(rng, (p["n_head_kv"] * hd, E), 0.05), T.BF16)
            t[b + "attn_output.weight"] = (normal(rng, (E, p["n_head"] * hd), 0.05), T.BF16)
            t[b + "attn_q_norm.weight"] = norm(hd)
            t[b + "attn_k_norm.weight"] = norm(hd)
        else:
            t[b + "attn_qkv.weight"] = (normal(rng, (2 * key_dim + value_dim, E), 0.05), T.BF16)
            t[b + "attn_gate.weight"] = (normal(rng, (value_dim, E), 0.05), T.BF16)
            t[b + "ssm_ba.weight"] = (normal(rng, (2 * p["n_v_heads"], E), 0.05), T.BF16)
            t[b + "ssm_conv1d.weight"] = (normal(rng, (2 * key_dim + value_dim, p["conv_kernel"]), 0.2), T.F32)
            t[b + dt] = (normal(rng, (p["n_v_heads"],), 0.5), T.F32)
            t[b + "ssm_a"] = (-np.exp(normal(rng, (p["n_v_heads"],), 0.5)), T.F32)
            t[b + "ssm_norm.weight"] = (1.0 + normal(rng, (p["v_head_dim"],), 0.05), T.F32)
            t[b + "ssm_out.weight"] = (normal(rng, (E, value_dim), 0.05), T.BF16)
        t[b + "ffn_gate_inp.weight"] = (normal(rng, (X, E), 0.1), T.F32)
        t[b + "ffn_gate_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        t[b + "ffn_up_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        t[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, FX), 0.05), T.BF16)
        # HF's [1, hidden] BF16 gate; the older converter squeezed it to one
        # F32 row (the same BF16 values).
        gate = normal(rng, (1, E), 0.05)
        t[b + "ffn_gate_inp_shexp.weight"] = (gate, T.BF16) if shexp_gate_2d else (bf16_values(gate[0]), T.F32)
        t[b + "ffn_gate_shexp.weight"] = (normal(rng, (FS, E), 0.05), T.BF16)
        t[b + "ffn_up_shexp.weight"] = (normal(rng, (FS, E), 0.05), T.BF16)
        t[b + "ffn_down_shexp.weight"] = (normal(rng, (E, FS), 0.05), T.BF16)
    return t


def legacy_qwen3next(path: Path, seed: int = 0) -> Path:
    """Qwen3-Next as `qwen3next` (77eb2ca61): 4 layers (the 4th full attention,
    heads 4/2, head 16, a quarter rotary), n_embd 64, 4 experts (2 used) of 32
    plus a shared one, delta-net with 2 key and 4 value heads of 16, a
    ~440-token byte-level BPE vocabulary.  Untranslated llama.cpp fails:
    tensor `blk.0.ssm_dt.bias` not found."""
    p = QWEN3NEXT
    rng = np.random.default_rng(seed)
    tok = _tokenizer_kvs("qwen2")
    kvs = {**_hparams("qwen3next", p), **tok}
    kvs["qwen3next.attention.head_count_kv"] = [
        p["n_head_kv"] if _is_attention(p, i) else 0 for i in range(p["n_layer"])
    ]
    tensors = _tensors(rng, p, len(tok["tokenizer.ggml.tokens"]), dt="ssm_dt", shexp_gate_2d=False)
    return write(path, "qwen3next", kvs, tensors, ollama_order=True)


def qwen35moe_qwen3next(path: Path, seed: int = 0) -> Path:
    """The same checkpoint as the current converter writes it (`qwen35moe`,
    fb3076099).  Untranslated llama.cpp fails: key not found
    `qwen35moe.rope.dimension_sections`."""
    p = QWEN3NEXT
    rng = np.random.default_rng(seed)
    tok = _tokenizer_kvs("qwen35")
    kvs = {**_hparams("qwen35moe", p), **tok, "qwen35moe.attention.head_count_kv": p["n_head_kv"]}
    tensors = _tensors(rng, p, len(tok["tokenizer.ggml.tokens"]), dt="ssm_dt.bias", shexp_gate_2d=True)
    return write(path, "qwen35moe", kvs, tensors, ollama_order=True)
