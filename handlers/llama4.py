"""Llama 4 as Ollama wrote it: one monolithic `llama4` blob with the text
model, the vision tower (`v.*`) and the projector (`mm.*`).

The text side already has llama.cpp's architecture, keys and tensor names;
its loader refuses the blob only for the tower's extra tensors.  The
tokenizer differs from llama.cpp's conversion: Ollama's converter did not
know Llama 4's pre-tokenizer (`default`, llama.cpp's conversion: `llama4`),
wrote `add_bos_token` false (Llama 4 adds its BOS through tokenizer.json's
post-processor, which llama.cpp's converter reads), and named the padding
rows `[PAD<i>]` typed user-defined.

The projector becomes llama.cpp's `llama4` clip file: the pixel-shuffle
adapter MLP and the projector under `mm.model.*`, CLIP block names, the
position table as `v.position_embd.weight`.  Departure from llama.cpp
b11434's own converter: it maps the vision blocks' `post_attention_layernorm`
to `v.blk.N.attn_post_norm` (a name gemma4 later claimed), which clip.cpp
applies after attention instead of before the MLP; here it is `ln2`, as
clip.cpp's Llama 4 graph needs it and as earlier llama.cpp conversions wrote.
"""
from __future__ import annotations

from dataclasses import dataclass

from compatfs.gguf_source import SourceGGUF
from compatfs.gguf_values import VT, Value, array, boolean, string, u32
from compatfs.handlers.qwen25vl import PadTokensUnused
from compatfs.translation import (
    Copy, CopyEach, Default, Drop, Hide, KeepOnly, Rename, Set, Translation, any_of, arch_is, as_projector,
    has_tensor_prefix, missing_or_default,
)


# -- Llama 4's own KV edit ---------------------------------------------------------------

@dataclass(frozen=True)
class ScaleFactor:
    """`key` (u32) = 1 / the float at `ratio` (the pixel-shuffle ratio 0.5
    shuffles 2x2 patches into one), when `key` is absent and the ratio is a
    positive number whose inverse is a whole number; nothing otherwise (clip.cpp
    then refuses the projector for lack of it)."""
    ratio: str
    key: str

    def apply(self, kv: dict[str, Value], src: SourceGGUF) -> None:
        value = kv.get(self.ratio)
        ratio = None if value is None or value.vtype != VT.FLOAT32 else value.decode()
        if self.key in kv or not ratio or ratio <= 0:
            return
        scale = round(1.0 / ratio)
        if scale >= 1 and abs(scale * ratio - 1.0) < 1e-4:
            kv[self.key] = u32(scale)


# -- the translations ----------------------------------------------------------------------

# llama.cpp's conversion keeps the tower in the mmproj and names the pre-tokenizer.
DETECT = arch_is("llama4") & any_of(
    has_tensor_prefix("v."),
    has_tensor_prefix("mm."),
    missing_or_default("tokenizer.ggml.pre"),
)

TEXT = Translation(
    name="llama4",
    detect=DETECT,
    kv=(
        Set("tokenizer.ggml.pre", string("llama4"), when=missing_or_default("tokenizer.ggml.pre")),
        # Llama 4's tokenizer prepends <|begin_of_text|> (its post-processor).
        Set("tokenizer.ggml.add_bos_token", boolean(True)),
        PadTokensUnused(),
        # The tower's hyperparameters go to the mmproj.
        Drop(("llama4.vision.",)),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

# Llama 4's preprocessor normalises with mean = std = 0.5.
IMAGE_MEAN_STD = (0.5, 0.5, 0.5)

CLIP = Translation(
    name="llama4-clip",
    detect=DETECT & has_tensor_prefix("v."),
    kv=(
        CopyEach("llama4.vision.", "clip.vision.", (
            "block_count", "embedding_length", "feed_forward_length", "attention.head_count", "image_size",
            "patch_size",
        )),
        Copy("llama4.vision.layer_norm_epsilon", "clip.vision.attention.layer_norm_epsilon"),
        # The projector's output feeds the language model's embedding.
        Copy("llama4.embedding_length", "clip.vision.projection_dim"),
        ScaleFactor("llama4.vision.pixel_shuffle_ratio", "clip.vision.projector.scale_factor"),
        Default("clip.vision.image_mean", array(VT.FLOAT32, IMAGE_MEAN_STD)),
        Default("clip.vision.image_std", array(VT.FLOAT32, IMAGE_MEAN_STD)),
        Set("clip.has_vision_encoder", boolean(True)),
        Set("clip.use_gelu", boolean(True)),
        Set("clip.projector_type", string("llama4")),
        # Not carried, as llama.cpp's converter writes neither: the vision rope
        # base (clip.cpp fixes 10000) and the pixel-shuffle ratio itself.
        *as_projector("llama4"),
    ),
    tensors=(
        KeepOnly(("v.", "mm.")),
        # The adapter MLP first: the block-leaf rename below would take its fc1/fc2.
        Rename("v.vision_adapter.mlp.fc1", "mm.model.mlp.1"),
        Rename("v.vision_adapter.mlp.fc2", "mm.model.mlp.2"),
        Rename("mm.linear_1", "mm.model.fc"),
        Rename("v.positional_embedding_vlm", "v.position_embd.weight"),
        Rename("v.class_embedding", "v.class_embd"),
        Rename("v.patch_embedding", "v.patch_embd"),
        Rename("v.layernorm_pre", "v.pre_ln"),
        Rename("v.layernorm_post", "v.post_ln"),
        Rename(".attn_output", ".attn_out", under="v.blk."),
        Rename(".attn_norm", ".ln1", under="v.blk."),
        Rename(".ffn_norm", ".ln2", under="v.blk."),
        Rename(".mlp.fc1", ".ffn_up", under="v.blk."),
        Rename(".mlp.fc2", ".ffn_down", under="v.blk."),
    ),
)
