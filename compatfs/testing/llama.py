"""Llama blobs: Llama 3 instruct as older Ollama blobs looked (the legacy form
of `handlers/llama.py`), and a plain SentencePiece llama that no handler claims.

* `convert/llama.go` at c8cf0d94e (April 2024, "llama3 conversion"): gpt2 tokenizer,
  no `tokenizer.ggml.pre`, eos = `<|end_of_text|>` (128001), no eot key, merges
  and no scores.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode, llama_spm_tokens


LLAMA3: Dims = dict(
    n_layer=2,
    n_embd=16,
    n_ff=32,
    n_head=2,
    n_head_kv=1,
    context_length=8192,
    rope_freq_base=500000.0,
    rms_eps=1e-5,
    n_vocab=128256,
    n_base=128000,
)
LLAMA3_BOS_ID = 128000
LLAMA3_EOS_ID = 128001  # <|end_of_text|>: what the legacy file calls eos
LLAMA3_START_HEADER_ID = 128006
LLAMA3_END_HEADER_ID = 128007
LLAMA3_EOT_ID = 128009
LLAMA3_N_VOCAB = 128256


PLAIN_LLAMA: Dims = dict(
    n_layer=2,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=4,
    context_length=4096,
    rope_freq_base=10000.0,
    rms_eps=1e-5,
    bos=1,
    eos=2,
    unk=0,
)

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

_LLAMA3_SPECIAL_NAMES = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "<|eot_id|>",
}


@functools.cache
def llama3_tokens() -> tuple[list[str], list[int], list[str]]:
    """Llama 3 byte-level BPE vocab (tokens, token_type, merges), 128256 entries:
    the 256 GPT-2 byte characters first, then one token per learned merge, filler
    ``<|filler_N|>`` (NORMAL, never produced by the merges) up to 128000, then the
    specials 128000..128255 (CONTROL), the unnamed ones ``<|reserved_special_token_K|>``."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(400)
    toks = list(b2u.values())
    seen = set(toks)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            toks.append(a + b)
    n_base = LLAMA3["n_base"]
    toks += [f"<|filler_{i}|>" for i in range(n_base - len(toks))]
    types = [1] * n_base
    reserved = 0
    for i in range(256):
        name = _LLAMA3_SPECIAL_NAMES.get(i)
        if name is None:
            name = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        toks.append(name)
        types.append(3)
    assert len(toks) == LLAMA3_N_VOCAB
    return toks, types, [f"{a} {b}" for a, b in merges]


def llama3_ordinary_token_id(text: str = "\u0120the") -> int:
    """Id of an ordinary (merged) token in the llama3 vocab, default 'Ġthe' (" the")."""
    return llama3_tokens()[0].index(text)


