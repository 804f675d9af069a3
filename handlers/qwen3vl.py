"""Qwen3-VL as Ollama wrote it: one monolithic `qwen3vl` (or `qwen3vlmoe`)
blob with the text model, the vision tower (`v.*`), its merger and the
deepstack mergers.

llama.cpp loads the text model under the same architecture names but needs
two keys Ollama's converter (f63eea3, `convert/convert_qwen3vl.go`) never
wrote: the M-RoPE sections and the number of deepstack layers.  The vision
side is a `clip` projector of type `qwen3vl_merger`; against llama.cpp's own
conversion of the same weights, Ollama's blob differs in that

- the vision QKV was split into `attn_q`/`attn_k`/`attn_v` (llama.cpp reads
  one `attn_qkv`, weight and bias);
- the Conv3D patch embedding is one tensor, ggml [w, h, frames, out*in],
  the HF weight with its two channel axes flattened; llama.cpp reads one
  Conv2D weight [w, h, in, out] per temporal frame (`v.patch_embd.weight`,
  `.weight.1`);
- the deepstack mergers are numbered by position in the list
  (`v.deepstack_merger.<j>`); llama.cpp numbers them by the vision block
  they follow (`v.deepstack.<deepstack_visual_indexes[j]>`);
- merger, block norms and MLP keep HF-ish names.

Qwen3.5's vision tower has the same layout (without deepstack mergers):
`handlers/qwen35.py` builds its projector with `vision_projector` below.

Departures from Ollama's handler, where llama.cpp's conversion says
otherwise: the M-RoPE sections come from the head size (Ollama injects the
8B model's [24, 20, 20, 0] whatever the head size, which makes llama.cpp
assert on smaller heads); the deepstack layer count is the mergers the blob
holds (Ollama: the length of the index list); the tokenizer gets Qwen's BOS,
control FIM markers and unused padding rows, and MoE files the experts'
width from their tensors (Ollama's handler does neither); the QKV merge
keeps the blob's dtype when Q, K and V share one (F32 only when they differ)
and the patch embeddings keep theirs (Ollama: F32); feed-forward length and
image size come from the tensors, and the vision epsilon from the text
model's RMS epsilon, as llama.cpp's converter takes it; no pixel-budget,
channel, temporal-patch or vision-rope keys (llama.cpp's converter writes
none for this projector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys
from gguf import GGMLQuantizationType as DT
from gguf import MODEL_TENSOR as T
from gguf import TokenType as TT

from compatfs.format.header import SourceGGUF, TensorInfo
from compatfs.errors import GGUFError
from compatfs.format.values import VT, array, boolean, u32
from compatfs.translate import Op, Part, Runs, as_array
from compatfs.translate import (
    ArchKeys,
    BlockCount,
    CopyEachIfAbsent,
    CopyIfAbsent,
    Count,
    Default,
    DefaultTokenId,
    Drop,
    DropPrefix,
    FromShape,
    Hide,
    KVEdit,
    KVs,
    PadArray,
    PadTokensUnused,
    Produce,
    ProducePerBlock,
    Rename,
    TensorEdit,
    Tensors,
    ToF32,
    TokenType,
    Translation,
    arch_is,
    base,
    clip_projector,
    concatenated,
    describe,
    has_key,
    integer_array,
    leaf,
    split_qkv,
    tensor,
    whole,
)

from .qwen25vl import FIM_MARKERS


# -- Qwen3-VL's own KV edits ----------------------------------------------------------

# Qwen3-VL's published M-RoPE split of the 64 rotary pairs of its 128-wide heads.
PUBLISHED_SECTIONS, PUBLISHED_PAIRS = (24, 20, 20), 64


@dataclass(frozen=True)
class MRopeSections(KVEdit):
    """`key` (4 x i32) = M-RoPE sections for the head size of `tensor` (a
    per-head norm, one weight per head dimension), when `key` is absent: the
    published proportions scaled to head/2 rotary pairs, height and width
    rounded down, the rest temporal ([24, 20, 20, 0] for the published
    128-wide heads, [4, 2, 2, 0] for 16).  The blob carries no sections of its
    own; the proportions hold for every published Qwen3-VL size."""

    key: str
    tensor: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        t = src.tensors.get(self.tensor)
        # (A tensor of a type ggml defines has a length the file bounds.)
        if self.key in kv or t is None or not isinstance(t.dtype, DT) or len(t.shape) != 1 or t.shape[0] % 2:
            return
        pairs = t.shape[0] // 2
        spatial = pairs * PUBLISHED_SECTIONS[1] // PUBLISHED_PAIRS
        kv[self.key] = array(VT.INT32, [pairs - 2 * spatial, spatial, spatial, 0])


def deepstack_layers(src: SourceGGUF, indexes: str, blocks: str) -> list[int]:
    """The vision blocks the deepstack mergers follow, merger j after block
    `indexes[j]`: one distinct block < KV `blocks` per merger the blob holds."""
    value = src.kvs.get(indexes)
    layers = [] if value is None else [int(x) for x in integer_array(indexes, value)]
    mergers, n_blocks = src.block_ids("v.deepstack_merger."), whole(src.kvs.get(blocks))
    if n_blocks is None and blocks in src.kvs:
        raise GGUFError(f"{blocks} is {describe(src.kvs[blocks])}, not a block count")
    n_blocks = n_blocks or 0
    if (
        mergers != frozenset(range(len(layers)))
        or len(set(layers)) != len(layers)
        or any(not 0 <= b < n_blocks for b in layers)
    ):
        raise GGUFError(
            f"{indexes} = {layers[:8]} does not place the {len(mergers)} deepstack mergers "
            f"among {n_blocks} vision blocks"
        )
    return layers


@dataclass(frozen=True)
class DeepstackMask(KVEdit):
    """`key` (bool array, one per vision block, KV `blocks`) = which blocks a
    deepstack merger follows (the array `indexes`)."""

    key: str
    indexes: str
    blocks: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        layers = set(deepstack_layers(src, self.indexes, self.blocks))
        kv[self.key] = array(VT.BOOL, [i in layers for i in range(whole(src.kvs.get(self.blocks)) or 0)])


@dataclass(frozen=True)
class ImageSize(KVEdit):
    """`key` (u32) = the side of the position grid of `positions` (ggml
    [n_embd, side*side]) times the patch side of `patch` (ggml [p, p, ...]):
    the image size the learnt position table was trained for."""

    key: str
    positions: str
    patch: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        pos, patch = src.tensors.get(self.positions), src.tensors.get(self.patch)
        if self.key in kv or pos is None or patch is None or len(pos.shape) != 2 or not patch.shape:
            return
        side = math.isqrt(pos.shape[1])
        if side * side == pos.shape[1] and side * patch.shape[0] < 2**32:
            kv[self.key] = u32(side * patch.shape[0])


# -- the projector's tensor edits and op ----------------------------------------------


@dataclass(frozen=True)
class FrameOfPatchEmbedding(Op):
    """Temporal frame `frame` of a Conv3D patch embedding stored as ggml
    [w, h, frames, out*in] (HF's [out, in, frames, h, w], channel axes
    flattened): the Conv2D weight ggml [w, h, in, out], in the blob's dtype."""

    frame: int = 0

    @classmethod
    def of(cls, src: TensorInfo, channels_out: int, frame: int) -> FrameOfPatchEmbedding:
        if len(src.shape) != 4 or not channels_out or src.shape[3] % channels_out or not 0 <= frame < src.shape[2]:
            raise GGUFError(
                f"{src.name}: shape {src.shape} is no Conv3D patch embedding "
                f"with {channels_out} output channels and a frame {frame}"
            )
        if src.dtype not in (DT.F32, DT.F16, DT.BF16):
            raise GGUFError(f"{src.name}: a {src.dtype!r} patch embedding cannot be split without dequantizing")
        w, h, _, packed = src.shape
        return cls((src,), (w, h, packed // channels_out, channels_out), src.known_dtype(), frame)

    def pieces(self):
        """Each of the out*in channel pairs holds its frames' w*h elements
        one after the other: the frame's, pair after pair, as one strided
        run served from the blob."""
        src = self.inputs[0]
        frames, packed = src.shape[2:]
        unit = src.nbytes // (frames * packed)
        return [Runs((Part(src, self.frame * unit, unit, frames * unit),), packed)]

    def _compute(self, data):
        arr = as_array(self.inputs[0], data[0])  # numpy [out*in, frames, h, w]
        return np.ascontiguousarray(arr[:, self.frame]).tobytes()


def patch_frame(frame: int, weight: str = "v.patch_embed.weight", bias: str = "v.patch_embed.bias"):
    """A `Produce` maker: frame `frame` of the patch embedding `weight`; the
    output channels are the length of its `bias`."""

    def make(src: SourceGGUF) -> Op | None:
        w, b = src.tensors.get(weight), src.tensors.get(bias)
        if w is None or b is None:
            return None
        if len(b.shape) != 1:
            raise GGUFError(f"{bias}: shape {b.shape} is not one bias per output channel")
        return FrameOfPatchEmbedding.of(w, b.shape[0], frame)

    return make


DEEPSTACK_LEAVES = (("norm", T.V_DS_NORM), ("linear_fc1", T.V_DS_FC1), ("linear_fc2", T.V_DS_FC2))


@dataclass(frozen=True)
class RenameDeepstack(TensorEdit):
    """Tensor edit: `v.deepstack_merger.<j>.<leaf>` becomes llama.cpp's
    `v.deepstack.<indexes[j]>.<leaf>`, numbered by the vision block it follows."""

    indexes: str
    blocks: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for j, block in enumerate(deepstack_layers(src, self.indexes, self.blocks)):
            for merger_leaf, t in DEEPSTACK_LEAVES:
                ts = Rename(f"v.deepstack_merger.{j}.{merger_leaf}", base(t, block)).apply(ts, src)
        return ts


# -- the translations -----------------------------------------------------------------


def qwen_tokenizer() -> tuple:
    """Qwen's tokenizer as llama.cpp's converter writes it: <|endoftext|> is
    BOS (never added), FIM and repository markers control, Ollama's padding
    rows unused (`PadTokensUnused`)."""
    return (
        DefaultTokenId(Keys.Tokenizer.BOS_ID, "<|endoftext|>"),
        Default(Keys.Tokenizer.ADD_BOS, boolean(False)),
        Default(Keys.Tokenizer.ADD_EOS, boolean(False)),
        TokenType(FIM_MARKERS, TT.CONTROL),
        PadTokensUnused(),
    )


def text_translation(arch: str) -> Translation:
    k = ArchKeys(arch)
    return Translation(
        name=arch,
        # llama.cpp's conversion carries the sections; Ollama's never did.
        detect=arch_is(arch) & ~has_key(k.Rope.DIMENSION_SECTIONS),
        kv=(
            # A config whose rope scaling names a type gave the converter its
            # 3 sections; without one (the published configs) none are written.
            PadArray(f"{arch}.rope.mrope_section", k.Rope.DIMENSION_SECTIONS, 4),
            MRopeSections(k.Rope.DIMENSION_SECTIONS, "blk.0.attn_k_norm.weight"),
            BlockCount(k.LLM.NUM_DEEPSTACK_LAYERS, "v.deepstack_merger."),
            # MoE: not written by Ollama's converter (llama.cpp would divide
            # the dense width by the experts used).
            FromShape(k.LLM.EXPERT_FEED_FORWARD_LENGTH, "blk.0.ffn_gate_exps.weight", axis=1),
            DropPrefix((f"{arch}.vision.",)),
            Drop((f"{arch}.rope.mrope_section",)),
            *qwen_tokenizer(),
        ),
        tensors=(Hide(("v.", "mm.")),),
    )


def vision_projector(name: str, arch: str, detect) -> Translation:
    """The `qwen3vl_merger` projector of a Qwen3-VL-style vision tower
    embedded in an `arch` blob (Qwen3-VL, Qwen3.5)."""
    v = f"{arch}.vision."
    return clip_projector(
        name,
        detect,
        arch,
        "qwen3vl_merger",
        counts=(Count(f"{v}block_count", "v.blk."),),
        copy=("block_count", "embedding_length", "attention.head_count", "patch_size", "spatial_merge_size"),
        edits=(
            FromShape(Keys.ClipVision.FEED_FORWARD_LENGTH, "v.blk.0.mlp.linear_fc1.weight", axis=1),
            ImageSize(Keys.ClipVision.IMAGE_SIZE, "v.pos_embed.weight", "v.patch_embed.weight"),
            # llama.cpp's converter takes the text model's RMS epsilon.
            CopyIfAbsent(ArchKeys(arch).Attention.LAYERNORM_RMS_EPS, Keys.ClipVision.Attention.LAYERNORM_EPS),
            CopyIfAbsent(f"{v}attention.layer_norm_epsilon", Keys.ClipVision.Attention.LAYERNORM_EPS),
            CopyEachIfAbsent(v, "clip.vision.", ("image_mean", "image_std")),
        ),
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        tail=(DeepstackMask(Keys.ClipVision.IS_DEEPSTACK_LAYERS, f"{v}deepstack_visual_indexes", f"{v}block_count"),),
        keep=("v.",),
        tensors=(
            # The converter split one QKV into three equal parts.
            *(
                ProducePerBlock(
                    f"{v}block_count",
                    tensor(T.V_ENC_ATTN_QKV, "{}", kind),
                    concatenated(*split_qkv(kind)),
                    consumes=split_qkv(kind),
                )
                for kind in ("weight", "bias")
            ),
            Produce(tensor(T.V_ENC_EMBD_PATCH), patch_frame(0), consumes=("v.patch_embed.weight",)),
            Produce(tensor(T.V_ENC_EMBD_PATCH, suffix="weight.1"), patch_frame(1)),
            Rename("v.patch_embed", base(T.V_ENC_EMBD_PATCH)),
            Rename("v.pos_embed", base(T.V_ENC_EMBD_POS)),
            Rename("v.merger.norm", base(T.V_POST_NORM)),
            Rename("v.merger.linear_fc1", base(T.V_MMPROJ, 0)),
            Rename("v.merger.linear_fc2", base(T.V_MMPROJ, 2)),
            RenameDeepstack(f"{v}deepstack_visual_indexes", f"{v}block_count"),
            Rename(".norm1", leaf(T.V_ENC_INPUT_NORM), under="v.blk."),
            Rename(".norm2", leaf(T.V_ENC_POST_ATTN_NORM), under="v.blk."),
            Rename(".mlp.linear_fc1", leaf(T.V_ENC_FFN_UP), under="v.blk."),
            Rename(".mlp.linear_fc2", leaf(T.V_ENC_FFN_DOWN), under="v.blk."),
            # llama.cpp's converter keeps the position table in F32.
            ToF32((tensor(T.V_ENC_EMBD_POS),)),
        ),
    )


TEXT = text_translation("qwen3vl")
TEXT_MOE = text_translation("qwen3vlmoe")
CLIP = vision_projector("qwen3vl-clip", "qwen3vl", TEXT.detect)
CLIP_MOE = vision_projector("qwen3vlmoe-clip", "qwen3vlmoe", TEXT_MOE.detect)
