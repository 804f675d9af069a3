"""LFM2 blobs as Ollama's first LFM2 converter wrote them (the legacy form of
`handlers/lfm2.py`); ../shared/fixtures/ollama/lfm2.gguf is the current
converter's form of a checkpoint of the same shape.

* `convert/convert_lfm2.go` at 01cf7445f (2026-01-20, "add lfm2 architecture
  and LFM2.5-1.2B-Thinking support", until 4b2ac1f36): `lfm2.*` keys for
  vocabulary size, blocks, widths, context, heads, `key_length`/
  `value_length` = hidden / heads, rms epsilon, rope base and the
  short-convolution cache length; `feed_forward_length` the config's
  `intermediate_size` as it stands, although with `block_auto_adjust_ff_dim`
  the feed-forward tensors are 2/3 of it rounded up to `block_multiple_of`;
  `attention.head_count_kv` one entry per layer from `layer_types`
  (the KV heads for `full_attention`, 0 for convolution layers); the
  embedding norm (`model.embedding_norm`, applied after the last block)
  named `output_norm.weight`; convolution weights squeezed to ggml [L, D].
* `convert/convert.go` and `tokenizer.go` at 01cf7445f: byte-level BPE with
  pre-tokenizer "default" (LFM2's split has no known digest there), scores
  = token ids, the special tokens first (control), BOS `<|startoftext|>`
  added, EOS `<|im_end|>`, padding `<|pad|>`; tied embeddings (no
  `output.weight`).
* Dtypes as Ollama kept the bf16 checkpoint: matrices BF16, norms and the
  convolution F32.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, attention, embeddings, ffn, linear, llm_kvs, norm, normal, write
from .tokenizers import byte_level_kvs, byte_level_vocab

LFM2: Dims = dict(
    n_layer=3,
    attention_layers=[2],
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    context_length=128000,
    rms_eps=1e-5,
    rope_freq_base=1_000_000.0,
    l_cache=3,
    # LFM2's block_ff_dim with auto-adjust: 2/3 of 192 rounded up to a multiple of 64.
    intermediate_size=192,
    n_ff=128,
)

SPECIALS = (
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|fim_pre|>",
    "<|fim_mid|>",
    "<|fim_suf|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
) + tuple(f"<|reserved_{i}|>" for i in range(14, 32))

CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\n'"
    " + message['content'] + '<|im_end|>\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@functools.cache
def lfm2_tokens() -> tuple[list[str], list[int], list[float], list[str]]:
    """(tokens, types, scores, merges): LFM2's 32 special tokens, bytes, merged tokens."""
    return byte_level_vocab(head=SPECIALS)


def legacy_lfm2(path: Path, seed: int = 0) -> Path:
    """LFM2 (Lfm2ForCausalLM, LFM2.5 config layout with `layer_types`): 3
    layers, two short-convolution and the last attention, n_embd 64, heads
    4/2, feed-forward 128 (the KV says 192); ~0.3 MB.  Untranslated llama.cpp
    refuses it (no `token_embd_norm.weight`; the feed-forward length does not
    match `ffn_gate`)."""
    p = LFM2
    rng = np.random.default_rng(seed)
    toks = lfm2_tokens()[0]
    E, H, HKV, F = p["n_embd"], p["n_head"], p["n_head_kv"], p["n_ff"]
    hd = E // H
    a = "lfm2"
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        f"{a}.vocab_size": len(toks),
        # the config's intermediate_size, as it stands
        f"{a}.feed_forward_length": p["intermediate_size"],
        f"{a}.attention.head_count_kv": np.array(
            [HKV if i in p["attention_layers"] else 0 for i in range(p["n_layer"])], np.uint32
        ),
        f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd,
        f"{a}.shortconv.l_cache": p["l_cache"],
        **byte_level_kvs(lfm2_tokens(), "default"),
        "tokenizer.ggml.bos_token_id": toks.index("<|startoftext|>"),
        "tokenizer.ggml.eos_token_id": toks.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": toks.index("<|pad|>"),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    tensors = embeddings(rng, len(toks), E, tied=True)
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, E), T.F32)
        if i in p["attention_layers"]:
            tensors.update(attention(rng, b, E, H * hd, HKV * hd))
            tensors[b + "attn_q_norm.weight"] = (norm(rng, hd), T.F32)
            tensors[b + "attn_k_norm.weight"] = (norm(rng, hd), T.F32)
        else:
            tensors[b + "shortconv.conv.weight"] = (normal(rng, (E, p["l_cache"]), 0.2), T.F32)
            tensors[b + "shortconv.in_proj.weight"] = linear(rng, 3 * E, E)
            tensors[b + "shortconv.out_proj.weight"] = linear(rng, E, E)
        tensors[b + "ffn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(ffn(rng, b, E, F))
    return write(path, a, kvs, tensors, ollama_order=True)
