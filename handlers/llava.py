"""LLaVA / BakLLaVA projectors written before `clip.projector_type` existed.

llama.cpp no longer assumes a projector type; these files were all the
two-layer MLP projector (`mm.0`, `mm.2`).
"""
from compatfs.gguf_values import string
from compatfs.translation import Set, Translation, arch_is, has_key, has_true

DEFAULT_PROJECTOR = Translation(
    name="llava-mlp",
    detect=arch_is("clip") & has_true("clip.has_vision_encoder")
    & ~has_key("clip.projector_type") & ~has_key("clip.vision.projector_type"),
    kv=(Set("clip.projector_type", string("mlp")),),
)
