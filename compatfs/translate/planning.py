"""A translation and how it is applied to a blob.

A `Translation` is a table: a detector (`Pred`), KV edits and tensor edits,
applied in the order listed.  `plan(translation, source)` turns it into a
`ViewSpec`: the ordered KVs and the tensors of the translated file, each
tensor either a byte range of the blob or an op.  Nothing here reads tensor
data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod
from collections.abc import Iterable

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as DT

from ..format.header import MAX_DIM, SourceGGUF
from ..errors import GGUFError
from ..format.values import Value
from .kv_edits import KVEdit, KVs, When
from .kv_reads import describe, whole
from .predicates import Pred
from .tensor_edits import Rename, TensorEdit, Tensors, ViewTensor


@dataclass(frozen=True)
class Count:
    """The KV `key` counts the blocks `<prefix><i>.*` of the blob: a value
    that is not a whole number, or exceeds the blocks the blob holds, refuses
    the translation (it would drive loops over tensors that are not there)."""

    key: str
    prefix: str

    def check(self, src: SourceGGUF) -> None:
        value = src.kvs.get(self.key)
        if value is None:
            return
        held, n = len(src.block_ids(self.prefix)), whole(value)
        if n is None or not 0 <= n <= held:
            raise GGUFError(f"{self.key} is {describe(value)}, but the blob holds {held} {self.prefix}* blocks")


@dataclass(frozen=True)
class StoredType:
    """A ggml type number no GGUF reader knows, whose layout a translation
    does (`elements` per block of `nbytes`): its tensors' byte ranges are
    checked like any other's."""

    number: int
    elements: int
    nbytes: int


@dataclass(frozen=True)
class Translation:
    """What one handler changes for the files its detector claims."""

    name: str
    detect: Pred
    kv: tuple[KVEdit, ...] = ()
    tensors: tuple[TensorEdit, ...] = ()
    counts: tuple[Count, ...] = ()  # checked before anything is planned
    stored_types: tuple[StoredType, ...] = ()  # types of the blob only this translation can size

    def __post_init__(self) -> None:
        """Checked when the handler module is imported: an edit in the wrong
        list fails there, naming it, instead of at the first open."""
        if not isinstance(self.detect, Pred):
            raise TypeError(f"translation {self.name}: detect is {self.detect!r}, not a Pred")
        for edit in _flatten(self.kv):
            if not isinstance(edit, KVEdit):
                raise TypeError(f"translation {self.name}: {edit!r} in kv is not a KV edit")
        for edit in self.tensors:
            if not isinstance(edit, TensorEdit):
                raise TypeError(f"translation {self.name}: {edit!r} in tensors is not a tensor edit")
        for count in self.counts:
            if not isinstance(count, Count):
                raise TypeError(f"translation {self.name}: {count!r} in counts is not a Count")
        for t in self.stored_types:
            if not isinstance(t, StoredType) or t.number in GGML_QUANT_SIZES:
                raise TypeError(f"translation {self.name}: {t!r} is not a StoredType of an unknown ggml type")

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


@dataclass
class ViewSpec:
    """The content of a translated file, before layout."""

    kvs: list[tuple[str, Value]]
    tensors: list[ViewTensor]
    alignment: int
    handler: str
    idle_renames: tuple = ()  # the `Rename`s that matched no tensor of this blob


def plan(tr: Translation, src: SourceGGUF) -> ViewSpec:
    """Apply `tr` to `src`: the KVs and tensors of the translated file."""
    if src.duplicates:
        raise GGUFError(f"duplicate {', '.join(src.duplicates[:5])}: a translation would drop one of each")
    check_data(src, tr.stored_types)
    for count in tr.counts:
        count.check(src)
    kv: KVs = dict(src.kvs)
    for edit in tr.kv:
        try:
            edit.apply(kv, src)
        except GGUFError as e:
            raise GGUFError(f"{tr.name}: {label(edit)}: {e}") from None
    ts: Tensors = [ViewTensor(t.name, t.shape, t.dtype, source=t, order=t.offset) for t in src.tensors.values()]
    idle: list[TensorEdit] = []
    for t_edit in tr.tensors:
        before = [t.name for t in ts] if isinstance(t_edit, Rename) else None
        try:
            ts = t_edit.apply(ts, src)
        except GGUFError as e:
            raise GGUFError(f"{tr.name}: {label(t_edit)}: {e}") from None
        if before is not None and before == [t.name for t in ts]:
            idle.append(t_edit)
    names = [t.name for t in ts]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise GGUFError(f"translation {tr.name} yields duplicate tensor names {dup[:5]}")
    for t in ts:
        if any(not 0 <= d <= MAX_DIM for d in t.shape):
            raise GGUFError(f"translation {tr.name}: tensor {t.name} has a dimension beyond ggml's int64")
        if t.op is None and not isinstance(t.dtype, DT):
            raise GGUFError(
                f"tensor {t.name} has ggml type {int(t.dtype)}, which no GGUF reader accepts, "
                f"and {tr.name} does not convert it"
            )
        if t.op is None and (t.source is None or t.nbytes > t.source.nbytes):
            raise GGUFError(f"translation {tr.name}: tensor {t.name} is not backed by the blob's bytes")
    return ViewSpec(list(kv.items()), ts, src.alignment, tr.name, tuple(idle))


def label(edit) -> str:
    """An edit as its class and its names and numbers (its tuples and callables left out)."""
    parts = [
        v.name if isinstance(v, Enum) else repr(v)
        for v in vars(edit).values()
        if isinstance(v, (str, int)) and not isinstance(v, bool)
    ]
    return f"{type(edit).__name__}({', '.join(parts)})"


def check_data(src: SourceGGUF, stored: tuple[StoredType, ...] = ()) -> None:
    """Every tensor lies inside the blob's data section, and no two overlap
    (a translated view would serve the same bytes twice).  A tensor of a type
    neither ggml nor `stored` defines has no known size: its start is
    checked (inside the data, not inside another tensor)."""
    sizes = {t.number: (t.elements, t.nbytes) for t in stored}
    spans = []
    for t in src.tensors.values():
        if isinstance(t.dtype, DT):
            end = t.offset + t.nbytes
        elif t.dtype in sizes:
            elements, nbytes = sizes[t.dtype]
            n = prod(t.shape)
            if t.shape and t.shape[0] % elements:
                raise GGUFError(
                    f"tensor {t.name}: a row of {t.shape[0]} is not a whole number of "
                    f"{elements}-element blocks of ggml type {t.dtype}"
                )
            end = t.offset + n // elements * nbytes
        else:
            end = t.offset
        spans.append((t.offset, end, t.name))
    spans.sort()
    for (start, end, name), (next_start, _, next_name) in zip(spans, spans[1:] + [(src.size, 0, "")], strict=True):
        if start < src.data_offset:
            raise GGUFError(f"tensor {name} starts before the data section")
        if end > next_start:
            raise GGUFError(f"tensor {name} overlaps {next_name or 'the end of the file'}")


def first_claim(translations: Iterable[Translation], src: SourceGGUF) -> Translation | None:
    """The first translation, in dispatch order, whose detector claims `src`."""
    return next((t for t in translations if t.claims(src)), None)


__all__ = ["Count", "StoredType", "Translation", "ViewSpec", "plan", "check_data", "first_claim"]
