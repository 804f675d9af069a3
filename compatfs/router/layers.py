"""What becomes of a model's Modelfile layers, as `compatfs ls` tells it:
each layer applied and how (its params as sampling defaults in model.gguf
and as flags in models.ini and `llama-args`, its template as model.gguf's
chat template, its system layer as that template's default system message,
its adapters as llama-server's `--lora`, its messages layer as the chat
template's first messages), and one line for each thing not applied, saying
why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import GGUFError
from ..names import MODEL_FILE
from ..sources.base import adapter_files
from ..tree import Snapshot, Tree
from ..view.sampling import of_layer
from .preset import Entry, adapters_passed, refusal, section

# models.ini options that are the model's files, not its params layer's.
_FILES = ("alias", "model", "mmproj", "embeddings", "lora")

MESSAGES_NOT_APPLIED = (
    "messages: not applied (model.gguf is made without the messages layer: send the "
    "Modelfile's MESSAGEs as the first `messages` of a chat)"
)


@dataclass(frozen=True)
class Account:
    applied: tuple[tuple[str, str], ...]  # (layer, how)
    notes: tuple[str, ...]  # what is not applied, or bounded, one line each

    def as_dict(self) -> dict:
        return {
            "applied": [{"layer": layer, "how": how} for layer, how in self.applied],
            "not_applied": list(self.notes),
        }


def account(tree: Tree, snap: Snapshot, name: str) -> Account:
    """The account of model folder `name` of `snap`."""
    folder = snap.listing.folders[name]
    applied: list[tuple[str, str]] = []
    notes: list[str] = []
    ref = snap.files[name].get(MODEL_FILE)
    layers = getattr(ref, "params", None)
    if layers is not None:
        made = of_layer(layers)
        if tree.views.translate:
            applied += made.applied
            notes += made.notes
        else:
            notes.append("params, template, system: not in model.gguf (served unchanged, --no-translate)")
    try:
        summary = tree.views.summary(folder.model)
        arch, translated = summary.arch, summary.text is not None
    except GGUFError:
        arch, translated = None, False
    entry = Entry(
        name,
        Path(name),
        False,
        folder.params,
        False,
        folder.model,
        None,
        adapter_files(folder.adapters),
        arch,
        translated,
    )
    s = section(entry)
    flags = [f"{k} {v}" for k, v in s.options if k not in _FILES]
    if flags:
        applied.append(("params", "models.ini and llama-args flags: " + ", ".join(flags)))
    loras = adapters_passed(entry, [])  # (what it leaves out is in the section's notes already)
    if loras:
        applied.append(("adapters", "llama-server's --lora (models.ini lora, llama-args, run): " + ", ".join(loras)))
    notes += [n for n in s.notes if n not in notes]
    if folder.messages is not None and getattr(layers, "messages", None) is None:
        notes.append(MESSAGES_NOT_APPLIED)
    why = refusal(name)
    if why is not None:
        notes.append(f"models.ini: {why}")
    return Account(tuple(applied), tuple(notes))
