"""Tensor edits: changes to the tensor list of a translated file, each a
`TensorEdit` applied as `apply(ts, src)` to the list as edited so far,
returning the new list."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Callable

from gguf import GGMLQuantizationType as DT

from ..format.header import SourceGGUF, TensorInfo, tensor_nbytes
from .kv_reads import whole
from ..errors import GGUFError
from .ops import Op, Permute, Promote


@dataclass
class ViewTensor:
    """A tensor of the translated file: a blob range (`op is None`) or an op."""

    name: str
    shape: tuple[int, ...]
    dtype: DT | int  # an int: a blob tensor of a type gguf-py does not know (see plan)
    source: TensorInfo | None = None  # blob tensor whose bytes are served (a prefix, if shorter)
    op: Op | None = None
    order: int = 0  # blob offset that places it in the data section
    renamed: bool = False  # a tensor is renamed at most once: renames never chain

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)


Tensors = list[ViewTensor]


class TensorEdit(ABC):
    """An edit of the translated file's tensors (listed in a `Translation`'s `tensors`)."""

    @abstractmethod
    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        """The tensor list after this edit."""


@dataclass(frozen=True)
class Hide(TensorEdit):
    """Tensors whose names start with one of `prefixes` are left out."""

    prefixes: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        return [t for t in ts if not t.name.startswith(self.prefixes)]


@dataclass(frozen=True)
class KeepOnly(TensorEdit):
    """Only tensors whose names start with one of `prefixes` stay."""

    prefixes: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        return [t for t in ts if t.name.startswith(self.prefixes)]


@dataclass(frozen=True)
class Rename(TensorEdit):
    """Whole dot-separated name components: the components of `old` become
    those of `new`, at the start of the name, or anywhere after the first
    component when `old` starts with a dot (`.attn_output` renames
    `v.blk.3.attn_output.weight`; `blk.1` never touches `blk.10`).  Only
    tensors whose names start with `under` are considered; with `into`, that
    leading `under` becomes `into` in the same rename (a tower moved as its
    inner names change).  A tensor that an earlier rename already renamed is
    left alone: renames never chain."""

    old: str
    new: str
    under: str = ""
    into: str | None = None

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        old, new = _parts(self.old), _parts(self.new)
        starts = range(1, 2**31) if self.old.startswith(".") else range(0, 1)
        for t in ts:
            if t.renamed or not t.name.startswith(self.under):
                continue
            parts = t.name.split(".")
            at = next(
                (i for i in starts[: max(len(parts) - len(old) + 1, 0)] if tuple(parts[i : i + len(old)]) == old), None
            )
            if at is not None:
                name = ".".join((*parts[:at], *new, *parts[at + len(old) :]))
                if self.into is not None:
                    name = self.into + name[len(self.under) :]
                t.name, t.renamed = name, True
        return ts


def _parts(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in pattern.strip(".").split(".") if p)


@dataclass(frozen=True)
class RenameEnd(TensorEdit):
    """Tensors whose names end with `end` have that end replaced by `new`
    (counts as their one rename): `RenameEnd(".ssm_dt", ".ssm_dt.bias")`
    names `blk.3.ssm_dt` as `blk.3.ssm_dt.bias`, and nothing else."""

    end: str
    new: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for t in ts:
            if t.name.endswith(self.end) and not t.renamed:
                t.name, t.renamed = t.name[: len(t.name) - len(self.end)] + self.new, True
        return ts


@dataclass(frozen=True)
class ToF32(TensorEdit):
    """Tensors named `names` (after renames) are served as F32 when stored as F16/BF16."""

    names: tuple[str, ...]

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        for t in ts:
            if t.name in self.names and t.op is None and t.source is not None and t.dtype in (DT.F16, DT.BF16):
                t.op = Promote.of(t.source)
                t.dtype = DT.F32
        return ts


@dataclass(frozen=True)
class RopePermute(TensorEdit):
    """Every tensor named `prefix`...`suffix` gets llama.cpp's rope row order
    (`LlamaModel.permute` of its converter): per head, the HF layout [first
    halves | second halves] becomes interleaved pairs.  The head count is the
    blob's KV `heads`.  Plain dtypes only (F32/F16/BF16); a quantized match
    is an error rather than a silently wrong tensor."""

    prefix: str
    suffixes: tuple[str, ...]
    heads: str

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        n_head = whole(src.kvs.get(self.heads))
        for t in ts:
            if (
                not (t.name.startswith(self.prefix) and t.name.endswith(self.suffixes))
                or t.op is not None
                or t.source is None
            ):
                continue
            rows, rest = (t.shape[-1], tuple(reversed(t.shape[:-1]))) if t.shape else (0, ())
            if (
                n_head is None
                or n_head <= 0
                or not rows
                or rows % (2 * n_head)
                or t.dtype not in (DT.F32, DT.F16, DT.BF16)
            ):
                raise GGUFError(f"{t.name}: cannot rope-permute {t.dtype!r} with {self.heads}={n_head!r}")
            view = (n_head, 2, rows // n_head // 2, *rest)
            t.op = Permute.of(t.source, view, (0, 2, 1, *range(3, len(view))))
        return ts


@dataclass(frozen=True)
class Produce(TensorEdit):
    """Tensor `name` is made by `make(src)` from blob tensors; it takes the
    place of its first input, and the blob tensors in `consumes` are left out."""

    name: str
    make: Callable[[SourceGGUF], Op | None]
    consumes: tuple[str, ...] = ()

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        return _produced(ts, self.name, self.make(src), self.consumes)


def _produced(ts: Tensors, name: str, op: Op | None, consumes: tuple[str, ...]) -> Tensors:
    """`ts` with tensor `name` made by `op` in the place of its first input,
    less the blob tensors `consumes`; `ts` itself when `op` is None."""
    if op is None:
        return ts
    first = op.inputs[0].offset if op.inputs else 0
    ts = [t for t in ts if t.source is None or t.source.name not in consumes]
    ts.append(ViewTensor(name, op.shape, op.dtype, op=op, order=first))
    return ts


@dataclass(frozen=True)
class ProducePerBlock(TensorEdit):
    """`Produce` once per block i < KV `blocks` that the blob holds: tensor
    `name.format(i)` made by `make(src, i)`, consuming `consumes` formatted
    with i; blocks where `make` gives None are left as they are."""

    blocks: str
    name: str
    make: Callable[[SourceGGUF, int], Op | None]
    consumes: tuple[str, ...] = ()

    def apply(self, ts: Tensors, src: SourceGGUF) -> Tensors:
        prefix = self.name.partition("{}")[0]
        count = whole(src.kvs.get(self.blocks)) or 0
        for i in sorted(i for i in src.block_ids(prefix) if i < count):
            ts = _produced(ts, self.name.format(i), self.make(src, i), tuple(c.format(i) for c in self.consumes))
        return ts


__all__ = [
    "ViewTensor",
    "Tensors",
    "TensorEdit",
    "Hide",
    "KeepOnly",
    "Rename",
    "RenameEnd",
    "ToF32",
    "RopePermute",
    "Produce",
    "ProducePerBlock",
]
