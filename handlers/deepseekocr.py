"""DeepSeek-OCR as Ollama wrote it: one `deepseekocr` blob with the MoE text
model, the SAM encoder (`s.*`), the CLIP encoder (`v.*`) and the projector (`mm.*`).

llama.cpp loads the text as `deepseek2-ocr` and reads the vision side from a
`clip` projector of type `deepseekocr`: SAM under `v.sam.*`, CLIP with its
usual leaf names, the projector as `mm.model.fc`, the newline and view
separator embeddings under `v.*`.  Ollama's converter wrote neither the
experts' width nor the shared-expert count; both are read off the first MoE
block's tensors.  Neither converter permutes attention Q/K, so the text
tensors are served as stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.header import SourceGGUF
from compatfs.format.values import f32, string, u32
from compatfs.translate import (
    ArchKeys,
    CopyEachIfAbsent,
    CopyIfAbsent,
    CopyPrefixIfAbsent,
    Count,
    Default,
    DropPrefix,
    FromFirstBlock,
    Hide,
    KVEdit,
    KVs,
    Rename,
    Scaled,
    Set,
    ToF32,
    Translation,
    arch,
    arch_is,
    base,
    blocks,
    clip_projector,
    leaf,
    tensor,
    whole,
)


# -- DeepSeek-OCR's own KV edit ----------------------------------------------------------


@dataclass(frozen=True)
class SharedExpertCount(KVEdit):
    """`key` (u32) = the shared experts' stacked width (axis 0 of the first
    `<prefix><i>.<suffix>`) over `per_expert` (an integer KV), when `key` is absent."""

    key: str
    prefix: str
    suffix: str
    per_expert: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        width = whole(kv.get(self.per_expert))
        if self.key in kv or not width:
            return
        for i in sorted(src.block_ids(self.prefix)):
            t = src.tensors.get(f"{self.prefix}{i}.{self.suffix}")
            if t is not None and t.shape:
                kv[self.key] = u32(t.shape[0] // width)
                return


# -- the translations -------------------------------------------------------------------

OLD, NEW = "deepseekocr", arch(A.DEEPSEEK2OCR)
K = ArchKeys(NEW)
DETECT = arch_is(OLD)

# llama.cpp's converter's template: the messages' contents, concatenated.
CHAT_TEMPLATE = "{% for m in messages %}{{m['content']}}{% endfor %}"

TEXT = Translation(
    name="deepseekocr",
    detect=DETECT,
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        DropPrefix((f"{OLD}.vision.", f"{OLD}.sam.")),
        CopyPrefixIfAbsent(f"{OLD}.", f"{NEW}."),
        DropPrefix((f"{OLD}.",)),
        Default(K.Attention.LAYERNORM_RMS_EPS, f32(1e-6)),
        # ffn_down_exps is [expert width, n_embd, experts]; the shared experts'
        # down projection [shared count x expert width, n_embd].
        FromFirstBlock(K.LLM.EXPERT_FEED_FORWARD_LENGTH, "blk.", "ffn_down_exps.weight", axis=0),
        SharedExpertCount(
            K.LLM.EXPERT_SHARED_COUNT, "blk.", "ffn_down_shexp.weight", per_expert=K.LLM.EXPERT_FEED_FORWARD_LENGTH
        ),
        Default(Keys.Tokenizer.CHAT_TEMPLATE, string(CHAT_TEMPLATE)),
    ),
    tensors=(Hide(("s.", "v.", "mm.")),),
)

V, SAM = f"{OLD}.vision.", f"{OLD}.sam."

CLIP = clip_projector(
    "deepseekocr-clip",
    DETECT,
    OLD,
    "deepseekocr",
    counts=(Count(V + "block_count", "v.blk."), Count(SAM + "block_count", "s.blk.")),
    copy=("block_count", "embedding_length", "image_size", "patch_size"),
    head=(
        CopyIfAbsent(V + "head_count", Keys.ClipVision.Attention.HEAD_COUNT),
        CopyEachIfAbsent(SAM, "clip.vision.sam.", ("block_count", "embedding_length", "head_count")),
    ),
    edits=(
        # As llama.cpp's converter writes them for DeepSeek-OCR's config: the
        # feed-forward length as 4 x heads (unused by this projector), one CLIP
        # patch per SAM output cell, windows of 14, 2 to 9 tiles.
        Scaled(Keys.ClipVision.Attention.HEAD_COUNT, Keys.ClipVision.FEED_FORWARD_LENGTH, 4),
        Default(Keys.ClipVision.Projector.SCALE_FACTOR, u32(1)),
        Default(Keys.ClipVision.WINDOW_SIZE, u32(14)),
        Default(Keys.ClipVision.PREPROC_MIN_TILES, u32(2)),
        Default(Keys.ClipVision.PREPROC_MAX_TILES, u32(9)),
        Default(Keys.ClipVision.Attention.LAYERNORM_EPS, f32(1e-6)),
    ),
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    keep=("s.", "v.", "mm."),
    tensors=(
        # SAM, moved under llama.cpp's `v.sam.`, its inner names renamed as it moves.
        Rename("s.position_embd", tensor(T.V_SAM_POS_EMBD)),
        Rename("s.patch_embd", base(T.V_SAM_PATCH_EMBD)),
        Rename(".attn.qkv", leaf(T.V_SAM_ATTN_QKV), under="s.blk.", into=blocks(T.V_SAM_ATTN_QKV)),
        Rename(".attn.proj", leaf(T.V_SAM_ATTN_OUT), under="s.blk.", into=blocks(T.V_SAM_ATTN_OUT)),
        Rename(
            ".attn.rel_pos_h", leaf(T.V_SAM_ATTN_POS_H) + ".weight", under="s.blk.", into=blocks(T.V_SAM_ATTN_POS_H)
        ),
        Rename(
            ".attn.rel_pos_w", leaf(T.V_SAM_ATTN_POS_W) + ".weight", under="s.blk.", into=blocks(T.V_SAM_ATTN_POS_W)
        ),
        Rename(".norm1", leaf(T.V_SAM_PRE_NORM), under="s.blk.", into=blocks(T.V_SAM_PRE_NORM)),
        Rename(".norm2", leaf(T.V_SAM_POST_NORM), under="s.blk.", into=blocks(T.V_SAM_POST_NORM)),
        Rename(".mlp.lin1", leaf(T.V_SAM_MLP_LIN_1), under="s.blk.", into=blocks(T.V_SAM_MLP_LIN_1)),
        Rename(".mlp.lin2", leaf(T.V_SAM_MLP_LIN_2), under="s.blk.", into=blocks(T.V_SAM_MLP_LIN_2)),
        *(Rename(f"s.neck.{i}", base(T.V_SAM_NECK, i)) for i in range(4)),  # conv, norm, conv, norm
        Rename("s.net_2", base(T.V_SAM_NET_2)),
        Rename("s.net_3", base(T.V_SAM_NET_3)),
        # CLIP.
        Rename("v.pre_layrnorm", base(T.V_PRE_NORM)),
        Rename(".self_attn.qkv_proj", leaf(T.V_ENC_ATTN_QKV), under="v.blk."),
        Rename(".self_attn.out_proj", leaf(T.V_ENC_ATTN_O), under="v.blk."),
        Rename(".layer_norm1", leaf(T.V_ENC_INPUT_NORM), under="v.blk."),
        Rename(".layer_norm2", leaf(T.V_ENC_POST_ATTN_NORM), under="v.blk."),
        Rename(".mlp.fc1", leaf(T.V_ENC_FFN_UP), under="v.blk."),
        Rename(".mlp.fc2", leaf(T.V_ENC_FFN_DOWN), under="v.blk."),
        # The projector and the learned layout embeddings.
        Rename("mm.layers", base(T.V_MMPROJ_FC)),
        Rename("mm.image_newline", base(T.V_ENC_EMBD_IMGNL)),
        Rename("mm.view_seperator", base(T.V_ENC_EMBD_VSEP)),
        # Convolution kernels and embeddings in F32, as llama.cpp's converter keeps them.
        ToF32(
            (
                tensor(T.V_ENC_EMBD_PATCH),
                tensor(T.V_SAM_PATCH_EMBD),
                tensor(T.V_SAM_NECK, 0),
                tensor(T.V_SAM_NECK, 2),
                tensor(T.V_SAM_NET_2),
                tensor(T.V_SAM_NET_3),
            )
        ),
    ),
)
