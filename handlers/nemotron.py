"""Nemotron-H as Ollama wrote it: `nemotron_h_moe` text blobs, and the unified
`nemotron_h_omni` blob (text, RADIO vision tower, projector and audio encoder).

Most `nemotron_h_moe` blobs load as they are.  The latent-FFN variants
(Nemotron 3 Super) keep the latent projections as `ffn_latent_in`/`_out`
(llama.cpp: `ffn_latent_down`/`_up`) and carry no `moe_latent_size`, without
which llama.cpp takes the model width for the experts' width; and a checkpoint's
MTP head is written as `mtp.*` tensors under HF-ish names, which no loader claims.

llama.cpp loads the omni blob's text as `nemotron_h_moe` (or `nemotron_h`
without experts) and its vision side as a `clip` projector of type
`nemotron_v2_vl`.  Audio stays out of both views: Ollama's converter writes the
Parakeet encoder in a layout of its own, and its handler leaves it out too.

The projector's position table is stored at RADIO's full grid; llama.cpp's
converter resamples it to the grid of the fixed input size (bilinear, corners
aligned), which `ResampleGrid` does on first read.

Attention Q/K of the text model: llama.cpp's converter puts their rows in its
rope order (per head), Ollama's keeps HF's.  Nemotron-H's attention has no
rope, and Q and K rows permuted alike within each head give the same q·k, so
the text tensors are served as stored (a departure from llama.cpp's bytes,
not from its results).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import f32, string, u32
from compatfs.translate import Elementwise, Op, to_f32
from compatfs.translate import (
    ArchKeys,
    CopyPrefixIfAbsent,
    Count,
    Default,
    DropPrefix,
    FromFirstBlock,
    Hide,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    Produce,
    ProducePerBlock,
    Rename,
    Set,
    ToF32,
    Translation,
    When,
    any_of,
    arch,
    arch_is,
    base,
    clip_projector,
    concatenated,
    describe,
    has_block_tensor,
    has_tensor_prefix,
    leaf,
    split_qkv,
    tensor,
    value_at_least,
    whole,
)


# -- Nemotron's own ops -------------------------------------------------------


@dataclass(frozen=True)
class Reshaped(Elementwise):
    """The input's elements in their stored order, as F32 under another ggml shape
    of the same size (a linear patch embedder as a conv kernel)."""


@dataclass(frozen=True)
class ResampleGrid(Op):
    """A position table of `source`² rows (ggml [width, source²]) resampled to
    `target`² rows as a square grid, bilinear with corners aligned (torch's
    `interpolate(mode="bilinear", align_corners=True)`); F32 out."""

    source: int = 0
    target: int = 0

    def _compute(self, data):
        s, t = self.source, self.target
        grid = to_f32(self.inputs[0], data[0]).reshape(s, s, -1).astype(np.float64)
        at = np.arange(t) * ((s - 1) / (t - 1)) if t > 1 else np.zeros(t)
        lo = np.floor(at).astype(np.int64)
        hi = np.minimum(lo + 1, s - 1)
        w = at - lo
        rows = grid[lo] * (1 - w)[:, None, None] + grid[hi] * w[:, None, None]
        out = rows[:, lo] * (1 - w)[None, :, None] + rows[:, hi] * w[None, :, None]
        return out.astype("<f4").tobytes()


def _square_side(n: int) -> int | None:
    side = math.isqrt(n)
    return side if side * side == n else None


# -- the text translations -------------------------------------------------------------

MOE = arch(A.NEMOTRON_H_MOE)
K_MOE = ArchKeys(MOE)


TEXT_MOE = Translation(
    name="nemotron_h_moe",
    # Ollama's detector looks at blocks 0 and 1 only; the latent tensors of any block count here.
    detect=arch_is(MOE) & any_of(has_block_tensor("ffn_latent_in"), has_tensor_prefix("mtp.")),
    kv=(FromFirstBlock(K_MOE.LLM.MOE_LATENT_SIZE, "blk.", "ffn_latent_in.weight", axis=1),),
    tensors=(
        # The MTP head: llama.cpp's converter folds it into an extra block
        # (`nextn_predict_layers`); Ollama's handler, and this one, leave it out.
        Hide(("mtp.",)),
        Rename(".ffn_latent_in", leaf(T.MOE_LATENT_DOWN)),
        Rename(".ffn_latent_out", leaf(T.MOE_LATENT_UP)),
    ),
)

OMNI = "nemotron_h_omni"
DETECT_OMNI = arch_is(OMNI) & any_of(has_tensor_prefix("v."), has_tensor_prefix("a."), has_tensor_prefix("mm."))
OMNI_HAS_EXPERTS = value_at_least(f"{OMNI}.expert_count", 1) | value_at_least(f"{OMNI}.expert_used_count", 1)


def _text_arch(text_arch: str) -> tuple:
    """The omni blob's text keys under `text_arch`; its vision and audio keys left out."""
    return (
        Set(Keys.General.ARCHITECTURE, string(text_arch)),
        DropPrefix((f"{OMNI}.vision.", f"{OMNI}.audio.")),
        CopyPrefixIfAbsent(f"{OMNI}.", f"{text_arch}."),
        DropPrefix((f"{OMNI}.",)),
    )


