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

from gguf import GGMLQuantizationType as DT

from compatfs.gguf_source import SourceGGUF, TensorInfo
from compatfs.gguf_values import VT, GGUFError, Value, array, boolean, string, u32
from compatfs.handlers.qwen25vl import PadTokensUnused
from compatfs.ops import Concat, Op
from compatfs.translation import (
    Copy, CopyEach, CopyPrefix, Count, Default, DefaultTokenId, Drop, Hide, KeepOnly, PadArray, ProducePerBlock,
    Rename, Set, Translation, arch_is, as_projector, has_tensor_prefix,
)


# -- GLM-OCR's own KV edit and tensor maker -------------------------------------------------

@dataclass(frozen=True)
class RotaryWidth:
    """`key` (u32) = the head width `head` times the rotary fraction `factor`
    (1.0 when absent), when `key` is absent: the dimensions rope turns."""
    head: str
    factor: str
    key: str

    def apply(self, kv: dict[str, Value], src: SourceGGUF) -> None:
        head, factor = kv.get(self.head), kv.get(self.factor)
        if self.key in kv or head is None or head.vtype != VT.UINT32:
            return
        fraction = factor.decode() if factor is not None and factor.vtype == VT.FLOAT32 else 1.0
        if 0 < fraction <= 1:
            kv[self.key] = u32(int(head.decode() * fraction))


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

TEXT = Translation(
    name="glmocr",
    detect=DETECT,
    counts=(Count("glmocr.block_count", "blk."),),
    kv=(
        Set("general.architecture", string("glm4")),
        # The tower's keys go to the mmproj, the media token ids nowhere (llama.cpp reads none).
        Drop(("glmocr.vision.", "glmocr.image_", "glmocr.video_")),
        CopyPrefix("glmocr.", "glm4."),
        PadArray("glm4.rope.mrope_section", "glm4.rope.dimension_sections", 4),
        RotaryWidth("glm4.attention.key_length", "glm4.rope.partial_rotary_factor", "glm4.rope.dimension_count"),
        Drop(("glmocr.", "glm4.rope.mrope_section", "glm4.rope.partial_rotary_factor")),
        Set("tokenizer.ggml.pre", string("chatglm-bpe")),
        # Where the tokenizer config names none, llama.cpp's converter takes these from GLM's markers.
        DefaultTokenId("tokenizer.ggml.bos_token_id", "<|endoftext|>"),
        DefaultTokenId("tokenizer.ggml.unknown_token_id", "<|endoftext|>"),
        DefaultTokenId("tokenizer.ggml.eot_token_id", "<|user|>"),
        PadTokensUnused(),
    ),
    tensors=(
        Hide(("v.", "mm.")),
        ProducePerBlock("glmocr.block_count", "blk.{}.ffn_up.weight", gate_up,
                        consumes=("blk.{}.ffn_gate.weight", "blk.{}.ffn_up.weight")),
        Rename(".attn_out", ".attn_output", under="blk."),
        Rename(".post_attn_norm", ".post_attention_norm", under="blk."),
        Rename(".post_ffn_norm", ".post_ffw_norm", under="blk."),
    ),
)

# GLM-OCR's preprocessor (the OpenAI CLIP statistics), for files without them.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

CLIP = Translation(
    name="glmocr-clip",
    detect=DETECT & has_tensor_prefix("v."),
    kv=(
        CopyEach("glmocr.vision.", "clip.vision.", (
            "block_count", "embedding_length", "attention.head_count", "image_size", "patch_size",
            "image_mean", "image_std",
        )),
        Copy("glmocr.vision.intermediate_size", "clip.vision.feed_forward_length"),
        Copy("glmocr.vision.attention.layer_norm_rms_epsilon", "clip.vision.attention.layer_norm_epsilon"),
        # The merger's output feeds the language model's embedding.
        Copy("glmocr.embedding_length", "clip.vision.projection_dim"),
        Default("clip.vision.image_mean", array(VT.FLOAT32, IMAGE_MEAN)),
        Default("clip.vision.image_std", array(VT.FLOAT32, IMAGE_STD)),
        Set("clip.has_vision_encoder", boolean(True)),
        Set("clip.use_silu", boolean(True)),
        Set("clip.projector_type", string("glm4v")),
        # Not carried, as llama.cpp's converter writes none of them: spatial
        # merge (clip.cpp's glm4v default is GLM's 2), temporal patch, pixel
        # limits, the merger's output width (the text width).
        *as_projector("glmocr"),
    ),
    tensors=(
        KeepOnly(("v.", "mm.")),
        # The Conv3D patch embedding, split into its two temporal halves.
        Rename("v.patch_embd_0.weight", "v.patch_embd.weight"),
        Rename("v.patch_embd_1.weight", "v.patch_embd.weight.1"),
    ),
)
