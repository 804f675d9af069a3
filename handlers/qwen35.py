"""Qwen3.5 as Ollama wrote it: one monolithic `qwen35` (or `qwen35moe`) blob
with the hybrid text model (gated delta-net and attention blocks), the
multi-token-prediction head (`mtp.*`) and the vision tower (`v.*`).

Ollama's converter (f63eea3, `convert/convert_qwen3next.go`) already wrote
llama.cpp's tensor names and transforms for the text blocks (norms shifted
by one, `ssm_a` = -exp(A_log), V heads reordered); against llama.cpp's own
conversion of the same weights its blob differs in that

- the M-RoPE sections have 3 entries (llama.cpp reads 4) and the KV heads
  are a per-layer array with 0 for the delta-net layers;
- the delta-net bias is named `ssm_dt` (llama.cpp: `ssm_dt.bias`);
- the MTP head keeps HF's names under `mtp.*`: llama.cpp loads it as one
  more block after the text blocks (`blk.<n>.*`, the shared projection and
  norms as `blk.<n>.nextn.*`, `nextn_predict_layers` = 1) with the norm
  weights stored as 1 + w, which the converter did for the MTP block's own
  norms (names ending `_norm.weight`) but not for the shared ones; the MoE
  variant keeps the MTP block's experts one tensor per expert, llama.cpp
  reads them stacked;
- the vision tower sits inside: the projector is Qwen3-VL's
  (`handlers/qwen3vl.py`), without deepstack mergers.

Departures from Ollama's handler, where llama.cpp's conversion says
otherwise: only the shared MTP norms are shifted (Ollama's handler shifts
the MTP block's own norms a second time); a blob with other than one MTP
layer (llama.cpp runs exactly one) is served without its MTP head; the
recurrent layers are listed as llama.cpp's converter lists them; the
projector's feed-forward length and image size come from the tensors
(Ollama injects Qwen3.5-35B-A3B's 4304 and 768).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as DT
from gguf import MODEL_TENSOR as T

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import VT, array, u32
from compatfs.translate import AddScalar
from compatfs.translate import (
    ArchKeys,
    Count,
    Default,
    Drop,
    DropPrefix,
    Hide,
    KVEdit,
    KVs,
    PadArray,
    PerLayerToMax,
    Produce,
    Rename,
    RenameEnd,
    TensorEdit,
    Tensors,
    Translation,
    any_of,
    arch_is,
    base,
    describe,
    has_key,
    has_tensor_prefix,
    has_true,
    leaf,
    stacked,
    tensor,
    whole,
)

from .qwen3vl import qwen_tokenizer, vision_projector


# -- Qwen3.5's own KV edits -----------------------------------------------------------


def mtp_block(src: SourceGGUF, blocks: str) -> int | None:
    """The block number the MTP layer takes in llama.cpp's layout: the one
    after the text blocks.  None when the blob holds no single MTP layer."""
    if src.block_ids("mtp.layers.") != frozenset({0}):
        return None
    text = src.block_ids("blk.")
    if text != frozenset(range(len(text))) or whole(src.kvs.get(blocks)) != len(text):
        raise GGUFError(
            f"{blocks} is {describe(src.kvs.get(blocks))}, but the text blocks held are "
            f"{sorted(text)[:8]}{' ...' if len(text) > 8 else ''}"
        )
    return len(text)


@dataclass(frozen=True)
class MtpBlockCount(KVEdit):
    """With an MTP layer, `blocks` counts it too and `nextn` = 1."""

    blocks: str
    nextn: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        n = mtp_block(src, self.blocks)
        if n is not None:
            kv[self.blocks], kv[self.nextn] = u32(n + 1), u32(1)


@dataclass(frozen=True)
class RecurrentLayers(KVEdit):
    """`key` (bool per block of KV `blocks`, as counted by now) = which blocks
    are delta-net layers: those whose `marker` tensor the blob holds."""

    key: str
    blocks: str
    marker: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        n = whole(kv.get(self.blocks)) or 0
        kv[self.key] = array(VT.BOOL, [self.marker.format(i) in src.tensors for i in range(n)])


# -- the MTP head ---------------------------------------------------------------------

# mtp.<name> -> llama.cpp's tensor in the MTP block, and whether its norm
# weight is still HF's w (stored by llama.cpp as 1 + w).
MTP_SHARED = (
    ("mtp.fc", T.NEXTN_EH_PROJ, False),
    ("mtp.pre_fc_norm_embedding", T.NEXTN_ENORM, True),
    ("mtp.pre_fc_norm_hidden", T.NEXTN_HNORM, True),
    ("mtp.embed_tokens", T.NEXTN_EMBED_TOKENS, False),
    ("mtp.shared_head.head", T.NEXTN_SHARED_HEAD_HEAD, False),
    ("mtp.shared_head.norm", T.NEXTN_SHARED_HEAD_NORM, True),
    ("mtp.norm", T.NEXTN_SHARED_HEAD_NORM, True),
)
MTP_EXPERTS = (("gate_proj", T.FFN_GATE_EXP), ("up_proj", T.FFN_UP_EXP), ("down_proj", T.FFN_DOWN_EXP))


@dataclass(frozen=True)
class PlaceMtp(TensorEdit):
    """Tensor edit: the MTP layer becomes block n (KV `blocks`, the text
    blocks): `mtp.layers.0.*` -> `blk.<n>.*`, per-expert tensors stacked,
    shared tensors per `MTP_SHARED`.  Without a single MTP layer the `mtp.*`
    tensors are left out."""

    blocks: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        n = mtp_block(src, self.blocks)
        if n is None:
            return Hide(("mtp.",)).apply(ts, src)
        prefix = "mtp.layers.0.mlp.experts."
        experts = src.block_ids(prefix)
        if experts and experts != frozenset(range(len(experts))):
            raise GGUFError(f"{prefix}*: experts {sorted(experts)} are not numbered 0..{len(experts) - 1}")
        for proj, stack in MTP_EXPERTS if experts else ():
            names = tuple(f"{prefix}{e}.{proj}.weight" for e in range(len(experts)))
            if any(name not in src.tensors for name in names):
                raise GGUFError(f"{prefix}*.{proj}.weight: not every expert has one")
            make = lambda s, names=names: stacked([s.tensors[name] for name in names])
            ts = Produce(tensor(stack, n), make, consumes=names).apply(ts, src)
        ts = Rename("mtp.layers.0", f"blk.{n}").apply(ts, src)
        shifted = set()
        for old, shared, shift in MTP_SHARED:
            new = base(shared, n)
            ts = Rename(old, new).apply(ts, src)
            if shift:
                shifted.add(new + ".weight")
        for t in ts:
            if t.name in shifted and t.op is None and t.source is not None:
                if t.dtype not in (DT.F32, DT.F16, DT.BF16):
                    raise GGUFError(f"{t.source.name}: a norm weight stored as {t.dtype!r}")
                t.op, t.dtype = AddScalar.of(t.source, 1.0), DT.F32
        return ts


# -- the translations -----------------------------------------------------------------


def detector(arch: str):
    """Ollama's Qwen3.5 blobs carry the vision tower or its keys, the 3-entry
    `rope.mrope_section` beside the sections, and the V-head reorder flag.
    (Qwen3-Next blobs that Ollama's converter also wrote as `qwen35moe` have
    none of them: no vision, no M-RoPE, heads not reordered; they are
    `handlers/qwen3next.py`'s.)"""
    return arch_is(arch) & any_of(
        has_tensor_prefix("v."),
        has_key(f"{arch}.vision.block_count"),
        has_key(f"{arch}.image_token_id"),
        has_key(f"{arch}.rope.mrope_section"),
        has_true(f"{arch}.ssm.v_head_reordered"),
    )


def text_translation(arch: str) -> Translation:
    k = ArchKeys(arch)
    return Translation(
        name=arch,
        detect=detector(arch),
        counts=(Count(k.LLM.BLOCK_COUNT, "blk."),),
        kv=(
            PadArray(k.Rope.DIMENSION_SECTIONS, k.Rope.DIMENSION_SECTIONS, 4),
            # llama.cpp's converter writes Qwen3.5's default when the config has none.
            Default(k.Rope.DIMENSION_SECTIONS, array(VT.INT32, [11, 11, 10, 0])),
            PerLayerToMax(k.Attention.HEAD_COUNT_KV),
            MtpBlockCount(k.LLM.BLOCK_COUNT, k.LLM.NEXTN_PREDICT_LAYERS),
            RecurrentLayers(f"{arch}.attention.recurrent_layers", k.LLM.BLOCK_COUNT, "blk.{}.ssm_a"),
            # Vision keys go to the projector; the rest is not read by llama.cpp
            # (interleaved M-RoPE and the V-head order are implied by the arch).
            DropPrefix((f"{arch}.vision.",)),
            Drop(
                (
                    f"{arch}.image_token_id",
                    f"{arch}.vision_start_token_id",
                    f"{arch}.vision_end_token_id",
                    f"{arch}.mrope_sections",
                    f"{arch}.rope.mrope_section",
                    f"{arch}.rope.mrope_interleaved",
                    f"{arch}.ssm.v_head_reordered",
                )
            ),
            *qwen_tokenizer(),
        ),
        tensors=(Hide(("v.", "mm.")), RenameEnd(".ssm_dt", leaf(T.SSM_DT) + ".bias"), PlaceMtp(k.LLM.BLOCK_COUNT)),
    )


TEXT = text_translation("qwen35")
TEXT_MOE = text_translation("qwen35moe")
CLIP = vision_projector("qwen35-clip", "qwen35", TEXT.detect)
CLIP_MOE = vision_projector("qwen35moe-clip", "qwen35moe", TEXT_MOE.detect)
