"""Whether stock llama.cpp loads a model's files: as they are, translated by
a handler, or not at all (an architecture llama.cpp does not have).

The architectures llama.cpp has are gguf-py's table (`gguf.MODEL_ARCH_NAMES`,
the Python side of `llama-arch.cpp`) and the few a newer llama.cpp added since
the gguf-py release compatfs pins.  A known architecture
is necessary, not sufficient: a blob no handler claims is judged by its
architecture alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

from ..errors import GGUFError
from ..view.catalog import BlobViews
from ..names import MMPROJ_FILE, MODEL_FILE

# Architectures llama.cpp b11434 (the release scripts/e2e checks) loads that
# the gguf-py release compatfs pins does not name yet.
NEWER_THAN_GGUF_PY = frozenset(
    {
        "bailingmoe3",
        "clef",
        "cohere2moe",
        "deepseek32",
        "deepseek4",
        "dflash",
        "dots3note",
        "eagle3",
        "gemma4-assistant",
        "glm5-next",
        "granite_swa",
        "graniteswitch",
        "hrm_text",
        "hy_v3",
        "hy_v4",
        "kimi-k3",
        "laguna",
        "maple",
        "mellum",
        "minimax-01",
        "minimax-m3",
        "muse-glimmer",
        "nanbeige",
        "pockettts",
        "qwen3tts",
        "qwen4exp",
        "spark2_5",
        "talkie",
    }
)
KNOWN_ARCHS = frozenset(gguf.MODEL_ARCH_NAMES.values()) | NEWER_THAN_GGUF_PY

AS_IS = "as-is"
TRANSLATED = "translated"
NO = "no"

# What a model folder's own layers add to its model.gguf, by key prefix, as
# `ls` names it.
ADDED_BY_LAYERS = {"general.sampling.": "sampling defaults", "tokenizer.chat_template": "chat template"}


def _added(keys: tuple[str, ...]) -> str:
    """The keys a model's layers add, named by what they are."""
    named = [what for prefix, what in ADDED_BY_LAYERS.items() if any(k.startswith(prefix) for k in keys)]
    other = [k for k in keys if not any(k.startswith(p) for p in ADDED_BY_LAYERS)]
    return ", ".join(named + other)


@dataclass(frozen=True)
class Verdict:
    """How llama.cpp takes one view: `loads` is AS_IS, TRANSLATED or NO."""

    loads: str
    handler: str | None = None
    reason: str | None = None
    adds: tuple[str, ...] = ()  # keys the model's own layers add to the file (its params layer's)

    def __str__(self) -> str:
        if self.loads == NO:
            return f"no: {self.reason}"
        plus = f" + {_added(self.adds)}" if self.adds else ""
        if self.loads == TRANSLATED:
            return f"translated ({self.handler}){plus}"
        return f"as is{plus}"

    def as_dict(self) -> dict:
        return {"loads": self.loads, "handler": self.handler, "reason": self.reason, "adds": list(self.adds)}


def view_verdict(views: BlobViews, blob: Path, kind: str, adds: tuple[str, ...] = ()) -> Verdict:
    """The verdict for the `kind` view of `blob` with the keys `adds` a model
    folder's layers add to it (GGUFError when unreadable)."""
    s = views.summary(blob)
    if s.error:
        raise GGUFError(s.error)
    tr = s.text if kind == MODEL_FILE else s.clip
    arch = s.arch if kind == MODEL_FILE else "clip"  # a projector view is a clip file
    if arch not in KNOWN_ARCHS:
        why = f"architecture {arch!r} is not in llama.cpp" if arch else "no general.architecture"
        if tr is not None:
            why += f" (after {tr})"
        return Verdict(NO, tr, why)
    return Verdict(TRANSLATED, tr, None, adds) if tr is not None else Verdict(AS_IS, adds=adds)


def model_verdict(views: BlobViews, files: dict) -> dict[str, Verdict]:
    """Verdicts for the GGUF files of one model directory (`Tree` FileRefs by
    name), as a user opens them: with what the model's own layers add."""
    return {
        name: view_verdict(views, ref.blob, ref.kind, tuple(k for k, _ in views.sampling_kvs(ref.kind, ref.params)))
        for name, ref in files.items()
        if name in (MODEL_FILE, MMPROJ_FILE)
    }


def summary(verdicts: dict[str, Verdict]) -> str:
    """One line: the text view's verdict, and the projector's where it differs in kind."""
    text = verdicts.get(MODEL_FILE)
    out = str(text) if text else "-"
    proj = verdicts.get(MMPROJ_FILE)
    if proj is not None and text is not None and text.loads != NO:
        out += f"; mmproj {proj}"
    return out
