"""Gemma 3n as Ollama wrote it: the text model of Gemma3nForConditionalGeneration.

Ollama's converter (`convert/convert_gemma3n.go`) kept the full vocabulary
(text, then the image/audio slots) in `token_embd` and the tokenizer, but the
per-layer embedding only for the text vocabulary; llama.cpp wants both
embeddings as long as the vocabulary, and its own converter pads the
per-layer one with zero rows for the image/audio slots (they take their
embeddings from the towers).  Ollama's layer instead cuts the vocabulary and
`token_embd` down to the per-layer rows; llama.cpp's form is the target here.

Ollama also named the local rope base `rope.freq_base_local` (llama.cpp:
`rope.freq_base_swa`; without it llama.cpp runs the sliding-window layers
with the global base) and the head size `head_dim` (llama.cpp:
`attention.key_length`/`value_length`), and wrote the tokenizer without
`add_space_prefix`, so llama.cpp would prepend a space to every prompt.

Departures from Ollama's handler, each toward llama.cpp's conversion:
- the per-layer embedding is padded, not the vocabulary cut (image/audio
  token ids stay valid);
- `tokenizer.ggml.eos_token_ids` (where Ollama's layer appends `<end_of_turn>`)
  is dropped: llama.cpp reads no EOS list and makes `<end_of_turn>`
  end-of-generation by its text;
- `<unusedN>` stay as typed (Ollama's layer types them normal; they are);
  the image markers become control, as in `handlers/gemma3.py`; Ollama's
  `[PADn]` slots become llama.cpp's unused `[PAD<id>]`;
- rope SWA base, head size, softcapping and `add_space_prefix` are set,
  which Ollama's handler leaves out; keys llama.cpp reads nowhere (Ollama's
  altup extras, `add_padding/unknown_token`, the SentencePiece vocabulary's
  BPE merges) are dropped, as its conversion has none of them.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import TokenType as TT

from compatfs.format.header import SourceGGUF
from compatfs.format.values import boolean, f32, string
from compatfs.translate import Op, PadRows
from compatfs.translate import (
    ArchKeys,
    BYTE_TOKENS,
    CopyIfAbsent,
    Default,
    Drop,
    Hide,
    PadTokensUnused,
    Produce,
    Set,
    TokenType,
    Translation,
    any_of,
    arch_is,
    has_key,
    rows_differ,
    tensor,
)

K = ArchKeys("gemma3n")
TOKEN_EMBD, PER_LAYER_EMBD = "token_embd.weight", "per_layer_token_embd.weight"


def padded_per_layer_embd(src: SourceGGUF) -> Op | None:
    """The per-layer embedding with zero rows up to `token_embd`'s rows
    (llama.cpp's converter pads the image/audio slots so); None when they agree."""
    tok, per_layer = src.tensors.get(TOKEN_EMBD), src.tensors.get(PER_LAYER_EMBD)
    if (
        tok is None
        or per_layer is None
        or len(tok.shape) != 2
        or not per_layer.shape
        or tok.shape[1] == per_layer.shape[-1]
    ):
        return None
    return PadRows.of(per_layer, tok.shape[1])


TEXT = Translation(
    name="gemma3n",
    detect=arch_is("gemma3n")
    & any_of(
        rows_differ(TOKEN_EMBD, PER_LAYER_EMBD),
        has_key("gemma3n.rope.freq_base_local"),
        ~has_key(Keys.Tokenizer.ADD_PREFIX),
    ),
    kv=(
        CopyIfAbsent("gemma3n.rope.freq_base_local", K.Rope.FREQ_BASE_SWA),
        CopyIfAbsent("gemma3n.head_dim", K.Attention.KEY_LENGTH),
        CopyIfAbsent("gemma3n.head_dim", K.Attention.VALUE_LENGTH),
        # Gemma 3n's published value; llama.cpp applies 30 whatever the key says.
        Default(K.LLM.FINAL_LOGIT_SOFTCAPPING, f32(30.0)),
        # Ollama's names and keys llama.cpp reads nowhere.
        Drop(
            (
                "gemma3n.rope.freq_base_local",
                "gemma3n.head_dim",
                "gemma3n.altup.correct_scale",
                "gemma3n.altup.lr_multiplier",
                "tokenizer.ggml.add_padding_token",
                "tokenizer.ggml.add_unknown_token",
                "tokenizer.ggml.eos_token_ids",
                # BPE merges: a SentencePiece vocabulary has none.
                Keys.Tokenizer.MERGES,
            )
        ),
        # Gemma's SentencePiece model: no dummy prefix, byte fallback.
        Set(Keys.Tokenizer.MODEL, string("llama")),
        Default(Keys.Tokenizer.ADD_PREFIX, boolean(False)),
        Default(Keys.Tokenizer.ADD_SEP, boolean(False)),
        TokenType(BYTE_TOKENS, TT.BYTE),
        TokenType(("<start_of_image>", "<end_of_image>"), TT.CONTROL),
        PadTokensUnused(),
    ),
    tensors=(
        # No Ollama converter wrote the towers into this file; a blob that has
        # them still loads as text (llama.cpp counts every tensor).
        Hide(("v.", "a.", "mm.")),
        Produce(tensor(T.PER_LAYER_TOKEN_EMBD), padded_per_layer_embd, consumes=(PER_LAYER_EMBD,)),
    ),
)
