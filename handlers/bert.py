"""BERT-architecture embedding models with a SentencePiece unigram tokenizer
(XLM-RoBERTa: Snowflake Arctic Embed 2) as Ollama published them.

llama.cpp's converter writes such a model as `bert` with tokenizer `t5`
(unigram) and the tokenizer's normalization table as the raw byte array
`tokenizer.ggml.precompiled_charsmap`.  In the published
snowflake-arctic-embed2 blob that table is an array of strings, one
character each, which spell the table's base64 text; llama.cpp's vocabulary
loader accepts only an (u)int8 array there and refuses the model.  The one
change is to decode it back to the bytes.  The edit is particular to these
files: `CharsmapFromBase64` is defined here.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from compatfs.format.header import SourceGGUF
from compatfs.format.values import VT, Value, array
from compatfs.translate import KVEdit, Pred, Translation, arch_is, value_is

CHARSMAP = Keys.Tokenizer.PRECOMPILED_CHARSMAP


def base64_chars(value: Value | None) -> str | None:
    """The text spelled by a string array of one-byte strings, else None."""
    if value is None or value.element_type != VT.STRING:
        return None
    n = value.count
    items = np.frombuffer(value.payload, dtype=np.uint8, offset=12)
    if n == 0 or items.size != 9 * n:  # each element: u64 length 1, then its byte
        return None
    items = items.reshape(n, 9)
    if (items[:, :8].view("<u8")[:, 0] != 1).any():
        return None
    return items[:, 8].tobytes().decode("ascii", "replace")


@dataclass(frozen=True)
class CharsmapFromBase64(KVEdit):
    """`key`, an array of single-character strings spelling base64 text,
    becomes the bytes that text encodes (UINT8 array); anything else, or
    text that is not base64, is left as it is."""

    key: str

    def apply(self, kv: dict[str, Value], src: SourceGGUF) -> None:
        text = base64_chars(kv.get(self.key))
        if text is None:
            return
        text = text.rstrip("=")
        try:
            raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            return
        if raw:
            kv[self.key] = array(VT.UINT8, np.frombuffer(raw, dtype=np.uint8))


def charsmap_is_strings() -> Pred:
    return Pred(f"{CHARSMAP} is a string array", lambda s: base64_chars(s.kvs.get(CHARSMAP)) is not None)


TEXT = Translation(
    name="bert",
    detect=arch_is("bert") & value_is(Keys.Tokenizer.MODEL, "t5") & charsmap_is_strings(),
    kv=(CharsmapFromBase64(CHARSMAP),),
)
