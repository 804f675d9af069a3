"""Detectors: named tests of a source blob (`Pred`) and the generic ones
handlers combine.  Each is total: a key of another type than it reads (an
array where a string belongs, strings where counts belong) is simply not a
match."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np
from gguf import Keys

from ..format.header import SourceGGUF
from ..format.values import VT
from .kv_reads import is_integer_array, layers_held, scalar


@dataclass(frozen=True)
class Pred:
    """A named test of a source blob; combine with `|`, `&` and `~`."""

    text: str
    test: Callable[[SourceGGUF], bool] = field(repr=False, compare=False)

    def __call__(self, src: SourceGGUF) -> bool:
        return bool(self.test(src))

    def __or__(self, other: Pred) -> Pred:
        return Pred(f"({self.text} or {other.text})", lambda s: self(s) or other(s))

    def __and__(self, other: Pred) -> Pred:
        return Pred(f"{self.text} and {other.text}", lambda s: self(s) and other(s))

    def __invert__(self) -> Pred:
        return Pred(f"not {self.text}", lambda s: not self(s))


ALWAYS = Pred("always", lambda s: True)


def any_of(*preds: Pred) -> Pred:
    return Pred("any of [" + ", ".join(p.text for p in preds) + "]", lambda s: any(p(s) for p in preds))


def arch_is(name: str) -> Pred:
    return value_is(Keys.General.ARCHITECTURE, name)


def has_key(key: str) -> Pred:
    return Pred(f"has {key}", lambda s: key in s.kvs)


def has_true(key: str) -> Pred:
    return Pred(f"{key} is true", lambda s: scalar(s.kvs.get(key)) is True)


def is_array(key: str) -> Pred:
    return Pred(f"{key} is an array", lambda s: key in s.kvs and s.kvs[key].vtype == VT.ARRAY)


def per_layer_mismatch(key: str, tensor: str) -> Pred:
    """The per-layer integer array `key` is nonzero for a layer without `tensor.format(i)`."""

    def test(s: SourceGGUF) -> bool:
        value = s.kvs.get(key)
        if not is_integer_array(value):
            return False
        counts = np.asarray(value.decode())
        return bool((counts[~layers_held(s, tensor, len(counts))] != 0).any())

    return Pred(f"{key} counts layers without {tensor}", test)


def has_tensor(name: str) -> Pred:
    return Pred(f"has tensor {name}", lambda s: name in s.tensors)


def has_tensor_prefix(prefix: str) -> Pred:
    return Pred(f"has {prefix}* tensors", lambda s: s.has_tensor_prefix(prefix))


def has_tensor_ending(end: str) -> Pred:
    return Pred(f"has *{end} tensors", lambda s: any(name.endswith(end) for name in s.tensors))


def has_block_tensor(component: str) -> Pred:
    """Some `blk.<i>.<component>.*` tensor is in the blob."""
    needle = f".{component}."
    return Pred(
        f"has blk.*.{component} tensors", lambda s: any(n.startswith("blk.") and needle in n for n in s.tensors)
    )


def rows_differ(a: str, b: str) -> Pred:
    """Blob matrices `a` and `b` both exist and differ in row count (ggml axis 1)."""

    def test(s: SourceGGUF) -> bool:
        ta, tb = s.tensors.get(a), s.tensors.get(b)
        return ta is not None and tb is not None and len(ta.shape) == len(tb.shape) == 2 and ta.shape[1] != tb.shape[1]

    return Pred(f"{a} and {b} differ in rows", test)


def value_is(key: str, want) -> Pred:
    """The scalar or string KV `key` equals `want` (of the same Python type:
    a bool is never equal to an int)."""

    def test(s: SourceGGUF) -> bool:
        value = scalar(s.kvs.get(key))
        return type(value) is type(want) and value == want

    return Pred(f"{key} == {want!r}", test)


def value_at_least(key: str, n) -> Pred:
    def test(s: SourceGGUF) -> bool:
        value = scalar(s.kvs.get(key))
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= n

    return Pred(f"{key} >= {n}", test)


def str_contains(key: str, needle: str) -> Pred:
    def test(s: SourceGGUF) -> bool:
        value = scalar(s.kvs.get(key))
        return isinstance(value, str) and needle in value

    return Pred(f"{key} contains {needle!r}", test)


def missing_or_default(key: str) -> Pred:
    return Pred(f"{key} missing or default", lambda s: key not in s.kvs or scalar(s.kvs[key]) in ("", "default"))


def token_is(index: int, text: str) -> Pred:
    def test(s: SourceGGUF) -> bool:
        tokens = s.kvs.get(Keys.Tokenizer.LIST)
        return tokens is not None and tokens.string_at(index) == text

    return Pred(f"token {index} is {text}", test)


def has_token(text: str) -> Pred:
    def test(s: SourceGGUF) -> bool:
        tokens = s.kvs.get(Keys.Tokenizer.LIST)
        return tokens is not None and text in tokens.indices_of({text})

    return Pred(f"has token {text}", test)


__all__ = [
    "Pred",
    "any_of",
    "arch_is",
    "has_key",
    "has_true",
    "is_array",
    "per_layer_mismatch",
    "has_tensor",
    "has_tensor_prefix",
    "has_tensor_ending",
    "has_block_tensor",
    "rows_differ",
    "value_is",
    "value_at_least",
    "str_contains",
    "missing_or_default",
    "token_is",
    "has_token",
    "ALWAYS",
]