def legacy_llama3_instruct(path: Path, seed: int = 0, *, greedy_token_id: int = LLAMA3_EOT_ID) -> Path:
    """Llama 3 instruct as older Ollama blobs looked (convert/llama.go, April 2024).

    n_embd 16, 2 layers, heads 2/1 (head_dim 8), n_ff 32, context 8192, rope base 5e5;
    F16 matrices incl. a separate output.weight, F32 norms; ~8.3 MB.
    Tokenizer: gpt2, 128256 tokens (see :func:`llama3_tokens`), merges, no scores,
    bos 128000, **eos 128001**, **no tokenizer.ggml.pre**, no eot/eos_token_ids keys,
    a Llama 3 chat template (<|start_header_id|> ... <|eot_id|>).
    The weights make the greedy next token always ``greedy_token_id`` (default
    <|eot_id|> 128009; e.g. ``llama3_ordinary_token_id()`` for an ordinary token): every
    embedding has 1.0 in the last dimension d, attn_output/ffn_down have a zero row d so
    it survives the residual stream, and output.weight column d is 0 except +8 for the
    target row.
    """
    p = LLAMA3
    if not 0 <= greedy_token_id < LLAMA3_N_VOCAB:
        raise ValueError(greedy_token_id)
    rng = np.random.default_rng(seed)
    toks, types, merges = llama3_tokens()
    E, F, H, HKV, NV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"], p["n_vocab"]
    hd = E // H
    d = E - 1
    kvs: dict[str, Any] = {
        "general.name": "Meta-Llama-3-8B-Instruct",
        "general.file_type": 1,
        "llama.vocab_size": NV,
        "llama.context_length": p["context_length"],
        "llama.embedding_length": E,
        "llama.block_count": p["n_layer"],
        "llama.feed_forward_length": F,
        "llama.rope.freq_base": p["rope_freq_base"],
        "llama.rope.dimension_count": hd,
        "llama.attention.head_count": H,
        "llama.attention.head_count_kv": HKV,
        "llama.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": LLAMA3_BOS_ID,
        "tokenizer.ggml.eos_token_id": LLAMA3_EOS_ID,
        "tokenizer.chat_template": LLAMA3_CHAT_TEMPLATE,
    }
    emb = normal(rng, (NV, E), 0.02)
    emb[:, d] = 1.0
    out = normal(rng, (NV, E), 0.02)
    out[:, d] = 0.0
    out[greedy_token_id, d] = 8.0
    tensors: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (emb, T.F16),
        "output_norm.weight": (np.ones(E, np.float32), T.F32),
        "output.weight": (out, T.F16),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        wo = normal(rng, (E, H * hd), 0.02)
        wo[d] = 0.0
        down = normal(rng, (E, F), 0.02)
        down[d] = 0.0
        tensors[b + "attn_norm.weight"] = (np.ones(E, np.float32), T.F32)
        tensors[b + "attn_q.weight"] = (normal(rng, (H * hd, E), 0.02), T.F16)
        tensors[b + "attn_k.weight"] = (normal(rng, (HKV * hd, E), 0.02), T.F16)
        tensors[b + "attn_v.weight"] = (normal(rng, (HKV * hd, E), 0.02), T.F16)
        tensors[b + "attn_output.weight"] = (wo, T.F16)
        tensors[b + "ffn_norm.weight"] = (np.ones(E, np.float32), T.F32)
        tensors[b + "ffn_gate.weight"] = (normal(rng, (F, E), 0.02), T.F16)
        tensors[b + "ffn_up.weight"] = (normal(rng, (F, E), 0.02), T.F16)
        tensors[b + "ffn_down.weight"] = (down, T.F16)
    return write(path, "llama", kvs, tensors, ollama_order=True)


def plain_llama_text(path: Path, seed: int = 0) -> Path:
    """Tiny llama-architecture text model with a SentencePiece (``llama``) tokenizer that
    llama.cpp loads as is and no compat handler claims (no token 128009, no Llama 3
    template): n_embd 64 (= legacy_llava_projector's output), 2 layers, 4 heads, n_ff 128,
    context 4096, <unk>=0 <s>=1 </s>=2, bytes at 3..258, F16 matrices, F32 norms."""
    p = PLAIN_LLAMA
    rng = np.random.default_rng(seed)
    toks, scores, types = llama_spm_tokens()
    E, F, H, HKV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"]
    hd = E // H
    NV = len(toks)
    kvs: dict[str, Any] = {
        "general.name": "llava-tiny",
        "general.file_type": 1,
        "llama.context_length": p["context_length"],
        "llama.embedding_length": E,
        "llama.block_count": p["n_layer"],
        "llama.feed_forward_length": F,
        "llama.rope.dimension_count": hd,
        "llama.rope.freq_base": p["rope_freq_base"],
        "llama.attention.head_count": H,
        "llama.attention.head_count_kv": HKV,
        "llama.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": list(toks),
        "tokenizer.ggml.scores": list(scores),
        "tokenizer.ggml.token_type": list(types),
        "tokenizer.ggml.bos_token_id": p["bos"],
        "tokenizer.ggml.eos_token_id": p["eos"],
        "tokenizer.ggml.unknown_token_id": p["unk"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (NV, E), 0.05), T.F16),
        "output_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
        "output.weight": (normal(rng, (NV, E), 0.05), T.F16),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        t[b + "attn_q.weight"] = (normal(rng, (H * hd, E), 0.05), T.F16)
        t[b + "attn_k.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.F16)
        t[b + "attn_v.weight"] = (normal(rng, (HKV * hd, E), 0.05), T.F16)
        t[b + "attn_output.weight"] = (normal(rng, (E, H * hd), 0.05), T.F16)
        t[b + "ffn_norm.weight"] = (1.0 + normal(rng, (E,), 0.05), T.F32)
        t[b + "ffn_gate.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_up.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_down.weight"] = (normal(rng, (E, F), 0.05), T.F16)
    return write(path, "llama", kvs, t, ollama_order=True)
