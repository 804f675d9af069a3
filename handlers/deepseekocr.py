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

from compatfs.gguf_source import SourceGGUF
from compatfs.gguf_values import VT, Value, array, boolean, f32, string, u32
from compatfs.translation import (
    Copy, CopyEach, CopyPrefix, Count, Default, Drop, FromFirstBlock, Hide, KeepOnly, Rename, Set, Tensors,
    ToF32, Translation, arch_is, as_projector,
)

KVs = dict[str, Value]


# -- DeepSeek-OCR's own KV and tensor edits --------------------------------------------

@dataclass(frozen=True)
class SharedExpertCount:
    """`key` (u32) = the shared experts' stacked width (axis 0 of the first
    `<prefix><i>.<suffix>`) over `per_expert` (a u32 KV), when `key` is absent."""
    key: str
    prefix: str
    suffix: str
    per_expert: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        width = kv.get(self.per_expert)
        if self.key in kv or width is None or width.vtype != VT.UINT32 or not width.decode():
            return
        for i in sorted(src.block_ids(self.prefix)):
            t = src.tensors.get(f"{self.prefix}{i}.{self.suffix}")
            if t is not None:
                kv[self.key] = u32(t.shape[0] // width.decode())
                return


@dataclass(frozen=True)
class TimesFour:
    """`dst` (u32) = 4 x the u32 `src`, when `dst` is absent and `src` present."""
    src: str
    dst: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.src)
        if self.dst not in kv and value is not None and value.vtype == VT.UINT32:
            kv[self.dst] = u32(4 * value.decode())


@dataclass(frozen=True)
class MovePrefix:
    """Tensor edit: names starting with `old` start with `new` instead.  A
    move of the whole tower, applied after the renames of its inner names
    (unlike `Rename`, it may follow one on the same tensor)."""
    old: str
    new: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for t in ts:
            if t.name.startswith(self.old):
                t.name = self.new + t.name[len(self.old):]
        return ts


# -- the translations -------------------------------------------------------------------

OLD, NEW = "deepseekocr", "deepseek2-ocr"
DETECT = arch_is(OLD)

# llama.cpp's converter's template: the messages' contents, concatenated.
CHAT_TEMPLATE = "{% for m in messages %}{{m['content']}}{% endfor %}"

TEXT = Translation(
    name="deepseekocr",
    detect=DETECT,
    kv=(
        Set("general.architecture", string(NEW)),
        Drop((f"{OLD}.vision.", f"{OLD}.sam.")),
        CopyPrefix(f"{OLD}.", f"{NEW}."),
        Drop((f"{OLD}.",)),
        Default(f"{NEW}.attention.layer_norm_rms_epsilon", f32(1e-6)),
        # ffn_down_exps is [expert width, n_embd, experts]; the shared experts'
        # down projection [shared count x expert width, n_embd].
        FromFirstBlock(f"{NEW}.expert_feed_forward_length", "blk.", "ffn_down_exps.weight", axis=0),
        SharedExpertCount(f"{NEW}.expert_shared_count", "blk.", "ffn_down_shexp.weight",
                          per_expert=f"{NEW}.expert_feed_forward_length"),
        Default("tokenizer.chat_template", string(CHAT_TEMPLATE)),
    ),
    tensors=(Hide(("s.", "v.", "mm.")),),
)

V, SAM = f"{OLD}.vision.", f"{OLD}.sam."

CLIP = Translation(
    name="deepseekocr-clip",
    detect=DETECT,
    counts=(Count(V + "block_count", "v.blk."), Count(SAM + "block_count", "s.blk.")),
    kv=(
        CopyEach(V, "clip.vision.", ("block_count", "embedding_length", "image_size", "patch_size")),
        Copy(V + "head_count", "clip.vision.attention.head_count"),
        CopyEach(SAM, "clip.vision.sam.", ("block_count", "embedding_length", "head_count")),
        # The projector's output feeds the language model's embedding.
        Copy(f"{OLD}.embedding_length", "clip.vision.projection_dim"),
        # As llama.cpp's converter writes them for DeepSeek-OCR's config: the
        # feed-forward length as 4 x heads (unused by this projector), one CLIP
        # patch per SAM output cell, windows of 14, 2 to 9 tiles.
        TimesFour("clip.vision.attention.head_count", "clip.vision.feed_forward_length"),
        Default("clip.vision.projector.scale_factor", u32(1)),
        Default("clip.vision.window_size", u32(14)),
        Default("clip.vision.preproc_min_tiles", u32(2)),
        Default("clip.vision.preproc_max_tiles", u32(9)),
        Default("clip.vision.attention.layer_norm_epsilon", f32(1e-6)),
        Default("clip.vision.image_mean", array(VT.FLOAT32, (0.5, 0.5, 0.5))),
        Default("clip.vision.image_std", array(VT.FLOAT32, (0.5, 0.5, 0.5))),
        Set("clip.has_vision_encoder", boolean(True)),
        Set("clip.use_gelu", boolean(True)),
        Set("clip.projector_type", string("deepseekocr")),
        *as_projector(OLD),
    ),
    tensors=(
        KeepOnly(("s.", "v.", "mm.")),
        # SAM, renamed within `s.` and then moved under `v.sam.`.
        Rename("s.position_embd", "s.pos_embd.weight"),
        Rename(".attn.proj", ".attn.out", under="s.blk."),
        Rename(".attn.rel_pos_h", ".attn.pos_h.weight", under="s.blk."),
        Rename(".attn.rel_pos_w", ".attn.pos_w.weight", under="s.blk."),
        Rename(".norm1", ".pre_ln", under="s.blk."),
        Rename(".norm2", ".post_ln", under="s.blk."),
        MovePrefix("s.", "v.sam."),
        # CLIP.
        Rename("v.pre_layrnorm", "v.pre_ln"),
        Rename(".self_attn.qkv_proj", ".attn_qkv", under="v.blk."),
        Rename(".self_attn.out_proj", ".attn_out", under="v.blk."),
        Rename(".layer_norm1", ".ln1", under="v.blk."),
        Rename(".layer_norm2", ".ln2", under="v.blk."),
        Rename(".mlp.fc1", ".ffn_up", under="v.blk."),
        Rename(".mlp.fc2", ".ffn_down", under="v.blk."),
        # The projector and the learned layout embeddings.
        Rename("mm.layers", "mm.model.fc"),
        Rename("mm.image_newline", "v.image_newline"),
        Rename("mm.view_seperator", "v.view_seperator"),
        # Convolution kernels and embeddings in F32, as llama.cpp's converter keeps them.
        ToF32(("v.patch_embd.weight", "v.sam.patch_embd.weight", "v.sam.neck.0.weight", "v.sam.neck.2.weight",
               "v.sam.net_2.weight", "v.sam.net_3.weight")),
    ),
)
