"""One model of a store by the name `ollama` takes, and the files its
directory shows (the same lookups the mount makes)."""
from __future__ import annotations

from .store import StoreError
from .tree import FileRef, Tree


def canonical_name(name: str) -> str:
    """`gemma3` means `gemma3:latest`, as in `ollama run`."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def model_files(tree: Tree, name: str) -> tuple[str, dict[str, FileRef]]:
    """The model's name as the tree shows it, and its files by file name;
    StoreError when the store has no such model (with the reason it is left out)."""
    name = canonical_name(name.strip("/"))
    snap = tree.snapshot()
    if name not in snap.model_dirs:
        why = snap.scan.skipped.get(name)
        raise StoreError(f"no model {name} in {tree.store.root}" + (f" ({why})" if why else ""))
    listing = tree.lookup(name)
    files = {f: tree.lookup(f"{name}/{f}") for f in listing}
    return name, {f: ref for f, ref in files.items() if isinstance(ref, FileRef)}
