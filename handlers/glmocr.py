"""GLM-OCR as Ollama wrote it: one monolithic `glmocr` blob with the text
model, the vision tower (`v.*`) and the merger (`mm.*`).

llama.cpp loads GLM-OCR's text model as `glm4` (M-RoPE in four
`rope.dimension_sections`, the rotary width in `rope.dimension_count`, the
MLP's gate and up halves fused in `ffn_up`, gate first) and the vision side as
a `clip` projector of type `glm4v`.  Ollama's converter wrote `glmocr.*` keys,
three M-RoPE sections and a `partial_rotary_factor` instead of the width, split
the fused MLP, and named three block tensors its own way.  Its tokenizer
metadata says pre-tokenizer `llama-bpe` (GLM's split regex is Llama 3's, but
`llama-bpe` also makes llama.cpp add a BOS GLM never adds) and carries no BOS,
unknown or EOT id; llama.cpp's converter writes `chatglm-bpe` and, where the
tokenizer config names none, takes them from `<|endoftext|>` and `<|user|>`.

What cannot be recovered: llama.cpp's conversion keeps GLM-OCR's MTP layer
(one more block, `nextn_predict_layers`); Ollama's converter dropped it, so
the view has the main layers only, which is what llama.cpp runs anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import SourceGGUF, TensorInfo
from compatfs.errors import GGUFError
from compatfs.format.values import string, u32
from compatfs.translate import Concat, Op
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    CopyPrefixIfAbsent,
    Count,
    DefaultTokenId,
    Drop,
    DropPrefix,
    Hide,
    KVEdit,
    KVs,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PadArray,
    PadTokensUnused,
    ProducePerBlock,
    Rename,
    Set,
    Translation,
    arch,
    arch_is,
    clip_projector,
    finite,
    has_tensor_prefix,
    leaf,
    tensor,
    whole,
)


# -- GLM-OCR's own KV edit and tensor maker -------------------------------------------------


@dataclass(frozen=True)
class RotaryWidth(KVEdit):
    """`key` (u32) = the head width `head` times the rotary fraction `factor`
    (1.0 when absent; one that is no number in (0, 1] leaves `key` out),
    when `key` is absent: the dimensions rope turns."""

    head: str
    factor: str
    key: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        head, factor = whole(kv.get(self.head)), kv.get(self.factor)
        if self.key in kv or head is None:
            return
        fraction = 1.0 if factor is None else finite(factor)
        if fraction is not None and 0 < fraction <= 1:
            kv[self.key] = u32(int(head * fraction))


def gate_up(src: SourceGGUF, i: int) -> Op | None:
    """Block i's MLP gate and up halves as llama.cpp's one `ffn_up` (gate rows
    first, then up); None where the block has no split pair."""
    gate, up = src.tensors.get(f"blk.{i}.ffn_gate.weight"), src.tensors.get(f"blk.{i}.ffn_up.weight")
    if gate is None or up is None:
        return None
    if gate.shape != up.shape or gate.dtype != up.dtype or len(gate.shape) != 2 or not isinstance(gate.dtype, DT):
        raise GGUFError(f"{_describe(gate)} and {_describe(up)} cannot be fused")
    return Concat.of(gate, up)


def _describe(t: TensorInfo) -> str:
    return f"{t.name} {list(t.shape)} {getattr(t.dtype, 'name', f'ggml type {int(t.dtype)}')}"


# -- the translations ----------------------------------------------------------------------

DETECT = arch_is("glmocr")
NEW = arch(A.GLM4)
K = ArchKeys(NEW)

TEXT = Translation(
    name="glmocr",
    detect=DETECT,
    counts=(Count("glmocr.block_count", "blk."),),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        # The tower's keys go to the mmproj, the media token ids nowhere (llama.cpp reads none).
        DropPrefix(("glmocr.vision.", "glmocr.image_", "glmocr.video_")),
        CopyPrefixIfAbsent("glmocr.", f"{NEW}."),
        PadArray(f"{NEW}.rope.mrope_section", K.Rope.DIMENSION_SECTIONS, 4),
        RotaryWidth(K.Attention.KEY_LENGTH, f"{NEW}.rope.partial_rotary_factor", K.Rope.DIMENSION_COUNT),
        DropPrefix(("glmocr.",)),
        Drop((f"{NEW}.rope.mrope_section", f"{NEW}.rope.partial_rotary_factor")),
        Set(Keys.Tokenizer.PRE, string("chatglm-bpe")),
        # Where the tokenizer config names none, llama.cpp's converter takes these from GLM's markers.
        DefaultTokenId(Keys.Tokenizer.BOS_ID, "<|endoftext|>"),
        DefaultTokenId(Keys.Tokenizer.UNK_ID, "<|endoftext|>"),
        DefaultTokenId(Keys.Tokenizer.EOT_ID, "<|user|>"),
        PadTokensUnused(),
    ),
    tensors=(
        Hide(("v.", "mm.")),
        ProducePerBlock(
            "glmocr.block_count",
            tensor(T.FFN_UP, "{}"),
            gate_up,
            consumes=("blk.{}.ffn_gate.weight", "blk.{}.ffn_up.weight"),
        ),
        Rename(".attn_out", leaf(T.ATTN_OUT), under="blk."),
        Rename(".post_attn_norm", leaf(T.ATTN_POST_NORM), under="blk."),
        Rename(".post_ffn_norm", leaf(T.FFN_POST_NORM), under="blk."),
    ),
)

CLIP = clip_projector(
    "glmocr-clip",
    DETECT & has_tensor_prefix("v."),
    "glmocr",
    "glm4v",
    copy=(
        "block_count",
        "embedding_length",
        "attention.head_count",
        "image_size",
        "patch_size",
        "image_mean",
        "image_std",
    ),
    head=(
        CopyIfAbsent("glmocr.vision.intermediate_size", Keys.ClipVision.FEED_FORWARD_LENGTH),
        CopyIfAbsent("glmocr.vision.attention.layer_norm_rms_epsilon", Keys.ClipVision.Attention.LAYERNORM_EPS),
    ),
    # GLM-OCR's preprocessor (OpenAI CLIP's statistics), for files without them.
    mean=OPENAI_CLIP_MEAN,
    std=OPENAI_CLIP_STD,
    activation=Keys.ClipVision.USE_SILU,
    # Not carried, as llama.cpp's converter writes none of them: spatial
    # merge (clip.cpp's glm4v default is GLM's 2), temporal patch, pixel
    # limits, the merger's output width (the text width).
    tensors=(
        # The Conv3D patch embedding, split into its two temporal halves.
        Rename("v.patch_embd_0.weight", tensor(T.V_ENC_EMBD_PATCH)),
        Rename("v.patch_embd_1.weight", tensor(T.V_ENC_EMBD_PATCH, suffix="weight.1")),
    ),
)
