"""The vocabulary handlers are written in, and how a translation is applied.

A `Translation` is a table: a detector (`Pred`), KV edits and tensor edits,
applied in the order listed.  `plan(translation, source)` turns it into a
`ViewSpec`: the ordered KVs and the tensors of the translated file, each
tensor either a byte range of the blob or an op.  Nothing here reads tensor
data.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterable, Union

from gguf import Keys
from gguf import GGMLQuantizationType as DT

from .gguf_source import SourceGGUF, TensorInfo, tensor_nbytes
from .gguf_values import VT, GGUFError, Value, array, string, u32
from .ops import Op, Promote


# -- detectors --------------------------------------------------------------

@dataclass(frozen=True)
class Pred:
    """A named test of a source blob; combine with `|`, `&` and `~`."""

    text: str
    test: Callable[[SourceGGUF], bool] = field(repr=False, compare=False)

    def __call__(self, src: SourceGGUF) -> bool:
        return self.test(src)

    def __or__(self, other: "Pred") -> "Pred":
        return Pred(f"({self.text} or {other.text})", lambda s: self(s) or other(s))

    def __and__(self, other: "Pred") -> "Pred":
        return Pred(f"{self.text} and {other.text}", lambda s: self(s) and other(s))

    def __invert__(self) -> "Pred":
        return Pred(f"not {self.text}", lambda s: not self(s))


def any_of(*preds: Pred) -> Pred:
    return Pred("any of [" + ", ".join(p.text for p in preds) + "]", lambda s: any(p(s) for p in preds))


def arch_is(name: str) -> Pred:
    return Pred(f"architecture is {name}", lambda s: s.architecture == name)


def has_key(key: str) -> Pred:
    return Pred(f"has {key}", lambda s: key in s.kvs)


def has_true(key: str) -> Pred:
    return Pred(f"{key} is true", lambda s: s.get(key) is True)


def per_layer_mismatch(key: str, tensor: str) -> Pred:
    """The per-layer array `key` is nonzero for a layer without `tensor.format(i)`."""
    def test(s: SourceGGUF) -> bool:
        value = s.kvs.get(key)
        if value is None or value.element_type is None:
            return False
        return any(n and tensor.format(i) not in s.tensors for i, n in enumerate(value.decode()))
    return Pred(f"{key} counts layers without {tensor}", test)


def has_tensor(name: str) -> Pred:
    return Pred(f"has tensor {name}", lambda s: name in s.tensors)


def has_tensor_prefix(prefix: str) -> Pred:
    return Pred(f"has {prefix}* tensors", lambda s: s.has_tensor_prefix(prefix))


def value_is(key: str, want) -> Pred:
    return Pred(f"{key} == {want!r}", lambda s: key in s.kvs and _scalar(s, key) == want)


def value_at_least(key: str, n) -> Pred:
    return Pred(f"{key} >= {n}", lambda s: isinstance(_scalar(s, key), (int, float)) and _scalar(s, key) >= n)


def str_contains(key: str, needle: str) -> Pred:
    def test(s: SourceGGUF) -> bool:
        value = _scalar(s, key)
        return isinstance(value, str) and needle in value
    return Pred(f"{key} contains {needle!r}", test)


def missing_or_default(key: str) -> Pred:
    return Pred(f"{key} missing or default", lambda s: key not in s.kvs or _scalar(s, key) in ("", "default"))


def token_is(index: int, text: str) -> Pred:
    def test(s: SourceGGUF) -> bool:
        tokens = s.kvs.get(Keys.Tokenizer.LIST)
        return tokens is not None and tokens.string_at(index) == text
    return Pred(f"token {index} is {text}", test)


def _scalar(s: SourceGGUF, key: str):
    v = s.kvs.get(key)
    return None if v is None or v.vtype == VT.ARRAY else v.decode()


ALWAYS = Pred("always", lambda s: True)


# -- KV edits -------------------------------------------------------------------

KVs = dict[str, Value]


@dataclass(frozen=True)
class Copy:
    """`dst` takes `src`'s value when `dst` is absent and `src` present."""
    src: str
    dst: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.dst not in kv and self.src in kv:
            kv[self.dst] = kv[self.src]


@dataclass(frozen=True)
class CopyEach:
    """`Copy(src_prefix + name, dst_prefix + name)` for each of `names`."""
    src_prefix: str
    dst_prefix: str
    names: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for name in self.names:
            Copy(self.src_prefix + name, self.dst_prefix + name).apply(kv, src)


@dataclass(frozen=True)
class Default:
    """`key` = `value` when `key` is absent."""
    key: str
    value: Value

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        kv.setdefault(self.key, self.value)


@dataclass(frozen=True)
class Set:
    """`key` = `value`, replacing any value in place; only `when` it holds of the blob."""
    key: str
    value: Value
    when: Pred = ALWAYS

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.when(src):
            kv[self.key] = self.value


