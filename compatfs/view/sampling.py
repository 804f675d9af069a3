"""A model folder's model.gguf: its blob's text view with what the model's
Modelfile layers say llama.cpp reads from a GGUF file:

- the sampling defaults of its params layer as llama.cpp's
  `general.sampling.*` KVs (llama.cpp reads them when it loads a model, and
  a request that names a value still overrides it);
- its template layer, translated to Jinja (`compatfs.template`), as
  `tokenizer.chat_template`, with its system layer as the default system
  message of a chat that opens without one, and its messages layer (a
  Modelfile's MESSAGEs) as the first messages of every chat after it; a
  template that is not translated leaves the blob's own (or none), and the
  system and messages layers unused.

Two tags of one blob with different layers show different model.gguf
files; `blobs/` shows each blob's own translation.  Each layer is read by
identity (device, inode, size, times) as the last scan of the store found
it (`saw_layers`; as it is now for a layer no scan found): a layer that
changes is read (and a template translated) again once a scan finds it
changed, never per read or lookup of model.gguf; what cannot be used adds
no KVs, and the reason is kept for `compatfs ls`.  One reading is kept per
layer (pair), and only for the layers a scan of the store still names
(`retain_layers`): as many as the store has.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gguf import Keys

from ..errors import GGUFError
from ..files.lookup import identity, status
from ..files.shared import read_shared
from ..format.header import SourceGGUF
from ..format.params import Sampling, layer_sampling
from ..format.values import string
from ..template import ChatTemplate, translate
from ..template.translate import MAX_MESSAGES, MAX_SYSTEM, MAX_TEMPLATE, parse_messages
from ..translate import ALWAYS, Translation, ViewSpec, plan

# The blob as it is, laid out afresh: what gains the KVs where no handler
# claims the blob.
UNCHANGED = Translation("unchanged", ALWAYS)


@dataclass(frozen=True)
class Layers:
    """A model's Modelfile layers that model.gguf carries (None: it has none)."""

    params: Path | None = None
    template: Path | None = None
    system: Path | None = None
    messages: Path | None = None

    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.params, self.template, self.system, self.messages) if p is not None)


def layers_of(
    params: Path | None, template: Path | None, system: Path | None, messages: Path | None = None
) -> Layers | None:
    """The Layers of a model folder (None where it has none of them)."""
    layers = Layers(params, template, system, messages)
    return layers if layers.paths() else None


@dataclass(frozen=True)
class Applied:
    """What model.gguf gains from a model's layers: its KVs, how each layer
    is applied (layer -> how), and what is not, with why (one line each)."""

    kvs: tuple = ()
    applied: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


_lock = threading.Lock()
_params: dict[str, tuple[tuple, Sampling]] = {}  # layer path -> (its identity, its reading)
# (template, system, messages) -> (identities, translation, why the messages layer is not in it)
_templates: dict[tuple[str, str, str], tuple[tuple, ChatTemplate, str | None]] = {}
_made: dict[Layers, tuple[tuple, Applied]] = {}  # a model's layers -> (their identities, what they give)
_seen: dict[str, os.stat_result] = {}  # layer path -> its status as the last scan found it


def saw_layers(statuses: Mapping[Path, os.stat_result | OSError]) -> None:
    """The statuses of layers as a scan of the store just found them
    (`lookup.statuses`): what tells whether a layer changed until the next
    scan (the scan that finds one changed has its folder's answers
    forgotten), so that a lookup of model.gguf resolves no layer's path."""
    with _lock:
        for path, st in statuses.items():
            if isinstance(st, os.stat_result) and stat.S_ISREG(st.st_mode):
                _seen[str(path)] = st
            else:
                _seen.pop(str(path), None)


def _stamp(path: Path | None) -> tuple:
    if path is None:
        return ()
    with _lock:
        st = _seen.get(str(path))
    return identity(st if st is not None else status(path))  # resolved as every store path is (never into the mount)


def _sampling(path: Path) -> Sampling:
    try:
        stamp = _stamp(path)
    except OSError as e:
        return Sampling(
            (), (f"params layer {path.name} cannot be read ({e.strerror}): no sampling defaults in model.gguf",)
        )
    with _lock:
        hit = _params.get(str(path))
    if hit is None or hit[0] != stamp:
        hit = stamp, layer_sampling(path)
        with _lock:
            _params[str(path)] = hit
    return hit[1]


def _read(path: Path | None, what: str, limit: int) -> bytes:
    if path is None:
        return b""
    try:
        return read_shared(path, limit, f"{what} layer")  # (NotShared: a ValueError saying why)
    except (GGUFError, OSError) as e:
        raise ValueError(f"its {what} layer {path.name} cannot be read ({e})") from None


