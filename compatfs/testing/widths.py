"""Legacy blobs at the published widths of real models, for the benchmark
(`scripts/bench.py --only widths`): one or two layers of each op-heavy legacy
form, named and keyed exactly as the tiny writers of this package name them,
with tensors as wide as the published models'.

The tiny writers build float arrays and quantize them; at these widths that
would take gigabytes and minutes.  Here a writer's own function runs with its
dimension table replaced by the published widths, its `normal` replaced by a
zero-strided broadcast (no memory) and its `write` replaced by a capture of
the keys, names, shapes and types it would write (`_capture`); gpt-oss, whose
writer quantizes before writing, has its names, keys and types read from a
tiny blob of its legacy form and its shapes from `_gptoss_shape`.  Tensor
data is then streamed from a tile of valid blocks (`_tile`): small normals for
F32/F16/BF16, MXFP4 blocks of random nibbles with E8M0 scales near 2^-7.  A
blob of 1-3 GB takes seconds and a few MiB of memory.  The weights load and
compute (nonsense); they are not the published weights.

Each form is what one Ollama converter wrote (the tiny writer it reuses
says how): gpt-oss fused, `convert/convert_gptoss.go` from 59412fbb4 to the
parent of c00fa9cc2; gpt-oss type-4 MXFP4, the same at 4ae4f47b1; Gemma 4's
older MoE form, `convert/convert_gemma4.go` at c29932c63; Qwen3-VL MoE,
`convert/convert_qwen3vl.go` at f63eea3d2; GLM-OCR, `convert/convert_glmocr.go`
at 8f4a00813 (unchanged through f63eea3d2).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import gguf
import numpy as np

from . import gemma4, glmocr, gptoss, qwen3vl
from .core import T, kv_type, ollama_tensor_order

ALIGNMENT = 32  # Ollama's WriteGGUF alignment (no general.alignment key)

# gpt-oss-120b, openai/gpt-oss-120b config.json: hidden_size 2880,
# intermediate_size 2880, num_local_experts 128, num_experts_per_tok 4,
# num_attention_heads 64, num_key_value_heads 8, head_dim 64 (36 layers; one
# written).  gpt-oss-20b differs in num_local_experts 32 and 24 layers.
GPTOSS_120B = dict(
    n_layer=1, n_embd=2880, n_ff=2880, n_expert=128, n_expert_used=4, n_head=64, n_head_kv=8, head_dim=64
)

# Gemma 4 26B-A4B, the metadata of Ollama's gemma4:26b-a4b blob (ollama.com
# library page): embedding_length 2816, feed_forward_length 2112,
# expert_count 128, expert_used_count 8, expert_feed_forward_length 704,
# head_count 16, head_count_kv 8, key_length 512, key_length_swa 256,
# sliding_window 1024, context_length 262144 (30 blocks; two written: one
# sliding, one global, as the tiny writer lays them out).  Vision, Ollama's
# gemma4 clip handler commit 034fee349 ("n_embd=1152, n_head=16, n_ff=4304,
# n_layer=27 ... patch_size=16"; one block written); the position table keeps
# the tiny writer's 256 rows.
GEMMA4_26B = dict(
    n_layer=2,
    n_embd=2816,
    n_ff=2112,
    n_head=16,
    n_head_kv=8,
    head_dim_swa=256,
    head_dim=512,
    n_expert=128,
    n_expert_used=8,
    n_ff_exp=704,
    context_length=262144,
    sliding_window=1024,
    v_n_layer=1,
    v_n_embd=1152,
    v_n_ff=4304,
    v_n_head=16,
    v_head_dim=72,
    patch_size=16,
)

# Qwen3-VL-30B-A3B, Qwen's config.json: text hidden_size 2048,
# moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8,
# num_attention_heads 32, num_key_value_heads 4, head_dim 128 (48 layers; two
# written); vision_config depth 27, hidden_size 1152, intermediate_size 4304,
# num_heads 16, patch_size 16, temporal_patch_size 2, spatial_merge_size 2,
# num_position_embeddings 2304, out_hidden_size 2048 (two blocks written, one
# deepstack merger: fewer than the text blocks, as llama.cpp needs).
QWEN3VL_30B = dict(
    n_layer=2,
    n_embd=2048,
    n_ff=6144,
    n_head=32,
    n_head_kv=4,
    head_dim=128,
    n_expert=128,
    n_expert_used=8,
    n_ff_exp=768,
    v_n_layer=2,
    v_n_embd=1152,
    v_n_ff=4304,
    v_n_head=16,
    patch_size=16,
    merge=2,
    n_pos=2304,
    deepstack=[1],
)

# GLM-OCR, zai-org/GLM-OCR config.json: text hidden_size 1536,
# intermediate_size 4608, num_attention_heads 16, num_key_value_heads 8,
# head_dim 128, mrope_section [16, 24, 24] (16 layers; one written);
# vision_config hidden_size 1024, depth 24, num_heads 16, intermediate_size
# 4096, image_size 336, patch_size 14, spatial_merge_size 2,
# temporal_patch_size 2, out_hidden_size 1536 (one block written).  The
# merger's feed-forward width (not an op tensor) is taken as the text's 4608.
GLMOCR_REAL = dict(
    n_layer=1,
    n_embd=1536,
    n_head=16,
    n_head_kv=8,
    head_dim=128,
    n_ff=4608,
    mrope_section=[16, 24, 24],
    v_n_layer=1,
    v_n_embd=1024,
    v_n_head=16,
    v_n_ff=4096,
    image_size=336,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=1536,
    merger_ff=4608,
)


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), as the writers build arrays
    dtype: Any  # a ggml type, or gptoss.OLLAMA_MXFP4

    @property
    def nbytes(self) -> int:
        qtype = T.MXFP4 if self.dtype == gptoss.OLLAMA_MXFP4 else T(self.dtype)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if self.shape[-1] % block:
            raise ValueError(f"{self.name}: rows of {self.shape[-1]} are not whole {qtype.name} blocks")
        return int(np.prod(self.shape)) // block * size


@dataclass
class Blob:
    """What a writer would write: architecture, keys (name -> (value, type,
    element type)) and tensors."""

    arch: str
    kvs: dict[str, tuple]
    tensors: list[Tensor]


# -- capturing what a tiny writer writes ----------------------------------------------------


def _capture(module, dims_name: str, dims: dict, writer: Callable[[Path], Any]) -> Blob:
    """Run `writer` (a function of `module` that ends in `core.write`) with
    `module.<dims_name>` updated by `dims`, arrays that cost no memory, and
    the write captured instead of done."""
    got: list[Blob] = []

    def zeros(_rng, shape, _std):
        return np.broadcast_to(np.float32(0), tuple(shape))

    def capture(_path, arch, kvs, tensors, *, ollama_order):
        values = {**kvs, "general.architecture": arch}
        got.append(
            Blob(
                arch,
                {k: (list(v) if isinstance(v, tuple) else v, *kv_type(v)) for k, v in values.items()},
                [Tensor(n, tuple(a.shape), dt) for n, (a, dt) in tensors.items()],
            )
        )

    with _patched(module, {dims_name: {**getattr(module, dims_name), **dims}, "normal": zeros, "write": capture}):
        writer(Path("unused.gguf"))
    return got[0]


@contextlib.contextmanager
def _patched(module, attrs: dict):
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def gemma4_moe_blob() -> Blob:
    """Gemma 4's older MoE form (`gemma4.legacy_gemma4_moe`: gate and up
    expert stacks split, fused per expert by the handler) at 26B-A4B widths."""
    return _capture(gemma4, "GEMMA4_MOE", GEMMA4_26B, gemma4.legacy_gemma4_moe)


def qwen3vl_moe_blob() -> Blob:
    """Qwen3-VL-MoE as Ollama wrote it (`qwen3vl.legacy_qwen3vl_moe`: vision
    QKV split, Conv3D patch embedding flattened) at Qwen3-VL-30B-A3B widths."""
    return _capture(qwen3vl, "QWEN3VL_MOE", QWEN3VL_30B, qwen3vl.legacy_qwen3vl_moe)


def glmocr_blob() -> Blob:
    """GLM-OCR as Ollama wrote it (`glmocr.legacy_glmocr`: MLP gate and up
    split, Conv3D patch halves) at GLM-OCR's widths."""
    return _capture(glmocr, "GLMOCR", GLMOCR_REAL, glmocr.legacy_glmocr)


