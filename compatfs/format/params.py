"""Ollama's params layer: the JSON object Ollama writes from a Modelfile's
PARAMETER lines (e.g. `{"num_ctx": 8192, "stop": ["<|eot_id|>"],
"temperature": 0.6}`), read and checked, and the one table of what each
option is in llama.cpp: a llama-server flag (passed by `router.params`), and
for the sampling options the `general.sampling.*` key a GGUF file carries it
in (`sampling`).

A params layer is an untrusted store file: one that is not a JSON object
(or nests deeper than Python's parser goes) is not used at all; a value of the wrong type or out of range is left out, with
a note saying why (Ollama would refuse the request instead).  An option that
sizes an allocation is bounded by what the machine and the model allow
(`Limits`: threads by the CPUs this process may run on, the context by the
model's trained context, batches, tokens kept, predicted or remembered by
that context, GPU layers by the model's blocks), with a note saying so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from gguf import Keys

from ..files.shared import NotShared, read_shared
from ..errors import GGUFError
from ..format.values import f32, i32

# A params layer is a few hundred bytes; more than this is not one.
MAX_BYTES = 1 << 20

_I32 = (-(1 << 31), (1 << 31) - 1)
_F32_MAX = 3.4028234663852886e38


def _int(v, lo: float = _I32[0], hi: float = _I32[1]) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not float(v).is_integer():
        raise ValueError(f"{v!r} is not an integer")
    if not lo <= v <= hi:
        raise ValueError(f"{v!r} is outside {lo:g}..{hi:g}")
    return int(v)


def _float(v, lo: float = -_F32_MAX, hi: float = _F32_MAX) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{v!r} is not a number")
    if not lo <= v <= hi:
        raise ValueError(f"{v!r} is outside {lo:g}..{hi:g}")
    return float(v)


@dataclass(frozen=True)
class Option:
    """One Ollama option: the llama-server flag that takes it, the range it
    must lie in, and the `general.sampling.*` key llama.cpp reads it from in
    a GGUF file (when it has one: then model.gguf carries it)."""

    flag: str
    kind: str = "float"  # "int", "float", "stop" (strings), "true" (a flag when true)
    lo: float | None = None
    hi: float | None = None
    sampling: str | None = None
    const: str | None = None  # for "true": the flag's value
    bound: str | None = None  # the `Limits` field that bounds it from above

    def check(self, v):
        """The value, checked (ValueError saying what is wrong)."""
        bounds = {k: b for k, b in (("lo", self.lo), ("hi", self.hi)) if b is not None}
        if self.kind == "int":
            return _int(v, **bounds)
        if self.kind == "float":
            return _float(v, **bounds)
        if self.kind == "stop":
            words = v if isinstance(v, list) else [v]
            if not all(isinstance(w, str) for w in words):
                raise ValueError(f"{v!r} is not a list of strings")
            return [w for w in words if w]
        if not isinstance(v, bool):
            raise ValueError(f"{v!r} is not true or false")
        return v


# Ollama option -> llama-server (llama.cpp b11434 `common/arg.cpp`, sampling
# keys `common/common.cpp` and gguf-py).  Current Ollama options (api/types.go
# Options and Runner) first, then ones older Ollama releases wrote into
# params layers that llama-server still has.  Ranges: what llama.cpp accepts
# (an int32 or float32 at most; probabilities 0..1).
OPTIONS: dict[str, Option] = {
    "num_ctx": Option("--ctx-size", "int", 0, bound="context"),
    "num_batch": Option("--batch-size", "int", 1, bound="context"),
    "num_gpu": Option("--n-gpu-layers", "int", -1, bound="layers"),
    "main_gpu": Option("--main-gpu", "int", 0),
    "num_thread": Option("--threads", "int", -1, bound="cpus"),
    "num_keep": Option("--keep", "int", -1, bound="context"),
    "seed": Option("--seed", "int", -1, (1 << 32) - 1),
    "num_predict": Option("--n-predict", "int", -2, bound="context"),
    "top_k": Option("--top-k", "int", 0, sampling=Keys.General.SAMPLING_TOP_K),
    "top_p": Option("--top-p", "float", 0, 1, sampling=Keys.General.SAMPLING_TOP_P),
    "min_p": Option("--min-p", "float", 0, 1, sampling=Keys.General.SAMPLING_MIN_P),
    "typical_p": Option("--typical", "float", 0, 1),
    "repeat_last_n": Option(
        "--repeat-last-n", "int", -1, sampling=Keys.General.SAMPLING_PENALTY_LAST_N, bound="context"
    ),
    "temperature": Option("--temp", "float", 0, sampling=Keys.General.SAMPLING_TEMP),
    "repeat_penalty": Option("--repeat-penalty", "float", 0, sampling=Keys.General.SAMPLING_PENALTY_REPEAT),
    "presence_penalty": Option("--presence-penalty"),
    "frequency_penalty": Option("--frequency-penalty"),
    "stop": Option("--reverse-prompt", "stop"),
    "mirostat": Option("--mirostat", "int", 0, 2, sampling=Keys.General.SAMPLING_MIROSTAT),
    "mirostat_tau": Option("--mirostat-ent", "float", 0, sampling=Keys.General.SAMPLING_MIROSTAT_TAU),
    "mirostat_eta": Option("--mirostat-lr", "float", 0, sampling=Keys.General.SAMPLING_MIROSTAT_ETA),
    "rope_frequency_base": Option("--rope-freq-base", "float", 0),
    "rope_frequency_scale": Option("--rope-freq-scale", "float", 0),
    "numa": Option("--numa", "true", const="distribute"),
}


@dataclass(frozen=True)
class Limits:
    """What the machine and the model allow an option that sizes an
    allocation.  Where the model's own limits are not at hand (a params
    layer's sampling keys are read once for every model that names it;
    `llama-args` without a model), ceilings stand in for them."""

    cpus: int | None = None  # None: not known (an option it bounds is not used)
    context: int = 1 << 20  # tokens the model was trained on
    layers: int = 1 << 16  # its blocks, plus the output layer
    context_is: str = "the most tokens compatfs passes where the model's own context is not at hand"
    layers_is: str = "the most layers compatfs passes where the model's own are not at hand"

    def bounded(self, key: str, option: Option, v: int, params: dict) -> tuple[int, str | None]:
        """`v` (checked) within its bound, and a note when it was lowered
        (ValueError when its bound is not known).  A batch is bounded by the
        context the params ask for, where that is smaller."""
        if option.bound is None or v <= 0:  # 0 and below: llama.cpp's own defaults and "unlimited"
            return v, None
        limit, what = {
            "cpus": (self.cpus, "the CPUs this machine gives it"),
            "context": (self.context, self.context_is),
            "layers": (self.layers, self.layers_is),
        }[option.bound]
        if limit is None:
            raise ValueError(f"{v} cannot be checked: {what} is not known")
        if key == "num_batch" and isinstance(params.get("num_ctx"), int) and 0 < params["num_ctx"] < limit:
            limit, what = params["num_ctx"], "the params' num_ctx"
        if v <= limit:
            return v, None
        return limit, f"params {key}={v}: bounded to {limit} ({what})"


def read_params(path: Path, readers_of: Path | None = None) -> dict:
    """The params layer's JSON object (ValueError naming the layer otherwise).

    Its options go into files the mount shows to many (model.gguf's sampling
    keys, models.ini), so it is read as `files.shared.read_shared` reads:
    only where everyone who may see them (with `readers_of`: models.ini's
    readers) may read the layer itself."""
    try:
        doc = json.loads(read_shared(path, MAX_BYTES, "params layer", readers_of))
    except NotShared:
        raise
    except (GGUFError, OSError) as e:
        raise ValueError(f"params layer {path.name} cannot be read ({e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"params layer {path.name} is not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"params layer {path.name} nests arrays or objects too deeply to be read") from None
    if not isinstance(doc, dict):
        raise ValueError(f"params layer {path.name} is not a JSON object")
    return doc


@dataclass(frozen=True)
class Sampling:
    """A params layer's sampling options as GGUF KVs, in `OPTIONS` order, and
    what was left out of them (one line each)."""

    kvs: tuple = ()
    notes: tuple[str, ...] = ()


def sampling(params: dict, limits: Limits = Limits()) -> Sampling:
    """The `general.sampling.*` KVs of a params object: ints as int32 and
    floats as float32, as llama.cpp's converter writes them; the options
    `limits` bound, bounded (with a note)."""
    kvs, notes = [], []
    for key, option in OPTIONS.items():
        if option.sampling is None or key not in params:
            continue
        try:
            v, bounded = limits.bounded(key, option, option.check(params[key]), params)
        except ValueError as e:
            notes.append(f"params {key}: not in model.gguf ({e})")
            continue
        if bounded is not None:
            notes.append(bounded)
        kvs.append((option.sampling, i32(v) if option.kind == "int" else f32(v)))
    return Sampling(tuple(kvs), tuple(notes))


def layer_sampling(path: Path) -> Sampling:
    """`sampling` of the params layer at `path`; none, with the reason, when
    the layer cannot be used at all."""
    try:
        return sampling(read_params(path))
    except ValueError as e:
        return Sampling((), (f"{e}: no sampling defaults in model.gguf",))
