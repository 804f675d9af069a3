"""The clip projector file made from the vision side of a monolithic blob:
the KV edits every such translation shares, and a builder for the
translation itself."""

from __future__ import annotations

from gguf import Keys

from ..format.values import VT, array, boolean, string
from .kv_edits import CopyEachIfAbsent, CopyIfAbsent, Default, DropPrefix, KVEdit, Set
from .planning import Translation
from .predicates import Pred
from .tensor_edits import KeepOnly, TensorEdit

# The image statistics of OpenAI's CLIP preprocessor, which many towers keep.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def as_projector(arch: str) -> tuple[KVEdit, ...]:
    """The KV edits that make a monolithic `arch` blob's view a clip projector
    file: architecture `clip`, type `mmproj`, and none of the text model's or
    tokenizer's keys (put the `clip.*` copies before these)."""
    return (
        Set(Keys.General.ARCHITECTURE, string("clip")),
        Set(Keys.General.TYPE, string("mmproj")),
        DropPrefix((f"{arch}.", "tokenizer.")),
    )


def clip_projector(
    name: str,
    detect: Pred,
    arch: str,
    projector_type: str,
    *,
    copy: tuple[str, ...],
    head: tuple[KVEdit, ...] = (),
    edits: tuple[KVEdit, ...] = (),
    tail: tuple[KVEdit, ...] = (),
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    activation: str | None = Keys.ClipVision.USE_GELU,
    keep_present: bool = False,
    keep: tuple[str, ...] = ("v.", "mm."),
    tensors: tuple[TensorEdit, ...] = (),
    counts: tuple = (),
):
    """The translation of an `arch` blob's vision tower into a clip file of
    type `projector_type`.  Its KVs, in this order: the `copy` names of
    `<arch>.vision.*` as `clip.vision.*`, the `head` edits, the projection
    width (the text model's embedding length, which the projector's output
    feeds), the `edits`, the image `mean` and `std` where the blob has none,
    the `tail` edits, the vision encoder and `activation` flags (set, or with
    `keep_present` only where the blob has none), the projector type, and
    `as_projector`.  Its tensors: those under `keep`, then `tensors`."""
    flag = Default if keep_present else Set
    kv = (
        CopyEachIfAbsent(f"{arch}.vision.", "clip.vision.", copy),
        *head,
        CopyIfAbsent(f"{arch}.embedding_length", Keys.ClipVision.PROJECTION_DIM),
        *edits,
        *((Default(Keys.ClipVision.IMAGE_MEAN, array(VT.FLOAT32, mean)),) if mean is not None else ()),
        *((Default(Keys.ClipVision.IMAGE_STD, array(VT.FLOAT32, std)),) if std is not None else ()),
        *tail,
        flag(Keys.Clip.HAS_VISION_ENCODER, boolean(True)),
        *((flag(activation, boolean(True)),) if activation is not None else ()),
        Set(Keys.Clip.PROJECTOR_TYPE, string(projector_type)),
        *as_projector(arch),
    )
    return Translation(name=name, detect=detect, kv=kv, tensors=(KeepOnly(keep), *tensors), counts=counts)


__all__ = ["as_projector", "clip_projector", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD"]
