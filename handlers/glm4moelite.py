"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM) as Ollama wrote it.

llama.cpp's converter writes these checkpoints as `deepseek2` with MLA in
its absorbed form: one KV head, `key_length`/`value_length` the latent sizes
(kv_lora_rank + rope dims, kv_lora_rank) and `key_length_mla`/
`value_length_mla` the per-head sizes (qk_nope + rope dims, v_head_dim).
Ollama's converter until f63eea3 (2026-05-24, `convert/convert_glm4moelite.go`)
wrote architecture `glm4moelite` with the same tensors (`attn_k_b`/`attn_v_b`
already split) but the two pairs of lengths the other way round, the KV
heads per head, and no expert-group keys, nor the special-token ids that
llama.cpp's converter sets from GLM's tokens: end of turn `<|user|>` and of a
tool call `<|observation|>` (end-of-generation), BOS `[gMASK]` with
`add_bos_token = false` (the chat template writes `[gMASK]<sop>` itself).
The current form (`deepseek2`, since 9db4bdbad) has them and loads as it is.

Departures from Ollama's handler: the per-head lengths are
`key_length`/`value_length` of the blob (Ollama's handler takes both from
`key_length`, which gives `attn_v_b` the wrong shape whenever
v_head_dim != qk_nope + rope dims, and llama.cpp refuses the file); the
special tokens are found by their text, as llama.cpp's converter finds them
(Ollama's handler takes the 2nd and 3rd entries of `eos_token_ids`).
Ollama's converter drops the MTP layer, so the view has none.
"""

from gguf import MODEL_ARCH as A
from gguf import Keys

from compatfs.format.values import boolean, string, u32
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    CopyPrefixIfAbsent,
    Default,
    DefaultTokenId,
    DropPrefix,
    Set,
    Translation,
    arch,
    arch_is,
    has_key,
)

OLD, NEW = "glm4moelite.", arch(A.DEEPSEEK2)
K = ArchKeys(NEW)

# llama.cpp's converter (`_set_vocab_glm`) sets these from the tokens' text.
SPECIAL_TOKENS = (
    DefaultTokenId(Keys.Tokenizer.BOS_ID, "[gMASK]"),
    DefaultTokenId(Keys.Tokenizer.EOT_ID, "<|user|>"),
    DefaultTokenId(Keys.Tokenizer.EOM_ID, "<|observation|>"),
    DefaultTokenId(Keys.Tokenizer.UNK_ID, "<|endoftext|>"),
    Default(Keys.Tokenizer.ADD_BOS, boolean(False)),
    Default(Keys.Tokenizer.ADD_EOS, boolean(False)),
)

TEXT = Translation(
    name="glm4moelite",
    # Only the MLA form: the converter before 64737330a (January 2026) wrote
    # `attn_kv_b` unsplit and no `*_mla` lengths, which this table does not split.
    detect=arch_is("glm4moelite") & has_key(OLD + "attention.key_length_mla"),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        # The latent (absorbed) and per-head lengths trade places.
        CopyIfAbsent(OLD + "attention.key_length_mla", K.Attention.KEY_LENGTH),
        CopyIfAbsent(OLD + "attention.value_length_mla", K.Attention.VALUE_LENGTH),
        CopyIfAbsent(OLD + "attention.key_length", K.Attention.KEY_LENGTH_MLA),
        CopyIfAbsent(OLD + "attention.value_length", K.Attention.VALUE_LENGTH_MLA),
        CopyPrefixIfAbsent(OLD, f"{NEW}."),
        DropPrefix((OLD,)),
        # MLA shares one latent KV head.
        Set(K.Attention.HEAD_COUNT_KV, u32(1)),
        Default(K.LLM.EXPERT_GROUP_COUNT, u32(1)),
        Default(K.LLM.EXPERT_GROUP_USED_COUNT, u32(1)),
        *SPECIAL_TOKENS,
    ),
)