@dataclass(frozen=True)
class CopyPrefix:
    """Every `old`* key is copied to `new`* (when not already there)."""
    old: str
    new: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for key in [k for k in kv if k.startswith(self.old)]:
            kv.setdefault(self.new + key[len(self.old):], kv[key])


@dataclass(frozen=True)
class Drop:
    """Every key starting with one of `prefixes` is removed."""
    prefixes: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        for key in [k for k in kv if k.startswith(self.prefixes)]:
            del kv[key]


@dataclass(frozen=True)
class TruncateToRows:
    """Arrays `keys` cut to the row count (ggml axis 1) of `tensor`."""
    tensor: str
    keys: tuple[str, ...]

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        t = src.tensors.get(self.tensor)
        if t is None or len(t.shape) < 2:
            return
        for key in self.keys:
            if key in kv:
                kv[key] = kv[key].truncated(t.shape[1])


@dataclass(frozen=True)
class FromShape:
    """`key` (u32) = axis `axis` of blob tensor `tensor`, when the tensor exists."""
    key: str
    tensor: str
    axis: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        t = src.tensors.get(self.tensor)
        if t is not None and len(t.shape) > self.axis:
            kv[self.key] = u32(t.shape[self.axis])


@dataclass(frozen=True)
class ZeroPerLayer:
    """In the per-layer array `key`, layer i is set to 0 where blob tensor
    `tensor.format(i)` is missing (e.g. KV heads of layers without attention)."""
    key: str
    tensor: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.key)
        if value is None or value.element_type is None:
            return
        per_layer = value.decode().copy()
        for i in range(len(per_layer)):
            if self.tensor.format(i) not in src.tensors:
                per_layer[i] = 0
        kv[self.key] = array(value.element_type, per_layer)


@dataclass(frozen=True)
class TokenType:
    """The tokens whose text is one of `texts` get token type `token_type`
    (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""
    texts: tuple[str, ...]
    token_type: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        tokens, types = kv.get(Keys.Tokenizer.LIST), kv.get(Keys.Tokenizer.TOKEN_TYPE)
        if tokens is None or types is None or types.element_type is None:
            return
        found = tokens.indices_of(set(self.texts))
        current = types.decode()
        change = [i for i in found.values() if i < len(current) and current[i] != self.token_type]
        if change:
            new = current.copy()
            new[change] = self.token_type
            kv[Keys.Tokenizer.TOKEN_TYPE] = array(types.element_type, new)


@dataclass(frozen=True)
class FillArray:
    """Every element of the numeric array `key` becomes `value`
    (length and element type kept)."""
    key: str
    value: float

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        old = kv.get(self.key)
        if old is None or old.element_type in (None, VT.STRING, VT.ARRAY):
            return
        kv[self.key] = array(old.element_type, [self.value] * old.count)


@dataclass(frozen=True)
class PadArray:
    """`dst` = the integer array `src` padded with zeros to `length` elements,
    when `src` is present and `dst` absent (element type kept)."""
    src: str
    dst: str
    length: int

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.src)
        if self.dst in kv or value is None or value.element_type in (None, VT.STRING, VT.ARRAY):
            return
        items = [int(x) for x in value.decode()]
        if len(items) <= self.length:
            kv[self.dst] = array(value.element_type, items + [0] * (self.length - len(items)))


@dataclass(frozen=True)
class DefaultTokenId:
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


@dataclass(frozen=True)
class PerLayerToMax:
    """The per-layer integer array `key` becomes one u32, its largest entry
    (e.g. the KV heads of hybrid models, 0 on the recurrent layers)."""
    key: str

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        value = kv.get(self.key)
        if value is None or value.element_type not in _INTEGERS or not value.count:
            return
        largest = int(max(value.decode()))
        if 0 < largest < 2**32:
            kv[self.key] = u32(largest)


_INTEGERS = (VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64)


@dataclass(frozen=True)
class When:
    """The `edits` apply only when `pred` holds of the blob."""
    pred: Pred
    edits: tuple

    def apply(self, kv: KVs, src: SourceGGUF) -> None:
        if self.pred(src):
            for e in self.edits:
                e.apply(kv, src)


def as_projector(arch: str) -> tuple:
    """The KV edits that make a monolithic `arch` blob's view a clip projector
    file: architecture `clip`, type `mmproj`, and none of the text model's or
    tokenizer's keys (put the `clip.*` copies before these)."""
    return (
        Set(Keys.General.ARCHITECTURE, string("clip")),
        Set(Keys.General.TYPE, string("mmproj")),
        Drop((f"{arch}.", "tokenizer.")),
    )


