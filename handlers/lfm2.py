"""LFM2 (Liquid) as Ollama wrote it.

Older converters named the norm before the output projection `output_norm`
(llama.cpp: `token_embd_norm`) and could write a feed-forward length that
does not match the tensors.  The current converter, from the LFM2 release
config layout (`full_attn_idxs`), gives every layer KV heads, so llama.cpp
looks for attention tensors in the short-convolution layers.
"""

from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.values import string
from compatfs.translate import (
    ArchKeys,
    FromShape,
    Rename,
    Set,
    Translation,
    ZeroPerLayer,
    any_of,
    arch_is,
    has_tensor,
    per_layer_mismatch,
    tensor,
)

K = ArchKeys("lfm2")

TEXT = Translation(
    name="lfm2",
    detect=arch_is("lfm2")
    & any_of(
        has_tensor("output_norm.weight") & ~has_tensor("token_embd_norm.weight"),
        per_layer_mismatch(K.Attention.HEAD_COUNT_KV, "blk.{}.attn_q.weight"),
    ),
    kv=(
        Set(Keys.Tokenizer.PRE, string("lfm2")),
        FromShape(K.LLM.FEED_FORWARD_LENGTH, "blk.0.ffn_gate.weight", axis=1),
        # Only attention layers have KV heads.
        ZeroPerLayer(K.Attention.HEAD_COUNT_KV, "blk.{}.attn_q.weight"),
    ),
    tensors=(Rename("output_norm.weight", tensor(T.TOKEN_EMBD_NORM)),),
)
