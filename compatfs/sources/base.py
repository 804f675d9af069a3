"""What a mount shows, as any kind of source says it: the seam between a store
on disk and the mounted tree.

A source is a folder on disk holding GGUF files in some layout (an Ollama
store: `ollama.OllamaStore`; a plain folder tree: `folder.GGUFFolder`).  It
tells, at one moment (`scan`), which folders the mount has and what each
holds: the GGUF whose text view is `model.gguf`, the GGUF whose projector
view is `mmproj.gguf` (or none: then the model GGUF's own, if it has one),
and files passed through byte for byte.  It tells whose owner and mode each
mounted folder mirrors (`owner`: a folder on disk, which a caller must be
able to list to list the mounted one) and the folder's time (`mtime`).
What marks a change is derived from that by the tree: the identity of every
file a folder shows, and the status of every owner; where to look for one,
from the folders a scan listed and those holding the files it names.  Nothing outside a
source's own module knows its layout.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path


class SourceError(ValueError):
    """SOURCE is not a source compatfs can mount, or has no such model."""


@dataclass(frozen=True)
class Folder:
    """One mounted folder of GGUF files."""

    model: Path  # the GGUF shown as model.gguf (its text view)
    projector: Path | None = None  # the GGUF shown as mmproj.gguf; None: `model`'s own, if any
    passed: tuple[tuple[str, Path], ...] = ()  # (file name, file) shown byte for byte
    is_model: bool = True  # False: a folder that is not a model (an Ollama blob's), left out of `ls`
    params: Path | None = None  # Ollama's params layer: model.gguf carries its sampling options
    template: Path | None = None  # Ollama's template layer: model.gguf's chat template, translated
    system: Path | None = None  # Ollama's system layer: the chat template's default system message
    adapters: tuple[Path, ...] = ()  # Ollama's adapter layers (LoRA GGUF), in the manifest's order;
    # shown as `adapter_files` among `passed`
    messages: Path | None = None  # Ollama's messages layer (a Modelfile's MESSAGEs)
    # The store files whose contents tell this folder's name and files, below
    # the folder its mounted parent mirrors (`Source.owner`): an Ollama
    # model's host, namespace and model folders under manifests/ (listed) and
    # its manifest (read).
    told_by: tuple[Path, ...] = ()

    def ggufs(self) -> tuple[Path, ...]:
        return (self.model,) if self.projector is None else (self.model, self.projector)


ADAPTER_FILE = re.compile(r"^adapter(?:-([1-9][0-9]*))?\.gguf$")


def adapter_files(adapters: tuple[Path, ...]) -> tuple[tuple[str, Path], ...]:
    """The files a model folder shows its adapter layers as: `adapter.gguf`,
    `adapter-2.gguf`, ... in the manifest's order."""
    return tuple((f"adapter-{i + 1}.gguf" if i else "adapter.gguf", p) for i, p in enumerate(adapters))


def adapter_order(name: str) -> int | None:
    """The place (0, 1, ...) of an adapter file among a folder's, by its name
    (`adapter_files`); None for a file that is not one."""
    m = ADAPTER_FILE.match(name)
    return None if m is None else int(m.group(1) or 1) - 1


@dataclass
class Listing:
    """A source at one moment: its folders by mounted path (`a/b`), in the
    order their GGUFs are best indexed, and what was left out, with why."""

    folders: dict[str, Folder] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name or path -> reason
    read: set[Path] = field(default_factory=set)  # the folders on disk the scan listed (a change there: scan again)
    # Regular files the scan found (its source's own, and the tree's marks
    # of every file a folder shows), with their status as `lookup.status`
    # gave it then: what is answered of them until the next scan.
    seen: dict[Path, os.stat_result] = field(default_factory=dict)


class Source(ABC):
    """One kind of store; `root` is the folder it was opened at."""

    root: Path
    model_names = "its folder's path under the mount"  # what a model's name is, as a user writes it

    @abstractmethod
    def scan(self) -> Listing:
        """The source now (cheap when nothing changed: it may run every second)."""

    @abstractmethod
    def owner(self, folder: str, listing: Listing) -> Path:
        """The folder on disk whose owner and mode the mounted `folder` (any
        folder of the mount: "" is its root) mirrors, and which a caller must
        be able to list to list it."""

    @abstractmethod
    def mtime(self, folder: str, listing: Listing, owner_mtime: int) -> int:
        """The mounted `folder`'s modification time (ns); `owner_mtime`: that
        of its `owner` (0 when it cannot be read)."""

    def time_follows_owner(self, folder: str, listing: Listing) -> bool:
        """Whether the mounted `folder`'s time moves with its owner's
        (`mtime` gives it from `owner_mtime`)."""
        return True

    @abstractmethod
    def name(self, target: str) -> str:
        """The mounted folder a user's model name means (`gemma3` is
        `gemma3:latest` in an Ollama store)."""

    def refuses_mountpoint(self, mountpoint: Path) -> str | None:
        """Why the source cannot be mounted at `mountpoint` (None: it can)."""
        return None
