"""Tiny GGUF files written the way Ollama's converters wrote published blobs,
and Ollama-layout stores to hold them: for the tests, the demo store and
`scripts/e2e`.  The mount never imports this package.

One module per handler in `handlers/`, named as it, so that a translation
and the legacy forms it reads sit side by side by name; besides them, `core`
writes GGUF files in Ollama's layout, `tokenizers` makes small vocabularies,
`store` writes manifests and blobs, `widths` writes legacy forms at published
widths, and `gguf_edit`, `fuzz`, `fuzz_bytes` and `fuzz_structure` make the
fuzz cases.  Every writer of a handler's module is
``NAME(path, seed=0, **options) -> path`` and cites, in its module's
docstring, the converter commit whose output it reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from . import (
    bert,
    deepseekocr,
    embeddinggemma,
    gemma3,
    gemma3n,
    gemma4,
    glm4moelite,
    glmocr,
    gptoss,
    laguna,
    lfm2,
    llama,
    llama4,
    llava,
    mistral3,
    nemotron,
    olmo3,
    qwen25vl,
    qwen35,
    qwen3next,
    qwen3vl,
)

Writer = Callable[..., Path]


@dataclass(frozen=True)
class LegacyModel:
    """A model as a store holds it: a model blob, and a projector blob for
    models that ship one as a separate layer."""

    model: Writer
    projector: Writer | None = None
    tag: str = "latest"


# name -> how to write it; the demo store and scripts/e2e serve every entry.
LEGACY: dict[str, LegacyModel] = {
    "deepseek-ocr": LegacyModel(deepseekocr.legacy_deepseekocr, tag="3b"),
    "gemma3": LegacyModel(gemma3.legacy_gemma3_text, tag="1b"),
    "gemma3-vision": LegacyModel(gemma3.legacy_gemma3_vision, tag="4b"),
    "gemma4-moe": LegacyModel(gemma4.legacy_gemma4_moe, tag="26b"),
    "gpt-oss": LegacyModel(gptoss.legacy_gptoss_fused, tag="20b-fused"),
    "gpt-oss-mxfp4": LegacyModel(gptoss.legacy_gptoss_mxfp4, tag="20b-type4"),
    "llama3.1": LegacyModel(llama.legacy_llama3_instruct, tag="8b-instruct"),
    "llava": LegacyModel(llama.plain_llama_text, llava.legacy_llava_projector, tag="7b"),
    "embeddinggemma": LegacyModel(embeddinggemma.legacy_embeddinggemma, tag="300m"),
    "snowflake-arctic-embed2": LegacyModel(bert.legacy_snowflake_arctic_embed2, tag="568m"),
    "qwen3-next": LegacyModel(qwen3next.legacy_qwen3next, tag="80b"),
    "qwen3-next-q35": LegacyModel(qwen3next.qwen35moe_qwen3next, tag="80b"),
    "laguna": LegacyModel(laguna.legacy_laguna, tag="xs.2"),
    "nemotron-3-super": LegacyModel(nemotron.legacy_nemotron_h_moe, tag="120b"),
    "nemotron3": LegacyModel(nemotron.legacy_nemotron_h_omni, tag="33b"),
    "llama4": LegacyModel(llama4.legacy_llama4, tag="scout"),
    "glm-ocr": LegacyModel(glmocr.legacy_glmocr, tag="latest"),
    "qwen3-vl": LegacyModel(qwen3vl.legacy_qwen3vl_moe, tag="30b-a3b"),
    "qwen3.5": LegacyModel(qwen35.legacy_qwen35_moe, tag="35b-a3b"),
    "gemma3n": LegacyModel(gemma3n.legacy_gemma3n, tag="e4b"),
    "glm-4.7-flash": LegacyModel(glm4moelite.legacy_glm4moelite, tag="latest"),
    "lfm2": LegacyModel(lfm2.legacy_lfm2, tag="1.2b"),
    "mistral-small3.1": LegacyModel(mistral3.legacy_mistral3, tag="24b"),
    "olmo-3": LegacyModel(olmo3.legacy_olmo3, tag="7b"),
    "qwen2.5vl": LegacyModel(qwen25vl.legacy_qwen25vl, tag="7b"),
}


def write_models(root: Path, tmp: Path, namespace: str = "library") -> list[str]:
    """Add every `LEGACY` model to the store at `root` (files staged in `tmp`);
    the names the mount shows for them."""
    from .store import add_model

    names = []
    for name, entry in LEGACY.items():
        proj = entry.projector(tmp / f"{name}-proj.gguf") if entry.projector else None
        add_model(root, name, entry.model(tmp / f"{name}.gguf"), proj, namespace=namespace, tag=entry.tag)
        names.append(f"{name}:{entry.tag}" if namespace == "library" else f"{namespace}/{name}:{entry.tag}")
    return names
