"""Gemma 4 as Ollama wrote it: one monolithic `gemma4` blob with the text
model, the vision tower (`v.*`), the projector (`mm.*`) and, for the audio
models, the conformer (`a.*`, `mm.a.*`).

llama.cpp's own conversion writes the text model to `model.gguf` and the
vision (and audio) side to a `clip` mmproj with projector type `gemma4v`
(`gemma4a`).  Text tensors already carry llama.cpp's names, as do the vision
tensors; what differs is the tokenizer metadata, the embedded towers, and in
files from older converters the MoE layout and the packed vision clamps:

- `tokenizer.ggml.model` is `llama` (SentencePiece), where Gemma 4's
  tokenizer is BPE with byte fallback (llama.cpp: `gemma4`).  Its byte
  tokens `<0x..>` are typed normal (llama.cpp's converter: byte), the media
  markers user-defined (control), the scores are the token ids (llama.cpp's
  converter writes its BPE placeholder -1000; BPE does not read them).
- Older converters split the experts' gate and up projections
  (`ffn_gate_exps`, `ffn_up_exps`), which llama.cpp's converter writes fused
  per expert (`ffn_gate_up_exps`), and named the per-expert scale
  `ffn_gate_inp.per_expert_scale` (`ffn_down_exps.scale`).
- The vision tower's clippable-linear ranges are packed in one F32 tensor
  `v.clamp_data`; llama.cpp reads one scalar tensor per value.

The clamp layout is Gemma 4's own: the tensor edit `UnpackClamps` is defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import GGMLQuantizationType as DT
from gguf import TokenType as TT

from compatfs.format.header import SourceGGUF
from compatfs.format.values import VT, array, boolean, string, u32
from compatfs.translate import ConcatRows, Op
from compatfs.translate import (
    ArchKeys,
    BYTE_TOKENS,
    CopyEachIfAbsent,
    CopyIfAbsent,
    Count,
    Default,
    Drop,
    DropPrefix,
    FillArray,
    Hide,
    KeepOnly,
    ProducePerBlock,
    Rename,
    Set,
    TensorEdit,
    Tensors,
    ToF32,
    TokenType,
    Translation,
    ViewTensor,
    When,
    any_of,
    arch_is,
    as_projector,
    base,
    has_tensor_prefix,
    leaf,
    tensor,
    value_is,
    whole,
)


# -- Gemma 4's own tensor edit ------------------------------------------------------------

CLAMPS = ("input_min", "input_max", "output_min", "output_max")


@dataclass(frozen=True)
class UnpackClamps(TensorEdit):
    """Tensor edit: the F32 tensor `packed` holds, for each block i <
    KV `blocks` and each of its linears `per_block` (`<block>.<linear>`), then
    for each linear of `after`, the four values of `CLAMPS`; each value
    becomes a 1-element F32 tensor `<linear>.<clamp>` (served from its 4 bytes
    of the blob), and `packed` goes.  A `packed` of another size, or a block
    count other than the blocks the blob holds, leaves it alone."""

    packed: str
    blocks: str
    block: str  # e.g. "v.blk.{}"
    per_block: tuple[str, ...]
    after: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        t = src.tensors.get(self.packed)
        blocks = src.block_ids(self.block.partition("{}")[0])
        if whole(src.kvs.get(self.blocks)) != len(blocks) or blocks != frozenset(range(len(blocks))):
            return ts
        linears = [f"{self.block.format(i)}.{lin}" for i in range(len(blocks)) for lin in self.per_block]
        linears += list(self.after)
        if t is None or t.dtype != DT.F32 or t.shape != (len(linears) * len(CLAMPS),):
            return ts
        ts = [v for v in ts if v.source is None or v.source.name != self.packed]
        for j, (lin, clamp) in enumerate((lin, c) for lin in linears for c in CLAMPS):
            name, offset = f"{lin}.{clamp}", t.offset + 4 * j
            ts.append(ViewTensor(name, (1,), DT.F32, source=t.part(name, (1,), DT.F32, 4 * j), order=offset))
        return ts


def gate_up_experts(src: SourceGGUF, i: int) -> Op | None:
    """Block i's split expert gate and up stacks, fused per expert, unless it
    has them fused already or carries scale sidecars (then llama.cpp loads
    the split pair as it is)."""
    gate, up = src.tensors.get(f"blk.{i}.ffn_gate_exps.weight"), src.tensors.get(f"blk.{i}.ffn_up_exps.weight")
    sidecars = (f"blk.{i}.ffn_{p}_exps.{s}" for p in ("gate", "up") for s in ("scale", "input_scale"))
    if (
        gate is None
        or up is None
        or f"blk.{i}.ffn_gate_up_exps.weight" in src.tensors
        or any(s in src.tensors for s in sidecars)
        or gate.dtype != up.dtype
        or gate.shape != up.shape
        or len(gate.shape) != 3
    ):
        return None
    return ConcatRows.of(gate, up)


# -- the translations -----------------------------------------------------------------------

# llama.cpp's conversion keeps the towers in the mmproj and names the
# tokenizer `gemma4`; any of these marks the blob as Ollama-written.  (Split
# expert tensors alone do not: llama.cpp loads them too.)
K = ArchKeys("gemma4")
DETECT = arch_is("gemma4") & any_of(
    has_tensor_prefix("v."),
    has_tensor_prefix("a."),
    has_tensor_prefix("mm."),
    has_tensor_prefix("model.vision_tower."),
    value_is(Keys.Tokenizer.MODEL, "llama"),
)

# Image and audio markers: special tokens of Gemma 4's processor, control in
# llama.cpp's conversion, user-defined in Ollama's.  (The other added tokens,
# `<|turn>` and the like, stay user-defined: see the tests.)
MEDIA_MARKERS = ("<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>")

TEXT = Translation(
    name="gemma4",
    detect=DETECT,
    counts=(Count(K.LLM.BLOCK_COUNT, "blk."),),
    kv=(
        # Gemma 4's tokenizer is BPE with SentencePiece-style byte fallback;
        # as `llama` (SPM) its special tokens split into pieces.
        Set(Keys.Tokenizer.MODEL, string("gemma4"), when=value_is(Keys.Tokenizer.MODEL, "llama")),
        TokenType(BYTE_TOKENS, TT.BYTE),
        TokenType(MEDIA_MARKERS, TT.CONTROL),
        FillArray(Keys.Tokenizer.SCORES, -1000.0),
        Default(Keys.Tokenizer.ADD_PREFIX, boolean(False)),
        Default(Keys.Tokenizer.ADD_SEP, boolean(False)),
        # The tower hyperparameters go to the mmproj; the pre-tokenizer is
        # implied by the model `gemma4`; llama.cpp reads no EOS list.
        DropPrefix(("gemma4.vision.", "gemma4.audio.")),
        Drop((Keys.Tokenizer.PRE, "tokenizer.ggml.eos_token_ids")),
    ),
    tensors=(
        Hide(("v.", "a.", "mm.", "model.vision_tower.")),
        ProducePerBlock(
            K.LLM.BLOCK_COUNT,
            tensor(T.FFN_GATE_UP_EXP, "{}"),
            gate_up_experts,
            consumes=("blk.{}.ffn_gate_exps.weight", "blk.{}.ffn_up_exps.weight"),
        ),
        Rename(".ffn_gate_inp.per_expert_scale", leaf(T.FFN_DOWN_EXP) + ".scale"),
    ),
)

HAS_VISION, HAS_AUDIO = has_tensor_prefix("v."), has_tensor_prefix("a.")

CLIP = Translation(
    name="gemma4-clip",
    detect=DETECT & (HAS_VISION | HAS_AUDIO),
    counts=(Count("gemma4.vision.block_count", "v.blk."), Count("gemma4.audio.block_count", "a.blk.")),
    kv=(
        When(
            HAS_VISION,
            (
                CopyEachIfAbsent(
                    "gemma4.vision.",
                    "clip.vision.",
                    (
                        "block_count",
                        "embedding_length",
                        "feed_forward_length",
                        "attention.head_count",
                        "attention.layer_norm_epsilon",
                        "patch_size",
                    ),
                ),
                # Unused by clip.cpp (images are resized to a token budget);
                # llama.cpp's converter writes 224.
                Default(Keys.ClipVision.IMAGE_SIZE, u32(224)),
                # The projector's output feeds the language model's embedding.
                CopyIfAbsent(K.LLM.EMBEDDING_LENGTH, Keys.ClipVision.PROJECTION_DIM),
                # The tower normalises pixels itself (`v.std_bias`, `v.std_scale`).
                Default(Keys.ClipVision.IMAGE_MEAN, array(VT.FLOAT32, [0.0, 0.0, 0.0])),
                Default(Keys.ClipVision.IMAGE_STD, array(VT.FLOAT32, [1.0, 1.0, 1.0])),
                Set(Keys.Clip.HAS_VISION_ENCODER, boolean(True)),
                Set(Keys.ClipVision.PROJECTOR_TYPE, string("gemma4v")),
            ),
        ),
        When(
            HAS_AUDIO,
            (
                CopyEachIfAbsent(
                    "gemma4.audio.",
                    "clip.audio.",
                    (
                        "block_count",
                        "embedding_length",
                        "feed_forward_length",
                        "attention.head_count",
                        "attention.layer_norm_epsilon",
                    ),
                ),
                Default(Keys.ClipAudio.NUM_MEL_BINS, u32(128)),
                CopyIfAbsent(K.LLM.EMBEDDING_LENGTH, Keys.ClipAudio.PROJECTION_DIM),
                Set(Keys.Clip.HAS_AUDIO_ENCODER, boolean(True)),
                Set(Keys.ClipAudio.PROJECTOR_TYPE, string("gemma4a")),
            ),
        ),
        *as_projector("gemma4"),
    ),
    tensors=(
        KeepOnly(("v.", "a.", "mm.")),
        UnpackClamps(
            "v.clamp_data",
            "gemma4.vision.block_count",
            "v.blk.{}",
            per_block=("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down"),
            after=("mm.input_projection",),
        ),
        # llama.cpp's converter keeps the position table in F32.
        ToF32((tensor(T.V_ENC_EMBD_POS),)),
        # Audio: Ollama's names for the conformer's input and output projections ...
        Rename("a.pre_encode.out.weight", tensor(T.A_ENC_INP_PROJ)),
        Rename("mm.a.fc", base(T.A_ENC_OUT)),
        # ... and its block norms (in this order: ln2 is renamed before it is reused).
        Rename(".ln1", leaf(T.A_ENC_ATTN_PRE_NORM), under="a.blk."),
        Rename(".ln2", leaf(T.A_ENC_ATTN_POST_NORM), under="a.blk."),
        Rename(".layer_pre_norm", leaf(T.A_ENC_OUTPUT_NORM), under="a.blk."),
        Rename(".linear_pos", leaf(T.A_ENC_ATTN_K_REL), under="a.blk."),
    ),
)
