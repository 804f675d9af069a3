"""Mistral 3 (Mistral Small 3.1 style) as Ollama wrote it: one monolithic
blob with the text model, the Pixtral vision tower (`v.*`) and the projector
(`mm.*`).

Ollama's converter copies the HF `rope_parameters` verbatim, so a checkpoint
without rope scaling (Mistral Small 3.1 has `rope_theta` only) gets
`rope.scaling.type=""` and zero factor/betas, which llama.cpp rejects
(`rope_scaling_type_train != UNSPECIFIED`); llama.cpp's own conversion writes
no rope-scaling keys at all.  The pre-tokenizer is left `default` (llama.cpp:
`tekken`).  Older converters named the YaRN keys `rope.scaling.beta_fast`,
`beta_slow`, `mscale_all_dim` and `rope.scaling_beta`.

On the vision side the converter permuted text Q/K for llama.cpp's rope but
left vision Q/K in HF order, kept HF-ish tensor names, and wrote no
`[IMG_BREAK]` embedding tensor (llama.cpp's converter copies that row of the
text embedding into the projector as `v.token_embd.img_break`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf import Keys
from gguf import GGMLQuantizationType as DT

from compatfs.gguf_source import SourceGGUF
from compatfs.gguf_values import GGUFError, f32, string
from compatfs.ops import Permute
from compatfs.translation import (
    OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, Copy, Default, Drop, Hide, Produce, Rename, Set, TensorEdit, Tensors,
    Translation, When, any_of, arch_is, clip_projector, embedding_row, has_key, has_tensor_prefix, missing_or_default,
    whole,
)


# -- Mistral 3's own tensor edit ----------------------------------------------

@dataclass(frozen=True)
class RopePermute(TensorEdit):
    """Tensor edit: every tensor named `prefix`...`suffix` gets llama.cpp's
    rope row order (`LlamaModel.permute` of its converter): per head, the HF
    layout [first halves | second halves] becomes interleaved pairs.  The
    head count is the blob's KV `heads`.  Plain dtypes only (F32/F16/BF16);
    a quantized match is an error rather than a silently wrong tensor."""
    prefix: str
    suffixes: tuple[str, ...]
    heads: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        n_head = whole(src.kvs.get(self.heads))
        for t in ts:
            if not (t.name.startswith(self.prefix) and t.name.endswith(self.suffixes)) or t.op is not None:
                continue
            rows, rest = (t.shape[-1], tuple(reversed(t.shape[:-1]))) if t.shape else (0, ())
            if (n_head is None or n_head <= 0 or not rows or rows % (2 * n_head)
                    or t.dtype not in (DT.F32, DT.F16, DT.BF16)):
                raise GGUFError(f"{t.name}: cannot rope-permute {t.dtype!r} with {self.heads}={n_head!r}")
            view = (n_head, 2, rows // n_head // 2, *rest)
            t.op = Permute.of(t.source, view, (0, 2, 1, *range(3, len(view))))
        return ts


# -- the translations --------------------------------------------------------------

SCALING_TYPE = "mistral3.rope.scaling.type"
# The checkpoint has no rope scaling, yet the type key is there, "" (or "default").
NO_ROPE_SCALING = has_key(SCALING_TYPE) & missing_or_default(SCALING_TYPE)

# llama.cpp's conversion keeps the vision tower in a separate mmproj; any of
# these marks the blob as Ollama-written.
DETECT = arch_is("mistral3") & any_of(
    has_tensor_prefix("v."),
    has_tensor_prefix("mm."),
    has_key("mistral3.rope.scaling.beta_fast"),
    has_key("mistral3.rope.scaling.mscale_all_dim"),
    has_key("mistral3.rope.scaling_beta"),
    NO_ROPE_SCALING,
)

TEXT = Translation(
    name="mistral3",
    detect=DETECT,
    kv=(
        # An empty type (with zero factor and betas) fails llama.cpp's assert;
        # its own conversion writes no rope-scaling keys for such a checkpoint.
        When(NO_ROPE_SCALING, (Drop(("mistral3.rope.scaling.",)),)),
        # Older converters' YaRN names.
        Copy("mistral3.rope.scaling.beta_fast", "mistral3.rope.scaling.yarn_beta_fast"),
        Copy("mistral3.rope.scaling.beta_slow", "mistral3.rope.scaling.yarn_beta_slow"),
        Copy("mistral3.rope.scaling.mscale_all_dim", "mistral3.rope.scaling.yarn_log_multiplier"),
        Copy("mistral3.rope.scaling_beta", "mistral3.attention.temperature_scale"),
        Set(Keys.Tokenizer.PRE, string("tekken"), when=missing_or_default(Keys.Tokenizer.PRE)),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP = clip_projector(
    "mistral3-clip", DETECT & has_tensor_prefix("v."), "mistral3", "pixtral",
    copy=("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "image_size",
          "patch_size"),
    head=(Copy("mistral3.spatial_merge_size", Keys.ClipVision.SPATIAL_MERGE_SIZE),),
    # Hard-coded in HF's modeling_pixtral; the vision MLP is gated SiLU.
    edits=(Default(Keys.ClipVision.Attention.LAYERNORM_EPS, f32(1e-5)),),
    # Pixtral's preprocessing constants (OpenAI CLIP's image statistics).
    mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, activation=Keys.ClipVision.USE_SILU, keep_present=True,
    tensors=(
        # Pixtral's 2D rope expects llama.cpp's row order in vision Q/K.
        RopePermute("v.blk.", (".attn_q.weight", ".attn_k.weight"), heads="mistral3.vision.attention.head_count"),
        # The [IMG_BREAK] row separator, from the text embedding.
        Produce("v.token_embd.img_break", embedding_row("[IMG_BREAK]")),
        Rename("v.patch_conv", "v.patch_embd"),
        Rename("v.encoder_norm", "v.pre_ln"),
        Rename(".attn_output", ".attn_out"),
        Rename(".attn_norm", ".ln1"),
        Rename(".ffn_norm", ".ln2"),
        Rename("mm.linear_1", "mm.1"),
        Rename("mm.linear_2", "mm.2"),
        Rename("mm.patch_merger.merging_layer", "mm.patch_merger"),
        Rename("mm.norm", "mm.input_norm"),
    ),
)
