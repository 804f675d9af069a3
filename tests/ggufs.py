"""Small GGUF files for unit tests, written with gguf-py."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(path: Path, arch: str, kvs: dict | None = None, tensors: dict | None = None) -> Path:
    """`kvs`: key -> python value (int -> u32, float -> f32, str, bool, list);
    `tensors`: name -> numpy array (f32/f16) or (bytes array, GGMLQuantizationType)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (kvs or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, t in (tensors or {}).items():
        if isinstance(t, tuple):
            w.add_tensor(name, t[0], raw_dtype=t[1])
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bf16(a: np.ndarray) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """`a` stored as BF16 (truncated), for GGUFWriter."""
    raw = (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return raw, gguf.GGMLQuantizationType.BF16


rng = np.random.default_rng(1)


def synthetic_gemma3(path: Path) -> Path:
    """A small monolithic gemma3 blob with the markers of Ollama's converter:
    no rms epsilon, extra tokens past the embedding rows, `v.`/`mm.` tensors
    under Ollama's names (the F16 patch/position embeddings become op tensors)."""
    tokens = [f"t{i}" for i in range(40)]
    return write_gguf(
        path,
        "gemma3",
        kvs={
            "gemma3.block_count": 1,
            "gemma3.context_length": 131072,
            "gemma3.embedding_length": 32,
            "gemma3.vision.block_count": 1,
            "gemma3.vision.embedding_length": 16,
            "gemma3.vision.image_size": 28,
            "gemma3.vision.patch_size": 14,
            "gemma3.vision.attention.layer_norm_epsilon": 1e-6,
            "gemma3.mm.tokens_per_image": 4,
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [float(i) for i in range(40)],
            "tokenizer.ggml.token_type": [1] * 40,
        },
        tensors={
            "token_embd.weight": bf16(rng.standard_normal((37, 32))),
            "blk.0.attn_q.weight": rng.standard_normal((32, 32)).astype(np.float16),
            "output_norm.weight": rng.standard_normal(32).astype(np.float32),
            "v.patch_embedding.weight": rng.standard_normal((16, 3, 14, 14)).astype(np.float16),
            "v.position_embedding.weight": rng.standard_normal((4, 16)).astype(np.float16),
            "v.blk.0.layer_norm1.weight": rng.standard_normal(16).astype(np.float32),
            "v.blk.0.mlp.fc1.weight": rng.standard_normal((64, 16)).astype(np.float16),
            "v.blk.0.mlp.fc2.weight": rng.standard_normal((16, 64)).astype(np.float16),
            "v.post_layernorm.weight": rng.standard_normal(16).astype(np.float32),
            "mm.mm_input_projection.weight": rng.standard_normal((32, 16)).astype(np.float16),
        },
    )


def plain_model(path: Path) -> Path:
    """A GGUF no handler claims."""
    return write_gguf(
        path,
        "qwen2",
        kvs={"qwen2.block_count": 1},
        tensors={"token_embd.weight": np.arange(160, dtype=np.float32).reshape(10, 16)},
    )
