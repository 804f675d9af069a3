"""LoRA adapter blobs as Ollama's converter writes them (a Modelfile's
`ADAPTER` of a safetensors adapter, stored as an
`application/vnd.ollama.image.adapter` layer).

* `convert/convert.go` `ConvertAdapter` and `convert/convert_llama_adapter.go`
  at 0c819e167 (2024-08-23, "convert safetensor adapters into GGUF"),
  unchanged in form through fb3076099: KVs `adapter.lora.alpha` (f32),
  `adapter.type` "lora", `general.file_type` 1, `general.type` "adapter",
  `general.version` "v0.2", `general.architecture` the base model's, and for
  llama the base's `llama.attention.head_count`/`head_count_kv`, written
  sorted; tensors `blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_*>.weight.lora_a`
  and `.lora_b`, F16, `lora_a` stored as PEFT's `lora_A` (rank x in: GGUF
  dims [in, rank]) and `lora_b` as `lora_B` (out x rank: [rank, out]).  (Its
  repacking of attn_q/attn_k's `lora_a` permutes values only: random values
  stand for it here.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .core import T, normal, write
from .llama import PLAIN_LLAMA


def llama_adapter(
    path: Path,
    seed: int = 0,
    *,
    rank: int = 4,
    alpha: float = 8.0,
    std: float = 0.5,
    base: dict | None = None,
    arch: str = "llama",
    targets: tuple[str, ...] = ("attn_q", "attn_v", "ffn_up"),
) -> Path:
    """A LoRA adapter for `testing.llama.plain_llama_text` (`base`: the widths
    of another llama; `arch`: what it names as its base's architecture), with
    `targets` of every block adapted; `std` large enough that the adapted
    model's greedy output differs from the base's."""
    p = base or PLAIN_LLAMA
    rng = np.random.default_rng(seed)
    E, F, H, HKV = p["n_embd"], p["n_ff"], p["n_head"], p["n_head_kv"]
    hd = E // H
    out_in = {
        "attn_q": (H * hd, E),
        "attn_k": (HKV * hd, E),
        "attn_v": (HKV * hd, E),
        "attn_output": (E, H * hd),
        "ffn_gate": (F, E),
        "ffn_up": (F, E),
        "ffn_down": (E, F),
    }
    kvs: dict[str, Any] = {
        "adapter.lora.alpha": float(alpha),
        "adapter.type": "lora",
        "general.file_type": 1,
        "general.type": "adapter",
        "general.version": "v0.2",
    }
    if arch == "llama":
        kvs["llama.attention.head_count"] = H
        kvs["llama.attention.head_count_kv"] = HKV
    tensors: dict[str, tuple[np.ndarray, T]] = {}
    for i in range(p["n_layer"]):
        for target in targets:
            rows, cols = out_in[target]
            tensors[f"blk.{i}.{target}.weight.lora_a"] = (normal(rng, (rank, cols), std), T.F16)
            tensors[f"blk.{i}.{target}.weight.lora_b"] = (normal(rng, (rows, rank), std), T.F16)
    return write(path, arch, kvs, tensors, ollama_order=True)
