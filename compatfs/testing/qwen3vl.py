"""Qwen3-VL MoE blobs as Ollama's converter wrote them (the legacy form of
`handlers/qwen3vl.py` for `qwen3vlmoe`; the dense form has a genuine fixture
in ../shared/fixtures/ollama/qwen3_vl_legacy.gguf, which these follow).

* `convert/convert_qwen3vl.go` at f63eea3d2 (2026-05-24, the last commit before
  the converters were rewritten for llama-server in 9db4bdbad): the text
  config's KVs under `qwen3vlmoe` (`qwen3vl` + "moe" when `num_experts` > 0),
  then `vision.*` (block count, width, heads, channels, patch and merge size,
  epsilon, rope base, temporal patch size, `deepstack_visual_indexes`, the
  preprocessor's edges, mean and std); the vision QKV split into
  `attn_q`/`attn_k`/`attn_v`; the Conv3D patch embedding written with its two
  channel axes flattened, ggml [w, h, frames, out*in]; `model.visual` -> `v`,
  `blocks` -> `blk`, `attn.proj` -> `attn_out`, `deepstack_merger_list` ->
  `deepstack_merger` (numbered by position in the list).
* `convert/convert_qwen3.go` at f63eea3: no M-RoPE sections (Qwen3-VL's
  `rope_scaling` has no `type`), `norm_top_k_prob`; the fused expert
  `gate_up_proj` split into `ffn_gate_exps`/`ffn_up_exps` and transposed, ggml
  [n_embd, n_ff, n_expert], `down_proj` transposed to [n_ff, n_embd, n_expert];
  `post_attention_layernorm` -> `ffn_norm`.
* `convert/tokenizer.go` and `convert.go` at f63eea3: byte-level BPE
  (`gpt2`, pre-tokenizer `qwen2`), scores = token ids, special added tokens
  control and the others user-defined, the vocabulary padded to the embedding
  rows with `[PAD<i>]` (user-defined), EOS and the generation config's EOS
  list, padding id, `add_eos_token`/`add_padding_token` false.
* Dtypes as Ollama kept the bf16 checkpoint: text matrices BF16, vision
  matrices F16, norms and biases F32.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode


QWEN3VL_MOE: Dims = dict(
    n_layer=3,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    context_length=262144,
    rope_freq_base=5_000_000.0,
    rms_eps=1e-6,
    v_n_layer=3,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    patch_size=16,
    merge=2,
    n_pos=64,
    deepstack=[1, 2],  # llama.cpp adds deepstack outputs after text blocks 0..n-1: fewer than the text blocks
)

# Qwen's added tokens after the merged vocabulary, in order; True = special (control).
QWEN_ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_VOCAB = 512  # the embedding rows the vocabulary is padded to

# Qwen-VL's ChatML template, reduced to what a chat with images needs.
QWEN_VL_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- else %}"
    "{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{ content['text'] }}{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@functools.cache
def qwen_tokens() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the 256 byte characters, one token per
    learnt merge, Qwen's added tokens, `[PAD<i>]` up to `QWEN_VOCAB`."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(400)
    toks = list(b2u.values())
    seen = set(toks)
    kept = []
    for a, b in merges:
        if a + b not in seen and len(toks) < QWEN_VOCAB - len(QWEN_ADDED) - 6:
            seen.add(a + b)
            toks.append(a + b)
            kept.append(f"{a} {b}")
    types = [1] * len(toks)
    for text, special in QWEN_ADDED:
        toks.append(text)
        types.append(3 if special else 4)
    pads = QWEN_VOCAB - len(toks)
    toks += [f"[PAD{i}]" for i in range(pads)]
    types += [4] * pads
    return toks, types, kept


def qwen_tokenizer_kvs(pre: str) -> dict[str, Any]:
    toks, types, merges = qwen_tokens()
    endoftext, im_end = toks.index("<|endoftext|>"), toks.index("<|im_end|>")
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": [float(i) for i in range(len(toks))],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": im_end,
        "tokenizer.ggml.eos_token_ids": [im_end, endoftext],
        "tokenizer.ggml.padding_token_id": endoftext,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.chat_template": QWEN_VL_TEMPLATE,
    }


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + normal(rng, (n,), 0.05)).astype(np.float32)


def vision_kvs(prefix: str, p: Dims, deepstack: list[int]) -> dict[str, Any]:
    """The `vision.*` KVs both Qwen3-VL and Qwen3.5 converters write."""
    return {
        f"{prefix}.vision.block_count": p["v_n_layer"],
        f"{prefix}.vision.embedding_length": p["v_n_embd"],
        f"{prefix}.vision.attention.head_count": p["v_n_head"],
        f"{prefix}.vision.num_channels": 3,
        f"{prefix}.vision.patch_size": p["patch_size"],
        f"{prefix}.vision.spatial_merge_size": p["merge"],
        f"{prefix}.vision.attention.layer_norm_epsilon": 1e-6,
        f"{prefix}.vision.rope.freq_base": 10000.0,
        f"{prefix}.vision.temporal_patch_size": 2,
        f"{prefix}.vision.deepstack_visual_indexes": deepstack,
        f"{prefix}.vision.shortest_edge": 65536,
        f"{prefix}.vision.longest_edge": 16777216,
        f"{prefix}.vision.image_mean": [0.5, 0.5, 0.5],
        f"{prefix}.vision.image_std": [0.5, 0.5, 0.5],
    }


def vision_tensors(
    rng: np.random.Generator, p: Dims, out_embd: int, deepstack: list[int]
) -> dict[str, tuple[np.ndarray, T]]:
    """Qwen3-VL's vision tower as the converter wrote it (numpy, HF order)."""
    VE, VF, P, M = p["v_n_embd"], p["v_n_ff"], p["patch_size"], p["merge"]
    merged = VE * M * M
    t: dict[str, tuple[np.ndarray, T]] = {
        # Conv3D [out, in, frames, h, w] with out and in flattened.
        "v.patch_embed.weight": (normal(rng, (VE * 3, 2, P, P), 0.02), T.F16),
        "v.patch_embed.bias": (normal(rng, (VE,), 0.02), T.F32),
        "v.pos_embed.weight": (normal(rng, (p["n_pos"], VE), 0.02), T.F16),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for x in "qkv":
            t[b + f"attn_{x}.weight"] = (normal(rng, (VE, VE), 0.02), T.F16)
            t[b + f"attn_{x}.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "attn_out.weight"] = (normal(rng, (VE, VE), 0.02), T.F16)
        t[b + "attn_out.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "mlp.linear_fc1.weight"] = (normal(rng, (VF, VE), 0.02), T.F16)
        t[b + "mlp.linear_fc1.bias"] = (normal(rng, (VF,), 0.02), T.F32)
        t[b + "mlp.linear_fc2.weight"] = (normal(rng, (VE, VF), 0.02), T.F16)
        t[b + "mlp.linear_fc2.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        for n in ("norm1", "norm2"):
            t[b + f"{n}.weight"] = (_norm(rng, VE), T.F32)
            t[b + f"{n}.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    # The merger normalises before the spatial merge, the deepstack mergers after it.
    for name, width in [("v.merger", VE)] + [(f"v.deepstack_merger.{j}", merged) for j in range(len(deepstack))]:
        t[f"{name}.norm.weight"] = (_norm(rng, width), T.F32)
        t[f"{name}.norm.bias"] = (normal(rng, (width,), 0.02), T.F32)
        t[f"{name}.linear_fc1.weight"] = (normal(rng, (merged, merged), 0.02), T.F16)
        t[f"{name}.linear_fc1.bias"] = (normal(rng, (merged,), 0.02), T.F32)
        t[f"{name}.linear_fc2.weight"] = (normal(rng, (out_embd, merged), 0.02), T.F16)
        t[f"{name}.linear_fc2.bias"] = (normal(rng, (out_embd,), 0.02), T.F32)
    return t


def attention_tensors(
    rng: np.random.Generator, b: str, E: int, q_rows: int, kv_rows: int, hd: int, out_cols: int
) -> dict[str, tuple[np.ndarray, T]]:
    """One Qwen3-style attention: Q, K, V, output, per-head Q/K norms, input norm."""
    return {
        b + "attn_norm.weight": (_norm(rng, E), T.F32),
        b + "attn_q.weight": (normal(rng, (q_rows, E), 0.05), T.BF16),
        b + "attn_k.weight": (normal(rng, (kv_rows, E), 0.05), T.BF16),
        b + "attn_v.weight": (normal(rng, (kv_rows, E), 0.05), T.BF16),
        b + "attn_output.weight": (normal(rng, (E, out_cols), 0.05), T.BF16),
        b + "attn_q_norm.weight": (_norm(rng, hd), T.F32),
        b + "attn_k_norm.weight": (_norm(rng, hd), T.F32),
    }


def legacy_qwen3vl_moe(path: Path, seed: int = 0) -> Path:
    """Qwen3-VL-MoE (Qwen3-VL-30B-A3B layout, tiny): `qwen3vlmoe` text with
    routed experts, the vision tower with two deepstack mergers; ~1.2 MB."""
    p = QWEN3VL_MOE
    rng = np.random.default_rng(seed)
    E, H, HKV, hd, X, FX = p["n_embd"], p["n_head"], p["n_head_kv"], p["head_dim"], p["n_expert"], p["n_ff_exp"]
    a = "qwen3vlmoe"
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        f"{a}.block_count": p["n_layer"],
        f"{a}.context_length": p["context_length"],
        f"{a}.embedding_length": E,
        f"{a}.feed_forward_length": p["n_ff"],
        f"{a}.attention.head_count": H,
        f"{a}.attention.head_count_kv": HKV,
        f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd,
        f"{a}.expert_count": X,
        f"{a}.expert_used_count": p["n_expert_used"],
        f"{a}.norm_top_k_prob": True,
        f"{a}.rope.freq_base": p["rope_freq_base"],
        f"{a}.attention.layer_norm_rms_epsilon": p["rms_eps"],
        **vision_kvs(a, p, p["deepstack"]),
        **qwen_tokenizer_kvs("qwen2"),
    }
    n_vocab = len(kvs["tokenizer.ggml.tokens"])
    tensors: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output_norm.weight": (_norm(rng, E), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors.update(attention_tensors(rng, b, E, H * hd, HKV * hd, hd, H * hd))
        tensors[b + "ffn_norm.weight"] = (_norm(rng, E), T.F32)
        tensors[b + "ffn_gate_inp.weight"] = (normal(rng, (X, E), 0.05), T.BF16)
        tensors[b + "ffn_gate_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        tensors[b + "ffn_up_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        tensors[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, FX), 0.05), T.BF16)
    tensors.update(vision_tensors(rng, p, E, p["deepstack"]))
    return write(path, a, kvs, tensors, ollama_order=True)
