"""The params layer in llama-server's flags: each Ollama option of a params
object (read and checked by `format.params`) as the flag its `Option` names,
and the options llama-server has no flag for, each with why.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..format.params import OPTIONS, Option

# Options whose meaning llama-server has, but only in combination: use_mmap
# and use_mlock become one --load-mode.
LOAD_MODE = ("use_mmap", "use_mlock")

# Options with no llama-server flag, and why.
NO_EQUIVALENT = {
    "draft_num_predict": "Ollama's own draft model; llama-server takes a draft model with --spec-draft-model",
    "penalize_newline": "removed from llama.cpp's sampler",
    "tfs_z": "tail-free sampling was removed from llama.cpp",
    "low_vram": "no longer in llama.cpp",
    "f16_kv": "no longer in llama.cpp (see --cache-type-k/--cache-type-v)",
    "logits_all": "not a server setting",
    "vocab_only": "not a server setting",
    "num_gqa": "read from the model file",
}



def flag_argv(option: Option, v) -> list[str]:
    """llama-server's arguments for the value `v` of `option` (ValueError
    saying what is wrong with it)."""
    v = option.check(v)
    if option.kind == "stop":    # llama-server's stop words for requests that name none (repeatable)
        return [x for w in v for x in (option.flag, w)]
    if option.kind == "true":
        return [option.flag, *([] if option.const is None else [option.const])] if v else []
    return [option.flag, repr(v) if option.kind == "float" else str(v)]


@dataclass
class Args:
    """The arguments, and what could not be carried over (one line each)."""

    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _load_mode(params: dict) -> list[str]:
    mmap, mlock = params.get("use_mmap"), params.get("use_mlock")
    for key, v in (("use_mmap", mmap), ("use_mlock", mlock)):
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"{key}: {v!r} is not true or false")
    if mmap is None and mlock is None:
        return []
    mode = {(False, False): "none", (False, True): "mlock", (True, False): "mmap",
            (True, True): "mmap+mlock"}[(mmap is not False, bool(mlock))]
    return ["--load-mode", mode]


def translate_params(params: dict) -> Args:
    """llama-server flags for an Ollama params object."""
    out = Args()
    for key in sorted(params):
        value = params[key]
        if key in LOAD_MODE:
            continue
        option = OPTIONS.get(key)
        if option is None:
            why = NO_EQUIVALENT.get(key, "no llama-server equivalent known")
            out.notes.append(f"params {key}={json.dumps(value)}: not passed ({why})")
            continue
        try:
            out.argv += flag_argv(option, value)
        except ValueError as e:
            out.notes.append(f"params {key}: not passed ({e})")
    try:
        out.argv += _load_mode(params)
    except ValueError as e:
        out.notes.append(f"params {e}: not passed")
    return out
