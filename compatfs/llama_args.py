"""llama-server arguments for one model of the store: its mounted files, and
the settings of the manifest's params layer in llama-server's flags.

The params layer is the JSON object Ollama writes from a Modelfile's
PARAMETER lines (e.g. `{"num_ctx": 8192, "stop": ["<|eot_id|>"],
"temperature": 0.6}`).  Each Ollama option maps to at most one llama-server
flag (llama.cpp b11434, `common/arg.cpp`); an option without an equivalent
is reported, never dropped in silence.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .mounttable import points_of
from .views import MMPROJ_FILE, MODEL_FILE


def _int(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
        raise ValueError(f"{v!r} is not an integer")
    return str(int(v))


def _float(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{v!r} is not a number")
    return repr(v)


def _flag(flag: str, conv: Callable = _float) -> Callable[[object], list[str]]:
    return lambda v: [flag, conv(v)]


def _stop(v) -> list[str]:
    words = v if isinstance(v, list) else [v]
    if not all(isinstance(w, str) for w in words):
        raise ValueError(f"{v!r} is not a list of strings")
    # llama-server's stop words for requests that name none (-r, repeatable).
    return [x for w in words if w for x in ("--reverse-prompt", w)]


def _when_true(*flags: str) -> Callable[[object], list[str]]:
    def conv(v) -> list[str]:
        if not isinstance(v, bool):
            raise ValueError(f"{v!r} is not true or false")
        return list(flags) if v else []
    return conv


# Ollama option -> llama-server flag(s).  Current Ollama options (api/types.go
# Options and Runner) first, then ones older Ollama releases wrote into
# params layers that llama-server still has.
FLAGS: dict[str, Callable[[object], list[str]]] = {
    "num_ctx": _flag("--ctx-size", _int),
    "num_batch": _flag("--batch-size", _int),
    "num_gpu": _flag("--n-gpu-layers", _int),
    "main_gpu": _flag("--main-gpu", _int),
    "num_thread": _flag("--threads", _int),
    "num_keep": _flag("--keep", _int),
    "seed": _flag("--seed", _int),
    "num_predict": _flag("--n-predict", _int),
    "top_k": _flag("--top-k", _int),
    "top_p": _flag("--top-p"),
    "min_p": _flag("--min-p"),
    "typical_p": _flag("--typical"),
    "repeat_last_n": _flag("--repeat-last-n", _int),
    "temperature": _flag("--temp"),
    "repeat_penalty": _flag("--repeat-penalty"),
    "presence_penalty": _flag("--presence-penalty"),
    "frequency_penalty": _flag("--frequency-penalty"),
    "stop": _stop,
    "mirostat": _flag("--mirostat", _int),
    "mirostat_tau": _flag("--mirostat-ent"),
    "mirostat_eta": _flag("--mirostat-lr"),
    "rope_frequency_base": _flag("--rope-freq-base"),
    "rope_frequency_scale": _flag("--rope-freq-scale"),
    "numa": _when_true("--numa", "distribute"),
}

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
        conv = FLAGS.get(key)
        if conv is None:
            why = NO_EQUIVALENT.get(key, "no llama-server equivalent known")
            out.notes.append(f"params {key}={json.dumps(value)}: not passed ({why})")
            continue
        try:
            out.argv += conv(value)
        except ValueError as e:
            out.notes.append(f"params {key}: not passed ({e})")
    try:
        out.argv += _load_mode(params)
    except ValueError as e:
        out.notes.append(f"params {e}: not passed")
    return out


def read_params(path: Path) -> dict:
    """The params layer's JSON object (ValueError naming the blob otherwise)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"params layer {path.name} cannot be read ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"params layer {path.name} is not a JSON object")
    return doc


def server_args(files: dict, model_dir: Path) -> Args:
    """`-m`, `--mmproj` (files of `model_dir`, the model's directory where
    llama-server sees the mount), and the translated params layer.
    `files` are the model directory's files by name (`models.model_files`)."""
    out = Args(["-m", str(model_dir / MODEL_FILE)])
    if MMPROJ_FILE in files:
        out.argv += ["--mmproj", str(model_dir / MMPROJ_FILE)]
    if "params.json" in files:
        try:
            params = translate_params(read_params(files["params.json"].blob))
        except ValueError as e:
            out.notes.append(str(e))
        else:
            out.argv += params.argv
            out.notes += params.notes
    if "template" in files:
        out.notes.append("template: Ollama's Go template is not passed; llama-server uses the chat "
                         "template in model.gguf (--chat-template-file to override)")
    if "system" in files:
        out.notes.append("system: llama-server has no default system prompt; send it as the first "
                         f"message (the text is in {model_dir / 'system'})")
    return out


def _shows(path: Path) -> bool:
    """Whether `path` is there (a dead mount, ENOTCONN, shows nothing)."""
    try:
        return path.exists()
    except OSError:
        return False


def find_model_dir(name: str, mount: str | None) -> Path:
    """The model's directory under `mount`, else under the one compatfs mount
    that shows it (ValueError when none or several do)."""
    if mount:
        return Path(mount) / name
    candidates = [m / name for m in points_of("fuse.compatfs") if _shows(m / name / MODEL_FILE)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(f"no compatfs mount shows {name}: mount the store, or name the mountpoint with --mount")
    raise ValueError(f"several compatfs mounts show {name} ({', '.join(map(str, candidates))}): choose one with --mount")
