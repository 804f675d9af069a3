"""Mistral 3 blobs as Ollama's converter wrote them (the legacy form of
`handlers/mistral3.py`), shaped like ../shared/fixtures/ollama/mistral3.gguf.

* `convert/convert_mistral.go` at f63eea3d2 (2026-05-24; the rope keys as
  d3e0a0dee, 2025-12-01, named them, until 9db4bdbad renamed them to
  llama.cpp's): one `mistral3` blob with text, the Pixtral tower (`v.*`) and
  the projector (`mm.*`); `vocab_size`, the text sizes, `key_length`/
  `value_length` the head size, the rope base and whatever the config's
  `rope_parameters` hold, copied as they are: `rope.scaling.factor`,
  `rope.scaling.type`, `rope.scaling.beta_fast`/`beta_slow` always (so a
  checkpoint without rope scaling, as Mistral Small 3.1, gets "", 0, 0, 0),
  `mscale`, `mscale_all_dim`, `original_context_length` and the Llama 4
  temperature as `rope.scaling_beta` where present; `vision.*` without an
  epsilon; `image_token_index`, `spatial_merge_size`, `mm.projector_bias`,
  `mm.projector_hidden_act`.  Text Q/K permuted for llama.cpp's rope, vision
  Q/K left in HF order; `vision_tower` -> `v`, `ln_pre` -> `encoder_norm`,
  `patch_conv`, `attention_norm`/`ffn_norm`, `multi_modal_projector` ->
  `mm` (`linear_1`, `linear_2`, `norm`, `patch_merger.merging_layer`); no
  `[IMG_BREAK]` embedding of its own.
* `convert/convert.go` and `tokenizer.go` at f63eea3d2: Tekken's byte-level
  BPE as `gpt2` with pre-tokenizer "default", the special tokens first
  (control), scores = token ids; BOS `<s>` added, EOS `</s>`, unknown
  `<unk>`, padding `<pad>`.
* Dtypes as Ollama kept the bf16 checkpoint: text matrices BF16, vision and
  projector matrices F16, norms F32.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, attention, embeddings, ffn, linear, llm_kvs, norm, normal, write
from .tokenizers import byte_level_kvs, byte_level_vocab

MISTRAL3: Dims = dict(
    n_layer=2,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    context_length=131072,
    rms_eps=1e-5,
    rope_freq_base=1_000_000_000.0,
    v_n_layer=3,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    image_size=112,
    patch_size=14,
    merge=2,
    v_rope_freq_base=10000.0,
)

# Ministral 3's YaRN with Llama 4 attention temperature (`rope_scaling=True`).
MINISTRAL3_ROPE: Dims = dict(
    type="yarn",
    factor=16.0,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
    original_context=16384,
    llama_4_scaling_beta=0.1,
)

SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
) + tuple(f"<SPECIAL_{i}>" for i in range(20, 32))

CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}{%- elif message['role'] == 'user' %}"
    "{%- if message['content'] is string %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- else %}"
    "{{- '[INST]' }}{%- for block in message['content'] %}{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{{- '[IMG]' }}{%- endif %}{%- endfor %}{{- '[/INST]' }}"
    "{%- endif %}{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)


@functools.cache
def mistral3_tokens() -> tuple[list[str], list[int], list[float], list[str]]:
    """(tokens, types, scores, merges): Tekken's 32 special tokens, bytes, merged tokens."""
    return byte_level_vocab(head=SPECIALS)


