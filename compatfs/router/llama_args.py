"""llama-server arguments for one model of the store: its mounted files (its
adapters as `--lora`), and the settings of the manifest's params layer in
llama-server's flags.

Each Ollama option maps to at most one llama-server flag (the table is
`format.params.OPTIONS`, passed by `params.translate_params`); an option without an equivalent is reported, never
dropped in silence.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..files.mounttable import points_of
from ..format.params import read_params
from ..view.sampling import of_layer
from .adapters import adapter_names, lora_value, refusal as adapter_refusal
from .params import Args, model_limits, translate_params
from ..names import MMPROJ_FILE, MODEL_FILE


def server_args(
    files: dict, model_dir: Path, embedding: bool = False, arch: str | None = None, translated: bool = False
) -> Args:
    """`-m`, `--mmproj` (files of `model_dir`, the model's directory where
    llama-server sees the mount), `--embeddings` for an `embedding` model (as
    its models.ini section has it: llama-server answers /v1/embeddings only
    with it), `--lora` with the model's adapters that llama.cpp loads on a
    model.gguf of architecture `arch` (`translated`: a handler's view), the
    translated params layer bounded by the model's limits, and what the
    model's Modelfile layers do not give it (`view.sampling.of_layer`)."""
    out = Args(["-m", str(model_dir / MODEL_FILE)])
    if MMPROJ_FILE in files:
        out.argv += ["--mmproj", str(model_dir / MMPROJ_FILE)]
    if embedding:
        out.argv.append("--embeddings")
    model = files.get(MODEL_FILE)
    loras, notes = lora_files(files, model, arch, translated)
    if loras:
        out.argv += ["--lora", lora_value([model_dir / n for n in loras])]
    out.notes += notes
    if "params.json" in files:
        try:
            raw = read_params(files["params.json"].blob)
            params = translate_params(raw, model_limits(model.blob if model else None, raw))
        except ValueError as e:
            out.notes.append(str(e))
        else:
            out.argv += params.argv
            out.notes += params.notes
    if model is not None and model.params is not None:
        out.notes += [n for n in of_layer(model.params).notes if n not in out.notes]
    return out


def lora_files(files: dict, model, arch: str | None, translated: bool) -> tuple[list[str], list[str]]:
    """The adapter files of a model folder llama.cpp loads with its model.gguf
    (`model`, its FileRef), in their order, and one line for each left out."""
    names, notes = [], []
    for name in adapter_names(files):
        why = (
            "the model has no model.gguf"
            if model is None
            else adapter_refusal(files[name].blob, model.blob, arch, translated)
        )
        if why is None:
            names.append(name)
        else:
            notes.append(f"adapters: {name} not passed ({why})")
    return names, notes


ANSWER_WITHIN = 2.0  # seconds a compatfs mount has to say whether it shows a model


def _showing(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Of `paths`, those there and those whose mount did not answer within
    `ANSWER_WITHIN` (a stopped or hung daemon): each is looked up in a thread
    of its own, so one stuck mount delays the answer by that bound at most.
    A dead mount (ENOTCONN) shows nothing."""
    found: dict[Path, bool] = {}

    def look(path: Path) -> None:
        try:
            found[path] = path.exists()
        except OSError:
            found[path] = False

    threads = [threading.Thread(target=look, args=(p,), daemon=True) for p in paths]
    for t in threads:
        t.start()
    deadline = time.monotonic() + ANSWER_WITHIN
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [p for p in paths if found.get(p)], [p for p in paths if p not in found]


def find_model_dir(name: str, mount: str | None) -> Path:
    """The model's directory under `mount`, else under the one compatfs mount
    that shows it (ValueError when none or several do; a mount that does not
    answer is left out, and named when no other shows the model)."""
    if mount:
        return Path(mount) / name
    points = points_of("fuse.compatfs")
    shown, silent = _showing([m / name / MODEL_FILE for m in points])
    candidates = [m / name for m in points if m / name / MODEL_FILE in shown]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        why = "".join(
            f"; {m} did not answer within {ANSWER_WITHIN:g} s" for m in points if m / name / MODEL_FILE in silent
        )
        raise ValueError(f"no compatfs mount shows {name}{why}: mount the store, or name the mountpoint with --mount")
    raise ValueError(
        f"several compatfs mounts show {name} ({', '.join(map(str, candidates))}): choose one with --mount"
    )
