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

Two KV edits particular to these files are defined here: `WindowPattern`
(the window-attention period) and `PadTokensUnused` (Ollama's padding tokens).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from gguf import Keys

from compatfs.gguf_source import SourceGGUF
from compatfs.gguf_values import VT, Value, array, boolean, string, u32
from compatfs.translation import (
    Copy, CopyEach, CopyPrefix, Default, DefaultTokenId, Drop, FromShape, Hide, KeepOnly, PadArray, Rename, Set,
    TokenType, Translation, arch_is, as_projector,
)

KVs = dict[str, Value]
CONTROL, UNUSED = 3, 5   # tokenizer.ggml.token_type values


# -- Qwen2.5-VL's own KV edits ------------------------------------------------------------

@dataclass(frozen=True)
class WindowPattern:
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
        blocks = [] if value is None or value.element_type is None else [int(x) for x in value.decode()]
        if not blocks:
            kv.setdefault(self.key, u32(self.default))
            return
        period = blocks[0] + 1
        if all(b - a == period for a, b in zip(blocks, blocks[1:])):
            kv[self.key] = u32(period)


_PAD = re.compile(r"\[PAD(\d+)\]\Z")


@dataclass(frozen=True)
class PadTokensUnused:
    """Ollama pads the vocabulary up to the embedding rows with tokens named
    `[PAD0]`, `[PAD1]`, ... typed user-defined, which llama.cpp matches in any
    input text; llama.cpp's converter names the same rows `[PAD<id>]` and types
    them unused, so they never come out of tokenization.  The trailing run
    `[PAD0]`..`[PAD<k-1>]` becomes that."""

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        tokens, types = kv.get(Keys.Tokenizer.LIST), kv.get(Keys.Tokenizer.TOKEN_TYPE)
        if tokens is None or types is None or types.element_type in (None, VT.STRING, VT.ARRAY):
            return
        n = tokens.count
        last = _PAD.match(tokens.string_at(n - 1) or "") if n else None
        if last is None:
            return
        k = int(last.group(1)) + 1
        if k > n or any(tokens.string_at(n - k + i) != f"[PAD{i}]" for i in range(k)):
            return
        first = n - k
        names = array(VT.STRING, [f"[PAD{first + i}]" for i in range(k)])
        head = struct.pack("<IQ", VT.STRING, n)
        kv[Keys.Tokenizer.LIST] = Value(
            VT.ARRAY, head + bytes(tokens.truncated(first).payload[12:]) + bytes(names.payload[12:]))
        kinds = types.decode().copy()
        kinds[first:] = UNUSED
        kv[Keys.Tokenizer.TOKEN_TYPE] = array(types.element_type, kinds)


# -- the translations -----------------------------------------------------------------------

DETECT = arch_is("qwen25vl")

# Qwen's FIM and repository markers: llama.cpp's converter types every
# `<|...|>` added token as control; Ollama typed these user-defined.
FIM_MARKERS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")

TEXT = Translation(
    name="qwen25vl",
    detect=DETECT,
    kv=(
        Set(Keys.General.ARCHITECTURE, string("qwen2vl")),
        # llama.cpp's loader reads its KVs under the architecture's prefix.
        Drop(("qwen25vl.vision.",)),
        CopyPrefix("qwen25vl.", "qwen2vl."),
        # M-RoPE sections: Ollama's 3 (temporal, height, width), llama.cpp's 4.
        PadArray("qwen2vl.rope.mrope_section", "qwen2vl.rope.dimension_sections", 4),
        Drop(("qwen25vl.", "qwen2vl.rope.mrope_section")),
        # Qwen2.5-VL's config names <|endoftext|> BOS; its tokenizer adds neither BOS nor EOS.
        DefaultTokenId(Keys.Tokenizer.BOS_ID, "<|endoftext|>"),
        Default(Keys.Tokenizer.ADD_BOS, boolean(False)),
        Default(Keys.Tokenizer.ADD_EOS, boolean(False)),
        TokenType(FIM_MARKERS, CONTROL),
        PadTokensUnused(),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)   # Qwen2.5-VL's preprocessor (OpenAI CLIP values)
CLIP_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

CLIP = Translation(
    name="qwen25vl-clip",
    detect=DETECT,
    kv=(
        CopyEach("qwen25vl.vision.", "clip.vision.", (
            "block_count", "embedding_length", "patch_size", "attention.head_count",
            "attention.layer_norm_epsilon",
        )),
        # The merger's output feeds the language model's embedding.
        Copy("qwen25vl.embedding_length", Keys.ClipVision.PROJECTION_DIM),
        FromShape(Keys.ClipVision.FEED_FORWARD_LENGTH, "v.blk.0.ffn_up.weight", axis=1),
        # Full attention every p-th block, windowed in between; files from
        # older converters hold an empty list: the published models use p = 8.
        WindowPattern("qwen25vl.vision.fullatt_block_indexes", Keys.ClipVision.N_WA_PATTERN, default=8),
        # Not in the config: llama.cpp's converter takes Qwen2-VL's 560.
        Default(Keys.ClipVision.IMAGE_SIZE, u32(560)),
        Default(Keys.ClipVision.IMAGE_MEAN, array(VT.FLOAT32, CLIP_IMAGE_MEAN)),
        Default(Keys.ClipVision.IMAGE_STD, array(VT.FLOAT32, CLIP_IMAGE_STD)),
        Set(Keys.Clip.HAS_VISION_ENCODER, boolean(True)),
        Set(Keys.ClipVision.USE_SILU, boolean(True)),
        Set(Keys.Clip.PROJECTOR_TYPE, string("qwen2.5vl_merger")),
        # Not carried, as llama.cpp's converter writes none of them: window
        # size, spatial merge and channels (clip.cpp fixes 112, 2x2 and RGB for
        # this projector), vision rope base, temporal patch size.
        *as_projector("qwen25vl"),
    ),
    tensors=(
        KeepOnly(("v.",)),
        Rename("v.merger.ln_q.", "v.post_ln."),
        Rename("v.merger.mlp.", "mm."),                       # mm.0 and mm.2, LLaVA-style
        # The Conv3D patch embedding, split into its two temporal halves.
        Rename("v.patch_embd_0.weight", "v.patch_embd.weight"),
        Rename("v.patch_embd_1.weight", "v.patch_embd.weight.1"),
    ),
)