def _chat_template(template: Path, system: Path | None, messages: Path | None) -> tuple[ChatTemplate, str | None]:
    """The translation of a template layer with a system and a messages
    layer (again once any changes), and why the messages layer is not in it
    (a messages layer that cannot be used leaves the template without it)."""
    try:
        stamp = (_stamp(template), _stamp(system), _stamp(messages))
    except OSError as e:
        return ChatTemplate(reason=f"a layer cannot be read ({e.strerror})"), None
    key = (str(template), str(system), str(messages))
    with _lock:
        hit = _templates.get(key)
    if hit is None or hit[0] != stamp:
        listed, unused = None, None
        if messages is not None:
            try:
                listed = parse_messages(_read(messages, "messages", MAX_MESSAGES + 1))
            except ValueError as e:
                unused = str(e)
        try:
            made = translate(
                _read(template, "template", MAX_TEMPLATE + 1), _read(system, "system", MAX_SYSTEM + 1), listed
            )
        except ValueError as e:
            made = ChatTemplate(reason=str(e))
        hit = stamp, made, unused
        with _lock:
            _templates[key] = hit
    return hit[1], hit[2]


def of_layer(layers: Layers) -> Applied:
    """What model.gguf gains from `layers` (made again once a scan finds
    one changed; asked at every lookup of model.gguf, it resolves no path
    for a layer the last scan found)."""
    try:
        stamps = tuple(_stamp(p) for p in layers.paths())
    except OSError:
        return _applied(layers)  # (each unreadable layer's note says why)
    with _lock:
        hit = _made.get(layers)
    if hit is None or hit[0] != stamps:
        hit = stamps, _applied(layers)
        with _lock:
            _made[layers] = hit
    return hit[1]


def _applied(layers: Layers) -> Applied:
    kvs: list = []
    applied: list[tuple[str, str]] = []
    notes: list[str] = []
    if layers.params is not None:
        s = _sampling(layers.params)
        kvs += s.kvs
        notes += s.notes
        if s.kvs:
            applied.append(("params", "sampling defaults in model.gguf: " + ", ".join(k for k, _ in s.kvs)))
    if layers.template is not None:
        t, unused = _chat_template(layers.template, layers.system, layers.messages)
        if unused is not None:
            notes.append(f"messages: not applied ({unused})")
        if t.jinja is not None:
            kvs.append((Keys.Tokenizer.CHAT_TEMPLATE, string(t.jinja)))
            applied.append(("template", "model.gguf's chat template (tokenizer.chat_template), translated to Jinja"))
            if layers.system is not None:
                applied.append(("system", "the default system message of the chat template"))
            if layers.messages is not None and unused is None:
                applied.append(
                    (
                        "messages",
                        "the chat template's first messages of every chat, after the system "
                        "message, before the chat's own (as Ollama joins them)",
                    )
                )
        else:
            notes.append(f"template: not applied, model.gguf keeps its own chat template ({t.reason})")
    for layer, path in (("system", layers.system), ("messages", layers.messages)):
        if (
            path is not None
            and not any(name == layer for name, _ in applied)
            and not any(n.startswith(f"{layer}: not applied") for n in notes)
        ):
            notes.append(f"{layer}: not applied (only a translated template layer carries it)")
    return Applied(tuple(kvs), tuple(applied), tuple(notes))


def retain_layers(paths: set[Path]) -> None:
    """Forget the readings of every layer not in `paths`."""
    keep = {str(p) for p in paths}
    with _lock:
        for gone in [p for p in _seen if p not in keep]:
            del _seen[gone]
        for gone in [p for p in _params if p not in keep]:
            del _params[gone]
        for key in [k for k in _templates if k[0] not in keep or any(p != "None" and p not in keep for p in k[1:])]:
            del _templates[key]
        for layers in [k for k in _made if any(str(p) not in keep for p in k.paths())]:
            del _made[layers]


def kvs_key(kvs: tuple) -> str:
    """A text that tells one set of KVs from another (a digest of their keys,
    types and encoded values): what the index keys a sampled size by."""
    h = hashlib.sha256()
    for key, value in kvs:
        h.update(f"{key}={int(value.vtype)}:".encode() + bytes(value.payload) + b";")
    return h.hexdigest()


def with_sampling(spec: ViewSpec | None, source: SourceGGUF, kvs: tuple) -> ViewSpec:
    """`spec` (None: the blob unchanged) with `kvs` set: a key the blob already
    has keeps its place and takes the new value, the others follow the
    existing KVs."""
    if spec is None:
        spec = plan(UNCHANGED, source)
    new = dict(kvs)
    merged = [(k, new.pop(k, v)) for k, v in spec.kvs]
    merged += list(new.items())
    return ViewSpec(merged, spec.tensors, spec.alignment, spec.handler, spec.idle_renames)
