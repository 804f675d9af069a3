"""Blobs at published widths, written from random quantized blocks with
valid scales (never by quantizing gigabytes of floats): seconds to write.

gpt-oss-20b: 32 experts, n_embd 2880, expert width 2880 (the fused gate/up
stack 2 x 92,160 rows); gpt-oss-120b: 128 experts, the same widths."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from compatfs.testing import gptoss

GPTOSS_20B = dict(n_embd=2880, n_ff=2880, n_expert=32)
GPTOSS_120B = dict(n_embd=2880, n_ff=2880, n_expert=128)
QK, BLOCK = 32, 17


def mxfp4_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` MXFP4 blocks: an E8M0 scale near 1 (2^-8 .. 2^3), 16 random nibble bytes."""
    blocks = rng.integers(0, 256, (n, BLOCK), dtype=np.uint8)
    blocks[:, 0] = rng.integers(119, 131, n, dtype=np.uint8)
    return blocks.reshape(-1)


def fused_gptoss(
    path: Path, n_embd: int, n_ff: int, n_expert: int, layers: int = 1, seed: int = 0, ollama_mxfp4: bool = False
) -> Path:
    """A gpt-oss blob of the older fused form (gate and up rows interleaved in
    one `ffn_gate_up_exps` per layer), its expert stacks at the given widths,
    the rest of the tiny model's tensors as they are; with `ollama_mxfp4`, the
    MXFP4 stacks typed 4 in the checkpoint's block layout (the oldest form).
    Written once: an existing file is returned as it is."""
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tiny = gptoss.current_gptoss(path.with_name(path.name + ".tiny"))
    try:
        r = gguf.GGUFReader(tiny)
        kvs = {
            name: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
            for name, f in r.fields.items()
            if not name.startswith("GGUF.")
        }
        tensors = {
            t.name: (tuple(int(d) for d in t.shape), t.tensor_type, np.asarray(t.data).view(np.uint8))
            for t in r.tensors
        }
    finally:
        tiny.unlink()
    kvs["gptoss.block_count"] = (layers, *kvs["gptoss.block_count"][1:])
    tensors = {n: t for n, t in tensors.items() if not n.startswith("blk.") or int(n.split(".")[1]) < layers}
    rng = np.random.default_rng(seed)
    for i in range(layers):
        for part in ("gate", "up"):
            for kind in ("weight", "bias"):
                del tensors[f"blk.{i}.ffn_{part}_exps.{kind}"]
        rows = 2 * n_ff
        tensors[f"blk.{i}.ffn_gate_up_exps.weight"] = (
            (n_embd, rows, n_expert),
            gguf.GGMLQuantizationType.MXFP4,
            mxfp4_blocks(rng, n_embd // QK * rows * n_expert),
        )
        tensors[f"blk.{i}.ffn_gate_up_exps.bias"] = (
            (rows, n_expert),
            gguf.GGMLQuantizationType.F32,
            rng.standard_normal(rows * n_expert, dtype=np.float32).view(np.uint8),
        )
    if ollama_mxfp4:
        tensors = {
            n: gptoss.to_ollama_mxfp4(t) if t[1] == gguf.GGMLQuantizationType.MXFP4 else t for n, t in tensors.items()
        }
    tmp = gptoss.write_raw(path.with_name(path.name + ".partial"), kvs, tensors)
    tmp.rename(path)
    return path


def rewritten(src: Path, path: Path, replace: dict, kvs: dict | None = None) -> Path:
    """The GGUF `src` written again at `path` (as Ollama lays a blob out)
    with the tensors of `replace` (name -> (ggml shape, ggml type, bytes))
    and the keys of `kvs` (name -> (value, type, element type)) in place of
    its own."""
    r = gguf.GGUFReader(src)
    own = {
        name: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
        for name, f in r.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors = {
        t.name: (tuple(int(d) for d in t.shape), t.tensor_type, np.asarray(t.data).view(np.uint8)) for t in r.tensors
    }
    tensors.update(replace)
    return gptoss.write_raw(path, {**own, **(kvs or {})}, tensors)
