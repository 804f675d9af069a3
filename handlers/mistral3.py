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

from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.values import f32, string
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    Default,
    DropPrefix,
    Hide,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    Produce,
    Rename,
    RopePermute,
    Set,
    Translation,
    When,
    any_of,
    arch_is,
    base,
    clip_projector,
    embedding_row,
    has_key,
    has_tensor_prefix,
    leaf,
    missing_or_default,
)


# -- the translations --------------------------------------------------------------

K = ArchKeys("mistral3")
SCALING_TYPE = K.Rope.SCALING_TYPE
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
        When(NO_ROPE_SCALING, (DropPrefix(("mistral3.rope.scaling.",)),)),
        # Older converters' YaRN names.
        CopyIfAbsent("mistral3.rope.scaling.beta_fast", K.Rope.SCALING_YARN_BETA_FAST),
        CopyIfAbsent("mistral3.rope.scaling.beta_slow", K.Rope.SCALING_YARN_BETA_SLOW),
        CopyIfAbsent("mistral3.rope.scaling.mscale_all_dim", K.Rope.SCALING_YARN_LOG_MUL),
        CopyIfAbsent("mistral3.rope.scaling_beta", K.Attention.TEMPERATURE_SCALE),
        Set(Keys.Tokenizer.PRE, string("tekken"), when=missing_or_default(Keys.Tokenizer.PRE)),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP = clip_projector(
    "mistral3-clip",
    DETECT & has_tensor_prefix("v."),
    "mistral3",
    "pixtral",
    copy=("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "image_size", "patch_size"),
    head=(CopyIfAbsent("mistral3.spatial_merge_size", Keys.ClipVision.SPATIAL_MERGE_SIZE),),
    # Hard-coded in HF's modeling_pixtral; the vision MLP is gated SiLU.
    edits=(Default(Keys.ClipVision.Attention.LAYERNORM_EPS, f32(1e-5)),),
    # Pixtral's preprocessing constants (OpenAI CLIP's image statistics).
    mean=OPENAI_CLIP_MEAN,
    std=OPENAI_CLIP_STD,
    activation=Keys.ClipVision.USE_SILU,
    keep_present=True,
    tensors=(
        # Pixtral's 2D rope expects llama.cpp's row order in vision Q/K.
        RopePermute("v.blk.", (".attn_q.weight", ".attn_k.weight"), heads="mistral3.vision.attention.head_count"),
        # The [IMG_BREAK] row separator, from the text embedding.
        Produce(base(T.V_TOK_EMBD_IMG_BREAK), embedding_row("[IMG_BREAK]")),
        Rename("v.patch_conv", base(T.V_ENC_EMBD_PATCH)),
        Rename("v.encoder_norm", base(T.V_PRE_NORM)),
        Rename(".attn_output", leaf(T.V_ENC_ATTN_O)),
        Rename(".attn_norm", leaf(T.V_ENC_INPUT_NORM)),
        Rename(".ffn_norm", leaf(T.V_ENC_POST_ATTN_NORM)),
        Rename("mm.linear_1", base(T.V_MMPROJ, 1)),
        Rename("mm.linear_2", base(T.V_MMPROJ, 2)),
        Rename("mm.patch_merger.merging_layer", base(T.V_MM_PATCH_MERGER)),
        Rename("mm.norm", base(T.V_MM_INP_NORM)),
    ),
)
