"""OLMo 3 as Ollama wrote it.

llama.cpp b11434 has no `olmo3` architecture: its converter writes OLMo 3
checkpoints as `olmo2` (the OLMo 2 loader reads the sliding-window pattern
that OLMo 3 adds).  Ollama's converter (`convert/convert_olmo.go`, for
Olmo3ForCausalLM only) wrote `olmo3` from ffbe8e076 (2025-12-15) to f63eea3
(2026-05-24) and `olmo2` since 9db4bdbad; both forms differ from llama.cpp's
conversion of the same weights in that

- the YaRN attention factor is stored as `rope.scaling.attn_factor`, which
  llama.cpp multiplies into the attention scale on top of the YaRN
  magnitude scaling it derives from the factor itself (so the scale is
  applied twice); llama.cpp's converter writes it as
  `rope.scaling.yarn_attn_factor`, which the OLMo 2 loader does not read;
- the current form writes no `add_bos_token`, and llama.cpp then adds a BOS
  (the `llama-bpe` pre-tokenizer defaults to one) that OLMo's tokenizer does
  not add.

Departure from Ollama's handler (which only renames the architecture): the
attention factor is moved and the BOS default stated, as llama.cpp's
conversion has them.
"""

from gguf import MODEL_ARCH as A
from gguf import Keys

from compatfs.format.values import boolean, string
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    CopyPrefixIfAbsent,
    Default,
    Drop,
    DropPrefix,
    Set,
    Translation,
    When,
    any_of,
    arch,
    arch_is,
    has_key,
    value_is,
)

NEW = arch(A.OLMO2)
K = ArchKeys(NEW)
# Ollama's name of YaRN's attention factor (llama.cpp's: rope.scaling.yarn_attn_factor).
ATTN_FACTOR = "olmo2.rope.scaling.attn_factor"

TEXT = Translation(
    name="olmo3",
    detect=arch_is("olmo3")
    | (
        arch_is("olmo2")
        & any_of(
            # Neither key is ever written by llama.cpp's converter.
            has_key("tokenizer.ggml.eos_token_ids"),
            has_key(ATTN_FACTOR),
        )
    ),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        CopyPrefixIfAbsent("olmo3.", f"{NEW}."),
        DropPrefix(("olmo3.",)),
        When(
            value_is("olmo3.rope.scaling.type", "yarn") | value_is(K.Rope.SCALING_TYPE, "yarn"),
            (CopyIfAbsent(ATTN_FACTOR, K.Rope.SCALING_YARN_ATTN_FACTOR), Drop((ATTN_FACTOR,))),
        ),
        Default(Keys.Tokenizer.ADD_BOS, boolean(False)),
        Default(Keys.Tokenizer.ADD_EOS, boolean(False)),
    ),
)
