"""Snowflake Arctic Embed 2 blobs as Ollama published them (the legacy form of
`handlers/bert.py`): an XLM-RoBERTa encoder as a `bert` file with a `t5`
(SentencePiece unigram) tokenizer whose normalization table
`tokenizer.ggml.precompiled_charsmap` is stored as an array of one-character
strings spelling the table's base64 text.

No Ollama converter wrote this file: `convert/convert_bert.go` (5a28b9cf5,
2024-06-06, to f63eea3, 2026-05-24) converts BertModel only, with tokenizer
`bert` (WordPiece) and no charsmap.  snowflake-arctic-embed2 (published
December 2024) is a GGUF of llama.cpp's XLM-RoBERTa conversion imported as
it was, charsmap and all.  The string form is documented by Ollama itself:
its vendored llama.cpp patch "fix kv loading on snowflake-arctic-embed
models" (4289c7435, 2025-03-07, `llama/patches/0019-fix-string-arr-kv-loading.patch`)
made the loader read that key's raw data whatever its type, 4b903f088
(2025-05-13, "fix crash on snowflake embedding model", issue #10685) removed
the (u)int8 assert that v0.7.0 tripped on with this blob, and the compat
layer that replaced the patches (`llama/compat/llama-ollama-compat.cpp`,
`handle_snowflake_arctic_embed2`, 9db4bdbad, 2026-05-29) detects
`bert` + tokenizer `t5` + a string-array charsmap of single characters and
decodes it as base64.

Everything else is what llama.cpp's XLM-RoBERTa conversion writes
(`conversion/bert.py`, `_xlmroberta_set_vocab`): tokens `<s> <pad> </s>
<unk>` then the pieces and `<mask>`, `add_space_prefix` and
`remove_extra_whitespaces` true, one token type, CLS pooling (Arctic Embed 2
pools the CLS token), position embeddings without XLM-R's two padding rows,
KVs in the converter's order.  The charsmap here is a small table built in
code: NFKC's folding of the no-break space and the fullwidth ASCII forms.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import spm_pieces


SNOWFLAKE: Dims = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, context_length=128, eps=1e-5, pooling_type=2)
CONTROL, UNKNOWN, NORMAL = 3, 2, 1  # tokenizer.ggml.token_type values

# NFKC on a few characters: the no-break space, and U+FF01..U+FF5E (fullwidth ASCII).
NORMALIZE = {"\u00a0": " ", **{chr(0xFF01 + i): chr(0x21 + i) for i in range(0x5E)}}


def precompiled_charsmap(mapping: dict[str, str]) -> bytes:
    """SentencePiece's compiled normalization table for `mapping`: a u32 byte
    count, a double-array trie over the UTF-8 bytes of the keys in the
    XOR-compressed layout llama.cpp's UGM tokenizer walks (per unit: label in
    bits 0-7, has-value in bit 8, base from bit 10; value units carry bit 31
    and an offset), then the NUL-terminated replacements the values point to.
    Each inner node gets a 256-unit block for its children (and its value at
    the block's start); the values of childless nodes share blocks, as value
    units never match a label."""
    trie: dict = {}
    replacements = bytearray()
    for key, text in sorted(mapping.items()):
        node = trie
        for b in key.encode("utf-8"):
            node = node.setdefault(b, {})
        node[None] = len(replacements)
        replacements += text.encode("utf-8") + b"\0"

    units: list[int] = [0] * 256  # block 0: the root's children (root base 0)
    leaves: list[int] = []  # free value slots of the shared block(s)

    def new_block() -> int:
        units.extend([0] * 256)
        return len(units) - 256

    def place(node: dict, offset: int) -> None:
        """Children of `node` at offset ^ label, its value at `offset`."""
        if None in node:
            units[offset] = (1 << 31) | node[None]
        for label, child in sorted((k, v) for k, v in node.items() if k is not None):
            index = offset ^ label
            if any(k is not None for k in child):
                child_offset = new_block()
            else:
                if not leaves:
                    start = new_block()
                    leaves.extend(range(start, start + 256))
                child_offset = leaves.pop(0)
            units[index] = ((index ^ child_offset) << 10) | ((None in child) << 8) | label
            place(child, child_offset)

    place(trie, 0)
    xcda = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(xcda)) + xcda + bytes(replacements)


def xlmr_tokens() -> tuple[list[str], list[float], list[int]]:
    """A small unigram vocabulary in XLM-RoBERTa's layout: `<s> <pad> </s> <unk>`,
    the '\u2581' word pieces and single characters (scores -rank), `<mask>` last."""
    pieces, singles, _ = spm_pieces(150)
    body = list(pieces) + [c for c in singles if c not in pieces]
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *body, "<mask>"]
    scores = [0.0] * 4 + [-float(i) for i in range(len(body))] + [0.0]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [NORMAL] * len(body) + [CONTROL]
    return tokens, scores, types


def legacy_snowflake_arctic_embed2(path: Path, seed: int = 0) -> Path:
    """A 2-layer XLM-RoBERTa `bert` embedding model as snowflake-arctic-embed2's
    blob has it; untranslated, llama.cpp refuses the string-typed charsmap."""
    p = SNOWFLAKE
    rng = np.random.default_rng(seed)
    tokens, scores, types = xlmr_tokens()
    charsmap = base64.b64encode(precompiled_charsmap(NORMALIZE)).decode("ascii")
    kvs: dict[str, Any] = {
        "general.name": "snowflake-arctic-embed-l-v2.0",
        "bert.block_count": p["n_layer"],
        "bert.context_length": p["context_length"],
        "bert.embedding_length": p["n_embd"],
        "bert.feed_forward_length": p["n_ff"],
        "bert.attention.head_count": p["n_head"],
        "bert.attention.layer_norm_epsilon": p["eps"],
        "general.file_type": 1,
        "bert.attention.causal": False,
        "bert.pooling_type": p["pooling_type"],
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.token_type_count": 1,
        "tokenizer.ggml.remove_extra_whitespaces": True,
        "tokenizer.ggml.precompiled_charsmap": list(charsmap),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.seperator_token_id": 2,
        "tokenizer.ggml.padding_token_id": 1,
        "tokenizer.ggml.cls_token_id": 0,
        "tokenizer.ggml.mask_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": True,
        "general.quantization_version": 2,
    }
    E, F = p["n_embd"], p["n_ff"]

    def norm() -> tuple[np.ndarray, T]:
        return (1.0 + normal(rng, (E,), 0.05)).astype(np.float32), T.F32

    def bias(n: int) -> tuple[np.ndarray, T]:
        return normal(rng, (n,), 0.02), T.F32

    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (normal(rng, (len(tokens), E), 0.1), T.F16),
        "position_embd.weight": (normal(rng, (p["context_length"], E), 0.1), T.F16),
        "token_types.weight": (normal(rng, (1, E), 0.1), T.F32),
        "token_embd_norm.weight": norm(),
        "token_embd_norm.bias": bias(E),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[b + proj + ".weight"] = (normal(rng, (E, E), 0.1), T.F16)
            t[b + proj + ".bias"] = bias(E)
        t[b + "attn_output_norm.weight"], t[b + "attn_output_norm.bias"] = norm(), bias(E)
        t[b + "ffn_up.weight"], t[b + "ffn_up.bias"] = (normal(rng, (F, E), 0.1), T.F16), bias(F)
        t[b + "ffn_down.weight"], t[b + "ffn_down.bias"] = (normal(rng, (E, F), 0.1), T.F16), bias(E)
        t[b + "layer_output_norm.weight"], t[b + "layer_output_norm.bias"] = norm(), bias(E)
    return write(path, "bert", kvs, t, ollama_order=False)
