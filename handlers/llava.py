"""LLaVA / BakLLaVA projectors written before `clip.projector_type` existed.

llama.cpp no longer assumes a projector type; these files were all the
two-layer MLP projector (`mm.0`, `mm.2`).
"""

from gguf import Keys

from compatfs.format.values import string
from compatfs.translate import Set, Translation, arch_is, has_key, has_true

DEFAULT_PROJECTOR = Translation(
    name="llava-mlp",
    detect=arch_is("clip")
    & has_true(Keys.Clip.HAS_VISION_ENCODER)
    & ~has_key(Keys.Clip.PROJECTOR_TYPE)
    & ~has_key(Keys.ClipVision.PROJECTOR_TYPE),
    kv=(Set(Keys.Clip.PROJECTOR_TYPE, string("mlp")),),
)