# -- gpt-oss: names and keys from a tiny blob of the legacy form, shapes from the table ------


def gptoss_blob(*, ollama_mxfp4: bool, n_expert: int | None = None) -> Blob:
    """gpt-oss-120b in the older fused form (`gptoss.legacy_gptoss_fused`)
    or, with `ollama_mxfp4`, the type-4 MXFP4 form (the same names, every
    MXFP4 stack typed 4 as `gptoss.relayout` types it), at `GPTOSS_120B`
    widths (with `n_expert` experts instead of its 128: rows as wide, fewer
    of them).  gguf-py refuses type 4, so names, keys and types are read from
    a tiny blob of the fused form."""
    p = GPTOSS_120B if n_expert is None else {**GPTOSS_120B, "n_expert": n_expert}
    with tempfile.TemporaryDirectory() as tmp, _patched(gptoss, {"GPTOSS": {**gptoss.GPTOSS, "n_layer": p["n_layer"]}}):
        r = gguf.GGUFReader(gptoss.legacy_gptoss_fused(Path(tmp) / "tiny.gguf"))
        kvs = {
            name: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
            for name, f in r.fields.items()
            if not name.startswith("GGUF.")
        }
        typed: dict[str, T | int] = {t.name: T(t.tensor_type) for t in r.tensors}
    if ollama_mxfp4:
        typed = {n: gptoss.OLLAMA_MXFP4 if dt == T.MXFP4 else dt for n, dt in typed.items()}
    n_vocab = len(kvs["tokenizer.ggml.tokens"][0])
    pre = "gptoss."
    for key, value in (
        ("block_count", p["n_layer"]),
        ("embedding_length", p["n_embd"]),
        ("feed_forward_length", p["n_ff"]),
        ("expert_count", p["n_expert"]),
        ("expert_used_count", p["n_expert_used"]),
        ("attention.head_count", p["n_head"]),
        ("attention.head_count_kv", p["n_head_kv"]),
        ("attention.key_length", p["head_dim"]),
        ("attention.value_length", p["head_dim"]),
    ):
        _, vtype, sub = kvs[pre + key]
        kvs[pre + key] = (value, vtype, sub)
    return Blob("gptoss", kvs, [Tensor(name, _gptoss_shape(name, p, n_vocab), dt) for name, dt in typed.items()])


