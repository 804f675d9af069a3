"""Gemma 3 blobs as Ollama's converters wrote them (the legacy form of `handlers/gemma3.py`).

* `convert/convert_gemma3.go` at 80c7ce381 (March 2025, the converter that produced
  the first published gemma3 blobs): nested `gemma3.rope.{global,local}.freq_base`
  and `final_logit_softcapping` (default 30) for Gemma3ForCausalLM; the
  Gemma3ForConditionalGeneration branch writes no rope and no rms-epsilon keys at all,
  `context_length` 131072 and the head counts from a table keyed on the block
  count (34/48/62 -> 8/4, 16/8, 32/16; any other count reads *top-level*
  `num_attention_heads` which a multimodal config lacks, i.e. writes 0 heads).
* `convert/convert.go` ModelParameters.KV at that time: `tokenizer.ggml.pre`
  "default", and `add_<type>_token` for *every* special token found in
  tokenizer.json's added tokens (so `add_padding_token`/`add_unknown_token` appear).
* `convert/tokenizer_spm.go`: SentencePiece types kept, `<start_of_turn>`/
  `<end_of_turn>` forced to CONTROL, added_tokens.json entries appended with score
  -1000 and type USER_DEFINED (4) -- the `<image_soft_token>` past the embedding rows.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np

from .core import Dims, T, normal, write
from .tokenizers import byte_tokens, spm_pieces


GEMMA3_TEXT: Dims = dict(
    n_layer=4,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=1,
    head_dim=16,
    context_length=32768,
    sliding_window=512,
    rope_global=1_000_000.0,
    rope_local=10_000.0,
    final_logit_softcapping=30.0,
    bos=2,
    eos=1,
    pad=0,
    unk=3,
    start_of_turn=10,
    end_of_turn=11,
)


GEMMA3_VISION: Dims = dict(
    # 34 blocks: the only way Ollama's converter writes non-zero head counts for a
    # Gemma3ForConditionalGeneration checkpoint (table keyed on 34/48/62 blocks).
    n_layer=34,
    n_embd=64,
    n_ff=128,
    n_head=8,
    n_head_kv=4,
    head_dim=16,
    context_length=131072,
    sliding_window=1024,
    n_vocab=576,
    tokens_per_image=4,
    v_n_layer=2,
    v_n_embd=64,
    v_n_ff=128,
    v_n_head=4,
    v_eps=1e-6,
    image_size=112,
    patch_size=14,
    num_channels=3,
)

_GEMMA3_SPECIALS = [
    ("<pad>", 3),
    ("<eos>", 3),
    ("<bos>", 3),
    ("<unk>", 2),
    ("<mask>", 1),
    ("[multimodal]", 1),
    ("<unused0>", 1),
    ("<unused1>", 1),
    ("<unused2>", 1),
    ("<unused3>", 1),
    ("<start_of_turn>", 3),
    ("<end_of_turn>", 3),
    ("<start_of_image>", 1),
    ("<end_of_image>", 1),
]


@functools.cache
def gemma3_tokens() -> tuple[list[str], list[float], list[int], list[str]]:
    """Gemma 3 SentencePiece vocabulary as Ollama's spm parser emits it (tokens,
    scores, token_type, merges): specials 0..13 (<pad>=0 <eos>=1 <bos>=2 <unk>=3,
    <start_of_turn>=10 <end_of_turn>=11 forced CONTROL, <start/end_of_image> NORMAL),
    byte tokens <0x00>..<0xFF> at 14..269 (type 6), '\u2581' word pieces (scores -rank)."""
    pieces, singles, merges = spm_pieces(200)
    toks = [t for t, _ in _GEMMA3_SPECIALS] + byte_tokens()
    types = [ty for _, ty in _GEMMA3_SPECIALS] + [6] * 256
    scores = [0.0] * len(toks)
    body = list(pieces) + [c for c in singles if c not in pieces]
    for i, p in enumerate(body):
        toks.append(p)
        scores.append(-float(i))
        types.append(1)
    return toks, scores, types, list(merges)


def _gemma_norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gemma RMSNorm weight with Ollama's +1 shift already applied (HF stores w, used as 1+w)."""
    return (1.0 + normal(rng, (n,), 0.05)).astype(np.float32)


