"""The names gguf-py has, in the forms handlers write them: an architecture's
name, a tensor's name with or without its suffix, the components after a
block number and the prefix before it that a `Rename` writes, and `{arch}`
keys with the architecture filled in.

Handlers write the names llama.cpp reads through these (the tensors they
make, the keys they set or keep, the architecture they give a view), so that
a gguf-py release that moves a name moves the handler's target with it
(`tests/test_gguf_names.py` checks every translated view against gguf-py,
and that the views follow a gguf-py whose names moved).  The names Ollama's
converters wrote, which handlers rename, detect, read or drop, stay literals,
even where they are spelled as llama.cpp's.
"""

from __future__ import annotations

from typing import Any

from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES, Keys


def arch(a: MODEL_ARCH) -> str:
    """The architecture's name (`general.architecture`): gguf-py's `MODEL_ARCH_NAMES`."""
    return MODEL_ARCH_NAMES[a]


def tensor(t: MODEL_TENSOR, bid: int | str | None = None, suffix: str | None = "weight") -> str:
    """The full name of `t` (of block `bid`, a number or `"{}"` for a name
    template), with `.suffix` (`weight`, `bias`, none).  ValueError when a
    block tensor is named without a block, or another with one."""
    template = TENSOR_NAMES[t]
    if ("{bid}" in template) != (bid is not None):
        raise ValueError(f"{t.name} ({template}) is named {'without' if bid is None else 'with'} a block")
    name = template.format(bid=bid) if bid is not None else template
    return name if suffix is None else f"{name}.{suffix}"


def base(t: MODEL_TENSOR, bid: int | str | None = None) -> str:
    """The name of `t` (of block `bid`) without a suffix (`v.post_ln`,
    `mm.0`): what a `Rename` of whole leading components writes."""
    return tensor(t, bid, suffix=None)


def leaf(t: MODEL_TENSOR) -> str:
    """The components of a block tensor's name after its block number, with
    a leading dot (`.attn_out` of `v.blk.{bid}.attn_out`): what a `Rename`
    of inner components writes."""
    template = TENSOR_NAMES[t]
    _, sep, rest = template.partition("{bid}.")
    if not sep:
        raise ValueError(f"{t.name} ({template}) is no block tensor")
    return "." + rest


def blocks(t: MODEL_TENSOR) -> str:
    """The prefix of a block tensor's name before its block number
    (`v.sam.blk.`): where a `Rename` moves a tower (its `into`)."""
    head, sep, _ = TENSOR_NAMES[t].partition("{bid}")
    if not sep:
        raise ValueError(f"{t.name} ({TENSOR_NAMES[t]}) is no block tensor")
    return head


class ArchKeys:
    """gguf-py's `Keys` with the architecture filled in:
    `ArchKeys("gemma3").Rope.FREQ_BASE` is `"gemma3.rope.freq_base"`, and a
    key of no architecture is as gguf-py spells it."""

    def __init__(self, arch_name: str, group: type = Keys):
        self._arch, self._group = arch_name, group

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._group, attr)
        if isinstance(value, type):
            return ArchKeys(self._arch, value)
        if not isinstance(value, str):
            raise AttributeError(f"{self._group.__name__}.{attr} is no key")
        return value.replace("{arch}", self._arch)

    def __repr__(self) -> str:
        return f"ArchKeys({self._arch!r}, {self._group.__qualname__})"


__all__ = ["arch", "tensor", "base", "leaf", "blocks", "ArchKeys"]
