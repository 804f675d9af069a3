"""Qwen3-Next (hybrid gated-delta-net and attention MoE) as Ollama wrote it.

Two forms, both with llama.cpp's tensor layout for the delta-net blocks
(`attn_qkv`/`attn_gate` split from HF's `in_proj_qkvz`, the fused `ssm_ba`,
`ssm_a` = -exp(A_log), norms stored as 1 + w):

- `qwen3next` (`convert/convert_qwen3next.go` from 77eb2ca61, 2026-02-03,
  until da70c3222): the KV heads as a per-layer array (0 for delta-net
  layers; llama.cpp reads one number) and the dt bias named `ssm_dt`
  (llama.cpp: `ssm_dt.bias`).  This is the form Ollama's handler translates.
- `qwen35moe` (the same converter since da70c3222, 2026-02-24, which writes
  every checkpoint of the family under Qwen3.5's architecture): no
  `rope.dimension_sections` (Qwen3-Next has no M-RoPE), so llama.cpp's
  qwen35moe loader refuses the file, with or without Ollama's handler; the
  delta-net tensors are Qwen3-Next's (`ssm_ba`, where Qwen3.5 has
  `ssm_alpha`/`ssm_beta`), which is what llama.cpp's `qwen3next` loader
  reads.  Presented as `qwen3next` it is what llama.cpp's converter writes
  for the checkpoint, pre-tokenizer `qwen2` (Qwen3-Next's tokenizer) where
  Ollama wrote `qwen35`.

Blobs with Qwen3.5's vision tower or M-RoPE keys are `handlers/qwen35.py`'s.
"""

from __future__ import annotations

from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.values import string
from compatfs.translate import (
    ArchKeys,
    CopyPrefixIfAbsent,
    Count,
    DropPrefix,
    PerLayerToMax,
    RenameEnd,
    Set,
    Translation,
    any_of,
    arch,
    arch_is,
    has_key,
    has_tensor_ending,
    has_tensor_prefix,
    is_array,
    leaf,
    value_is,
)

ARCH = arch(A.QWEN3NEXT)
K = ArchKeys(ARCH)


# Ollama's `qwen35moe` form of a Qwen3-Next checkpoint: Qwen3-Next's fused
# beta/alpha projection, none of Qwen3.5's M-RoPE or vision markers.
AS_QWEN35MOE = (
    arch_is("qwen35moe")
    & has_tensor_ending(".ssm_ba.weight")
    & ~any_of(
        has_key("qwen35moe.rope.dimension_sections"),
        has_key("qwen35moe.rope.mrope_section"),
        has_key("qwen35moe.vision.block_count"),
        has_tensor_prefix("v."),
        has_tensor_prefix("mtp."),
    )
)

TEXT = Translation(
    name="qwen3next",
    detect=AS_QWEN35MOE | (arch_is(ARCH) & any_of(has_tensor_ending(".ssm_dt"), is_array(K.Attention.HEAD_COUNT_KV))),
    counts=(Count("qwen35moe.block_count", "blk."), Count(K.LLM.BLOCK_COUNT, "blk.")),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(ARCH)),
        CopyPrefixIfAbsent("qwen35moe.", f"{ARCH}."),
        DropPrefix(("qwen35moe.",)),
        PerLayerToMax(K.Attention.HEAD_COUNT_KV),
        Set(Keys.Tokenizer.PRE, string("qwen2"), when=value_is(Keys.Tokenizer.PRE, "qwen35")),
    ),
    # llama.cpp reads the time-step bias as a bias.
    tensors=(RenameEnd(".ssm_dt", leaf(T.SSM_DT) + ".bias"),),
)