def _gemma3_text_tensors(rng: np.random.Generator, p: Dims, n_vocab: int) -> dict[str, tuple[np.ndarray, T]]:
    E, F, hd = p["n_embd"], p["n_ff"], p["head_dim"]
    q, kv = p["n_head"] * hd, p["n_head_kv"] * hd
    emb = normal(rng, (n_vocab, E), 0.05)
    emb[0] = 0.0  # padding_idx row, as in HF init
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (emb, T.BF16),
        "output_norm.weight": (_gemma_norm(rng, E), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_q.weight"] = (normal(rng, (q, E), 0.05), T.BF16)
        t[b + "attn_k.weight"] = (normal(rng, (kv, E), 0.05), T.BF16)
        t[b + "attn_v.weight"] = (normal(rng, (kv, E), 0.05), T.BF16)
        t[b + "attn_output.weight"] = (normal(rng, (E, q), 0.05), T.BF16)
        t[b + "attn_q_norm.weight"] = (_gemma_norm(rng, hd), T.F32)
        t[b + "attn_k_norm.weight"] = (_gemma_norm(rng, hd), T.F32)
        t[b + "attn_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "post_attention_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "ffn_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "post_ffw_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "ffn_gate.weight"] = (normal(rng, (F, E), 0.05), T.BF16)
        t[b + "ffn_up.weight"] = (normal(rng, (F, E), 0.05), T.BF16)
        t[b + "ffn_down.weight"] = (normal(rng, (E, F), 0.05), T.BF16)
    return t


def gemma3_hparams(p: Mapping[str, Any]) -> dict[str, Any]:
    """The text hyperparameter KVs every Ollama gemma3 converter wrote, from
    `p`'s layer count, widths, head counts, context length and sliding
    window (a table here, or values read from a blob)."""
    return {
        "general.file_type": 1,
        "general.quantization_version": 2,
        "gemma3.block_count": p["n_layer"],
        "gemma3.context_length": p["context_length"],
        "gemma3.embedding_length": p["n_embd"],
        "gemma3.feed_forward_length": p["n_ff"],
        "gemma3.attention.head_count": p["n_head"],
        "gemma3.attention.head_count_kv": p["n_head_kv"],
        "gemma3.attention.key_length": p["head_dim"],
        "gemma3.attention.value_length": p["head_dim"],
        "gemma3.attention.sliding_window": p["sliding_window"],
    }


def _gemma3_tokenizer_kvs(tokens: list[str], scores: list[float], types: list[int], merges: list[str]) -> dict:
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": GEMMA3_TEXT["bos"],
        "tokenizer.ggml.eos_token_id": GEMMA3_TEXT["eos"],
        "tokenizer.ggml.padding_token_id": GEMMA3_TEXT["pad"],
        "tokenizer.ggml.unknown_token_id": GEMMA3_TEXT["unk"],
        # the 2025 converter wrote add_<type>_token for every special it found
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.ggml.add_unknown_token": False,
    }


def legacy_gemma3_text(
    path: Path,
    seed: int = 0,
    *,
    extra_tokens: Sequence[str] = ("<image_soft_token>",),
    rms_epsilon: float | None = None,
) -> Path:
    """Gemma 3 1B-style text model (Gemma3ForCausalLM) as Ollama's 2025 converter wrote it.

    4 layers, n_embd 64, n_ff 128, heads 4/1, head_dim 16, context 32768, sliding window
    512; BF16 matrices, F32 norms (+1 already applied); no output.weight (tied).
    Legacy markers: ``gemma3.rope.global.freq_base`` (1e6) / ``gemma3.rope.local.freq_base``
    (1e4) instead of ``rope.freq_base``/``freq_base_swa``; no
    ``gemma3.attention.layer_norm_rms_epsilon`` (pass ``rms_epsilon=1e-6`` to write it, as
    the 80c7ce381 converter actually did); ``add_padding_token``/``add_unknown_token``;
    pre "default"; ``final_logit_softcapping`` 30 (the converter's default); no chat
    template; the tokenizer arrays are ``len(extra_tokens)`` longer than token_embd's rows
    (``extra_tokens`` appended with score -1000, type 4 -- Ollama's added_tokens.json handling).
    Untranslated llama.cpp fails: key not found gemma3.attention.layer_norm_rms_epsilon;
    with ``rms_epsilon`` set it fails on token_embd's shape (n_vocab comes from the
    tokenizer arrays); with ``rms_epsilon`` set and ``extra_tokens=()`` it loads but runs
    the global layers with rope base 1e4 (llama.cpp's default) instead of 1e6.
    """
    p = GEMMA3_TEXT
    rng = np.random.default_rng(seed)
    toks, scores, types, merges = gemma3_tokens()
    toks, scores, types = list(toks), list(scores), list(types)  # (the cached lists stay as they are)
    n_rows = len(toks)
    for extra in extra_tokens:
        toks.append(extra)
        scores.append(-1000.0)
        types.append(4)
    kvs: dict[str, Any] = {
        **gemma3_hparams(p),
        "gemma3.final_logit_softcapping": p["final_logit_softcapping"],
        "gemma3.rope.global.freq_base": p["rope_global"],
        "gemma3.rope.local.freq_base": p["rope_local"],
        **_gemma3_tokenizer_kvs(toks, scores, types, merges),
    }
    if rms_epsilon is not None:
        kvs["gemma3.attention.layer_norm_rms_epsilon"] = float(rms_epsilon)
    return write(path, "gemma3", kvs, _gemma3_text_tensors(rng, p, n_rows), ollama_order=True)


