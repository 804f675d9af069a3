"""The shared core of the legacy writers: GGUF files laid out the way
Ollama's `fs/ggml/gguf.go` WriteGGUF wrote them (KVs sorted by key, tensors
`blk.N.*` by block number first, then the rest by name; alignment 32 and no
`general.alignment` key), and seeded weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Sequence

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
Dims = dict[str, Any]  # a writer's widths and settings, by name


V = gguf.GGUFValueType


def kv_type(value: Any) -> tuple[V, V | None]:
    """The GGUF type of a KV value (and of its entries): bool, np.uint32 and
    int -> u32, float -> f32, str; lists of bool, int (-> i32), float or str;
    numpy arrays of int32, uint32 or float32 (which may be empty) as arrays
    of that type."""
    if isinstance(value, np.ndarray):
        return V.ARRAY, {np.dtype(np.int32): V.INT32, np.dtype(np.uint32): V.UINT32, np.dtype(np.float32): V.FLOAT32}[
            value.dtype
        ]
    if isinstance(value, bool):
        return V.BOOL, None
    if isinstance(value, np.uint32):
        return V.UINT32, None
    if isinstance(value, int):
        return V.UINT32, None
    if isinstance(value, float):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    if isinstance(value, (list, tuple)):
        first = value[0]
        if isinstance(first, bool):
            return V.ARRAY, V.BOOL
        if isinstance(first, int):
            return V.ARRAY, V.INT32
        if isinstance(first, float):
            return V.ARRAY, V.FLOAT32
        return V.ARRAY, V.STRING
    raise TypeError(f"unsupported KV value {value!r}")


def ollama_tensor_order(names: Iterable[str]) -> list[str]:
    def key(n: str):
        m = re.match(r"blk\.(\d+)\.", n)
        return (0, int(m.group(1)), n) if m else (1, 0, n)

    return sorted(names, key=key)


def write(
    path: Path, arch: str, kvs: dict[str, Any], tensors: dict[str, tuple[np.ndarray, T]], *, ollama_order: bool
) -> Path:
    """kvs: key -> value (as `kv_type` types it; an empty numpy array is
    written empty, as Ollama's writer writes an empty slice);
    tensors: name -> (numpy array in HF layout, stored dtype).  With ollama_order the
    keys are written sorted and the tensors in WriteGGUF's block order; otherwise
    in insertion order (gguf-py script style, general.architecture first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.kv_data[0].clear()
    items = dict(kvs)
    items["general.architecture"] = arch
    keys = sorted(items) if ollama_order else ["general.architecture"] + [k for k in kvs if k != "general.architecture"]
    # gguf-py writes no empty array: one entry stands in and is cut below.
    empty = {k: kv_type(v)[1] for k, v in items.items() if isinstance(v, np.ndarray) and not v.size}
    for k in keys:
        vtype, sub = kv_type(items[k])
        value = [0] if k in empty else list(items[k]) if vtype == V.ARRAY else items[k]
        w.add_key_value(k, value, vtype, sub_type=sub)
    names = ollama_tensor_order(tensors) if ollama_order else list(tensors)
    for name in names:
        arr, dtype = tensors[name]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == T.F32:
            w.add_tensor(name, arr)
        elif dtype == T.F16:
            w.add_tensor(name, arr.astype(np.float16))
        elif dtype == T.BF16:
            w.add_tensor(name, gguf.quants.quantize(arr, T.BF16), raw_dtype=T.BF16)
        else:
            raise ValueError(dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if empty:
        from .gguf_edit import Blob, payload

        blob = Blob.parse(path.read_bytes())
        for k, sub in empty.items():
            blob.kv(k).payload = payload(V.ARRAY, (sub, []))
        path.write_bytes(blob.serialize())
    return path


def normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """A norm weight near 1."""
    return (1.0 + normal(rng, (n,), 0.05)).astype(np.float32)


def linear(rng: np.random.Generator, rows: int, cols: int, dtype: T = T.BF16) -> tuple[np.ndarray, T]:
    """A seeded matrix of `rows` outputs by `cols` inputs (HF layout), stored as `dtype`."""
    return normal(rng, (rows, cols), 0.05), dtype


def form(path: Path) -> tuple[dict[str, tuple[str, ...]], set[tuple[str, str, int]]]:
    """What a writer must reproduce of a converter's file, whatever its widths:
    each KV's GGUF type (and entry type), and each tensor's name (block
    numbers as `N`), ggml type and rank."""
    r = gguf.GGUFReader(path)
    keys = {k: tuple(t.name for t in f.types) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {(re.sub(r"\.\d+\.", ".N.", t.name), t.tensor_type.name, len(t.shape)) for t in r.tensors}
    return keys, tensors


# What Ollama's converters write for every unquantized (F16/BF16) conversion.
OLLAMA_GENERAL: dict[str, Any] = {"general.file_type": 1, "general.quantization_version": 2}


def embeddings(rng: np.random.Generator, n_vocab: int, n_embd: int, *, tied: bool) -> dict[str, tuple[np.ndarray, T]]:
    """`token_embd` (BF16), `output_norm` (F32) and, unless the embeddings
    are tied, `output` (BF16): a text model's ends, as Ollama kept a bf16
    checkpoint's."""
    t = {
        "token_embd.weight": (normal(rng, (n_vocab, n_embd), 0.05), T.BF16),
        "output_norm.weight": (norm(rng, n_embd), T.F32),
    }
    if not tied:
        t["output.weight"] = (normal(rng, (n_vocab, n_embd), 0.05), T.BF16)
    return t


def attention(
    rng: np.random.Generator,
    prefix: str,
    n_embd: int,
    q_rows: int,
    kv_rows: int,
    dtype: T = T.BF16,
    names: tuple[str, ...] = ("attn_q", "attn_k", "attn_v", "attn_output"),
) -> dict[str, tuple[np.ndarray, T]]:
    """Q, K, V and output projections of one attention block, named
    `prefix` + `names` (Q, K, V, output) + `.weight`."""
    q, k, v, out = (prefix + n + ".weight" for n in names)
    return {
        q: linear(rng, q_rows, n_embd, dtype),
        k: linear(rng, kv_rows, n_embd, dtype),
        v: linear(rng, kv_rows, n_embd, dtype),
        out: linear(rng, n_embd, q_rows, dtype),
    }


def ffn(
    rng: np.random.Generator, prefix: str, n_embd: int, n_ff: int, dtype: T = T.BF16
) -> dict[str, tuple[np.ndarray, T]]:
    """A gated feed-forward block: `prefix` + ffn_gate, ffn_up, ffn_down."""
    return {
        prefix + "ffn_gate.weight": linear(rng, n_ff, n_embd, dtype),
        prefix + "ffn_up.weight": linear(rng, n_ff, n_embd, dtype),
        prefix + "ffn_down.weight": linear(rng, n_embd, n_ff, dtype),
    }


def llm_kvs(arch: str, p: Dims) -> dict[str, Any]:
    """The text hyperparameters every Ollama converter writes from the HF
    config, under `arch`, from `p`'s n_layer, context_length, n_embd, n_ff,
    n_head, n_head_kv, rms_eps and rope_freq_base; with `OLLAMA_GENERAL`."""
    return {
        **OLLAMA_GENERAL,
        f"{arch}.block_count": p["n_layer"],
        f"{arch}.context_length": p["context_length"],
        f"{arch}.embedding_length": p["n_embd"],
        f"{arch}.feed_forward_length": p["n_ff"],
        f"{arch}.attention.head_count": p["n_head"],
        f"{arch}.attention.head_count_kv": p["n_head_kv"],
        f"{arch}.attention.layer_norm_rms_epsilon": p["rms_eps"],
        f"{arch}.rope.freq_base": p["rope_freq_base"],
    }
