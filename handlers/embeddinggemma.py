"""EmbeddingGemma as Ollama published it.

The first published blobs (embeddinggemma:300m, September 2025) are `gemma3`
files with the sentence-transformers projection head as two extra matrices
`dense.0.weight`/`dense.1.weight`; llama.cpp loads EmbeddingGemma as
`gemma-embedding` (bidirectional attention, the head as `dense_2`/`dense_3`
with its sizes in `dense_{2,3}_feat_{in,out}`).  As `gemma3` llama.cpp
refuses the two unclaimed tensors.  The current converter writes
`gemma-embedding` itself, but, as every Ollama Gemma file, without
`tokenizer.ggml.add_space_prefix`: llama.cpp then prepends a space to each
input and the embeddings differ from the model's own ("hello" is another
token).  This translation claims both and must run before `gemma3`'s.

Departures from Ollama's handler, toward llama.cpp's conversion: the
`gemma3.*` keys are moved, not copied (llama.cpp's conversion has none); the
local rope base is taken from the blob where it has one (Ollama's layer
always writes 10000); the tokenizer gets `add_space_prefix=false` and
control-typed image markers (as `handlers/gemma3.py`), also for the current
form, which Ollama's layer leaves alone; Ollama's `add_padding/unknown_token`
and BPE merges (llama.cpp reads neither for a SentencePiece vocabulary) are
dropped.  Ollama's handler also renames a
`norm.weight` to `output_norm.weight`; Ollama's own reader of these files
(`model/models/gemma3`) loads only `output_norm`, so no blob it ran has
that name, and the rename is left out.
"""

from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import TokenType as TT

from compatfs.format.values import boolean, f32, string
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    CopyPrefixIfAbsent,
    Default,
    Drop,
    DropPrefix,
    FromShape,
    Rename,
    Set,
    TokenType,
    Translation,
    arch,
    arch_is,
    base,
    has_key,
    has_tensor,
)

ARCH = arch(A.GEMMA_EMBEDDING)
K = ArchKeys(ARCH)

TEXT = Translation(
    name="embeddinggemma",
    detect=(arch_is("gemma3") & has_tensor("dense.0.weight")) | (arch_is(ARCH) & ~has_key(Keys.Tokenizer.ADD_PREFIX)),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(ARCH)),
        # llama.cpp reads the hyperparameters under the architecture's name.
        CopyPrefixIfAbsent("gemma3.", f"{ARCH}."),
        CopyIfAbsent(f"{ARCH}.rope.local.freq_base", K.Rope.FREQ_BASE_SWA),
        Default(K.Rope.FREQ_BASE_SWA, f32(10_000.0)),
        # The projection head: [n_embd, n_ff] up, [n_ff, n_embd] down (ggml shapes).
        FromShape(f"{ARCH}.dense_2_feat_in", "dense.0.weight", axis=0),
        FromShape(f"{ARCH}.dense_2_feat_out", "dense.0.weight", axis=1),
        FromShape(f"{ARCH}.dense_3_feat_in", "dense.1.weight", axis=0),
        FromShape(f"{ARCH}.dense_3_feat_out", "dense.1.weight", axis=1),
        # Attention is bidirectional and the sliding-window layout fixed for
        # this architecture: keys from the causal model's file would override them.
        DropPrefix(("gemma3.", f"{ARCH}.rope.local.")),
        Drop(
            (
                K.Attention.CAUSAL,
                K.Attention.SLIDING_WINDOW_PATTERN,
                "tokenizer.ggml.add_padding_token",
                "tokenizer.ggml.add_unknown_token",
                # BPE merges: a SentencePiece vocabulary has none.
                Keys.Tokenizer.MERGES,
            )
        ),
        # Gemma's SentencePiece model adds no dummy prefix.
        Default(Keys.Tokenizer.ADD_PREFIX, boolean(False)),
        Default(Keys.Tokenizer.ADD_SEP, boolean(False)),
        TokenType(("<start_of_image>", "<end_of_image>"), TT.CONTROL),
    ),
    tensors=(Rename("dense.0", base(T.DENSE_2_OUT)), Rename("dense.1", base(T.DENSE_3_OUT))),
)
