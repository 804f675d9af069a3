"""OLMo 3 blobs as Ollama's converter wrote them (the legacy form of
`handlers/olmo3.py`), shaped like ../shared/fixtures/ollama/olmo3_legacy.gguf.

* `convert/convert_olmo.go` at f63eea3d2 (2026-05-24, the last commit before
  9db4bdbad wrote `olmo2`): architecture `olmo3`; the config's sizes, head
  counts (KV heads default to the heads), rope base, and from `rope_scaling`
  the factor, original context, type and the YaRN attention factor as
  `rope.scaling.attn_factor`; rms epsilon, sliding window and one bool per
  layer (`sliding_attention`) as `attention.sliding_window_pattern`.
  Tensors under the HF names' ggml forms: whole-width `attn_q_norm`/
  `attn_k_norm`, `post_attention_norm` and `post_ffw_norm` (OLMo norms after
  each sublayer, none before), an untied `output.weight`.
* `convert/convert.go` and `tokenizer.go` at f63eea3d2: byte-level BPE
  (`gpt2`, pre-tokenizer `llama-bpe`), scores = token ids, the added tokens
  after the merged ones (control); `<|endoftext|>` as BOS, EOS and unknown,
  `<|pad|>` as padding, the generation config's EOS list, and
  `add_<type>_token` false for each of the four.
* Dtypes as Ollama kept the bf16 checkpoint: matrices BF16, norms F32.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, attention, embeddings, ffn, llm_kvs, norm, write
from .tokenizers import byte_level_kvs, byte_level_vocab

OLMO3: Dims = dict(
    n_layer=4,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=4,
    context_length=65536,
    rms_eps=1e-6,
    rope_freq_base=500000.0,
    rope_factor=8.0,
    original_context=8192,
    sliding_window=4096,
    sliding=[True, True, True, False],
)

ADDED = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endofprompt|>",
    "<|pad|>",
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@functools.cache
def olmo3_tokens() -> tuple[list[str], list[int], list[float], list[str]]:
    """(tokens, types, scores, merges): bytes, merged tokens, OLMo's added tokens."""
    return byte_level_vocab(tail=tuple((t, 3) for t in ADDED))


def yarn_attn_factor(factor: float) -> float:
    """The YaRN attention factor HF's OLMo 3 config states: 0.1 ln(factor) + 1."""
    return 0.1 * math.log(factor) + 1.0


def legacy_olmo3(path: Path, seed: int = 0) -> Path:
    """OLMo 3 (Olmo3ForCausalLM with YaRN) as `olmo3`: 4 layers, the last
    full attention, n_embd 64, 4/4 heads, n_ff 128, context 65536; ~0.5 MB.
    Untranslated llama.cpp refuses the architecture."""
    p = OLMO3
    rng = np.random.default_rng(seed)
    toks = olmo3_tokens()[0]
    endoftext = toks.index("<|endoftext|>")
    a = "olmo3"
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        f"{a}.attention.sliding_window": p["sliding_window"],
        f"{a}.attention.sliding_window_pattern": list(p["sliding"]),
        f"{a}.rope.scaling.factor": p["rope_factor"],
        f"{a}.rope.scaling.original_context_length": p["original_context"],
        f"{a}.rope.scaling.attn_factor": yarn_attn_factor(p["rope_factor"]),
        f"{a}.rope.scaling.type": "yarn",
        **byte_level_kvs(olmo3_tokens(), "llama-bpe"),
        "tokenizer.ggml.bos_token_id": endoftext,
        "tokenizer.ggml.eos_token_id": endoftext,
        "tokenizer.ggml.unknown_token_id": endoftext,
        "tokenizer.ggml.padding_token_id": toks.index("<|pad|>"),
        "tokenizer.ggml.eos_token_ids": [toks.index("<|im_end|>"), endoftext],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.ggml.add_unknown_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    E, F, H, HKV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"]
    hd = E // H
    tensors = embeddings(rng, len(toks), E, tied=False)
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors.update(attention(rng, b, E, H * hd, HKV * hd))
        tensors[b + "attn_q_norm.weight"] = (norm(rng, H * hd), T.F32)
        tensors[b + "attn_k_norm.weight"] = (norm(rng, HKV * hd), T.F32)
        tensors[b + "post_attention_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(ffn(rng, b, E, F))
        tensors[b + "post_ffw_norm.weight"] = (norm(rng, E), T.F32)
    return write(path, a, kvs, tensors, ollama_order=True)
