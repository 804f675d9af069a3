"""Tensor makers: the functions `Produce` (`make(src)`) and `ProducePerBlock`
(`make(src, i)`) call to build a tensor of the translated file from blob
tensors, or None where the blob has nothing to build it from."""

from __future__ import annotations

from gguf import GGMLQuantizationType as DT
from gguf import Keys

from ..format.header import SourceGGUF, TensorInfo, tensor_nbytes
from ..errors import GGUFError
from .ops import Concat, Op, Promote


def concatenated(*parts: str):
    """A `ProducePerBlock` maker: block i's tensors `parts` (names with `{}`
    for the block, e.g. the Q, K and V a converter split one QKV into)
    concatenated along their slowest axis, bytes kept where their dtypes
    agree, F32 where they differ; None where the block lacks one.  Parts of
    different shapes, or of a type ggml does not define, are refused."""

    def make(src: SourceGGUF, i: int) -> Op | None:
        ts = [t for p in parts if (t := src.tensors.get(p.format(i))) is not None]
        if len(ts) < len(parts):
            return None
        if len({t.shape for t in ts}) != 1 or not ts[0].shape or not all(isinstance(t.dtype, DT) for t in ts):
            raise GGUFError(f"cannot merge {[(t.name, t.shape, t.dtype) for t in ts]} into one tensor")
        return Concat.of(*ts)

    return make


def split_qkv(kind: str, block: str = "v.blk.{}") -> tuple[str, ...]:
    """The names a converter gives the Q, K and V `kind` (weight or bias) it
    split one QKV of `block` into, `{}` for the block: what `concatenated`
    merges back."""
    return tuple(f"{block}.attn_{x}.{kind}" for x in "qkv")


def stacked(srcs: list[TensorInfo]) -> Concat:
    """2-D tensors of one shape stacked along a new slowest axis (bytes kept;
    F32 where their dtypes differ)."""
    if (
        not srcs
        or len({t.shape for t in srcs}) != 1
        or len(srcs[0].shape) != 2
        or not all(isinstance(t.dtype, DT) for t in srcs)
    ):
        raise GGUFError(f"cannot stack {[(t.name, t.shape, t.dtype) for t in srcs][:4]}")
    same = len({t.dtype for t in srcs}) == 1
    return Concat(tuple(srcs), (*srcs[0].shape, len(srcs)), srcs[0].known_dtype() if same else DT.F32)


def embedding_row(token: str, embedding: str = "token_embd.weight"):
    """A `Produce` maker: the row of the matrix `embedding` for the
    vocabulary token `token`, as a 1-D F32 tensor.  Only that row's bytes are
    read (any dtype: a row is whole quantization blocks)."""

    def make(src: SourceGGUF) -> Op | None:
        t, tokens = src.tensors.get(embedding), src.kvs.get(Keys.Tokenizer.LIST)
        index = tokens.indices_of({token}).get(token) if tokens is not None else None
        if t is None or index is None or len(t.shape) != 2 or index >= t.shape[1]:
            return None
        row_bytes = tensor_nbytes(t.shape[:1], t.dtype)
        return Promote.of(t.part(f"{t.name}[{index}]", t.shape[:1], t.known_dtype(), index * row_bytes))

    return make


__all__ = ["concatenated", "split_qkv", "stacked", "embedding_row"]
