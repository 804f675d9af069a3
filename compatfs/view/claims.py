"""Which translations claim a blob, and what each of its views holds.

For a blob, `model.gguf` is the text view: the first text translation that
claims it, else the blob unchanged.  `mmproj.gguf` exists for a projector
blob (architecture `clip`: the first clip translation that claims it, else
unchanged) and for a monolithic blob that a clip translation claims.  With
translation off every view is the blob unchanged.

A handler that fails while claiming, planning or rendering a view (whatever
it raises) refuses that one view: GGUFError naming the blob, the handler and
the reason; the blob's other view is made as if it had not been asked.  A
fault of the system met meanwhile (memory running out, a blob read failing:
`blobfile.transient`) refuses nothing: it is raised as a `Transient`, so
that nothing remembers it as the blob's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from gguf import Keys

from .. import handlers
from ..errors import GGUFError
from ..files.blobfile import Transient, transient
from ..format.header import SourceGGUF
from ..format.values import VT
from ..names import MMPROJ_FILE, MODEL_FILE
from ..translate import Translation, ViewSpec, first_claim, plan
from .layout import View
from .opcache import OpCache
from .sampling import with_sampling

log = logging.getLogger(__name__)


def translation_enabled(no_translate: bool = False) -> bool:
    """Off with --no-translate or OLLAMA_LLAMA_CPP_COMPAT=0 (as in Ollama)."""
    return not no_translate and os.environ.get("OLLAMA_LLAMA_CPP_COMPAT") != "0"


@dataclass(frozen=True)
class BlobInfo:
    """A parsed blob, the translations that claim it, and why a claim
    failed (then that view is refused: a verdict on the blob's bytes, never
    a fault of the system, which `classify` raises)."""

    source: SourceGGUF
    text: Translation | None
    clip: Translation | None
    text_error: GGUFError | None = None
    clip_error: GGUFError | None = None

    @property
    def has_mmproj(self) -> bool:
        return is_projector(self.source) or self.clip is not None or self.clip_error is not None


def architecture(kvs) -> str | None:
    """general.architecture of `kvs` where it is a string (else None)."""
    v = kvs.get(Keys.General.ARCHITECTURE)
    if v is None or v.vtype != VT.STRING:
        return None
    try:
        return v.decode()
    except (GGUFError, UnicodeDecodeError):
        return None


def is_embedding(kvs) -> bool:
    """Whether a view of KVs `kvs` is an embedding model: it names a pooling
    type for its architecture."""
    arch = architecture(kvs)
    return arch is not None and f"{arch}.pooling_type" in kvs


def is_projector(source: SourceGGUF) -> bool:
    return architecture(source.kvs) == "clip"


class HandlerFailure(GGUFError):
    """A handler raised something other than GGUFError (it is not total) and
    other than a fault of the system: its view is refused as for any
    GGUFError; `__cause__` is what it raised (for the fuzzer, which reports
    these as findings)."""


def contained(what: str, fn, *args):
    """`fn(*args)`; whatever it raises as GGUFError naming `what` (a handler
    that is not total must take down no more than the view it makes): a
    GGUFError as its own kind, a fault of the system (`blobfile.transient`)
    as Transient, anything else as HandlerFailure."""
    try:
        return fn(*args)
    except HandlerFailure as e:
        raise HandlerFailure(f"{what}: {e}") from e.__cause__
    except GGUFError as e:
        raise type(e)(f"{what}: {e}") from None
    except Exception as e:
        kind = Transient if transient(e) else HandlerFailure
        raise kind(f"{what}: {type(e).__name__}: {e}") from e


def _claim(translations, source: SourceGGUF, kind: str) -> tuple[Translation | None, GGUFError | None]:
    """The first claiming translation, or why claiming failed; a fault of
    the system is raised (it says nothing of the blob)."""
    try:
        return contained(f"claiming {kind}", first_claim, translations, source), None
    except GGUFError as e:
        if transient(e):
            raise
        return None, e


def classify(source: SourceGGUF, translate: bool = True) -> BlobInfo:
    """Which translations claim `source` (none when translation is off).  A
    clip translation is asked only of a projector or a blob with `v.*`
    tensors (the vision part of a monolithic blob).  Transient when a fault
    of the system stopped a claim."""
    if not translate:
        return BlobInfo(source, None, None)
    text, text_error = _claim(handlers.TEXT, source, MODEL_FILE)
    clip = clip_error = None
    if is_projector(source) or source.has_tensor_prefix("v."):
        clip, clip_error = _claim(handlers.CLIP, source, MMPROJ_FILE)
    return BlobInfo(source, text, clip, text_error, clip_error)


def view_spec(info: BlobInfo, kind: str) -> ViewSpec | None:
    """What the `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob
    holds; None: the blob itself.  GGUFError when that view is refused."""
    if kind == MMPROJ_FILE and not info.has_mmproj:
        raise FileNotFoundError(f"{info.source.path} has no projector view")
    error = info.text_error if kind == MODEL_FILE else info.clip_error
    if error is not None:
        raise type(error)(str(error)) from error.__cause__
    tr = info.text if kind == MODEL_FILE else info.clip
    return contained(f"{tr.name}: planning {kind}", plan, tr, info.source) if tr is not None else None


def sampled_spec(info: BlobInfo, kind: str, sampling_kvs: tuple = ()) -> ViewSpec | None:
    """`view_spec`, with `sampling_kvs` (see `sampling`) set where there are any."""
    spec = view_spec(info, kind)
    if sampling_kvs:
        try:
            spec = with_sampling(spec, info.source, sampling_kvs)
        except GGUFError as e:  # a blob only served as it is (duplicate keys, say)
            log.warning("%s: model.gguf without its params layer's sampling defaults (%s)", info.source.path, e)
    return spec


def build_view(info: BlobInfo, kind: str, cache: OpCache, sampling_kvs: tuple = ()) -> View:
    """The `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob; with
    `sampling_kvs`, the text view with those KVs set."""
    spec = sampled_spec(info, kind, sampling_kvs)
    if spec is None:
        return View.identity(info.source.identity)
    return contained(f"rendering {kind}", View.translated, info.source, spec, cache, (info.source.identity, kind))
