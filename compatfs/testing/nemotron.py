"""Nemotron-H blobs as Ollama's converters wrote them (the legacy forms of `handlers/nemotron.py`).

* `convert/convert_nemotron_h.go` at 0ade9205c (2026-02-22, "models: add nemotronh
  architecture support"; the text converter is unchanged through f63eea3 and 9db4bdbad):
  `nemotron_h_moe` when the config has experts; per-layer `attention.head_count_kv` and
  `feed_forward_length` from `hybrid_override_pattern` (M: Mamba-2, *: attention,
  E: MoE); experts stacked into `ffn_{up,down}_exps`; `ssm_a` = -exp(A_log) and `ssm_d`
  as columns, `ssm_norm` as [groups, inner/groups], `ssm_conv1d` squeezed.  The
  latent-FFN variants (Nemotron 3 Super) keep HF's `fc1_latent_proj`/`fc2_latent_proj`
  as `ffn_latent_in`/`ffn_latent_out` and write no `moe_latent_size`; a checkpoint's MTP
  head (`mtp.layers.*`) is written under its HF names with only the converter's
  substring replacements applied (`attn_q`, `attn_norm`, `ffn_gate_inp`, ...; the
  per-expert `mixer.experts.N.{up,down}_proj` stay unmerged, the merges only match `blk.N`).
* `convert/convert_nemotron_h.go` at 87288ced4 (2026-04-28, "New models"),
  `nemotronHNanoVLModel`: one `nemotron_h_omni` blob with the text model, the RADIO
  vision tower (`v.*`: `attn_qkv` split into Q/K/V, `v.cls_embd`, `v.position_embd` without
  `.weight` and with the leading 1 dropped from [1, positions, width], the linear
  patch embedder [width, 3*patch*patch]), the MLP projector (`mm.norm`, `mm.1`, `mm.2`)
  and the Parakeet audio encoder (`a.*`, `mm.a.*`), vision and audio keys under
  `nemotron_h_omni.vision.*`/`.audio.*`.  The converter hard-codes RADIO ViT-H's
  32 blocks and 16 heads; the tiny tower writes its own counts in their place.

Tensor dtypes follow `convert/reader.go` Kind() for a BF16 checkpoint: 1-D tensors,
biases, `ffn_gate_inp`, `ssm_conv1d`, `v.position_embd.weight` and `a.subsampling.*`
F32, every other tensor BF16.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_level_merges, bytes_to_unicode


NEMOTRON_H: Dims = dict(
    pattern="ME*E",
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    context_length=8192,
    ssm_heads=8,
    ssm_head_dim=16,
    ssm_state=16,
    ssm_groups=2,
    conv_kernel=4,
    n_expert=4,
    n_expert_used=2,
    moe_ff=32,
    shexp_ff=64,
    latent=32,
    eps=1e-5,
    rope_theta=10000.0,
    routed_scaling=2.5,
)


RADIO: Dims = dict(
    v_n_layer=2,
    v_n_embd=64,
    v_n_head=4,
    patch_size=16,
    image_size=64,
    registers=2,
    source_side=8,
    scale_factor=2,
    proj_hidden=128,
    max_tiles=12,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)
PARAKEET = dict(a_n_layer=1, a_n_embd=32, a_n_head=4, mel_bins=128)

SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<image>", "<img>", "</img>", "<so_embedding>")
BOS, EOS, UNK, PAD = 1, 4, 0, 2
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


@functools.cache
def byte_bpe_tokens(specials: tuple[str, ...]) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of a few hundred tokens (tokens, types, merges):
    `specials` (control) first, then the 256 byte characters, then one token per
    learned merge."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(150)
    toks = list(specials) + [b2u[b] for b in range(256)]
    types = [3] * len(specials) + [1] * 256
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
            types.append(1)
    return toks, types, [f"{a} {b}" for a, b in merges]


def nemotron_tokens() -> tuple[list[str], list[int], list[str]]:
    return byte_bpe_tokens(SPECIALS)


def _tokenizer_kvs() -> dict[str, Any]:
    toks, types, merges = nemotron_tokens()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [0.0] * len(toks),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": EOS,
        "tokenizer.ggml.eos_token_ids": [2, EOS],
        "tokenizer.ggml.unknown_token_id": UNK,
        "tokenizer.ggml.padding_token_id": PAD,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
        "general.file_type": 1,
        "general.quantization_version": 2,
    }


def _text_kvs(arch: str, p: Dims, latent: bool) -> dict[str, Any]:
    pattern = p["pattern"]
    kv = {
        "block_count": len(pattern),
        "context_length": p["context_length"],
        "embedding_length": p["n_embd"],
        "attention.head_count": p["n_head"],
        "attention.key_length": p["head_dim"],
        "attention.value_length": p["head_dim"],
        "attention.layer_norm_epsilon": p["eps"],
        "attention.layer_norm_rms_epsilon": p["eps"],
        "rope.freq_base": p["rope_theta"],
        "rope.dimension_count": p["head_dim"],
        "attention.head_count_kv": [p["n_head_kv"] if c == "*" else 0 for c in pattern],
        "feed_forward_length": [p["moe_ff"] if c == "E" else 0 for c in pattern],
        "ssm.conv_kernel": p["conv_kernel"],
        "ssm.inner_size": p["ssm_heads"] * p["ssm_head_dim"],
        "ssm.state_size": p["ssm_state"],
        "ssm.group_count": p["ssm_groups"],
        "ssm.time_step_rank": p["ssm_heads"],
        "expert_count": p["n_expert"],
        "expert_used_count": p["n_expert_used"],
        "expert_feed_forward_length": p["moe_ff"],
        "expert_shared_count": 1,
        "expert_shared_feed_forward_length": p["shexp_ff"],
        "expert_weights_norm": True,
        "expert_weights_scale": p["routed_scaling"],
        "expert_group_count": 1,
        "expert_group_used_count": 1,
    }
    return {f"{arch}.{k}": v for k, v in kv.items()}


def _moe_tensors(rng, pre: str, p: Dims, latent: bool, merged: bool = True) -> dict[str, tuple[np.ndarray, T]]:
    E, X, F, S = p["n_embd"], p["n_expert"], p["moe_ff"], p["shexp_ff"]
    inner = p["latent"] if latent else E
    t = {
        pre + "attn_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
        pre + "exp_probs_b.bias": (normal(rng, (X,), 0.02), T.F32),
        pre + "ffn_gate_inp.weight": (normal(rng, (X, E), 0.1), T.F32),
        pre + "ffn_up_shexp.weight": (normal(rng, (S, E), 0.1), T.BF16),
        pre + "ffn_down_shexp.weight": (normal(rng, (E, S), 0.1), T.BF16),
    }
    if merged:
        t[pre + "ffn_up_exps.weight"] = (normal(rng, (X, F, inner), 0.1), T.BF16)
        t[pre + "ffn_down_exps.weight"] = (normal(rng, (X, inner, F), 0.1), T.BF16)
    else:
        for x in range(X):
            t[pre + f"mixer.experts.{x}.up_proj.weight"] = (normal(rng, (F, inner), 0.1), T.BF16)
            t[pre + f"mixer.experts.{x}.down_proj.weight"] = (normal(rng, (inner, F), 0.1), T.BF16)
    if latent:
        t[pre + "ffn_latent_in.weight"] = (normal(rng, (inner, E), 0.1), T.BF16)  # HF fc1_latent_proj
        t[pre + "ffn_latent_out.weight"] = (normal(rng, (E, inner), 0.1), T.BF16)  # HF fc2_latent_proj
    return t


def _attention_tensors(rng, pre: str, p: Dims) -> dict[str, tuple[np.ndarray, T]]:
    E, q, kv = p["n_embd"], p["n_head"] * p["head_dim"], p["n_head_kv"] * p["head_dim"]
    return {
        pre + "attn_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
        pre + "attn_q.weight": (normal(rng, (q, E), 0.1), T.BF16),
        pre + "attn_k.weight": (normal(rng, (kv, E), 0.1), T.BF16),
        pre + "attn_v.weight": (normal(rng, (kv, E), 0.1), T.BF16),
        pre + "attn_output.weight": (normal(rng, (E, q), 0.1), T.BF16),
    }


def _text_tensors(rng, p: Dims, latent: bool, mtp: bool) -> dict[str, tuple[np.ndarray, T]]:
    E, H = p["n_embd"], p["ssm_heads"]
    inner, gs = H * p["ssm_head_dim"], p["ssm_groups"] * p["ssm_state"]
    n_vocab = len(nemotron_tokens()[0])
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
    }
    for i, kind in enumerate(p["pattern"]):
        b = f"blk.{i}."
        if kind == "M":
            conv = inner + 2 * gs
            t.update(
                {
                    b + "attn_norm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
                    b + "ssm_in.weight": (normal(rng, (2 * inner + 2 * gs + H, E), 0.1), T.BF16),
                    b + "ssm_conv1d.weight": (normal(rng, (conv, p["conv_kernel"]), 0.2), T.F32),
                    b + "ssm_conv1d.bias": (normal(rng, (conv,), 0.02), T.F32),
                    b + "ssm_dt.bias": (normal(rng, (H,), 0.1), T.F32),
                    b + "ssm_a": (-np.exp(normal(rng, (H, 1), 0.3)), T.F32),  # -exp(A_log), a column
                    b + "ssm_d": (1.0 + normal(rng, (H, 1), 0.1), T.F32),
                    b + "ssm_norm.weight": (
                        1.0 + normal(rng, (p["ssm_groups"], inner // p["ssm_groups"]), 0.05),
                        T.F32,
                    ),
                    b + "ssm_out.weight": (normal(rng, (E, inner), 0.1), T.BF16),
                }
            )
        elif kind == "*":
            t.update(_attention_tensors(rng, b, p))
        else:
            t.update(_moe_tensors(rng, b, p, latent))
    if mtp:
        # Nemotron 3 Super's MTP head: layer 0 fuses the inputs and attends, layer 1 is MoE.
        m0, m1 = "mtp.layers.0.", "mtp.layers.1."
        t.update(
            {
                m0 + "enorm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
                m0 + "hnorm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
                m0 + "eh_proj.weight": (normal(rng, (E, 2 * E), 0.1), T.BF16),
                **_attention_tensors(rng, m0, p),
                **_moe_tensors(rng, m1, p, latent, merged=False),
                m1 + "final_layernorm.weight": (1.0 + normal(rng, (E,), 0.05), T.F32),
            }
        )
    return t


def legacy_nemotron_h_moe(path: Path, seed: int = 0, *, latent: bool = True, mtp: bool = True) -> Path:
    """`nemotron_h_moe` as Ollama writes Nemotron 3 Super-style checkpoints: pattern
    M, E, *, E (64 wide, 4 heads of 16, 2 KV heads; Mamba-2 with 8 heads of 16, state 16,
    2 groups; 4 experts of 32, 2 used, one shared of 64), experts in a 32-wide latent
    space (`ffn_latent_in`/`ffn_latent_out`, no `moe_latent_size` key), and an MTP head
    under `mtp.layers.{0,1}.*`.  Untranslated llama.cpp rejects the expert shapes
    (it takes the latent width for the model width) and the `mtp.*` tensors."""
    p = NEMOTRON_H
    rng = np.random.default_rng(seed)
    kvs = {**_tokenizer_kvs(), **_text_kvs("nemotron_h_moe", p, latent)}
    return write(path, "nemotron_h_moe", kvs, _text_tensors(rng, p, latent, mtp), ollama_order=True)


def _vision_tensors(rng, p: Dims, n_embd_text: int) -> dict[str, tuple[np.ndarray, T]]:
    VE, P, R = p["v_n_embd"], p["patch_size"], p["registers"]
    merged = VE * p["scale_factor"] ** 2
    t: dict[str, tuple[np.ndarray, T]] = {
        "v.patch_embd.weight": (normal(rng, (VE, 3 * P * P), 0.05), T.BF16),  # RADIO's linear embedder
        "v.cls_embd": (normal(rng, (R, VE), 0.1), T.BF16),
        "v.position_embd": (normal(rng, (p["source_side"] ** 2, VE), 0.1), T.BF16),
        "mm.norm.weight": (1.0 + normal(rng, (merged,), 0.05), T.F32),
        "mm.1.weight": (normal(rng, (p["proj_hidden"], merged), 0.05), T.BF16),
        "mm.2.weight": (normal(rng, (n_embd_text, p["proj_hidden"]), 0.05), T.BF16),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v"):  # the converter's split of attn_qkv
            t[b + proj + ".weight"] = (normal(rng, (VE, VE), 0.1), T.BF16)
            t[b + proj + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "attn_out.weight"] = (normal(rng, (VE, VE), 0.1), T.BF16)
        t[b + "attn_out.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        t[b + "ffn_up.weight"] = (normal(rng, (4 * VE, VE), 0.1), T.BF16)
        t[b + "ffn_up.bias"] = (normal(rng, (4 * VE,), 0.02), T.F32)
        t[b + "ffn_down.weight"] = (normal(rng, (VE, 4 * VE), 0.1), T.BF16)
        t[b + "ffn_down.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        for norm in ("ln1", "ln2"):
            t[b + norm + ".weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
            t[b + norm + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
    return t


def _audio_tensors(rng, a: dict, n_embd_text: int) -> dict[str, tuple[np.ndarray, T]]:
    """A representative part of the Parakeet encoder and its projector (hidden from both views)."""
    AE = a["a_n_embd"]
    return {
        "a.subsampling.conv0.weight": (normal(rng, (8, 1, 3, 3), 0.1), T.F32),
        "a.subsampling.conv0.bias": (normal(rng, (8,), 0.02), T.F32),
        "a.blk.0.attn_q.weight": (normal(rng, (AE, AE), 0.1), T.BF16),
        "a.blk.0.attn_norm.weight": (1.0 + normal(rng, (AE,), 0.05), T.F32),
        "mm.a.norm.weight": (1.0 + normal(rng, (AE,), 0.05), T.F32),
        "mm.a.1.weight": (normal(rng, (64, AE), 0.1), T.BF16),
        "mm.a.2.weight": (normal(rng, (n_embd_text, 64), 0.1), T.BF16),
    }


def legacy_nemotron_h_omni(path: Path, seed: int = 0) -> Path:
    """`nemotron_h_omni` as Ollama writes Nemotron 3 Nano Omni: the MoE text model of
    `legacy_nemotron_h_moe` (without latent experts or MTP), a 2-block RADIO tower
    (64 wide, 4 heads, patch 16, 64-pixel images, 2 register tokens, an 8x8 position
    table), the 2x2-merge MLP projector to the text width, and a slice of the audio
    encoder.  Untranslated llama.cpp knows neither the architecture nor, as a
    projector, the file."""
    p, v, a = NEMOTRON_H, RADIO, PARAKEET
    rng = np.random.default_rng(seed)
    toks = nemotron_tokens()[0]
    kvs = {**_tokenizer_kvs(), **_text_kvs("nemotron_h_omni", p, latent=False)}
    vision = {
        "block_count": v["v_n_layer"],
        "embedding_length": v["v_n_embd"],
        "feed_forward_length": 4 * v["v_n_embd"],
        "attention.head_count": v["v_n_head"],
        "attention.layer_norm_epsilon": 1e-6,
        "patch_size": v["patch_size"],
        "image_size": v["image_size"],
        "max_tiles": v["max_tiles"],
        "use_thumbnail": True,
        "num_channels": 3,
        "image_mean": v["image_mean"],
        "image_std": v["image_std"],
        "projector.scale_factor": v["scale_factor"],
        "image_token_id": toks.index("<image>"),
        "image_start_token_id": toks.index("<img>"),
        "image_end_token_id": toks.index("</img>"),
    }
    audio = {
        "block_count": a["a_n_layer"],
        "embedding_length": a["a_n_embd"],
        "feed_forward_length": 4 * a["a_n_embd"],
        "attention.head_count": a["a_n_head"],
        "attention.layer_norm_epsilon": 1e-5,
        "conv_kernel_size": 9,
        "num_mel_bins": a["mel_bins"],
        "sample_rate": 16000,
        "subsampling_factor": 8,
        "subsampling_conv_channels": 8,
        "subsampling_conv_kernel_size": 3,
        "subsampling_conv_stride": 2,
        "projection_hidden_size": 64,
        "scale_input": False,
        "sound_token_id": toks.index("<so_embedding>"),
    }
    kvs.update({f"nemotron_h_omni.vision.{k}": val for k, val in vision.items()})
    kvs.update({f"nemotron_h_omni.audio.{k}": val for k, val in audio.items()})
    tensors = {
        **_text_tensors(rng, p, latent=False, mtp=False),
        **_vision_tensors(rng, v, p["n_embd"]),
        **_audio_tensors(rng, a, p["n_embd"]),
    }
    return write(path, "nemotron_h_omni", kvs, tensors, ollama_order=True)
