"""Qwen3.5 MoE blobs as Ollama's converter wrote them (the legacy form of
`handlers/qwen35.py` for `qwen35moe`; the dense form has a genuine fixture in
../shared/fixtures/ollama/qwen3_5_legacy.gguf, which these follow).

* `convert/convert_qwen3next.go` at f63eea3d2 (2026-05-24, the last commit
  before the converters were rewritten for llama-server in 9db4bdbad), for
  Qwen3_5MoeForConditionalGeneration: architecture `qwen35moe`, pre-tokenizer
  `qwen35`; `attention.head_count_kv` per layer (0 on delta-net layers);
  `rope.dimension_sections`, `rope.mrope_section` and `mrope_sections` all
  the config's 3 sections, `rope.mrope_interleaved`; `rope.dimension_count`
  = head size x partial rotary factor; `ssm.*` and `ssm.v_head_reordered`;
  `full_attention_interval`; `feed_forward_length` = the config's
  `intermediate_size` (none in a MoE config: 0); `expert_count`,
  `expert_used_count`, `expert_feed_forward_length`,
  `expert_shared_feed_forward_length` (no `norm_top_k_prob`: unset in the
  config); `vision.*` as for Qwen3-VL, those unset in Qwen3.5's vision
  config left out, and `image_token_id`,
  `vision_start_token_id`, `vision_end_token_id`.
* Tensors: the text blocks' per-expert weights merged into
  `blk.<i>.ffn_{gate,up,down}_exps` (`mergeTensors` over
  `blk.<i>.mlp.experts.*`, i < num_hidden_layers), so the MTP block's experts
  stay one tensor per expert, `mtp.layers.0.mlp.experts.<e>.{gate,up,down}_proj.weight`;
  every other MTP tensor keeps HF's name under `mtp.` with the text
  replacements applied (`mtp.layers.0.attn_q`, `mtp.layers.0.ffn_gate_inp`,
  `..._shexp`); norms whose names end `_norm.weight` (not `ssm_norm`) stored
  as 1 + w, so `mtp.norm` and `mtp.pre_fc_norm_*` keep HF's w; `ssm_a` =
  -exp(A_log); `linear_attn.dt_bias` -> `ssm_dt`; the vision tower as
  Qwen3-VL's (`compatfs/testing/qwen3vl.py`), without deepstack mergers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .qwen3vl import _norm, attention_tensors, qwen_tokenizer_kvs, qwen_tokens, vision_kvs, vision_tensors


QWEN35_MOE: Dims = dict(
    n_layer=4,
    full_attention_interval=4,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    partial_rotary=0.25,
    sections=[2, 1, 1],
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    n_ff_shexp=32,
    context_length=262144,
    rope_freq_base=10_000_000.0,
    rms_eps=1e-6,
    ssm_conv=4,
    ssm_k_heads=2,
    ssm_v_heads=4,
    ssm_head_dim=16,
    v_n_layer=3,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    patch_size=16,
    merge=2,
    n_pos=64,
)


def _moe(
    rng: np.random.Generator, b: str, E: int, X: int, FX: int, FS: int, per_expert: bool
) -> dict[str, tuple[np.ndarray, T]]:
    t = {
        b + "ffn_gate_inp.weight": (normal(rng, (X, E), 0.05), T.BF16),
        b + "ffn_gate_shexp.weight": (normal(rng, (FS, E), 0.05), T.BF16),
        b + "ffn_up_shexp.weight": (normal(rng, (FS, E), 0.05), T.BF16),
        b + "ffn_down_shexp.weight": (normal(rng, (E, FS), 0.05), T.BF16),
        b + "ffn_gate_inp_shexp.weight": (normal(rng, (1, E), 0.05), T.BF16),
    }
    if per_expert:
        for e in range(X):
            t[b + f"mlp.experts.{e}.gate_proj.weight"] = (normal(rng, (FX, E), 0.05), T.BF16)
            t[b + f"mlp.experts.{e}.up_proj.weight"] = (normal(rng, (FX, E), 0.05), T.BF16)
            t[b + f"mlp.experts.{e}.down_proj.weight"] = (normal(rng, (E, FX), 0.05), T.BF16)
    else:
        t[b + "ffn_gate_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        t[b + "ffn_up_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        t[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, FX), 0.05), T.BF16)
    return t


def legacy_qwen35_moe(path: Path, seed: int = 0) -> Path:
    """Qwen3.5-MoE (Qwen3.5-35B-A3B layout, tiny): three delta-net blocks and
    one attention block with routed and shared experts, the MTP head, the
    vision tower; ~1.3 MB."""
    p = QWEN35_MOE
    rng = np.random.default_rng(seed)
    E, H, HKV, hd = p["n_embd"], p["n_head"], p["n_head_kv"], p["head_dim"]
    X, FX, FS = p["n_expert"], p["n_ff_exp"], p["n_ff_shexp"]
    KH, VH, SD = p["ssm_k_heads"], p["ssm_v_heads"], p["ssm_head_dim"]
    key_dim, value_dim = KH * SD, VH * SD
    n, every = p["n_layer"], p["full_attention_interval"]
    full = [(i + 1) % every == 0 for i in range(n)]
    toks = qwen_tokens()[0]
    a = "qwen35moe"
    kvs: dict[str, Any] = {
        "general.file_type": 1,
        "general.quantization_version": 2,
        f"{a}.block_count": n,
        f"{a}.context_length": p["context_length"],
        f"{a}.embedding_length": E,
        f"{a}.feed_forward_length": 0,
        f"{a}.attention.head_count": H,
        f"{a}.attention.head_count_kv": [HKV if f else 0 for f in full],
        f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd,
        f"{a}.attention.layer_norm_rms_epsilon": p["rms_eps"],
        f"{a}.rope.freq_base": p["rope_freq_base"],
        f"{a}.rope.dimension_count": int(hd * p["partial_rotary"]),
        f"{a}.mrope_sections": p["sections"],
        f"{a}.rope.mrope_section": p["sections"],
        f"{a}.rope.dimension_sections": p["sections"],
        f"{a}.rope.mrope_interleaved": True,
        f"{a}.expert_count": X,
        f"{a}.expert_used_count": p["n_expert_used"],
        f"{a}.expert_feed_forward_length": FX,
        f"{a}.expert_shared_feed_forward_length": FS,
        f"{a}.ssm.inner_size": value_dim,
        f"{a}.ssm.state_size": SD,
        f"{a}.ssm.group_count": KH,
        f"{a}.ssm.time_step_rank": VH,
        f"{a}.ssm.conv_kernel": p["ssm_conv"],
        f"{a}.ssm.v_head_reordered": True,
        f"{a}.full_attention_interval": every,
        f"{a}.image_token_id": toks.index("<|image_pad|>"),
        f"{a}.vision_start_token_id": toks.index("<|vision_start|>"),
        f"{a}.vision_end_token_id": toks.index("<|vision_end|>"),
        # Qwen3.5's vision config has no epsilon and no rope base (written
        # only when set).  The converter writes `vision.deepstack_visual_indexes`
        # = [] (INT32, empty); `core.write` cannot type an empty array, so it
        # is left out (the handler reads a missing list as an empty one).
        **{
            k: v
            for k, v in vision_kvs(a, p, []).items()
            if not k.endswith(("deepstack_visual_indexes", "layer_norm_epsilon", "rope.freq_base"))
        },
        **qwen_tokenizer_kvs("qwen35"),
    }
    n_vocab = len(toks)
    tensors: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output.weight": (normal(rng, (n_vocab, E), 0.05), T.BF16),
        "output_norm.weight": (_norm(rng, E), T.F32),
    }
    for i in range(n):
        b = f"blk.{i}."
        if full[i]:
            # The query projection carries the output gate: twice the heads' rows.
            tensors.update(attention_tensors(rng, b, E, 2 * H * hd, HKV * hd, hd, H * hd))
        else:
            tensors.update(
                {
                    b + "attn_norm.weight": (_norm(rng, E), T.F32),
                    b + "attn_qkv.weight": (normal(rng, (2 * key_dim + value_dim, E), 0.05), T.BF16),
                    b + "attn_gate.weight": (normal(rng, (value_dim, E), 0.05), T.BF16),
                    b + "ssm_alpha.weight": (normal(rng, (VH, E), 0.05), T.BF16),
                    b + "ssm_beta.weight": (normal(rng, (VH, E), 0.05), T.BF16),
                    b + "ssm_conv1d.weight": (normal(rng, (2 * key_dim + value_dim, p["ssm_conv"]), 0.1), T.F32),
                    b + "ssm_a": (-np.exp(normal(rng, (VH,), 0.5)), T.F32),
                    b + "ssm_dt": (normal(rng, (VH,), 0.5), T.F32),
                    b + "ssm_norm.weight": (_norm(rng, SD), T.F32),
                    b + "ssm_out.weight": (normal(rng, (E, value_dim), 0.05), T.BF16),
                }
            )
        tensors[b + "post_attention_norm.weight"] = (_norm(rng, E), T.F32)
        tensors.update(_moe(rng, b, E, X, FX, FS, per_expert=False))
    m = "mtp.layers.0."
    tensors.update(attention_tensors(rng, m, E, 2 * H * hd, HKV * hd, hd, H * hd))
    tensors[m + "post_attention_norm.weight"] = (_norm(rng, E), T.F32)
    tensors.update(_moe(rng, m, E, X, FX, FS, per_expert=True))
    tensors.update(
        {
            "mtp.fc.weight": (normal(rng, (E, 2 * E), 0.05), T.BF16),
            "mtp.norm.weight": (normal(rng, (E,), 0.05), T.F32),
            "mtp.pre_fc_norm_embedding.weight": (normal(rng, (E,), 0.05), T.F32),
            "mtp.pre_fc_norm_hidden.weight": (normal(rng, (E,), 0.05), T.F32),
        }
    )
    tensors.update(vision_tensors(rng, p, E, []))
    return write(path, a, kvs, tensors, ollama_order=True)
