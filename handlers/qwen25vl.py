"""Qwen2.5-VL as Ollama wrote it: one `qwen25vl` blob with the text model,
the vision tower and the merger.

llama.cpp loads Qwen2-VL and Qwen2.5-VL text under the `qwen2vl`
architecture (M-RoPE sections in `rope.dimension_sections`, four entries)
and reads the vision side from a separate `clip` projector of type
`qwen2.5vl_merger`.  The views below are what llama.cpp's own converter
writes for the same checkpoint.

Ollama's converter already split the Conv3D patch embedding into its two
temporal halves and the vision QKV into Q, K and V, as llama.cpp's converter
does, so the projector needs renames only.

The window-attention period is encoded Qwen2.5-VL's own way: the KV edit
`WindowPattern` is defined here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import TokenType as TT

from compatfs.format.header import SourceGGUF
from compatfs.format.values import boolean, string, u32
from compatfs.translate import (
    ArchKeys,
    CopyPrefixIfAbsent,
    Default,
    DefaultTokenId,
    Drop,
    DropPrefix,
    FromShape,
    Hide,
    KVEdit,
    KVs,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PadArray,
    PadTokensUnused,
    Rename,
    Set,
    TokenType,
    Translation,
    arch,
    arch_is,
    base,
    clip_projector,
    integer_array,
    tensor,
)


# -- Qwen2.5-VL's own KV edits ------------------------------------------------------------


@dataclass(frozen=True)
class WindowPattern(KVEdit):
    """`key` (u32) = the period of the full-attention blocks listed in the array
    `indexes` (blocks p-1, 2p-1, ... use full attention, the others windowed):
    p = indexes[0] + 1 when every gap equals it; `default` when the array is
    missing or empty; nothing when the blocks are not evenly spaced (clip.cpp
    cannot express that, and then refuses the projector for lack of `key`)."""

    indexes: str
    key: str
    default: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.indexes)
        blocks = [] if value is None else [int(x) for x in integer_array(self.indexes, value)]
        if not blocks:
            kv.setdefault(self.key, u32(self.default))
            return
        period = blocks[0] + 1
        if all(b - a == period for a, b in itertools.pairwise(blocks)):
            kv[self.key] = u32(period)


# -- the translations -----------------------------------------------------------------------

DETECT = arch_is("qwen25vl")
NEW = arch(A.QWEN2VL)
K = ArchKeys(NEW)

# Qwen's FIM and repository markers: llama.cpp's converter types every
# `<|...|>` added token as control; Ollama typed these user-defined.
FIM_MARKERS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")

TEXT = Translation(
    name="qwen25vl",
    detect=DETECT,
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        # llama.cpp's loader reads its KVs under the architecture's prefix.
        DropPrefix(("qwen25vl.vision.",)),
        CopyPrefixIfAbsent("qwen25vl.", f"{NEW}."),
        # M-RoPE sections: Ollama's 3 (temporal, height, width), llama.cpp's 4.
        PadArray(f"{NEW}.rope.mrope_section", K.Rope.DIMENSION_SECTIONS, 4),
        DropPrefix(("qwen25vl.",)),
        Drop((f"{NEW}.rope.mrope_section",)),
        # Qwen2.5-VL's config names <|endoftext|> BOS; its tokenizer adds neither BOS nor EOS.
        DefaultTokenId(Keys.Tokenizer.BOS_ID, "<|endoftext|>"),
        Default(Keys.Tokenizer.ADD_BOS, boolean(False)),
        Default(Keys.Tokenizer.ADD_EOS, boolean(False)),
        TokenType(FIM_MARKERS, TT.CONTROL),
        PadTokensUnused(),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP = clip_projector(
    "qwen25vl-clip",
    DETECT,
    "qwen25vl",
    "qwen2.5vl_merger",
    copy=("block_count", "embedding_length", "patch_size", "attention.head_count", "attention.layer_norm_epsilon"),
    edits=(
        FromShape(Keys.ClipVision.FEED_FORWARD_LENGTH, "v.blk.0.ffn_up.weight", axis=1),
        # Full attention every p-th block, windowed in between; files from
        # older converters hold an empty list: the published models use p = 8.
        WindowPattern("qwen25vl.vision.fullatt_block_indexes", Keys.ClipVision.N_WA_PATTERN, default=8),
        # Not in the config: llama.cpp's converter takes Qwen2-VL's 560.
        Default(Keys.ClipVision.IMAGE_SIZE, u32(560)),
    ),
    # Qwen2.5-VL's preprocessor keeps OpenAI CLIP's statistics.
    mean=OPENAI_CLIP_MEAN,
    std=OPENAI_CLIP_STD,
    activation=Keys.ClipVision.USE_SILU,
    # Not carried, as llama.cpp's converter writes none of them: window
    # size, spatial merge and channels (clip.cpp fixes 112, 2x2 and RGB for
    # this projector), vision rope base, temporal patch size.
    keep=("v.",),
    tensors=(
        Rename("v.merger.ln_q", base(T.V_POST_NORM)),
        # The merger's MLP as mm.0 and mm.2, LLaVA-style.
        Rename("v.merger.mlp.0", base(T.V_MMPROJ, 0)),
        Rename("v.merger.mlp.2", base(T.V_MMPROJ, 2)),
        # The Conv3D patch embedding, split into its two temporal halves.
        Rename("v.patch_embd_0.weight", tensor(T.V_ENC_EMBD_PATCH)),
        Rename("v.patch_embd_1.weight", tensor(T.V_ENC_EMBD_PATCH, suffix="weight.1")),
    ),
)
