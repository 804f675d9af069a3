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

from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.values import boolean, string
from compatfs.translate import (
    CopyIfAbsent,
    DropPrefix,
    Hide,
    PadTokensUnused,
    Reciprocal,
    Rename,
    Set,
    Translation,
    any_of,
    arch_is,
    base,
    clip_projector,
    has_tensor_prefix,
    leaf,
    missing_or_default,
    tensor,
)


# -- the translations ----------------------------------------------------------------------

# llama.cpp's conversion keeps the tower in the mmproj and names the pre-tokenizer.
DETECT = arch_is("llama4") & any_of(
    has_tensor_prefix("v."), has_tensor_prefix("mm."), missing_or_default(Keys.Tokenizer.PRE)
)

TEXT = Translation(
    name="llama4",
    detect=DETECT,
    kv=(
        Set(Keys.Tokenizer.PRE, string("llama4"), when=missing_or_default(Keys.Tokenizer.PRE)),
        # Llama 4's tokenizer prepends <|begin_of_text|> (its post-processor).
        Set(Keys.Tokenizer.ADD_BOS, boolean(True)),
        PadTokensUnused(),
        # The tower's hyperparameters go to the mmproj.
        DropPrefix(("llama4.vision.",)),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP = clip_projector(
    "llama4-clip",
    DETECT & has_tensor_prefix("v."),
    "llama4",
    "llama4",
    copy=("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "image_size", "patch_size"),
    head=(CopyIfAbsent("llama4.vision.layer_norm_epsilon", Keys.ClipVision.Attention.LAYERNORM_EPS),),
    # The pixel-shuffle ratio 0.5 shuffles 2x2 patches into one: scale factor 2.
    edits=(Reciprocal("llama4.vision.pixel_shuffle_ratio", Keys.ClipVision.Projector.SCALE_FACTOR),),
    # Llama 4's preprocessor normalises with mean = std = 0.5.
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    # Not carried, as llama.cpp's converter writes neither: the vision rope
    # base (clip.cpp fixes 10000) and the pixel-shuffle ratio itself.
    tensors=(
        # The adapter MLP first: the block-leaf rename below would take its fc1/fc2.
        Rename("v.vision_adapter.mlp.fc1", base(T.V_MMPROJ_MLP, 1)),
        Rename("v.vision_adapter.mlp.fc2", base(T.V_MMPROJ_MLP, 2)),
        Rename("mm.linear_1", base(T.V_MMPROJ_FC)),
        Rename("v.positional_embedding_vlm", tensor(T.V_ENC_EMBD_POS)),
        Rename("v.class_embedding", base(T.V_ENC_EMBD_CLS)),
        Rename("v.patch_embedding", base(T.V_ENC_EMBD_PATCH)),
        Rename("v.layernorm_pre", base(T.V_PRE_NORM)),
        Rename("v.layernorm_post", base(T.V_POST_NORM)),
        Rename(".attn_output", leaf(T.V_ENC_ATTN_O), under="v.blk."),
        Rename(".attn_norm", leaf(T.V_ENC_INPUT_NORM), under="v.blk."),
        Rename(".ffn_norm", leaf(T.V_ENC_POST_ATTN_NORM), under="v.blk."),
        Rename(".mlp.fc1", leaf(T.V_ENC_FFN_UP), under="v.blk."),
        Rename(".mlp.fc2", leaf(T.V_ENC_FFN_DOWN), under="v.blk."),
    ),
)
