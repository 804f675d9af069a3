"""gpt-oss blobs in the layouts of Ollama's older converters (the legacy forms
of `handlers/gptoss.py`), `convert/convert_gptoss.go`:

* at 59412fbb4 (2025-08-26, "convert(gptoss): mxfp4 to ggml layout") until
  the parent of c00fa9cc2 (2025-10-06, "convert: split gate_up bias"): the
  checkpoint's `gate_up_proj` blocks, scales and bias each written as one
  tensor per layer, `blk.N.ffn_gate_up_exps.weight` (MXFP4, ggml type 39,
  ggml [n_embd, 2*n_ff, n_expert]) and `blk.N.ffn_gate_up_exps.bias` (F32,
  [2*n_ff, n_expert]), gate and up rows interleaved as in the checkpoint
  (gate = rows 0::2, up = rows 1::2).  c00fa9cc2 split the bias and
  93085127f (2025-10-06) the weight into `ffn_gate_exps`/`ffn_up_exps`.
* at 4ae4f47b1 (2025-08-20, "gpt-oss: convert from hugging face format"),
  the parent of 59412fbb4: the same, with every MXFP4 stack stored as ggml
  type 4 (`TensorTypeMXFP4`, "formerly unused tensorTypeQ4_2"; `tensorKindMXFP4
  = 4` in convert/reader.go) and in the checkpoint's block layout: per block
  of 32 the E8M0 scale, then 16 bytes whose byte k holds element 2k in its
  low nibble and 2k+1 in its high nibble (`mxfp4.WriteTo` concatenates
  scales and blocks without the nibble transform 59412fbb4 added).

Everything else (KVs, names, the other tensors) is as the current converter
writes it (f63eea3; `KV()` is unchanged since 4ae4f47b1): `relayout` re-lays
a blob of the current form in an older layout, so the same weights can be
compared; the writers re-lay a tiny seeded model of the current form.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .core import Dims, T, kv_type, normal, ollama_tensor_order
from .tokenizers import byte_level_merges, bytes_to_unicode

OLLAMA_MXFP4 = 4  # ggml type number of MXFP4 in Ollama's converter before 59412fbb4


GPTOSS: Dims = dict(
    n_layer=2,
    n_embd=64,
    n_ff=96,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    n_expert=4,
    n_expert_used=2,
    context_length=131072,
    original_context=4096,
    sliding_window=128,
    rope_base=150000.0,
    rope_factor=32.0,
)
# o200k_harmony's special tokens, from <|startoftext|> (199998) on; placed
# after the tiny vocabulary's ordinary tokens at the same relative positions.
HARMONY = {
    0: "<|startoftext|>",
    1: "<|endoftext|>",
    4: "<|return|>",
    5: "<|constrain|>",
    7: "<|channel|>",
    8: "<|start|>",
    9: "<|end|>",
    10: "<|message|>",
    14: "<|call|>",
}
N_SPECIAL = 32
HARMONY_TEMPLATE = (
    "{% for message in messages %}<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)

# A tensor as written: ggml shape, ggml type (an int for Ollama's type 4), bytes.
Raw = tuple[tuple[int, ...], Any, np.ndarray]


# -- re-laying a blob of the current form -------------------------------------------------


def relayout(current: Path, path: Path, *, ollama_mxfp4: bool) -> Path:
    """The gpt-oss blob `current` (convert_gptoss.go at f63eea3) as the
    converter at 59412fbb4 wrote it (fused, interleaved gate/up stacks) or,
    with `ollama_mxfp4`, at 4ae4f47b1 (also MXFP4 as Ollama's type 4)."""
    r = gguf.GGUFReader(current)
    kvs = {
        name: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
        for name, f in r.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors: dict[str, Raw] = {
        t.name: (tuple(int(d) for d in t.shape), t.tensor_type, np.asarray(t.data).view(np.uint8)) for t in r.tensors
    }
    for i in sorted({int(n.split(".")[1]) for n in tensors if n.startswith("blk.")}):
        for kind in ("weight", "bias"):
            gate, up = tensors.pop(f"blk.{i}.ffn_gate_exps.{kind}"), tensors.pop(f"blk.{i}.ffn_up_exps.{kind}")
            tensors[f"blk.{i}.ffn_gate_up_exps.{kind}"] = interleave(gate, up, axis=1 if kind == "weight" else 0)
    if ollama_mxfp4:
        tensors = {n: to_ollama_mxfp4(t) if t[1] == T.MXFP4 else t for n, t in tensors.items()}
    return write_raw(path, kvs, tensors)


def interleave(gate: Raw, up: Raw, axis: int) -> Raw:
    """One stack whose entries along ggml `axis` alternate gate, up (the
    checkpoint's `gate_up_proj` layout): elements along axis 0, whole rows
    along axis 1."""
    shape, dtype, _ = gate
    if up[:2] != gate[:2]:
        raise ValueError(f"gate {gate[:2]} and up {up[:2]} differ")
    g, u = (t[2].reshape(*reversed(shape[axis + 1 :]), shape[axis], -1) for t in (gate, up))
    fused = np.stack((g, u), axis=-2).reshape(-1)
    return tuple(2 * d if k == axis else d for k, d in enumerate(shape)), dtype, fused


def to_ollama_mxfp4(t: Raw) -> Raw:
    """An MXFP4 stack in the checkpoint's block layout, typed 4 (before 59412fbb4)."""
    shape, _, data = t
    blocks = data.reshape(-1, 17)
    scale, qs = blocks[:, :1], blocks[:, 1:]
    values = np.concatenate((qs & 0x0F, qs >> 4), axis=1)  # ggml: byte j holds j and j+16
    packed = values[:, 0::2] | (values[:, 1::2] << 4)  # checkpoint: byte k holds 2k and 2k+1
    return shape, OLLAMA_MXFP4, np.concatenate((scale, packed), axis=1).reshape(-1)


def write_raw(path: Path, kvs: dict[str, tuple], tensors: dict[str, Raw]) -> Path:
    """A GGUF laid out as Ollama's WriteGGUF does (keys sorted, tensors by
    block then name, alignment 32): `kvs` name -> (value, type, element
    type), general.architecture among them; a type-4 tensor is written as
    MXFP4 (same block size) and its type then patched, as gguf-py refuses
    unknown types."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), kvs["general.architecture"][0])
    w.kv_data[0].clear()  # (the architecture it adds: written below with the other keys, in order)
    for key in sorted(kvs):
        value, vtype, sub = kvs[key]
        w.add_key_value(key, value, vtype, sub_type=sub)
    names = ollama_tensor_order(tensors)
    for name in names:
        shape, dtype, data = tensors[name]
        raw_dtype = T.MXFP4 if dtype == OLLAMA_MXFP4 else dtype
        row = gguf.quants.quant_shape_to_byte_shape((shape[0],), raw_dtype)[0]
        w.add_tensor(name, data.reshape(*reversed(shape[1:]), row), raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    patch = [t for t in gguf.GGUFReader(path).tensors if tensors[t.name][1] == OLLAMA_MXFP4]
    with open(path, "r+b") as f:
        for t in patch:
            f.seek(int(t.field.offset) + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape))
            f.write(np.uint32(OLLAMA_MXFP4).tobytes())
    return path


# -- a tiny model of the current form -----------------------------------------------------


@functools.cache
def harmony_tokens() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary (tokens, types, merges) learned from the
    corpus, followed by 32 harmony special tokens (control)."""
    b2u = bytes_to_unicode()
    merges = byte_level_merges(224)
    toks = list(b2u.values())
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
    types = [1] * len(toks)
    toks += [HARMONY.get(k, f"<|reserved_{len(toks) + k}|>") for k in range(N_SPECIAL)]
    types += [3] * N_SPECIAL
    return toks, types, [f"{a} {b}" for a, b in merges]


def current_gptoss(path: Path, seed: int = 0) -> Path:
    """A tiny gpt-oss as the current converter (f63eea3) writes it: BF16
    matrices, F32 norms, biases, sinks and router, MXFP4 (type 39) expert
    stacks in ggml's layout; Ollama's fixed token ids of the full o200k
    vocabulary (out of range here, as Ollama wrote them)."""
    p, rng = GPTOSS, np.random.default_rng(seed)
    toks, types, merges = harmony_tokens()
    E, F, X, hd = p["n_embd"], p["n_ff"], p["n_expert"], p["head_dim"]
    q, kv = p["n_head"] * hd, p["n_head_kv"] * hd
    pre = "gptoss."
    values: dict[str, Any] = {
        "general.architecture": "gptoss",
        "general.file_type": 4,
        "general.quantization_version": 2,
        pre + "block_count": p["n_layer"],
        pre + "context_length": p["context_length"],
        pre + "embedding_length": E,
        pre + "feed_forward_length": F,
        pre + "expert_count": X,
        pre + "expert_used_count": p["n_expert_used"],
        pre + "attention.head_count": p["n_head"],
        pre + "attention.head_count_kv": p["n_head_kv"],
        pre + "attention.key_length": hd,
        pre + "attention.value_length": hd,
        pre + "attention.layer_norm_rms_epsilon": 1e-5,
        pre + "attention.sliding_window": p["sliding_window"],
        pre + "rope.freq_base": p["rope_base"],
        pre + "rope.scaling.factor": p["rope_factor"],
        pre + "rope.scaling.original_context_length": p["original_context"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.scores": [float(i) for i in range(len(toks))],
        "tokenizer.ggml.bos_token_id": 199998,
        "tokenizer.ggml.eos_token_id": 199999,
        "tokenizer.ggml.eos_token_ids": [199999, 200002, 200012],
        "tokenizer.ggml.padding_token_id": toks.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.chat_template": HARMONY_TEMPLATE,
    }
    kvs = {k: (v, *kv_type(v)) for k, v in values.items()}

    def raw(arr: np.ndarray, dtype: T) -> Raw:
        shape = tuple(reversed(arr.shape))
        if dtype == T.F32:
            return shape, dtype, arr.astype("<f4").reshape(-1).view(np.uint8)
        return shape, dtype, gguf.quants.quantize(arr.astype(np.float32), dtype).reshape(-1).view(np.uint8)

    nv = len(toks)
    tensors: dict[str, Raw] = {
        "token_embd.weight": raw(normal(rng, (nv, E), 0.5), T.BF16),
        "output.weight": raw(normal(rng, (nv, E), 0.1), T.BF16),
        "output_norm.weight": raw(1.0 + normal(rng, (E,), 0.05), T.F32),
    }
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": raw(1.0 + normal(rng, (E,), 0.05), T.F32),
            b + "attn_q.weight": raw(normal(rng, (q, E), 0.1), T.BF16),
            b + "attn_q.bias": raw(normal(rng, (q,), 0.02), T.F32),
            b + "attn_k.weight": raw(normal(rng, (kv, E), 0.1), T.BF16),
            b + "attn_k.bias": raw(normal(rng, (kv,), 0.02), T.F32),
            b + "attn_v.weight": raw(normal(rng, (kv, E), 0.1), T.BF16),
            b + "attn_v.bias": raw(normal(rng, (kv,), 0.02), T.F32),
            b + "attn_out.weight": raw(normal(rng, (E, q), 0.1), T.BF16),
            b + "attn_out.bias": raw(normal(rng, (E,), 0.02), T.F32),
            b + "attn_sinks": raw(normal(rng, (p["n_head"],), 0.5), T.F32),
            b + "ffn_norm.weight": raw(1.0 + normal(rng, (E,), 0.05), T.F32),
            b + "ffn_gate_inp.weight": raw(normal(rng, (X, E), 0.1), T.F32),
            b + "ffn_gate_inp.bias": raw(normal(rng, (X,), 0.02), T.F32),
            b + "ffn_gate_exps.weight": raw(normal(rng, (X, F, E), 0.1), T.MXFP4),
            b + "ffn_gate_exps.bias": raw(normal(rng, (X, F), 0.02), T.F32),
            b + "ffn_up_exps.weight": raw(normal(rng, (X, F, E), 0.1), T.MXFP4),
            b + "ffn_up_exps.bias": raw(normal(rng, (X, F), 0.02), T.F32),
            b + "ffn_down_exps.weight": raw(normal(rng, (X, E, F), 0.1), T.MXFP4),
            b + "ffn_down_exps.bias": raw(normal(rng, (X, E), 0.02), T.F32),
        }
    return write_raw(path, kvs, tensors)


def legacy_gptoss_fused(path: Path, seed: int = 0) -> Path:
    """The tiny gpt-oss as the converter at 59412fbb4 wrote it: fused,
    interleaved gate/up stacks."""
    return _older(path, seed, ollama_mxfp4=False)


def legacy_gptoss_mxfp4(path: Path, seed: int = 0) -> Path:
    """The tiny gpt-oss as the converter at 4ae4f47b1 wrote it: fused,
    interleaved gate/up stacks, MXFP4 as Ollama's type 4 in the checkpoint's
    block layout."""
    return _older(path, seed, ollama_mxfp4=True)


def _older(path: Path, seed: int, ollama_mxfp4: bool) -> Path:
    path = Path(path)
    current = current_gptoss(path.with_name(path.name + ".current"), seed)
    try:
        return relayout(current, path, ollama_mxfp4=ollama_mxfp4)
    finally:
        current.unlink()
