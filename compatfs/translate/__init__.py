"""The vocabulary handlers are written in; handler modules import all of it
from here: detectors (`compatfs.translate.predicates`), typed reads of a KV's
value (`compatfs.translate.kv_reads`), KV edits (`compatfs.translate.kv_edits`),
tensor edits (`compatfs.translate.tensor_edits`), tensor makers
(`compatfs.translate.makers`), the ops a handler's own tensors are made with
(`compatfs.translate.ops`, and those that only move bytes,
`compatfs.translate.byte_ops`, with the input runs they move,
`compatfs.translate.runs`), the clip projector builder
(`compatfs.translate.projector`), the names gguf-py has, in the forms an edit
writes them (`compatfs.translate.gguf_names`), and the translation they make
up with `plan`, which applies one to a blob (`compatfs.translate.planning`).

What is not translation a handler takes from where it lives: the blob's
`SourceGGUF`, `TensorInfo` and KV values from `compatfs.format`, `GGUFError`
from `compatfs.errors`, scratch buffers from `compatfs.files.scratch`; and
`compatfs.translate.accel`, the optional compiled kernels, as a module."""

from . import byte_ops, gguf_names, kv_edits, kv_reads, makers, ops, planning, predicates, projector, runs, tensor_edits
from .byte_ops import *  # noqa: F401,F403
from .gguf_names import *  # noqa: F401,F403
from .kv_edits import *  # noqa: F401,F403
from .kv_reads import *  # noqa: F401,F403
from .makers import *  # noqa: F401,F403
from .ops import *  # noqa: F401,F403
from .planning import *  # noqa: F401,F403
from .predicates import *  # noqa: F401,F403
from .projector import *  # noqa: F401,F403
from .runs import *  # noqa: F401,F403
from .tensor_edits import *  # noqa: F401,F403

__all__ = [
    *predicates.__all__,
    *kv_reads.__all__,
    *kv_edits.__all__,
    *tensor_edits.__all__,
    *makers.__all__,
    *ops.__all__,
    *byte_ops.__all__,
    *projector.__all__,
    *runs.__all__,
    *planning.__all__,
    *gguf_names.__all__,
]
