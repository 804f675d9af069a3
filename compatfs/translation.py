"""The vocabulary handlers are written in: detectors (`compatfs.predicates`),
KV edits (`compatfs.kv_edits`) and the typed reads they make of a value
(`compatfs.kv_reads`), tensor edits (`compatfs.tensor_edits`), the
clip projector builder (`compatfs.projector`), and the translation they make
up with `plan`, which applies one to a blob (`compatfs.planning`).  Handler
modules import all of it from here."""
from .kv_edits import *  # noqa: F401,F403
from .kv_edits import __all__ as _kv_edits
from .kv_reads import describe, finite, integer_array, is_integer_array, number_array, scalar, whole  # noqa: F401
from .planning import Count, StoredType, Translation, ViewSpec, check_data, first_claim, plan  # noqa: F401
from .predicates import (  # noqa: F401
    ALWAYS, Pred, any_of, arch_is, has_block_tensor, has_key, has_tensor, has_tensor_ending, has_tensor_prefix,
    has_token, has_true, is_array, missing_or_default, per_layer_mismatch, rows_differ, str_contains, token_is, value_at_least,
    value_is,
)
from .projector import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, as_projector, clip_projector  # noqa: F401
from .tensor_edits import *  # noqa: F401,F403
from .tensor_edits import __all__ as _tensor_edits

__all__ = [
    *_kv_edits, *_tensor_edits, "Count", "StoredType", "Translation", "ViewSpec", "check_data", "first_claim",
    "plan", "ALWAYS", "Pred", "any_of", "arch_is", "has_block_tensor", "has_key", "has_tensor",
    "has_tensor_ending", "has_tensor_prefix", "has_token", "has_true", "is_array", "missing_or_default",
    "per_layer_mismatch", "rows_differ", "str_contains", "token_is", "value_at_least", "value_is", "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD", "as_projector", "clip_projector", "describe", "finite", "integer_array",
    "is_integer_array", "number_array", "scalar", "whole",
]