TEXT_OMNI = Translation(
    name="nemotron_h_omni",
    detect=DETECT_OMNI,
    kv=(When(OMNI_HAS_EXPERTS, _text_arch(MOE)), When(~OMNI_HAS_EXPERTS, _text_arch(arch(A.NEMOTRON_H)))),
    # Ollama's handler would go on to the latent-FFN and MTP fixes above for
    # a future omni variant that had them; no omni checkpoint does.
    tensors=(Hide(("a.", "v.", "mm.")),),
)


# -- the projector -------------------------------------------------------------------

V = f"{OMNI}.vision."


def _u32(src: SourceGGUF, key: str) -> int:
    value = whole(src.kvs.get(key))
    if value is None or value <= 0:
        raise GGUFError(f"{key} is {describe(src.kvs.get(key))}, expected a positive count")
    return value


def position_table(src: SourceGGUF) -> Op | None:
    """`v.position_embd` (RADIO's full grid, ggml [width, side²] or [width, side², 1])
    resampled to the grid of the input size: (image_size / patch_size)² rows, F32."""
    t = src.tensors.get("v.position_embd")
    if t is None:
        return None
    if len(t.shape) < 2:
        raise GGUFError(f"{t.name}: shape {t.shape} is not [width, side²]")
    width, target = _u32(src, V + "embedding_length"), _u32(src, V + "image_size") // _u32(src, V + "patch_size")
    rows = math.prod(t.shape[1:])
    source = _square_side(rows)
    # The table only ever shrinks (RADIO's grid spans its largest input).
    if t.shape[0] != width or source is None or t.shape[2:] not in ((), (1,)) or not 1 <= target <= source:
        raise GGUFError(f"{t.name}: shape {t.shape} is not [{width}, side²] with side >= {target}")
    return ResampleGrid((t,), (width, target * target), DT.F32, source, target)


def patch_kernel(src: SourceGGUF) -> Op | None:
    """RADIO's linear patch embedder [channels·patch·patch, width] (channel-major
    rows, as the HF weight flattens them) as the conv kernel [patch, patch,
    channels, width] that llama.cpp's converter writes; same element order."""
    t = src.tensors.get("v.patch_embd.weight")
    if t is None or len(t.shape) != 2:
        return None
    patch, width = _u32(src, V + "patch_size"), _u32(src, V + "embedding_length")
    channels = _u32(src, V + "num_channels") if V + "num_channels" in src.kvs else 3
    if t.shape != (channels * patch * patch, width):
        raise GGUFError(f"{t.name}: shape {t.shape} is not [{channels}·{patch}·{patch}, {width}]")
    return Reshaped((t,), (patch, patch, channels, width), DT.F32)


CLIP = clip_projector(
    "nemotron_h_omni-clip",
    DETECT_OMNI & has_tensor_prefix("v."),
    OMNI,
    "nemotron_v2_vl",
    counts=(Count(V + "block_count", "v.blk."),),
    copy=(
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.layer_norm_epsilon",
        "patch_size",
        "image_size",
        "projector.scale_factor",
        "image_mean",
        "image_std",
    ),
    edits=(
        Default(Keys.ClipVision.Attention.LAYERNORM_EPS, f32(1e-6)),
        Default(Keys.ClipVision.Projector.SCALE_FACTOR, u32(2)),
    ),
    # The converter's defaults: OpenAI CLIP's statistics.
    mean=OPENAI_CLIP_MEAN,
    std=OPENAI_CLIP_STD,
    # Not carried, as llama.cpp's converter writes none of them: channels,
    # tiling (clip.cpp resizes to the fixed size), media token ids.
    tensors=(
        Hide(("mm.a.",)),  # the audio projector
        Rename("v.cls_embd", base(T.V_ENC_EMBD_CLS)),
        ToF32((base(T.V_ENC_EMBD_CLS),)),  # concatenated with the F32 patch rows
        Produce(tensor(T.V_ENC_EMBD_POS), position_table, consumes=("v.position_embd",)),
        Produce(tensor(T.V_ENC_EMBD_PATCH), patch_kernel, consumes=("v.patch_embd.weight",)),
        # Ollama's converter split RADIO's fused QKV; llama.cpp's keeps it fused.
        *(
            ProducePerBlock(
                V + "block_count",
                tensor(T.V_ENC_ATTN_QKV, "{}", kind),
                concatenated(*split_qkv(kind)),
                consumes=split_qkv(kind),
            )
            for kind in ("weight", "bias")
        ),
        Rename("mm.norm", base(T.V_MMPROJ_MLP, 0)),
        Rename("mm.1", base(T.V_MMPROJ_MLP, 1)),
        Rename("mm.2", base(T.V_MMPROJ_MLP, 3)),
    ),
)