def _gptoss_shape(name: str, p: dict, n_vocab: int) -> tuple[int, ...]:
    """The numpy-order shape of a gpt-oss tensor at widths `p` (as
    `gptoss.current_gptoss` builds them, gate/up fused as `relayout` does)."""
    E, F, X, H = p["n_embd"], p["n_ff"], p["n_expert"], p["n_head"]
    q, kv = H * p["head_dim"], p["n_head_kv"] * p["head_dim"]
    suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
    shapes = {
        "token_embd.weight": (n_vocab, E),
        "output.weight": (n_vocab, E),
        "output_norm.weight": (E,),
        "attn_norm.weight": (E,),
        "attn_q.weight": (q, E),
        "attn_q.bias": (q,),
        "attn_k.weight": (kv, E),
        "attn_k.bias": (kv,),
        "attn_v.weight": (kv, E),
        "attn_v.bias": (kv,),
        "attn_out.weight": (E, q),
        "attn_out.bias": (E,),
        "attn_sinks": (H,),
        "ffn_norm.weight": (E,),
        "ffn_gate_inp.weight": (X, E),
        "ffn_gate_inp.bias": (X,),
        "ffn_gate_up_exps.weight": (X, 2 * F, E),
        "ffn_gate_up_exps.bias": (X, 2 * F),
        "ffn_down_exps.weight": (X, E, F),
        "ffn_down_exps.bias": (X, E),
    }
    if suffix not in shapes:
        raise ValueError(f"gpt-oss tensor {name} has no shape at real width")
    return shapes[suffix]


