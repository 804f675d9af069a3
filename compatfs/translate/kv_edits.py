"""KV edits: changes to the KVs of a translated file, each a `KVEdit`
applied as `apply(kv, src)` to the KVs as edited so far (`kv`, in place) and
the source blob.  Each is total: a value of another type than it reads is
left alone where the edit says so, or refused with a `GGUFError` naming the
key."""

from __future__ import annotations

import re
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from gguf import Keys
from gguf import TokenType as TT

from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..format.values import VT, Value, array, u32
from .kv_reads import describe, finite, integer_array, is_integer_array, layers_held, whole
from .predicates import ALWAYS, Pred

KVs = dict[str, Value]


class KVEdit(ABC):
    """An edit of the translated file's KVs (listed in a `Translation`'s `kv`)."""

    @abstractmethod
    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        """Change `kv` in place."""


@dataclass(frozen=True)
class CopyIfAbsent(KVEdit):
    """`dst` takes `src`'s value when `dst` is absent and `src` present."""

    src: str
    dst: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.dst not in kv and self.src in kv:
            kv[self.dst] = kv[self.src]


@dataclass(frozen=True)
class CopyEachIfAbsent(KVEdit):
    """`CopyIfAbsent(src_prefix + name, dst_prefix + name)` for each of `names`."""

    src_prefix: str
    dst_prefix: str
    names: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for name in self.names:
            CopyIfAbsent(self.src_prefix + name, self.dst_prefix + name).apply(kv, src)


@dataclass(frozen=True)
class Default(KVEdit):
    """`key` = `value` when `key` is absent."""

    key: str
    value: Value

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        kv.setdefault(self.key, self.value)


@dataclass(frozen=True)
class Set(KVEdit):
    """`key` = `value`, replacing any value in place; only `when` it holds of the blob."""

    key: str
    value: Value
    when: Pred = ALWAYS

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.when(src):
            kv[self.key] = self.value


@dataclass(frozen=True)
class CopyPrefixIfAbsent(KVEdit):
    """Every `old`* key is copied to `new`* (when not already there)."""

    old: str
    new: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for key in [k for k in kv if k.startswith(self.old)]:
            kv.setdefault(self.new + key[len(self.old) :], kv[key])


@dataclass(frozen=True)
class Drop(KVEdit):
    """Each of `keys` is removed where present (exactly that key: see `DropPrefix`)."""

    keys: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for key in self.keys:
            kv.pop(key, None)


@dataclass(frozen=True)
class DropPrefix(KVEdit):
    """Every key starting with one of `prefixes` is removed."""

    prefixes: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for key in [k for k in kv if k.startswith(self.prefixes)]:
            del kv[key]


