"""Tiny *legacy* GGUF files written the way Ollama's converters wrote published blobs.

Every builder is ``NAME(path, seed=0, **options) -> path``; weights are tiny seeded
numpy randoms, tokenizers are generated in code (no network, no /work/shared).
Each model, once translated the way ``llama/compat/llama-ollama-compat.cpp`` does
(see the docstrings), loads and generates in llama.cpp.

Ground truth for the layouts (ollama/ollama git history):

* ``fs/ggml/gguf.go`` WriteGGUF: KVs sorted by key, tensors ordered ``blk.N.*`` by
  block number first, then everything else by name; alignment 32, no
  ``general.alignment`` key.
* ``convert/convert_gemma3.go`` at 80c7ce381 (March 2025, the converter that produced
  the first published gemma3 blobs): nested ``gemma3.rope.{global,local}.freq_base``
  and ``final_logit_softcapping`` (default 30) for Gemma3ForCausalLM; the
  Gemma3ForConditionalGeneration branch writes no rope and no rms-epsilon keys at all,
  ``context_length`` 131072 and the head counts from a table keyed on the block
  count (34/48/62 -> 8/4, 16/8, 32/16; any other count reads *top-level*
  ``num_attention_heads`` which a multimodal config lacks, i.e. writes 0 heads).
* ``convert/convert.go`` ModelParameters.KV at that time: ``tokenizer.ggml.pre``
  "default", and ``add_<type>_token`` for *every* special token found in
  tokenizer.json's added tokens (so ``add_padding_token``/``add_unknown_token`` appear).
* ``convert/tokenizer_spm.go``: SentencePiece types kept, ``<start_of_turn>``/
  ``<end_of_turn>`` forced to CONTROL, added_tokens.json entries appended with score
  -1000 and type USER_DEFINED (4) -- the ``<image_soft_token>`` past the embedding rows.
* ``convert/llama.go`` at c8cf0d94e (April 2024, "llama3 conversion"): gpt2 tokenizer,
  no ``tokenizer.ggml.pre``, eos = ``<|end_of_text|>`` (128001), no eot key, merges
  and no scores.
* llama.cpp ``tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py`` (before it
  wrote ``clip.projector_type``): arch ``clip``, LLaVA MLP projector ``mm.0``/``mm.2``,
  CLIP names with the historical fc1->``ffn_down`` / fc2->``ffn_up`` swap, the last
  encoder layer and ``post_layernorm`` dropped.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
V = gguf.GGUFValueType

__all__ = [
    "legacy_gemma3_text", "legacy_gemma3_vision", "legacy_llama3_instruct",
    "legacy_llava_projector", "plain_llama_text", "write_all",
    "GEMMA3_TEXT", "GEMMA3_VISION", "LLAMA3", "LLAVA", "PLAIN_LLAMA",
    "LLAMA3_BOS_ID", "LLAMA3_EOS_ID", "LLAMA3_START_HEADER_ID", "LLAMA3_END_HEADER_ID",
    "LLAMA3_EOT_ID", "LLAMA3_N_VOCAB", "llama3_ordinary_token_id", "llama3_tokens",
    "gemma3_tokens", "llama_spm_tokens",
]

# --------------------------------------------------------------------------------------
# Parameters (exported so tests can assert on them)
# --------------------------------------------------------------------------------------

GEMMA3_TEXT = dict(
    n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=1, head_dim=16,
    context_length=32768, sliding_window=512, rope_global=1_000_000.0, rope_local=10_000.0,
    final_logit_softcapping=30.0,
    bos=2, eos=1, pad=0, unk=3, start_of_turn=10, end_of_turn=11,
)
GEMMA3_VISION = dict(
    # 34 blocks: the only way Ollama's converter writes non-zero head counts for a
    # Gemma3ForConditionalGeneration checkpoint (table keyed on 34/48/62 blocks).
    n_layer=34, n_embd=64, n_ff=128, n_head=8, n_head_kv=4, head_dim=16,
    context_length=131072, sliding_window=1024, n_vocab=576, tokens_per_image=4,
    v_n_layer=2, v_n_embd=64, v_n_ff=128, v_n_head=4, v_eps=1e-6,
    image_size=112, patch_size=14, num_channels=3,
)
LLAMA3 = dict(
    n_layer=2, n_embd=16, n_ff=32, n_head=2, n_head_kv=1, context_length=8192,
    rope_freq_base=500000.0, rms_eps=1e-5, n_vocab=128256, n_base=128000,
)
LLAMA3_BOS_ID = 128000
LLAMA3_EOS_ID = 128001            # <|end_of_text|>: what the legacy file calls eos
LLAMA3_START_HEADER_ID = 128006
LLAMA3_END_HEADER_ID = 128007
LLAMA3_EOT_ID = 128009
LLAMA3_N_VOCAB = 128256

PLAIN_LLAMA = dict(
    n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=4, context_length=4096,
    rope_freq_base=10000.0, rms_eps=1e-5, bos=1, eos=2, unk=0,
)
LLAVA = dict(
    # HF CLIP vision tower with 3 layers; the legacy script pops the last one -> 2.
    v_n_layer=2, v_n_embd=32, v_n_ff=64, v_n_head=2, v_eps=1e-5,
    image_size=56, patch_size=14, clip_projection_dim=24,   # CLIP's own visual projection, unused by LLaVA
    mm_hidden=PLAIN_LLAMA["n_embd"], n_embd_out=PLAIN_LLAMA["n_embd"],
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# --------------------------------------------------------------------------------------
# Tokenizers (generated, deterministic, independent of the weight seed)
# --------------------------------------------------------------------------------------

_CORPUS = """
The quick brown fox jumps over the lazy dog. Hello world, hello there! How are you today?
I am fine, thank you. The weather is nice and the sun is shining over the hills.
Once upon a time there was a little model that wanted to answer every question.
It read some books, wrote some words, and learned that the answer is often simple.
What is the capital of France? The capital of France is Paris. What do you see in the image?
I see a picture with some colors: red, green and blue. Let me think about this step by step.
Please tell me a story about a llama who lives in the mountains with her friends.
The llama walked along the river, looking for something new to eat and somewhere to sleep.
Numbers like 1, 2, 3, 10, 42 and 100 appear here too; so does punctuation (like this).
The user said hello to the model, and the model said hello world back to the user.
The assistant answered the user; the system prompt told the assistant to be brief and kind.
I'M SURE IT'S FINE. x.get(y) and d.get(key) and obj.get(name) return values.

