"""Laguna (poolside) as Ollama wrote it.

Ollama's converter (`convert/convert_laguna.go`, 87288ced4, 2026-04-28, as it
stood at f63eea3) wrote the attention output gate as `attn_g` (llama.cpp:
`attn_gate`), the sliding-window layers' rope keys under `rope.swa.*`
(llama.cpp: `rope.dimension_count_swa`, `rope.freq_base_swa`), and the YaRN
parameters under their short names: `rope.scaling.beta_fast`/`beta_slow`
(llama.cpp: `yarn_beta_fast`/`yarn_beta_slow`) and the attention factor as
`rope.scaling.attn_factor`, which llama.cpp multiplies into the attention
scale on top of the YaRN magnitude scaling it derives from the factor
itself; llama.cpp's converter writes it as `rope.scaling.yarn_attn_factor`.

Departure from Ollama's handler (which copies the two SWA keys and renames
the gate): the YaRN keys are moved as well, as llama.cpp's conversion has
them, so that full-attention layers are not scaled twice.
"""

from gguf import MODEL_TENSOR as T

from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    Drop,
    DropPrefix,
    Rename,
    Translation,
    When,
    any_of,
    arch_is,
    has_key,
    has_tensor,
    leaf,
    value_is,
)

P = "laguna."
K = ArchKeys("laguna")  # (an architecture the pinned gguf-py does not name)

TEXT = Translation(
    name="laguna",
    detect=arch_is("laguna")
    & any_of(
        has_key(P + "rope.swa.dimension_count"), has_key(P + "rope.swa.freq_base"), has_tensor("blk.0.attn_g.weight")
    ),
    kv=(
        CopyIfAbsent(P + "rope.swa.dimension_count", K.Rope.DIMENSION_COUNT_SWA),
        CopyIfAbsent(P + "rope.swa.freq_base", K.Rope.FREQ_BASE_SWA),
        CopyIfAbsent(P + "rope.scaling.beta_fast", K.Rope.SCALING_YARN_BETA_FAST),
        CopyIfAbsent(P + "rope.scaling.beta_slow", K.Rope.SCALING_YARN_BETA_SLOW),
        When(
            value_is(K.Rope.SCALING_TYPE, "yarn"),
            (CopyIfAbsent(P + "rope.scaling.attn_factor", K.Rope.SCALING_YARN_ATTN_FACTOR),),
        ),
        DropPrefix((P + "rope.swa.",)),
        Drop((P + "rope.scaling.beta_fast", P + "rope.scaling.beta_slow", P + "rope.scaling.attn_factor")),
    ),
    tensors=(Rename(".attn_g", leaf(T.ATTN_GATE)),),
)
