"""Qwen2.5-VL blobs as Ollama's converter wrote them (the legacy form of
`handlers/qwen25vl.py`), shaped like ../shared/fixtures/ollama/qwen2_5_vl.gguf.

* `convert/convert_qwen25vl.go` at f63eea3d2 (2026-05-24; unchanged in what
  it writes since 0aa8b371d, May 2025, until 33878e671 made an empty
  `fullatt_block_indexes` the published [7, 15, 23, 31]): one `qwen25vl`
  blob; the Qwen2 text keys under `qwen25vl.` with the three M-RoPE
  sections as `rope.mrope_section`; `vision.*` for blocks, width, heads,
  channels, patch size, spatial merge and patch size, window size,
  epsilon, rope base, the config's `fullatt_block_indexes` as they stand
  (an empty list stays empty) and the temporal patch size; the Conv3D
  patch embedding split into its two frames `v.patch_embd_0`/`_1` (ggml
  [patch, patch, channels, width]); the vision QKV split into `attn_q`/
  `attn_k`/`attn_v`; `visual` -> `v`, `blocks` -> `blk`, `attn.proj` ->
  `attn_out`, `norm1`/`norm2` -> `ln1`/`ln2`, the merger under
  `v.merger.ln_q` and `v.merger.mlp.{0,2}`.
* `convert/convert_qwen2.go`, `convert.go` and `tokenizer.go` at f63eea3d2:
  Q/K/V biases, tied embeddings; byte-level BPE (`gpt2`, pre-tokenizer
  `qwen2`), scores = token ids, the added tokens after the merged ones
  (special ones control, the tool and FIM markers user-defined), the
  vocabulary padded to the embedding rows with `[PAD<i>]`; EOS `<|im_end|>`
  with the generation config's list, padding `<|endoftext|>`; no BOS key.
* Dtypes as Ollama kept the bf16 checkpoint: text matrices BF16, vision
  matrices F16, norms and biases F32.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from .core import Dims, T, attention, embeddings, ffn, linear, llm_kvs, norm, normal, write
from .tokenizers import byte_level_kvs, byte_level_vocab

QWEN25VL: Dims = dict(
    n_layer=2,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    context_length=128000,
    rms_eps=1e-6,
    rope_freq_base=1_000_000.0,
    mrope_section=[2, 3, 3],
    n_vocab=512,
    v_n_layer=4,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    patch_size=14,
    merge=2,
    window_size=112,
    fullatt_blocks=[1, 3],
)

ADDED = tuple(
    (t, 3)
    for t in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )
) + tuple(
    (t, 4)
    for t in (
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    )
)

# Qwen2.5-VL's chat template without its video and vision-id branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def qwen25vl_tokens() -> tuple[list[str], list[int], list[float], list[str]]:
    """(tokens, types, scores, merges): bytes, merged tokens, Qwen2.5's added
    tokens, `[PAD<i>]` up to the embedding rows."""
    return byte_level_vocab(tail=ADDED, size=QWEN25VL["n_vocab"])


def legacy_qwen25vl(path: Path, seed: int = 0, *, fullatt_blocks: Sequence[int] | None = None) -> Path:
    """Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration), monolithic: 2 text
    layers (n_embd 64, heads 4/2, n_ff 128), a 4-block vision tower 64 wide
    with full attention in blocks 1 and 3 (`fullatt_blocks`, as the config
    lists them; `()` writes the empty list older checkpoints gave), 14-pixel
    patches merged 2x2 into the text width; ~0.9 MB.  Untranslated llama.cpp
    refuses the architecture, and the blob is no clip file."""
    p = QWEN25VL
    rng = np.random.default_rng(seed)
    toks = qwen25vl_tokens()[0]
    endoftext = toks.index("<|endoftext|>")
    im_end = toks.index("<|im_end|>")
    E, F, H, HKV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"]
    VE, VF, P, M = p["v_n_embd"], p["v_n_ff"], p["patch_size"], p["merge"]
    hd = E // H
    a = "qwen25vl"
    blocks = p["fullatt_blocks"] if fullatt_blocks is None else list(fullatt_blocks)
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        f"{a}.rope.mrope_section": list(p["mrope_section"]),
        f"{a}.vision.block_count": p["v_n_layer"],
        f"{a}.vision.embedding_length": VE,
        f"{a}.vision.attention.head_count": p["v_n_head"],
        f"{a}.vision.num_channels": 3,
        f"{a}.vision.patch_size": P,
        f"{a}.vision.spatial_merge_size": M,
        f"{a}.vision.spatial_patch_size": P,
        f"{a}.vision.window_size": p["window_size"],
        f"{a}.vision.attention.layer_norm_epsilon": 1e-6,
        f"{a}.vision.rope.freq_base": 10000.0,
        f"{a}.vision.fullatt_block_indexes": np.array(blocks, np.int32),
        f"{a}.vision.temporal_patch_size": 2,
        **byte_level_kvs(qwen25vl_tokens(), "qwen2"),
        "tokenizer.ggml.eos_token_id": im_end,
        "tokenizer.ggml.eos_token_ids": [im_end, endoftext],
        "tokenizer.ggml.padding_token_id": endoftext,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    tensors = embeddings(rng, len(toks), E, tied=True)
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(attention(rng, b, E, H * hd, HKV * hd))
        for x, rows in (("q", H * hd), ("k", HKV * hd), ("v", HKV * hd)):
            tensors[b + f"attn_{x}.bias"] = (normal(rng, (rows,), 0.02), T.F32)
        tensors[b + "ffn_norm.weight"] = (norm(rng, E), T.F32)
        tensors.update(ffn(rng, b, E, F))
    for frame in range(2):
        tensors[f"v.patch_embd_{frame}.weight"] = (normal(rng, (VE, 3, P, P), 0.02), T.F16)
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        tensors.update(attention(rng, b, VE, VE, VE, T.F16, names=("attn_q", "attn_k", "attn_v", "attn_out")))
        tensors.update(ffn(rng, b, VE, VF, T.F16))
        for x, rows in (
            ("attn_q", VE),
            ("attn_k", VE),
            ("attn_v", VE),
            ("attn_out", VE),
            ("ffn_gate", VF),
            ("ffn_up", VF),
            ("ffn_down", VE),
        ):
            tensors[b + f"{x}.bias"] = (normal(rng, (rows,), 0.02), T.F32)
        tensors[b + "ln1.weight"] = (norm(rng, VE), T.F32)
        tensors[b + "ln2.weight"] = (norm(rng, VE), T.F32)
    merged = VE * M * M
    tensors["v.merger.ln_q.weight"] = (norm(rng, VE), T.F32)
    tensors["v.merger.mlp.0.weight"] = linear(rng, merged, merged, T.F16)
    tensors["v.merger.mlp.0.bias"] = (normal(rng, (merged,), 0.02), T.F32)
    tensors["v.merger.mlp.2.weight"] = linear(rng, E, merged, T.F16)
    tensors["v.merger.mlp.2.bias"] = (normal(rng, (E,), 0.02), T.F32)
    return write(path, a, kvs, tensors, ollama_order=True)