Paragraphs are separated by blank lines.


Like this one.
"""

# Llama 3's pre-tokenizer split (ASCII approximation), so that the learned
# merges are the ones `llama-bpe` pre-tokenization can reach.
_BPE_SPLIT = re.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"""
                        r"""| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _train_bpe(words: dict[tuple[str, ...], int], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE on symbol tuples; ties broken by the pair's text (deterministic)."""
    words = dict(words)
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts: dict[tuple[str, str], int] = {}
        for w, f in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + f
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], tuple(-ord(c) for c in kv[0][0] + "\0" + kv[0][1])))
        pair = best[0]
        merges.append(pair)
        new_words: dict[tuple[str, ...], int] = {}
        for w, f in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + f
        words = new_words
    return merges


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


@functools.lru_cache(maxsize=None)
def _spm_pieces(n_merges: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(merged pieces in rank order, single characters by frequency, merges 'a b')."""
    words: dict[tuple[str, ...], int] = {}
    chars: dict[str, int] = {}
    for w in _CORPUS.split():
        sym = tuple("\u2581" + w)
        words[sym] = words.get(sym, 0) + 1
        for c in sym:
            chars[c] = chars.get(c, 0) + 1
    merges = _train_bpe(words, n_merges)
    pieces: list[str] = []
    seen: set[str] = set()
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            pieces.append(a + b)
    singles = tuple(c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])))
    return tuple(pieces), singles, tuple(f"{a} {b}" for a, b in merges)


def _byte_tokens() -> list[str]:
    return [f"<0x{b:02X}>" for b in range(256)]


_GEMMA3_SPECIALS = [
    ("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 1), ("[multimodal]", 1),
    ("<unused0>", 1), ("<unused1>", 1), ("<unused2>", 1), ("<unused3>", 1),
    ("<start_of_turn>", 3), ("<end_of_turn>", 3), ("<start_of_image>", 1), ("<end_of_image>", 1),
]


@functools.lru_cache(maxsize=None)
def gemma3_tokens() -> tuple[list[str], list[float], list[int], list[str]]:
    """Gemma 3 SentencePiece vocabulary as Ollama's spm parser emits it (tokens,
    scores, token_type, merges): specials 0..13 (<pad>=0 <eos>=1 <bos>=2 <unk>=3,
    <start_of_turn>=10 <end_of_turn>=11 forced CONTROL, <start/end_of_image> NORMAL),
    byte tokens <0x00>..<0xFF> at 14..269 (type 6), '\u2581' word pieces (scores -rank)."""
    pieces, singles, merges = _spm_pieces(200)
    toks = [t for t, _ in _GEMMA3_SPECIALS] + _byte_tokens()
    types = [ty for _, ty in _GEMMA3_SPECIALS] + [6] * 256
    scores = [0.0] * len(toks)
    body = list(pieces) + [c for c in singles if c not in pieces]
    for i, p in enumerate(body):
        toks.append(p)
        scores.append(-float(i))
        types.append(1)
    return toks, scores, types, list(merges)


@functools.lru_cache(maxsize=None)
def llama_spm_tokens() -> tuple[list[str], list[float], list[int]]:
    """Llama-2/LLaVA style SentencePiece vocab: <unk>=0 <s>=1 </s>=2, bytes 3..258."""
    pieces, singles, _ = _spm_pieces(120)
    toks = ["<unk>", "<s>", "</s>"] + _byte_tokens()
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(toks)
    body = list(pieces) + [c for c in singles if c not in pieces]
    for i, p in enumerate(body):
        toks.append(p)
        scores.append(-float(i))
        types.append(1)
    return toks, scores, types


_LLAMA3_SPECIAL_NAMES = {
    0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
    7: "<|end_header_id|>", 9: "<|eot_id|>",
}


@functools.lru_cache(maxsize=None)
def llama3_tokens() -> tuple[list[str], list[int], list[str]]:
    """Llama 3 byte-level BPE vocab (tokens, token_type, merges), 128256 entries:
    the 256 GPT-2 byte characters first, then one token per learned merge, filler
    ``<|filler_N|>`` (NORMAL, never produced by the merges) up to 128000, then the
    specials 128000..128255 (CONTROL), the unnamed ones ``<|reserved_special_token_K|>``."""
    b2u = _bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for m in _BPE_SPLIT.findall(_CORPUS):
        sym = tuple(b2u[b] for b in m.encode("utf-8"))
        if len(sym) > 1:
            words[sym] = words.get(sym, 0) + 1
    merges = _train_bpe(words, 400)
    toks = list(b2u.values())
    seen = set(toks)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            toks.append(a + b)
    n_base = LLAMA3["n_base"]
    toks += [f"<|filler_{i}|>" for i in range(n_base - len(toks))]
    types = [1] * n_base
    reserved = 0
    for i in range(256):
        name = _LLAMA3_SPECIAL_NAMES.get(i)
        if name is None:
            name = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        toks.append(name)
        types.append(3)
    assert len(toks) == LLAMA3_N_VOCAB
    return toks, types, [f"{a} {b}" for a, b in merges]


def llama3_ordinary_token_id(text: str = "\u0120the") -> int:
    """Id of an ordinary (merged) token in the llama3 vocab, default 'Ġthe' (" the")."""
    return llama3_tokens()[0].index(text)


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------

def _kv_type(value: Any) -> tuple[V, V | None]:
    if isinstance(value, bool):
        return V.BOOL, None
    if isinstance(value, np.uint32):
        return V.UINT32, None
    if isinstance(value, int):
        return V.UINT32, None
    if isinstance(value, float):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    if isinstance(value, (list, tuple)):
        first = value[0]
        if isinstance(first, bool):
            return V.ARRAY, V.BOOL
        if isinstance(first, int):
            return V.ARRAY, V.INT32
        if isinstance(first, float):
            return V.ARRAY, V.FLOAT32
        return V.ARRAY, V.STRING
    raise TypeError(f"unsupported KV value {value!r}")


def _ollama_tensor_order(names: Iterable[str]) -> list[str]:
    def key(n: str):
        m = re.match(r"blk\.(\d+)\.", n)
        return (0, int(m.group(1)), n) if m else (1, 0, n)
    return sorted(names, key=key)


def _write(path: Path, arch: str, kvs: dict[str, Any], tensors: dict[str, tuple[np.ndarray, T]],
           *, ollama_order: bool) -> Path:
    """kvs: key -> value (int -> u32, float -> f32, list of int -> i32 array);
    tensors: name -> (numpy array in HF layout, stored dtype).  With ollama_order the
    keys are written sorted and the tensors in WriteGGUF's block order; otherwise
    in insertion order (gguf-py script style, general.architecture first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.kv_data[0].clear()
    items = dict(kvs)
    items["general.architecture"] = arch
    keys = sorted(items) if ollama_order else ["general.architecture"] + [k for k in kvs if k != "general.architecture"]
    for k in keys:
        vtype, sub = _kv_type(items[k])
        w.add_key_value(k, list(items[k]) if vtype == V.ARRAY else items[k], vtype, sub_type=sub)
    names = _ollama_tensor_order(tensors) if ollama_order else list(tensors)
    for name in names:
        arr, dtype = tensors[name]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == T.F32:
            w.add_tensor(name, arr)
        elif dtype == T.F16:
            w.add_tensor(name, arr.astype(np.float16))
        elif dtype == T.BF16:
            w.add_tensor(name, gguf.quants.quantize(arr, T.BF16), raw_dtype=T.BF16)
        else:
            raise ValueError(dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _gemma_norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gemma RMSNorm weight with Ollama's +1 shift already applied (HF stores w, used as 1+w)."""
    return (1.0 + _normal(rng, (n,), 0.05)).astype(np.float32)


def _gemma3_text_tensors(rng: np.random.Generator, p: dict, n_vocab: int) -> dict[str, tuple[np.ndarray, T]]:
    E, F, hd = p["n_embd"], p["n_ff"], p["head_dim"]
    q, kv = p["n_head"] * hd, p["n_head_kv"] * hd
    emb = _normal(rng, (n_vocab, E), 0.05)
    emb[0] = 0.0                                         # padding_idx row, as in HF init
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (emb, T.BF16),
        "output_norm.weight": (_gemma_norm(rng, E), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_q.weight"] = (_normal(rng, (q, E), 0.05), T.BF16)
        t[b + "attn_k.weight"] = (_normal(rng, (kv, E), 0.05), T.BF16)
        t[b + "attn_v.weight"] = (_normal(rng, (kv, E), 0.05), T.BF16)
        t[b + "attn_output.weight"] = (_normal(rng, (E, q), 0.05), T.BF16)
        t[b + "attn_q_norm.weight"] = (_gemma_norm(rng, hd), T.F32)
        t[b + "attn_k_norm.weight"] = (_gemma_norm(rng, hd), T.F32)
        t[b + "attn_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "post_attention_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "ffn_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "post_ffw_norm.weight"] = (_gemma_norm(rng, E), T.F32)
        t[b + "ffn_gate.weight"] = (_normal(rng, (F, E), 0.05), T.BF16)
        t[b + "ffn_up.weight"] = (_normal(rng, (F, E), 0.05), T.BF16)
        t[b + "ffn_down.weight"] = (_normal(rng, (E, F), 0.05), T.BF16)
    return t


def _gemma3_hparams(p: dict) -> dict[str, Any]:
    """The text hyperparameter KVs every Ollama gemma3 converter wrote."""
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


# --------------------------------------------------------------------------------------
# 1. gemma3 text (1B style)
# --------------------------------------------------------------------------------------

def legacy_gemma3_text(path: Path, seed: int = 0, *,
                       extra_tokens: Sequence[str] = ("<image_soft_token>",),
                       rms_epsilon: float | None = None) -> Path:
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
    toks, scores, types, merges = (list(x) for x in gemma3_tokens())
    n_rows = len(toks)
    for extra in extra_tokens:
        toks.append(extra)
        scores.append(-1000.0)
        types.append(4)
    kvs: dict[str, Any] = {
        **_gemma3_hparams(p),
        "gemma3.final_logit_softcapping": p["final_logit_softcapping"],
        "gemma3.rope.global.freq_base": p["rope_global"],
        "gemma3.rope.local.freq_base": p["rope_local"],
        **_gemma3_tokenizer_kvs(toks, scores, types, merges),
    }
    if rms_epsilon is not None:
        kvs["gemma3.attention.layer_norm_rms_epsilon"] = float(rms_epsilon)
    return _write(path, "gemma3", kvs, _gemma3_text_tensors(rng, p, n_rows), ollama_order=True)


# --------------------------------------------------------------------------------------
# 2. gemma3 monolithic vision (4B style)
# --------------------------------------------------------------------------------------

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
    toks, scores, types, merges = (list(x) for x in gemma3_tokens())
    toks.append("<image_soft_token>")
    scores.append(-1000.0)
    types.append(4)
    for i in range(p["n_vocab"] - len(toks)):
        toks.append(f"[PAD{i}]")
        scores.append(-1.0)
        types.append(4)
    assert len(toks) == p["n_vocab"]
    kvs: dict[str, Any] = {
        **_gemma3_hparams(p),
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
    tensors["v.patch_embedding.weight"] = (_normal(rng, (VE, C, P, P), 0.05), T.F16)
    tensors["v.patch_embedding.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
    tensors["v.position_embedding.weight"] = (_normal(rng, (n_pos, VE), 0.1), T.F16)
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[b + proj + ".weight"] = (_normal(rng, (VE, VE), 0.1), T.F16)
            tensors[b + proj + ".bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "layer_norm1.weight"] = (1.0 + _normal(rng, (VE,), 0.05), T.F32)
        tensors[b + "layer_norm1.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "layer_norm2.weight"] = (1.0 + _normal(rng, (VE,), 0.05), T.F32)
        tensors[b + "layer_norm2.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        tensors[b + "mlp.fc1.weight"] = (_normal(rng, (VF, VE), 0.1), T.F16)
        tensors[b + "mlp.fc1.bias"] = (_normal(rng, (VF,), 0.02), T.F32)
        tensors[b + "mlp.fc2.weight"] = (_normal(rng, (VE, VF), 0.1), T.F16)
        tensors[b + "mlp.fc2.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
    tensors["v.post_layernorm.weight"] = (1.0 + _normal(rng, (VE,), 0.05), T.F32)
    tensors["v.post_layernorm.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
    # HF mm_input_projection_weight is (vision, text) -> ggml ne [text, vision]
    tensors["mm.mm_input_projection.weight"] = (_normal(rng, (VE, p["n_embd"]), 0.1), T.F16)
    tensors["mm.mm_soft_emb_norm.weight"] = (_gemma_norm(rng, VE), T.F32)
    return _write(path, "gemma3", kvs, tensors, ollama_order=True)


# --------------------------------------------------------------------------------------
# 3. llama3 instruct
# --------------------------------------------------------------------------------------

def legacy_llama3_instruct(path: Path, seed: int = 0, *, greedy_token_id: int = LLAMA3_EOT_ID) -> Path:
    """Llama 3 instruct as older Ollama blobs looked (convert/llama.go, April 2024).

    n_embd 16, 2 layers, heads 2/1 (head_dim 8), n_ff 32, context 8192, rope base 5e5;
    F16 matrices incl. a separate output.weight, F32 norms; ~8.3 MB.
    Tokenizer: gpt2, 128256 tokens (see :func:`llama3_tokens`), merges, no scores,
    bos 128000, **eos 128001**, **no tokenizer.ggml.pre**, no eot/eos_token_ids keys,
    a Llama 3 chat template (<|start_header_id|> ... <|eot_id|>).
    The weights make the greedy next token always ``greedy_token_id`` (default
    <|eot_id|> 128009; e.g. ``llama3_ordinary_token_id()`` for an ordinary token): every
    embedding has 1.0 in the last dimension d, attn_output/ffn_down have a zero row d so
    it survives the residual stream, and output.weight column d is 0 except +8 for the
    target row.
    """
    p = LLAMA3
    if not 0 <= greedy_token_id < LLAMA3_N_VOCAB:
        raise ValueError(greedy_token_id)
    rng = np.random.default_rng(seed)
    toks, types, merges = llama3_tokens()
    E, F, H, HKV, NV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"], p["n_vocab"]
    hd = E // H
    d = E - 1
    kvs: dict[str, Any] = {
        "general.name": "Meta-Llama-3-8B-Instruct",
        "general.file_type": 1,
        "llama.vocab_size": NV,
        "llama.context_length": p["context_length"],
        "llama.embedding_length": E,
        "llama.block_count": p["n_layer"],
        "llama.feed_forward_length": F,
        "llama.rope.freq_base": p["rope_freq_base"],
        "llama.rope.dimension_count": hd,
        "llama.attention.head_count": H,
        "llama.attention.head_count_kv": HKV,
        "llama.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": LLAMA3_BOS_ID,
        "tokenizer.ggml.eos_token_id": LLAMA3_EOS_ID,
        "tokenizer.chat_template": LLAMA3_CHAT_TEMPLATE,
    }
    emb = _normal(rng, (NV, E), 0.02)
    emb[:, d] = 1.0
    out = _normal(rng, (NV, E), 0.02)
    out[:, d] = 0.0
    out[greedy_token_id, d] = 8.0
    tensors: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (emb, T.F16),
        "output_norm.weight": (np.ones(E, np.float32), T.F32),
        "output.weight": (out, T.F16),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        wo = _normal(rng, (E, H * hd), 0.02)
        wo[d] = 0.0
        down = _normal(rng, (E, F), 0.02)
        down[d] = 0.0
        tensors[b + "attn_norm.weight"] = (np.ones(E, np.float32), T.F32)
        tensors[b + "attn_q.weight"] = (_normal(rng, (H * hd, E), 0.02), T.F16)
        tensors[b + "attn_k.weight"] = (_normal(rng, (HKV * hd, E), 0.02), T.F16)
        tensors[b + "attn_v.weight"] = (_normal(rng, (HKV * hd, E), 0.02), T.F16)
        tensors[b + "attn_output.weight"] = (wo, T.F16)
        tensors[b + "ffn_norm.weight"] = (np.ones(E, np.float32), T.F32)
        tensors[b + "ffn_gate.weight"] = (_normal(rng, (F, E), 0.02), T.F16)
        tensors[b + "ffn_up.weight"] = (_normal(rng, (F, E), 0.02), T.F16)
        tensors[b + "ffn_down.weight"] = (down, T.F16)
    return _write(path, "llama", kvs, tensors, ollama_order=True)


# --------------------------------------------------------------------------------------
# 4. LLaVA 1.5 projector (legacy clip mmproj)
# --------------------------------------------------------------------------------------

def legacy_llava_projector(path: Path, seed: int = 0) -> Path:
    """LLaVA-1.5 mmproj as the old ``convert_image_encoder_to_gguf.py --llava-projector``
    wrote it (published by Ollama for llava/bakllava), **without clip.projector_type**.

    arch ``clip``; has_text_encoder false, has_vision_encoder true, has_llava_projector
    true; ``clip.vision.*``: image 56, patch 14 (16 patches + class = 17 positions),
    embedding 32, ff 64, projection_dim 24 (CLIP's own visual projection; LLaVA never
    uses it), block_count 2 (3-layer tower, the last one dropped), 2 heads, eps 1e-5,
    CLIP image_mean/std; ``clip.use_gelu`` false (quick_gelu).  Tensors in script order:
    ``mm.0.{weight F16 [32->64], bias}``, ``mm.2.{weight F16 [64->64], bias}`` (output width 64
    = plain_llama_text n_embd), ``v.class_embd``, ``v.patch_embd.weight`` (F16, no bias),
    ``v.position_embd.weight`` (F16), ``v.pre_ln.*``, ``v.blk.N.{attn_k,attn_v,attn_q,attn_out,
    ln1,ffn_down,ffn_up,ln2}.{weight,bias}`` where ffn_down holds fc1 (32->64) and ffn_up
    fc2 -- the historical swapped naming llama.cpp detects and swaps back for mlp
    projectors; no ``v.post_ln``.  Untranslated llama.cpp: "unknown projector type".
    """
    p = LLAVA
    rng = np.random.default_rng(seed)
    VE, VF, P, C = p["v_n_embd"], p["v_n_ff"], p["patch_size"], 3
    n_pos = (p["image_size"] // P) ** 2 + 1
    kvs: dict[str, Any] = {
        "clip.has_text_encoder": False,
        "clip.has_vision_encoder": True,
        "clip.has_llava_projector": True,
        "general.file_type": 1,
        "general.name": "openai/clip-vit-large-patch14-336",
        "general.description": "image encoder for LLaVA",
        "clip.vision.image_size": p["image_size"],
        "clip.vision.patch_size": P,
        "clip.vision.embedding_length": VE,
        "clip.vision.feed_forward_length": VF,
        "clip.vision.projection_dim": p["clip_projection_dim"],
        "clip.vision.attention.head_count": p["v_n_head"],
        "clip.vision.attention.layer_norm_epsilon": p["v_eps"],
        "clip.vision.block_count": p["v_n_layer"],
        "clip.vision.image_mean": list(p["image_mean"]),
        "clip.vision.image_std": list(p["image_std"]),
        "clip.use_gelu": False,
    }
    H, O = p["mm_hidden"], p["n_embd_out"]
    t: dict[str, tuple[np.ndarray, T]] = {
        "mm.0.weight": (_normal(rng, (H, VE), 0.1), T.F16),
        "mm.0.bias": (_normal(rng, (H,), 0.02), T.F32),
        "mm.2.weight": (_normal(rng, (O, H), 0.1), T.F16),
        "mm.2.bias": (_normal(rng, (O,), 0.02), T.F32),
        "v.class_embd": (_normal(rng, (VE,), 0.1), T.F32),
        "v.patch_embd.weight": (_normal(rng, (VE, C, P, P), 0.05), T.F16),
        "v.position_embd.weight": (_normal(rng, (n_pos, VE), 0.1), T.F16),
        "v.pre_ln.weight": (1.0 + _normal(rng, (VE,), 0.05), T.F32),
        "v.pre_ln.bias": (_normal(rng, (VE,), 0.02), T.F32),
    }
    for i in range(p["v_n_layer"]):
        b = f"v.blk.{i}."
        for proj in ("attn_k", "attn_v", "attn_q", "attn_out"):
            t[b + proj + ".weight"] = (_normal(rng, (VE, VE), 0.1), T.F16)
            t[b + proj + ".bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        t[b + "ln1.weight"] = (1.0 + _normal(rng, (VE,), 0.05), T.F32)
        t[b + "ln1.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        t[b + "ffn_down.weight"] = (_normal(rng, (VF, VE), 0.1), T.F16)   # HF mlp.fc1
        t[b + "ffn_down.bias"] = (_normal(rng, (VF,), 0.02), T.F32)
        t[b + "ffn_up.weight"] = (_normal(rng, (VE, VF), 0.1), T.F16)     # HF mlp.fc2
        t[b + "ffn_up.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
        t[b + "ln2.weight"] = (1.0 + _normal(rng, (VE,), 0.05), T.F32)
        t[b + "ln2.bias"] = (_normal(rng, (VE,), 0.02), T.F32)
    return _write(path, "clip", kvs, t, ollama_order=False)


# --------------------------------------------------------------------------------------
# 5. plain llama text (LLaVA's language model)
# --------------------------------------------------------------------------------------

def plain_llama_text(path: Path, seed: int = 0) -> Path:
    """Tiny llama-architecture text model with a SentencePiece (``llama``) tokenizer that
    llama.cpp loads as is and no compat handler claims (no token 128009, no Llama 3
    template): n_embd 64 (= legacy_llava_projector's output), 2 layers, 4 heads, n_ff 128,
    context 4096, <unk>=0 <s>=1 </s>=2, bytes at 3..258, F16 matrices, F32 norms."""
    p = PLAIN_LLAMA
    rng = np.random.default_rng(seed)
    toks, scores, types = llama_spm_tokens()
    E, F, H, HKV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"]
    hd = E // H
    NV = len(toks)
    kvs: dict[str, Any] = {
        "general.name": "llava-tiny",
        "general.file_type": 1,
        "llama.context_length": p["context_length"],
        "llama.embedding_length": E,
        "llama.block_count": p["n_layer"],
        "llama.feed_forward_length": F,
        "llama.rope.dimension_count": hd,
        "llama.rope.freq_base": p["rope_freq_base"],
        "llama.attention.head_count": H,
        "llama.attention.head_count_kv": HKV,
        "llama.attention.layer_norm_rms_epsilon": p["rms_eps"],
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": list(toks),
        "tokenizer.ggml.scores": list(scores),
        "tokenizer.ggml.token_type": list(types),
        "tokenizer.ggml.bos_token_id": p["bos"],
        "tokenizer.ggml.eos_token_id": p["eos"],
        "tokenizer.ggml.unknown_token_id": p["unk"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    t: dict[str, tuple[np.ndarray, T]] = {
        "token_embd.weight": (_normal(rng, (NV, E), 0.05), T.F16),
        "output_norm.weight": (1.0 + _normal(rng, (E,), 0.05), T.F32),
        "output.weight": (_normal(rng, (NV, E), 0.05), T.F16),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = (1.0 + _normal(rng, (E,), 0.05), T.F32)
        t[b + "attn_q.weight"] = (_normal(rng, (H * hd, E), 0.05), T.F16)
        t[b + "attn_k.weight"] = (_normal(rng, (HKV * hd, E), 0.05), T.F16)
        t[b + "attn_v.weight"] = (_normal(rng, (HKV * hd, E), 0.05), T.F16)
        t[b + "attn_output.weight"] = (_normal(rng, (E, H * hd), 0.05), T.F16)
        t[b + "ffn_norm.weight"] = (1.0 + _normal(rng, (E,), 0.05), T.F32)
        t[b + "ffn_gate.weight"] = (_normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_up.weight"] = (_normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_down.weight"] = (_normal(rng, (E, F), 0.05), T.F16)
    return _write(path, "llama", kvs, t, ollama_order=True)


# --------------------------------------------------------------------------------------

def write_all(dirpath: Path, seed: int = 0) -> dict[str, Path]:
    """Write every builder's file into ``dirpath``; returns name -> path."""
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    builders = {
        "legacy_gemma3_text": legacy_gemma3_text,
        "legacy_gemma3_vision": legacy_gemma3_vision,
        "legacy_llama3_instruct": legacy_llama3_instruct,
        "legacy_llava_projector": legacy_llava_projector,
        "plain_llama_text": plain_llama_text,
    }
    return {name: fn(d / f"{name}.gguf", seed) for name, fn in builders.items()}
