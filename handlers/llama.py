"""Llama 3 instruct models as Ollama published them.

The files load, but leave out the pre-tokenizer (or call it "default") and
point the end-of-sequence token at `<|end_of_text|>` (128001) although turns
end with `<|eot_id|>` (128009).
"""

from gguf import Keys

from compatfs.format.values import VT, array, string, u32
from compatfs.translate import (
    Set,
    Translation,
    any_of,
    arch_is,
    has_key,
    missing_or_default,
    str_contains,
    token_is,
    value_is,
)

EOT_ID = 128009
END_OF_TEXT_ID = 128001

PRE_MISSING = missing_or_default(Keys.Tokenizer.PRE)

LLAMA3 = Translation(
    name="llama3",
    detect=arch_is("llama")
    & token_is(EOT_ID, "<|eot_id|>")
    & any_of(
        token_is(128006, "<|start_header_id|>"),
        str_contains(Keys.Tokenizer.CHAT_TEMPLATE, "<|start_header_id|>"),
        str_contains(Keys.Tokenizer.CHAT_TEMPLATE, "<|eot_id|>"),
    )
    & (PRE_MISSING | value_is(Keys.Tokenizer.EOS_ID, END_OF_TEXT_ID)),
    kv=(
        Set(Keys.Tokenizer.PRE, string("llama-bpe"), when=PRE_MISSING),
        Set(
            Keys.Tokenizer.EOS_ID,
            u32(EOT_ID),
            when=~has_key(Keys.Tokenizer.EOS_ID) | value_is(Keys.Tokenizer.EOS_ID, END_OF_TEXT_ID),
        ),
        Set(
            Keys.Tokenizer.EOT_ID,
            u32(EOT_ID),
            when=~has_key(Keys.Tokenizer.EOT_ID) | value_is(Keys.Tokenizer.EOT_ID, END_OF_TEXT_ID),
        ),
        Set("tokenizer.ggml.eos_token_ids", array(VT.INT32, [EOT_ID])),
    ),
)
