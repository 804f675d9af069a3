"""Per-architecture translations, in dispatch order.

`TEXT` is tried in order for a blob's `model.gguf`, `CLIP` for its
`mmproj.gguf`; the first translation whose detector claims the blob is
applied, and a blob no translation claims is served unchanged.

The detectors are written to be disjoint, each excluding the blobs of its
neighbours by what tells them apart (Gemma 3's excludes EmbeddingGemma's
projection head `dense.0.weight`; Qwen3-Next's `qwen35moe` form excludes
Qwen3.5's vision tower, M-RoPE keys and MTP head; Qwen3-VL's claims only
blobs without the sections llama.cpp's conversion writes), so the order of
these tables decides nothing but the overlaps listed in `OVERLAPS`.
`tests/test_claims.py` checks, on every blob of the corpus and on near
misses made for the purpose, that no blob is claimed by two translations of
a table except as listed there, and that each listed overlap goes to the
translation named first.
"""

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

# Blobs two translations of one table both claim, on purpose: (the one that
# is tried first and takes them, the other, which blobs, why).
OVERLAPS = (
    (
        "qwen35moe",
        "qwen3next",
        "a qwen35moe blob with Qwen3-Next's fused `ssm_ba` that also carries "
        "`image_token_id` or `ssm.v_head_reordered` true, and none of Qwen3.5's other markers",
        "both keys are Qwen3.5's: its vision's token, and V heads reordered into Qwen3.5's layout, which "
        "llama.cpp's qwen3next loader does not expect (Qwen3-Next checkpoints converted as qwen35moe carry "
        "neither); as Qwen3-Next the heads would be read in the wrong order",
    ),
)
