"""Reading a small store file whose contents go into what the mount shows to
many callers (a model folder's model.gguf keys, `models.ini`): a Modelfile
layer (params, template, system).

Such a file is read only where every caller who may search the folder
naming it (and, with `readers_of`, read that folder too: `models.ini`'s
readers) may read the file it resolves to, through every folder on the way
(`access.everyone_who_may`), decided on the very descriptor it is then read
from, never with the daemon's own rights.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GGUFError
from .access import READ, SEARCH, Recorder, everyone_who_may
from .blobfile import BlobFile
from .lookup import status


class NotShared(ValueError):
    """Not every caller who may see what the file's contents would go into
    may read the file itself."""


def _decide(f: BlobFile, seen: Recorder, path: Path, what: str, readers_of: Path | None) -> None:
    """NotShared unless everyone who may search `path`'s folder (and read
    `readers_of`) may read the open file `f`, as the walk `seen` opened it."""
    gate = Recorder()
    status(path.parent, gate, SEARCH)
    if readers_of is not None:
        status(readers_of, gate, READ)
    if not everyone_who_may(gate.chain, seen.chain):
        who = (
            f"everyone who may read {readers_of}" if readers_of is not None else f"everyone who may reach {path.parent}"
        )
        raise NotShared(f"{what} {path.name} is not readable by {who}: not used")


def is_shared(path: Path, readers_of: Path | None = None) -> bool:
    """Whether everyone who may read `readers_of` may read the file at
    `path` (decided as `read_shared` decides, reading none of its bytes);
    False where it cannot be opened, GGUFError where it is no regular file."""
    seen = Recorder()
    try:
        with BlobFile(path, caller=seen) as f:
            _decide(f, seen, path, "file", readers_of)
    except (NotShared, OSError):
        return False
    return True


def read_shared(path: Path, limit: int, what: str, readers_of: Path | None = None) -> bytes:
    """The bytes of the `what` file at `path` (at most `limit` of them, else
    GGUFError); NotShared where not everyone who may see them may read it,
    OSError where it cannot be opened."""
    seen = Recorder()
    with BlobFile(path, caller=seen) as f:
        _decide(f, seen, path, what, readers_of)
        size = f.stamp[2]
        if size > limit:
            raise GGUFError(f"{path}: {size} bytes, more than the {limit} a {what} may have")
        return bytes(f.read(0, size))