@dataclass(frozen=True)
class When(KVEdit):
    """The `edits` apply only when `pred` holds of the blob."""

    pred: Pred
    edits: tuple[KVEdit, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.pred(src):
            for e in self.edits:
                e.apply(kv, src)


# -- values read off the blob's tensors ---------------------------------------------


@dataclass(frozen=True)
class TruncateToRows(KVEdit):
    """Arrays `keys` cut to the row count (ggml axis 1) of `tensor`."""

    tensor: str
    keys: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        t = src.tensors.get(self.tensor)
        if t is None or len(t.shape) < 2:
            return
        for key in self.keys:
            if key in kv:
                if kv[key].vtype == VT.ARRAY and kv[key].element_type == VT.ARRAY:
                    raise GGUFError(f"{key} is {describe(kv[key])}, which cannot be cut to {t.shape[1]} rows")
                kv[key] = kv[key].truncated(t.shape[1])


@dataclass(frozen=True)
class FromShape(KVEdit):
    """`key` (u32) = axis `axis` of blob tensor `tensor`, when the tensor exists."""

    key: str
    tensor: str
    axis: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        t = src.tensors.get(self.tensor)
        if t is not None and len(t.shape) > self.axis:
            kv[self.key] = u32(t.shape[self.axis])


@dataclass(frozen=True)
class FromFirstBlock(KVEdit):
    """`key` (u32) = axis `axis` of `<prefix><i>.<suffix>` for the first block i
    the blob holds that has that tensor, when `key` is absent (a width the
    converter did not write, read off the first block that has it: the first
    MoE block's expert stack, say)."""

    key: str
    prefix: str
    suffix: str
    axis: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.key in kv:
            return
        for i in sorted(src.block_ids(self.prefix)):
            t = src.tensors.get(f"{self.prefix}{i}.{self.suffix}")
            if t is not None and len(t.shape) > self.axis:
                kv[self.key] = u32(t.shape[self.axis])
                return


@dataclass(frozen=True)
class BlockCount(KVEdit):
    """`key` (u32) = how many blocks `<prefix><i>.*` the blob holds, when absent."""

    key: str
    prefix: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        kv.setdefault(self.key, u32(len(src.block_ids(self.prefix))))


@dataclass(frozen=True)
class ZeroPerLayer(KVEdit):
    """In the per-layer integer array `key`, layer i is set to 0 where blob
    tensor `tensor.format(i)` is missing (e.g. KV heads of layers without
    attention); a scalar `key` is left alone."""

    key: str
    tensor: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.key)
        if value is None or value.vtype != VT.ARRAY:
            return
        per_layer = integer_array(self.key, value).copy()
        per_layer[~layers_held(src, self.tensor, len(per_layer))] = 0
        kv[self.key] = value.with_items(per_layer)


@dataclass(frozen=True)
class PerLayerToMax(KVEdit):
    """The per-layer integer array `key` becomes one u32, its largest entry
    (e.g. the KV heads of hybrid models, 0 on the recurrent layers)."""

    key: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.key)
        if not is_integer_array(value) or not value.count:
            return
        largest = int(max(value.decode()))
        if 0 < largest < 2**32:
            kv[self.key] = u32(largest)


# -- arrays ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FillArray(KVEdit):
    """Every element of the float array `key` becomes `value` (length and
    element type kept); a scalar `key` is left alone, an array of anything
    but floats refused."""

    key: str
    value: float

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        old = kv.get(self.key)
        if old is None or old.vtype != VT.ARRAY:
            return
        if old.element_type not in (VT.FLOAT32, VT.FLOAT64):
            raise GGUFError(f"{self.key} is {describe(old)}, not an array of floats")
        kv[self.key] = array(old.element_type, [self.value] * old.count)


@dataclass(frozen=True)
class PadArray(KVEdit):
    """`dst` = the integer array `src` padded with zeros to `length` elements,
    when `src` is present and not longer, and `dst` absent (element type
    kept); `dst` = `src` pads the array in place."""

    src: str
    dst: str
    length: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.src)
        if (self.dst != self.src and self.dst in kv) or value is None:
            return
        items = [int(x) for x in integer_array(self.src, value)]
        if len(items) <= self.length:
            kv[self.dst] = value.with_items(items + [0] * (self.length - len(items)))


# -- the tokenizer ---------------------------------------------------------------------

BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # SentencePiece's byte-fallback tokens


def _token_types(kv: KVs) -> tuple[Value, np.ndarray] | None:
    """The token list and the token types as an integer array; None when the
    file has not both; GGUFError when the types are not integers."""
    tokens, types = kv.get(Keys.Tokenizer.LIST), kv.get(Keys.Tokenizer.TOKEN_TYPE)
    if tokens is None or types is None or tokens.element_type != VT.STRING:
        return None
    return tokens, integer_array(Keys.Tokenizer.TOKEN_TYPE, types)


