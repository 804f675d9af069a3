"""Which source a command means.

SOURCE given: a compatfs mountpoint, or a path under one, means the source
mounted there (the mount table's SOURCE field, which `compatfs mount` sets
to the source's path); anything else is the source itself.  No SOURCE: the
first of the compatfs mount there is (one source), `$OLLAMA_MODELS`,
`~/.ollama/models`, and the demo store `scripts/mount.sh` writes; the error
names each place tried.

A command that reads a source in-process reads it as its mount does: never
through a compatfs mount of that source (`keep_out_of_mounts`), so a blob
linked into the mount is refused here as the mount refuses it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import PROG
from ..files import mounttable
from ..files.lookup import KEEP_OUT_ENV
from ..sources.base import Source, SourceError
from ..sources.choose import open_source

if TYPE_CHECKING:
    from ..tree import Tree

FSTYPE = "fuse.compatfs"
# Where scripts/mount.sh writes the demo store: .cache/ of the checkout.
DEMO_STORE = Path(__file__).resolve().parents[2] / ".cache" / "demo-store"


@dataclass(frozen=True)
class Found:
    """A source's path, and how it was chosen (empty: named by the user)."""

    path: Path
    why: str = ""


def mount_of(path: Path, table: list[mounttable.Mount] | None = None) -> mounttable.Mount | None:
    """The compatfs mount `path` is at or under (the innermost), looked up in
    the mount table only: nothing under a mountpoint is looked at."""
    p = Path(os.path.abspath(path.expanduser()))
    best = None
    for m in mounttable.mounts() if table is None else table:
        if (
            m.fstype == FSTYPE
            and (m.point == p or m.point in p.parents)
            and (best is None or len(m.point.parts) >= len(best.point.parts))
        ):
            best = m
    return best


def mounted_source(m: mounttable.Mount) -> Path:
    """The source the compatfs mount `m` serves; SourceError when the mount
    table does not say (a mount made with another `-o fsname`)."""
    if not os.path.isabs(m.source):
        raise SourceError(
            f"the compatfs mount at {m.point} does not name its source in the mount table "
            f"(fsname {m.source!r}): name the source instead of the mountpoint"
        )
    return Path(m.source)


def find_source(given: str | os.PathLike | None, mounts: bool = True) -> Found:
    """The source a command means (see the module's docstring); `mounts`:
    whether a compatfs mount there is counts as the default (not for
    `compatfs mount` itself)."""
    if given:
        path = Path(given).expanduser()
        m = mount_of(path)
        if m is not None:
            return Found(mounted_source(m), f"mounted at {m.point}")
        return Found(path)
    tried = []
    if mounts:
        found = [m for m in mounttable.mounts() if m.fstype == FSTYPE]
        sources = {Path(m.source): m.point for m in found if os.path.isabs(m.source)}
        if len(sources) == 1:
            ((path, point),) = sources.items()
            return Found(path, f"mounted at {point}")
        if len(sources) > 1:
            raise SourceError(
                "several compatfs mounts ("
                + ", ".join(f"{p} of {s}" for s, p in sources.items())
                + "): name one, or its source"
            )
        tried.append("a compatfs mount (none" + (" naming its source" if found else "") + ")")
    env = os.environ.get("OLLAMA_MODELS")
    candidates = [(Path(env).expanduser(), "$OLLAMA_MODELS")] if env else []
    candidates += [
        (Path.home() / ".ollama" / "models", "Ollama's default"),
        (DEMO_STORE, "the demo store scripts/mount.sh writes"),
    ]
    for path, why in candidates:
        if not path.is_dir():
            tried.append(f"{path} ({why}: not there)")
            continue
        try:
            open_source(path)
        except SourceError as e:
            tried.append(f"{path} ({why}: {e})")
            continue
        return Found(path, why)
    raise SourceError(
        "no source found; tried "
        + ", ".join(tried)
        + ". Name one (an Ollama store or a folder of GGUF files), or run scripts/mount.sh "
        "for the demo store"
    )


def keep_out_of_mounts(source: Path) -> list[Path]:
    """Keep this process out of every compatfs mount of `source`, as their
    daemons keep out of their own: a store file that leads into one is
    refused.  Returns them."""
    out = []
    real = os.path.realpath(source)
    for m in mounttable.mounts():
        if m.fstype != FSTYPE or not os.path.isabs(m.source) or os.path.realpath(m.source) != real:
            continue
        _keep_out(m.point)
        out.append(m.point)
    return out


def _keep_out(point: Path) -> None:
    """`blobfile.keep_out` for a mountpoint as the mount table writes it (a
    real path already): `keep_out` resolves its argument, which looks up the
    mount's root, and a stopped daemon would hang that lookup."""
    kept = json.loads(os.environ.get(KEEP_OUT_ENV) or "[]")
    kept = kept if isinstance(kept, list) else []
    os.environ[KEEP_OUT_ENV] = json.dumps(list(dict.fromkeys([*kept, str(point)])))


def open_named(given: str | None) -> Source:
    """The source a command reads in-process (`find_source`), read as its
    mounts read it (never through them); says on stderr which source it chose
    when none was named."""
    found = find_source(given)
    if found.why:
        print(f"{PROG}: source {found.path} ({found.why})", file=sys.stderr)
    keep_out_of_mounts(found.path)
    return open_source(found.path)


def model_tree(source: str | None, no_translate: bool = False) -> Tree:
    """A Tree over the source (views built in-process, as the mount builds them)."""
    from ..tree import Tree
    from ..view.catalog import BlobViews, translation_enabled

    return Tree(open_named(source), BlobViews(translate=translation_enabled(no_translate)))