def rope_kvs(rope_scaling: bool) -> dict[str, Any]:
    """The `rope.scaling*` KVs f63eea3d2 wrote from the config's `rope_parameters`."""
    if not rope_scaling:
        return {
            "mistral3.rope.scaling.factor": 0.0,
            "mistral3.rope.scaling.type": "",
            "mistral3.rope.scaling.beta_fast": 0.0,
            "mistral3.rope.scaling.beta_slow": 0.0,
        }
    r = MINISTRAL3_ROPE
    return {
        "mistral3.rope.scaling.factor": r["factor"],
        "mistral3.rope.scaling.type": r["type"],
        "mistral3.rope.scaling.beta_fast": r["beta_fast"],
        "mistral3.rope.scaling.beta_slow": r["beta_slow"],
        "mistral3.rope.scaling.mscale": r["mscale"],
        "mistral3.rope.scaling.mscale_all_dim": r["mscale_all_dim"],
        "mistral3.rope.scaling.original_context_length": r["original_context"],
        "mistral3.rope.scaling_beta": r["llama_4_scaling_beta"],
    }


def legacy_mistral3(path: Path, seed: int = 0, *, rope_scaling: bool = False) -> Path:
    """Mistral Small 3.1 style (Mistral3ForConditionalGeneration), monolithic:
    2 text layers (n_embd 64, heads 4/2, head 16, n_ff 128), a 3-block
    Pixtral tower 64 wide (112-pixel images, 14-pixel patches merged 2x2);
    ~0.7 MB.  Without rope scaling (the default) untranslated llama.cpp
    asserts on the empty scaling type; `rope_scaling` writes Ministral 3's
    YaRN under the older names instead.  The blob is no clip file."""
    p = MISTRAL3
    rng = np.random.default_rng(seed)
    toks = mistral3_tokens()[0]
    E, F, H, HKV, hd = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"], p["head_dim"]
    VE, VF, P, M = p["v_n_embd"], p["v_n_ff"], p["patch_size"], p["merge"]
    a = "mistral3"
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        f"{a}.vocab_size": len(toks),
        f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd,
        f"{a}.rope.dimension_count": hd,
        **rope_kvs(rope_scaling),
        f"{a}.vision.block_count": p["v_n_layer"],
        f"{a}.vision.embedding_length": VE,
        f"{a}.vision.feed_forward_length": VF,
        f"{a}.vision.attention.head_count": p["v_n_head"],
        f"{a}.vision.attention.key_length": VE // p["v_n_head"],
        f"{a}.vision.image_size": p["image_size"],
        f"{a}.vision.patch_size": P,
        f"{a}.vision.num_channels": 3,
        f"{a}.vision.rope.freq_base": p["v_rope_freq_base"],
        f"{a}.image_token_index": toks.index("[IMG]"),
        f"{a}.spatial_merge_size": M,
        f"{a}.mm.projector_bias": False,
        f"{a}.mm.projector_hidden_act": "gelu",
        **byte_level_kvs(mistral3_tokens(), "default"),
        "tokenizer.ggml.bos_token_id": toks.index("<s>"),
        "tokenizer.ggml.eos_token_id": toks.index("</s>"),
        "tokenizer.ggml.unknown_token_id": toks.index("<unk>"),
        "tokenizer.ggml.padding_token_id": toks.index("<pad>"),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    tensors = embeddings(rng, len(toks), E, tied=False)
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(attention(rng, b, E, H * hd, HKV * hd))
        tensors[b + "ffn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(ffn(rng, b, E, F))
    tensors["v.patch_conv.weight"] = (normal(rng, (VE, 3, P, P), 0.02), T.F16)
    tensors["v.encoder_norm.weight"] = (norm(rng, VE), T.F32)
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, VE), T.F32)
        tensors.update(attention(rng, b, VE, VE, VE, T.F16))
        tensors[b + "ffn_norm.weight"] = (norm(rng, VE), T.F32)
        tensors.update(ffn(rng, b, VE, VF, T.F16))
    tensors["mm.norm.weight"] = (norm(rng, VE), T.F32)
    tensors["mm.patch_merger.merging_layer.weight"] = linear(rng, VE, VE * M * M, T.F16)
    tensors["mm.linear_1.weight"] = linear(rng, E, VE, T.F16)
    tensors["mm.linear_2.weight"] = linear(rng, E, E, T.F16)
    return write(path, a, kvs, tensors, ollama_order=True)
