"""Llama 3 instruct models as Ollama published them.

The files load, but leave out the pre-tokenizer (or call it "default") and
point the end-of-sequence token at `<|end_of_text|>` (128001) although turns
end with `<|eot_id|>` (128009).
"""
from compatfs.gguf_values import VT, array, string, u32
from compatfs.translation import (
    Set, Translation, any_of, arch_is, has_key, missing_or_default, str_contains, token_is, value_is,
)

EOT_ID = 128009
END_OF_TEXT_ID = 128001

PRE_MISSING = missing_or_default("tokenizer.ggml.pre")

LLAMA3 = Translation(
    name="llama3",
    detect=arch_is("llama") & token_is(EOT_ID, "<|eot_id|>") & any_of(
        token_is(128006, "<|start_header_id|>"),
        str_contains("tokenizer.chat_template", "<|start_header_id|>"),
        str_contains("tokenizer.chat_template", "<|eot_id|>"),
    ) & (PRE_MISSING | value_is("tokenizer.ggml.eos_token_id", END_OF_TEXT_ID)),
    kv=(
        Set("tokenizer.ggml.pre", string("llama-bpe"), when=PRE_MISSING),
        Set("tokenizer.ggml.eos_token_id", u32(EOT_ID),
            when=~has_key("tokenizer.ggml.eos_token_id") | value_is("tokenizer.ggml.eos_token_id", END_OF_TEXT_ID)),
        Set("tokenizer.ggml.eot_token_id", u32(EOT_ID),
            when=~has_key("tokenizer.ggml.eot_token_id") | value_is("tokenizer.ggml.eot_token_id", END_OF_TEXT_ID)),
        Set("tokenizer.ggml.eos_token_ids", array(VT.INT32, [EOT_ID])),
    ),
)
