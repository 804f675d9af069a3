"""Per-architecture translations, in dispatch order.

`TEXT` is tried in order for a blob's `model.gguf`, `CLIP` for its
`mmproj.gguf`; the first translation whose detector claims the blob is
applied, and a blob no translation claims is served unchanged.  Order
matters where detectors overlap (as in Ollama's dispatch): EmbeddingGemma
before Gemma 3, Qwen2.5-VL before anything Qwen2-VL, GLM-4.7-Flash on its
way to deepseek2.
"""
from . import (
    bert, deepseekocr, embeddinggemma, gemma3, gemma3n, gemma4, glm4moelite, glmocr, gptoss, laguna, lfm2,
    llama, llama4, llava, mistral3, nemotron, olmo3, qwen25vl, qwen35, qwen3next, qwen3vl,
)

TEXT = (
    embeddinggemma.TEXT,
    gemma3.TEXT,
    gemma3n.TEXT,
    gemma4.TEXT,
    gptoss.TEXT,
    lfm2.TEXT,
    mistral3.TEXT,
    qwen25vl.TEXT,
    qwen3vl.TEXT,
    qwen3vl.TEXT_MOE,
    qwen35.TEXT,
    qwen35.TEXT_MOE,
    qwen3next.TEXT,
    olmo3.TEXT,
    glm4moelite.TEXT,
    laguna.TEXT,
    deepseekocr.TEXT,
    nemotron.TEXT_OMNI,
    nemotron.TEXT_MOE,
    llama.LLAMA3,
    bert.TEXT,
    llama4.TEXT,
    glmocr.TEXT,
)

CLIP = (
    llava.DEFAULT_PROJECTOR,
    gemma3.CLIP,
    mistral3.CLIP,
    gemma4.CLIP,
    qwen25vl.CLIP,
    deepseekocr.CLIP,
    nemotron.CLIP,
    llama4.CLIP,
    glmocr.CLIP,
    qwen3vl.CLIP,
    qwen3vl.CLIP_MOE,
    qwen35.CLIP,
    qwen35.CLIP_MOE,
)