@dataclass(frozen=True)
class TokenType(KVEdit):
    """The tokens whose text is one of `texts` get token type `token_type`."""

    texts: tuple[str, ...]
    token_type: TT

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        found = _token_types(kv)
        if found is None:
            return
        tokens, current = found
        at = tokens.indices_of(set(self.texts))
        change = [i for i in at.values() if i < len(current) and current[i] != self.token_type]
        if change:
            new = current.copy()
            new[change] = self.token_type
            kv[Keys.Tokenizer.TOKEN_TYPE] = kv[Keys.Tokenizer.TOKEN_TYPE].with_items(new)


_PAD = re.compile(r"\[PAD(\d+)\]\Z")


@dataclass(frozen=True)
class PadTokensUnused(KVEdit):
    """Ollama pads the vocabulary up to the embedding rows with tokens named
    `[PAD0]`, `[PAD1]`, ... typed user-defined, which llama.cpp matches in any
    input text; llama.cpp's converter names the same rows `[PAD<id>]` and types
    them unused, so they never come out of tokenization.  The trailing run
    `[PAD0]`..`[PAD<k-1>]` becomes that."""

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        found = _token_types(kv)
        if found is None:
            return
        tokens, kinds = found
        n = tokens.count
        last = _PAD.match(tokens.string_at(n - 1) or "") if n else None
        if last is None:
            return
        k = int(last.group(1)) + 1
        if k > n or any(tokens.string_at(n - k + i) != f"[PAD{i}]" for i in range(k)):
            return
        first = n - k
        names = array(VT.STRING, [f"[PAD{first + i}]" for i in range(k)])
        head = struct.pack("<IQ", VT.STRING, n)
        kv[Keys.Tokenizer.LIST] = Value(
            VT.ARRAY, head + bytes(tokens.truncated(first).payload[12:]) + bytes(names.payload[12:])
        )
        kinds = kinds.copy()
        kinds[first:] = TT.UNUSED
        kv[Keys.Tokenizer.TOKEN_TYPE] = kv[Keys.Tokenizer.TOKEN_TYPE].with_items(kinds)


@dataclass(frozen=True)
class DefaultTokenId(KVEdit):
    """`key` (u32) = the id of the token whose text is `text`, when `key` is
    absent and the vocabulary has that token."""

    key: str
    text: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        tokens = kv.get(Keys.Tokenizer.LIST)
        if self.key in kv or tokens is None:
            return
        found = tokens.indices_of({self.text})
        if self.text in found:
            kv[self.key] = u32(found[self.text])


# -- numbers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scaled(KVEdit):
    """`dst` (u32) = `factor` x the integer `src`, when `dst` is absent and
    `src` is an integer."""

    src: str
    dst: str
    factor: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = whole(kv.get(self.src))
        if self.dst not in kv and value is not None:
            kv[self.dst] = u32(self.factor * value)


@dataclass(frozen=True)
class Reciprocal(KVEdit):
    """`key` (u32) = 1 / the number at `ratio`, when `key` is absent and the
    ratio is a positive finite number whose inverse is a whole number (to
    1e-4); nothing otherwise."""

    ratio: str
    key: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        ratio = finite(kv.get(self.ratio))
        if self.key in kv or ratio is None or ratio <= 0:
            return
        scale = round(1.0 / ratio)
        if scale >= 1 and abs(scale * ratio - 1.0) < 1e-4:
            kv[self.key] = u32(scale)


__all__ = [
    "KVs",
    "KVEdit",
    "CopyIfAbsent",
    "CopyEachIfAbsent",
    "Default",
    "Set",
    "CopyPrefixIfAbsent",
    "Drop",
    "DropPrefix",
    "When",
    "TruncateToRows",
    "FromShape",
    "FromFirstBlock",
    "BlockCount",
    "ZeroPerLayer",
    "PerLayerToMax",
    "FillArray",
    "PadArray",
    "BYTE_TOKENS",
    "TokenType",
    "PadTokensUnused",
    "DefaultTokenId",
    "Scaled",
    "Reciprocal",
]