KVEdit = Union[Copy, CopyEach, Default, Set, CopyPrefix, Drop, TruncateToRows, FromShape, ZeroPerLayer, TokenType,
               FillArray, PadArray, DefaultTokenId, When]


# -- tensor edits ---------------------------------------------------------------

@dataclass
class ViewTensor:
    """A tensor of the translated file: a blob range (`op is None`) or an op."""

    name: str
    shape: tuple[int, ...]
    dtype: DT
    source: TensorInfo | None = None   # blob tensor whose bytes are served (a prefix, if shorter)
    op: Op | None = None
    order: int = 0                     # blob offset that places it in the data section
    renamed: bool = False              # a tensor is renamed at most once: renames never chain

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)


Tensors = list[ViewTensor]


@dataclass(frozen=True)
class Hide:
    """Tensors whose names start with one of `prefixes` are left out."""
    prefixes: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        return [t for t in ts if not t.name.startswith(self.prefixes)]


@dataclass(frozen=True)
class KeepOnly:
    """Only tensors whose names start with one of `prefixes` stay."""
    prefixes: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        return [t for t in ts if t.name.startswith(self.prefixes)]


@dataclass(frozen=True)
class Rename:
    """Whole dot-separated name components: the components of `old` become
    those of `new`, at the start of the name, or anywhere after the first
    component when `old` starts with a dot (`.attn_output` renames
    `v.blk.3.attn_output.weight`; `blk.1` never touches `blk.10`).  Only
    tensors whose names start with `under` are considered, and a tensor that
    an earlier `Rename` already renamed is left alone: renames never chain."""
    old: str
    new: str
    under: str = ""

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        old, new = _parts(self.old), _parts(self.new)
        starts = range(1, 2**31) if self.old.startswith(".") else range(0, 1)
        for t in ts:
            if t.renamed or not t.name.startswith(self.under):
                continue
            parts = t.name.split(".")
            at = next((i for i in starts[:max(len(parts) - len(old) + 1, 0)]
                       if tuple(parts[i:i + len(old)]) == old), None)
            if at is not None:
                t.name = ".".join((*parts[:at], *new, *parts[at + len(old):]))
                t.renamed = True
        return ts


def _parts(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in pattern.strip(".").split(".") if p)


@dataclass(frozen=True)
class AddSuffix:
    """Tensors whose names end with `end` get `suffix` appended (counts as
    their one rename)."""
    end: str
    suffix: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for t in ts:
            if t.name.endswith(self.end) and not t.renamed:
                t.name, t.renamed = t.name + self.suffix, True
        return ts


@dataclass(frozen=True)
class ToF32:
    """Tensors named `names` (after renames) are served as F32 when stored as F16/BF16."""
    names: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for t in ts:
            if t.name in self.names and t.op is None and t.dtype in (DT.F16, DT.BF16):
                t.op = Promote.of(t.source)
                t.dtype = DT.F32
        return ts


@dataclass(frozen=True)
class Produce:
    """Tensor `name` is made by `make(src)` from blob tensors; it takes the
    place of its first input, and the blob tensors in `consumes` are left out."""
    name: str
    make: Callable[[SourceGGUF], Op | None]
    consumes: tuple[str, ...] = ()

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        op = self.make(src)
        if op is None:
            return ts
        first = op.inputs[0].offset if op.inputs else 0
        ts = [t for t in ts if t.source is None or t.source.name not in self.consumes]
        ts.append(ViewTensor(self.name, op.shape, op.dtype, op=op, order=first))
        return ts


@dataclass(frozen=True)
class ProducePerBlock:
    """`Produce` once per block i < KV `blocks` that the blob holds: tensor
    `name.format(i)` made by `make(src, i)`, consuming `consumes` formatted
    with i; blocks where `make` gives None are left as they are."""
    blocks: str
    name: str
    make: Callable[[SourceGGUF, int], Op | None]
    consumes: tuple[str, ...] = ()

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        prefix = self.name.partition("{}")[0]
        count = _count(src, self.blocks)
        for i in sorted(i for i in src.block_ids(prefix) if i < count):
            produce = Produce(self.name.format(i), lambda s, i=i: self.make(s, i),
                              tuple(c.format(i) for c in self.consumes))
            ts = produce.apply(ts, src)
        return ts


def _count(src: SourceGGUF, key: str) -> int:
    value = src.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


TensorEdit = Union[Hide, KeepOnly, Rename, ToF32, Produce, ProducePerBlock]


# -- counts ---------------------------------------------------------------------

@dataclass(frozen=True)
class Count:
    """The KV `key` counts the blocks `<prefix><i>.*` of the blob: a value
    that is not a whole number, or exceeds the blocks the blob holds, refuses
    the translation (it would drive loops over tensors that are not there)."""
    key: str
    prefix: str

    def check(self, src: SourceGGUF) -> None:
        value = src.get(self.key)
        if value is None:
            return
        held = len(src.block_ids(self.prefix))
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= held:
            raise GGUFError(f"{self.key} = {value!r}, but the blob holds {held} {self.prefix}* blocks")


