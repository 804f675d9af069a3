"""Tiny tokenizers for the legacy writers, generated in code from a small
corpus (deterministic, independent of the weight seed, no network)."""

from __future__ import annotations

import functools
import itertools
import re
from typing import Any

CORPUS = """
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
BPE_SPLIT = re.compile(
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"""
    r"""| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_bpe(words: dict[tuple[str, ...], int], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE on symbol tuples; ties broken by the pair's text (deterministic)."""
    words = dict(words)
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts: dict[tuple[str, str], int] = {}
        for w, f in words.items():
            for a, b in itertools.pairwise(w):
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


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


@functools.cache
def spm_pieces(n_merges: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(merged pieces in rank order, single characters by frequency, merges 'a b')."""
    words: dict[tuple[str, ...], int] = {}
    chars: dict[str, int] = {}
    for w in CORPUS.split():
        sym = tuple("\u2581" + w)
        words[sym] = words.get(sym, 0) + 1
        for c in sym:
            chars[c] = chars.get(c, 0) + 1
    merges = train_bpe(words, n_merges)
    pieces: list[str] = []
    seen: set[str] = set()
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            pieces.append(a + b)
    singles = tuple(c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])))
    return tuple(pieces), singles, tuple(f"{a} {b}" for a, b in merges)


def byte_tokens() -> list[str]:
    return [f"<0x{b:02X}>" for b in range(256)]


@functools.cache
def llama_spm_tokens() -> tuple[list[str], list[float], list[int]]:
    """Llama-2/LLaVA style SentencePiece vocab: <unk>=0 <s>=1 </s>=2, bytes 3..258."""
    pieces, singles, _ = spm_pieces(120)
    toks = ["<unk>", "<s>", "</s>"] + byte_tokens()
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(toks)
    body = list(pieces) + [c for c in singles if c not in pieces]
    for i, p in enumerate(body):
        toks.append(p)
        scores.append(-float(i))
        types.append(1)
    return toks, scores, types


@functools.cache
def byte_level_merges(n_merges: int) -> tuple[tuple[str, str], ...]:
    """`n_merges` BPE merges learned from the corpus split as Llama 3's
    pre-tokenizer splits it, over GPT-2's byte characters (as byte-level BPE
    vocabularies are: `bytes_to_unicode`)."""
    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for m in BPE_SPLIT.findall(CORPUS):
        sym = tuple(b2u[b] for b in m.encode("utf-8"))
        if len(sym) > 1:
            words[sym] = words.get(sym, 0) + 1
    return tuple(train_bpe(words, n_merges))


@functools.cache
def byte_level_vocab(
    head: tuple[str, ...] = (), tail: tuple[tuple[str, int], ...] = (), *, n_merged: int = 224, size: int | None = None
) -> tuple[list[str], list[int], list[float], list[str]]:
    """A byte-level BPE vocabulary as Ollama's converters wrote one (tokens,
    token types, scores, merges): `head` (control) first, the 256 GPT-2 byte
    characters, `n_merged` tokens from the corpus' first merges (each merge
    that makes a new token; those merges are the list), then `tail` as
    (text, token type) pairs; with `size`, `[PAD<i>]` (user-defined, score
    -1) up to `size` entries.  The other scores are the token ids."""
    b2u = bytes_to_unicode()
    toks = list(head) + [b2u[b] for b in range(256)]
    seen = set(toks)
    merges: list[str] = []
    for a, b in byte_level_merges(400):
        if len(merges) == n_merged:
            break
        if a + b not in seen:
            seen.add(a + b)
            toks.append(a + b)
            merges.append(f"{a} {b}")
    if len(merges) < n_merged:
        raise ValueError(f"the corpus gives {len(merges)} merges, not {n_merged}")
    types = [3] * len(head) + [1] * (len(toks) - len(head))
    for text, kind in tail:
        toks.append(text)
        types.append(kind)
    scores = [float(i) for i in range(len(toks))]
    pads = 0 if size is None else size - len(toks)
    if pads < 0:
        raise ValueError(f"{len(toks)} tokens do not fit in {size}")
    toks += [f"[PAD{i}]" for i in range(pads)]
    types += [4] * pads
    scores += [-1.0] * pads
    return toks, types, scores, merges


def byte_level_kvs(vocab: tuple[list[str], list[int], list[float], list[str]], pre: str) -> dict[str, Any]:
    """The tokenizer KVs of a `byte_level_vocab` as Ollama writes them: model
    `gpt2`, pre-tokenizer `pre`, tokens, types, scores and merges."""
    tokens, types, scores, merges = vocab
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.merges": merges,
    }