def legacy_gemma3_vision(path: Path, seed: int = 0) -> Path:
    """Monolithic Gemma 3 4B-style blob (Gemma3ForConditionalGeneration) in Ollama's layout,
    shaped like /work/shared/fixtures/ollama/gemma3_vision.gguf.

    Text: 34 layers (the converter's head table gives 8/4 heads), n_embd 64, n_ff 128,
    head_dim 16 (key/value_length), context 131072, sliding window 1024, vocab 576
    (SPM vocab + ``<image_soft_token>`` + ``[PADn]`` up to the config's vocab size, so here
    tokens == embedding rows); no rope keys, no rms epsilon, no rope scaling keys;
    ``gemma3.mm.tokens_per_image`` 4. SigLIP tower under Ollama's names:
    ``v.patch_embedding.{weight F16 [14,14,3,64], bias}``, ``v.position_embedding.weight``
    F16 [64,64], ``v.blk.N.{attn_q,attn_k,attn_v,attn_output,mlp.fc1,mlp.fc2}`` (F16 weights,
    F32 biases), ``v.blk.N.layer_norm1/2``, ``v.post_layernorm``; projector
    ``mm.mm_input_projection.weight`` F16 [text 64, vision 64] and ``mm.mm_soft_emb_norm.weight``
    (+1 shifted, F32); ``gemma3.vision.*`` keys: 2 blocks, 64 wide, ff 128, image 112,
    patch 14, 3 channels, 4 heads, eps 1e-6.  112/14 = 8 patches a side, llama.cpp's gemma3
    projector avg-pools by n_merge=4 -> 2x2 = 4 tokens = tokens_per_image.
    Untranslated: text load fails on the rms epsilon key; as mmproj it is no clip file.
    """
    p = GEMMA3_VISION
    rng = np.random.default_rng(seed)
    toks, scores, types, merges = gemma3_tokens()
    toks, scores, types = list(toks), list(scores), list(types)  # (the cached lists stay as they are)
    toks.append("<image_soft_token>")
    scores.append(-1000.0)
    types.append(4)
    for i in range(p["n_vocab"] - len(toks)):
        toks.append(f"[PAD{i}]")
        scores.append(-1.0)
        types.append(4)
    assert len(toks) == p["n_vocab"]
    kvs: dict[str, Any] = {
        **gemma3_hparams(p),
        "gemma3.mm.tokens_per_image": p["tokens_per_image"],
        "gemma3.vision.block_count": p["v_n_layer"],
        "gemma3.vision.embedding_length": p["v_n_embd"],
        "gemma3.vision.feed_forward_length": p["v_n_ff"],
        "gemma3.vision.image_size": p["image_size"],
        "gemma3.vision.patch_size": p["patch_size"],
        "gemma3.vision.num_channels": p["num_channels"],
        "gemma3.vision.attention.head_count": p["v_n_head"],
        "gemma3.vision.attention.layer_norm_epsilon": p["v_eps"],
        **_gemma3_tokenizer_kvs(toks, scores, types, merges),
    }
    tensors = _gemma3_text_tensors(rng, p, p["n_vocab"])
    VE, VF, C, P = p["v_n_embd"], p["v_n_ff"], p["num_channels"], p["patch_size"]
    n_pos = (p["image_size"] // P) ** 2
    tensors["v.patch_embedding.weight"] = (normal(rng, (VE, C, P, P), 0.05), T.F16)
    tensors["v.patch_embedding.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    tensors["v.position_embedding.weight"] = (normal(rng, (n_pos, VE), 0.1), T.F16)
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[b + proj + ".weight"] = (normal(rng, (VE, VE), 0.1), T.F16)
            tensors[b + proj + ".bias"] = (normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "layer_norm1.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        tensors[b + "layer_norm1.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "layer_norm2.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
        tensors[b + "layer_norm2.bias"] = (normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "mlp.fc1.weight"] = (normal(rng, (VF, VE), 0.1), T.F16)
        tensors[b + "mlp.fc1.bias"] = (normal(rng, (VF,), 0.02), T.F32)
        tensors[b + "mlp.fc2.weight"] = (normal(rng, (VE, VF), 0.1), T.F16)
        tensors[b + "mlp.fc2.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    tensors["v.post_layernorm.weight"] = (1.0 + normal(rng, (VE,), 0.05), T.F32)
    tensors["v.post_layernorm.bias"] = (normal(rng, (VE,), 0.02), T.F32)
    # HF mm_input_projection_weight is (vision, text) -> ggml ne [text, vision]
    tensors["mm.mm_input_projection.weight"] = (normal(rng, (VE, p["n_embd"]), 0.1), T.F16)
    tensors["mm.mm_soft_emb_norm.weight"] = (_gemma_norm(rng, VE), T.F32)
    return write(path, "gemma3", kvs, tensors, ollama_order=True)