# -- translations ---------------------------------------------------------------

@dataclass(frozen=True)
class Translation:
    """What one handler changes for the files its detector claims."""

    name: str
    detect: Pred
    kv: tuple = ()
    tensors: tuple = ()
    counts: tuple = ()          # `Count`s checked before anything is planned

    def __post_init__(self) -> None:
        """Checked when the handler module is imported: an edit in the wrong
        list fails there, naming it, instead of at the first open."""
        if not isinstance(self.detect, Pred):
            raise TypeError(f"translation {self.name}: detect is {self.detect!r}, not a Pred")
        for edit in _flatten(self.kv):
            if _edit_kind(edit) != "kv":
                raise TypeError(f"translation {self.name}: {edit!r} in kv is not a KV edit")
        for edit in self.tensors:
            if _edit_kind(edit) != "tensors":
                raise TypeError(f"translation {self.name}: {edit!r} in tensors is not a tensor edit")
        for count in self.counts:
            if not isinstance(count, Count):
                raise TypeError(f"translation {self.name}: {count!r} in counts is not a Count")

    def claims(self, src: SourceGGUF) -> bool:
        return self.detect(src)


def _flatten(edits: tuple) -> list:
    """KV edits with the contents of `When`s."""
    out = []
    for edit in edits:
        out.append(edit)
        if isinstance(edit, When):
            out.extend(_flatten(edit.edits))
    return out


def _edit_kind(edit) -> str | None:
    """"kv" for an edit applied as `apply(kv, src)`, "tensors" for `apply(ts, src)`."""
    apply = getattr(type(edit), "apply", None)
    if apply is None:
        return None
    params = tuple(inspect.signature(apply).parameters)[1:]
    return {("kv", "src"): "kv", ("ts", "src"): "tensors"}.get(params)


@dataclass
class ViewSpec:
    """The content of a translated file, before layout."""

    kvs: list[tuple[str, Value]]
    tensors: list[ViewTensor]
    alignment: int
    handler: str
    idle_renames: tuple = ()    # the `Rename`s that matched no tensor of this blob


def plan(tr: Translation, src: SourceGGUF) -> ViewSpec:
    """Apply `tr` to `src`: the KVs and tensors of the translated file."""
    if src.duplicates:
        raise GGUFError(f"duplicate {', '.join(src.duplicates[:5])}: a translation would drop one of each")
    _check_data(src)
    for count in tr.counts:
        count.check(src)
    kv: KVs = dict(src.kvs)
    for edit in tr.kv:
        try:
            edit.apply(kv, src)
        except GGUFError as e:
            raise GGUFError(f"{tr.name}: {edit!r}: {e}") from None
    ts: Tensors = [ViewTensor(t.name, t.shape, t.dtype, source=t, order=t.offset) for t in src.tensors.values()]
    idle = []
    for edit in tr.tensors:
        before = [t.name for t in ts] if isinstance(edit, Rename) else None
        ts = edit.apply(ts, src)
        if before is not None and before == [t.name for t in ts]:
            idle.append(edit)
    names = [t.name for t in ts]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise GGUFError(f"translation {tr.name} yields duplicate tensor names {dup[:5]}")
    for t in ts:
        if t.op is None and not isinstance(t.dtype, DT):
            raise GGUFError(f"tensor {t.name} has ggml type {int(t.dtype)}, which no GGUF reader accepts, "
                            f"and {tr.name} does not convert it")
        if t.op is None and (t.source is None or t.nbytes > t.source.nbytes):
            raise GGUFError(f"translation {tr.name}: tensor {t.name} is not backed by the blob's bytes")
    return ViewSpec(list(kv.items()), ts, src.alignment, tr.name, tuple(idle))


def _check_data(src: SourceGGUF) -> None:
    """Every tensor of a known type lies inside the blob's data section, and no
    two overlap (a translated view would serve the same bytes twice)."""
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in src.tensors.values() if isinstance(t.dtype, DT))
    for (start, end, name), (next_start, _, next_name) in zip(spans, spans[1:] + [(src.size, 0, "")]):
        if start < src.data_offset:
            raise GGUFError(f"tensor {name} starts before the data section")
        if end > next_start:
            raise GGUFError(f"tensor {name} overlaps {next_name or 'the end of the file'}")


def first_claim(translations: Iterable[Translation], src: SourceGGUF) -> Translation | None:
    """The first translation, in dispatch order, whose detector claims `src`."""
    return next((t for t in translations if t.claims(src)), None)


# -- appended: generic pieces shared by several handlers -----------------------------

@dataclass(frozen=True)
class FromFirstBlock:
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
