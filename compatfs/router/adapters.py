"""A model's adapter layers as llama-server's `--lora` (`lora` in models.ini).

Ollama's converter (`convert.ConvertAdapter`) writes an adapter as llama.cpp's
LoRA loader (b11434 `src/llama-adapter.cpp`) reads one, and Ollama passes
each adapter blob to llama-server as it is: a model folder shows them
unchanged (`sources.base.adapter_files`).  What the loader refuses would
stop llama-server from loading the model at all, so each adapter's header is
checked first against what the loader requires: `general.type` "adapter",
`adapter.type` "lora", `adapter.lora.alpha` (if any) an f32,
`general.architecture` the model's, and tensors that are `.lora_a`/`.lora_b`
pairs (or `_norm.weight`, which the loader skips) of the model's tensors,
`lora_a` [in, rank] and `lora_b` [rank, out] of the model's [in, out].  An
adapter that fails is left out of `--lora`, with why.  Each check is kept
while the adapter and the model keep their identity.  In models.ini, which
many may read, an adapter is named only where all of them may read it, and
why one is left out is not said (it would tell what the adapter holds).
"""

from __future__ import annotations

import threading
from pathlib import Path

from gguf import GGUFValueType

from ..errors import GGUFError
from ..files.lookup import identity, status
from ..files.shared import is_shared
from ..format.header import SourceGGUF
from ..sources.base import adapter_order

_lock = threading.Lock()
_checked: dict[tuple[str, str], tuple[tuple, str | None]] = {}  # (adapter, model) -> (identities, refusal)
_KEEP = 256  # checks remembered (a store's adapters)


def adapter_names(files) -> list[str]:
    """The adapter files among a model folder's file names, in their order."""
    found = [(adapter_order(n), n) for n in files]
    return [n for i, n in sorted((i, n) for i, n in found if i is not None)]


def lora_value(paths: list[Path]) -> str:
    """`--lora`'s value for `paths`: comma-separated, a path holding a comma
    or a quote written in quotes (llama.cpp's `parse_csv_row`)."""

    def field(p: str) -> str:
        return '"' + p.replace('"', '""') + '"' if "," in p or '"' in p else p

    return ",".join(field(str(p)) for p in paths)


def shared(adapter: Path, readers_of: Path) -> bool:
    """Whether everyone who may read `readers_of` (models.ini's readers) may
    read the adapter, as `files.shared` decides it for a layer (deciding
    reads none of the adapter's bytes)."""
    try:
        return is_shared(adapter, readers_of)
    except GGUFError:  # no regular file: `refusal` refuses it, saying why
        return True


def refusal(adapter: Path, model: Path, arch: str | None, translated: bool) -> str | None:
    """Why llama.cpp's LoRA loader would refuse the adapter GGUF at `adapter`
    for the model whose model.gguf is the view of `model` with architecture
    `arch` (None: it loads).  The model's tensors are compared only where its
    view keeps the blob's (`translated` False)."""
    try:
        stamp = (identity(status(adapter)), identity(status(model)))
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    key = (str(adapter), str(model))
    with _lock:
        hit = _checked.get(key)
    if hit is not None and hit[0] == (stamp, arch, translated):
        return hit[1]
    why = _why(adapter, model, arch, translated)
    with _lock:
        if len(_checked) >= _KEEP:
            _checked.clear()
        _checked[key] = ((stamp, arch, translated), why)
    return why


def _why(adapter: Path, model: Path, arch: str | None, translated: bool) -> str | None:
    try:
        a = SourceGGUF(adapter)
    except (GGUFError, OSError) as e:
        return f"not a GGUF file llama.cpp reads ({e})"
    for key, want in (("general.type", "adapter"), ("adapter.type", "lora")):
        got = a.get(key)
        if got != want:
            return f"its {key} is {got!r}, not {want!r}"
    if "adapter.lora.alpha" in a.kvs and a.kvs["adapter.lora.alpha"].vtype != GGUFValueType.FLOAT32:
        return "its adapter.lora.alpha is not an f32"
    if a.architecture != arch:
        return f"it adapts architecture {a.architecture!r}, the model is {arch!r}"
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for t in a.tensors.values():
        base, dot, part = t.name.rpartition(".")
        if dot and part in ("lora_a", "lora_b"):
            if len(t.shape) != 2:
                return f"its tensor {t.name} is not a matrix"
            pairs.setdefault(base, {})[part] = t.shape
        elif not t.name.endswith("_norm.weight"):
            return f"its tensor {t.name} is neither .lora_a, .lora_b nor a norm"
    if not pairs:
        return "it has no LoRA tensors"
    for base, ab in pairs.items():
        if len(ab) != 2:
            return f"its {base} has only {next(iter(ab))}"
        if ab["lora_a"][1] != ab["lora_b"][0] and not base.endswith("token_embd.weight"):
            return f"its {base}: lora_a {list(ab['lora_a'])} and lora_b {list(ab['lora_b'])} differ in rank"
    if translated:
        return None
    try:
        m = SourceGGUF(model)
    except (GGUFError, OSError) as e:
        return f"the model cannot be read ({e})"
    for base, ab in pairs.items():
        weight = m.tensors.get(base)
        if weight is None:
            return f"the model has no tensor {base}"
        a_in, b_out = (
            (ab["lora_b"][1], ab["lora_a"][1])
            if base.endswith("token_embd.weight")
            else (ab["lora_a"][0], ab["lora_b"][1])
        )
        if len(weight.shape) < 2 or (weight.shape[0], weight.shape[1]) != (a_in, b_out):
            return f"its {base} does not fit the model's {list(weight.shape)}"
    return None
