"""The params layer in llama-server's flags: each Ollama option of a params
object (read and checked by `format.params`, bounded by `Limits`) as the flag
its `Option` names, and the options llama-server has no flag for, each with why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import GGUFError
from ..format.params import OPTIONS, Limits, Option
from ..view.summaries import Trained, trained

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
    if option.kind == "stop":  # llama-server's stop words for requests that name none (repeatable)
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
    mode = {(False, False): "none", (False, True): "mlock", (True, False): "mmap", (True, True): "mmap+mlock"}[
        (mmap is not False, bool(mlock))
    ]
    return ["--load-mode", mode]


def machine_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except OSError:
        return os.cpu_count() or 1


_BY_MODEL = {k for k, o in OPTIONS.items() if o.bound in ("context", "layers")}


def model_limits(model: Path | Trained | None, params: dict) -> Limits:
    """The `Limits` of a model on this machine: its trained context and its
    layers (the blocks it holds tensors of, and its output layer), as `model`
    says (a `Trained`: a summary's, no header parsed), or as the header of
    the model GGUF at `model` says (read only when `params` has an option
    they bound); `Limits`' ceilings where they cannot be read."""
    from ..format.header import SourceGGUF

    limits = Limits(machine_cpus())
    if model is None or not _BY_MODEL & set(params):
        return limits
    try:
        shape = model if isinstance(model, Trained) else trained(SourceGGUF(model))
    except (GGUFError, OSError, ValueError):
        return limits
    if shape.context_length is not None:
        limits = replace(limits, context=shape.context_length, context_is="the model's trained context")
    if shape.block_count:
        limits = replace(limits, layers=shape.block_count + 1, layers_is="the model's layers and its output layer")
    return limits


def translate_params(params: dict, limits: Limits | None = None) -> Args:
    """llama-server flags for an Ollama params object; `limits` bound the
    options that size an allocation (default: this machine's CPUs, and
    `Limits`' ceilings for the model's)."""
    limits = limits if limits is not None else Limits(machine_cpus())
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
            if option.bound is not None:
                value, note = limits.bounded(key, option, option.check(value), params)
                if note is not None:
                    out.notes.append(note)
            out.argv += flag_argv(option, value)
        except ValueError as e:
            out.notes.append(f"params {key}: not passed ({e})")
    try:
        out.argv += _load_mode(params)
    except ValueError as e:
        out.notes.append(f"params {e}: not passed")
    return out
