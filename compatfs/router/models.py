"""One model of a source by the name its kind takes (`gemma3` is
`gemma3:latest` in an Ollama store), and the files its directory shows (the
same lookups the mount makes)."""

from __future__ import annotations

from ..sources.base import SourceError
from ..tree import FileRef, Tree


def model_files(tree: Tree, name: str) -> tuple[str, dict[str, FileRef]]:
    """The model's name as the tree shows it, and its files by file name;
    SourceError when the source has no such model (with the reason it is left out)."""
    name = tree.source.name(name)
    snap = tree.snapshot()
    listing = tree.lookup(name) if name in snap.models else None
    if not isinstance(listing, list):  # (not a model, or gone in a rescan since the snapshot)
        why = snap.listing.skipped.get(name)
        raise SourceError(f"no model {name} in {tree.source.root}" + (f" ({why})" if why else ""))
    files = {f: tree.lookup(f"{name}/{f}") for f in listing}
    return name, {f: ref for f, ref in files.items() if isinstance(ref, FileRef)}