# -- streaming the blob ----------------------------------------------------------------------


def _tile(dtype, nbytes: int = 4 << 20) -> bytes:
    """About `nbytes` of valid data of `dtype`, whole blocks (seeded)."""
    rng = np.random.default_rng(0)
    if dtype in (T.MXFP4, gptoss.OLLAMA_MXFP4):
        n = nbytes // 17
        blocks = rng.integers(0, 256, (n, 17), dtype=np.uint8)
        blocks[:, 0] = rng.integers(118, 123, n, dtype=np.uint8)  # E8M0 scales 2^-9 .. 2^-5
        return blocks.tobytes()
    values = (rng.standard_normal(nbytes // 2) * 0.02).astype(np.float32)
    if dtype == T.F32:
        return values[: nbytes // 4].tobytes()
    if dtype == T.F16:
        return values.astype(np.float16).tobytes()
    if dtype == T.BF16:
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raise ValueError(f"no tile for ggml type {dtype}")


def write_blob(blob: Blob, path: Path) -> Path:
    """`blob` laid out as Ollama's WriteGGUF writes (keys sorted, tensors by
    block, alignment 32), tensor data streamed from tiles; a type-4 tensor is
    declared MXFP4 (same block size) and its type patched after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    order = {t.name: t for t in blob.tensors}
    tensors = [order[n] for n in ollama_tensor_order(order)]
    w = gguf.GGUFWriter(str(path), blob.arch)
    w.kv_data[0].clear()
    for key in sorted(blob.kvs):
        value, vtype, sub = blob.kvs[key]
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in tensors:
        raw = T.MXFP4 if t.dtype == gptoss.OLLAMA_MXFP4 else T(t.dtype)
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    tiles: dict[Any, bytes] = {}
    with open(path, "ab") as f:
        f.write(b"\0" * (-f.tell() % ALIGNMENT))
        for t in tensors:
            tile = tiles.setdefault(t.dtype, _tile(t.dtype))
            left = t.nbytes
            while left:
                n = min(left, len(tile))
                f.write(memoryview(tile)[:n])
                left -= n
            f.write(b"\0" * (-f.tell() % ALIGNMENT))
    _patch_type4(path, [t.name for t in tensors if t.dtype == gptoss.OLLAMA_MXFP4])
    return path


def _patch_type4(path: Path, names: list[str]) -> None:
    if not names:
        return
    r = gguf.GGUFReader(path)
    at = {t.name: int(t.field.offset) + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape) for t in r.tensors}
    del r
    with open(path, "r+b") as f:
        for name in names:
            f.seek(at[name])
            f.write(np.uint32(gptoss.OLLAMA_MXFP4).tobytes())


# The forms the benchmark measures: name -> (what it is, builder).
FORMS: dict[str, tuple[str, Callable[[], Blob]]] = {
    "gptoss-120b-fused": (
        "gpt-oss-120b, fused gate/up stacks (strided halves)",
        lambda: gptoss_blob(ollama_mxfp4=False),
    ),
    "gptoss-120b-mxfp4": ("gpt-oss-120b, type-4 MXFP4 (repacked by range)", lambda: gptoss_blob(ollama_mxfp4=True)),
    "gemma4-26b-moe": ("Gemma 4 26B-A4B, older MoE form (gate/up fused per expert)", gemma4_moe_blob),
    "qwen3vl-30b": ("Qwen3-VL-30B-A3B (vision QKV merge, Conv3D patch split)", qwen3vl_moe_blob),
    "glmocr": ("GLM-OCR (gate+up fused, Conv3D patch halves)", glmocr_blob),
}
