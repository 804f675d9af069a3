"""gpt-oss as Ollama's converters wrote it (`convert/convert_gptoss.go`).

Every form has architecture `gptoss` and keys `gptoss.*` (llama.cpp:
`gpt-oss`, `gpt-oss.*`), no `expert_feed_forward_length` (llama.cpp requires
it) and no rope scaling type (llama.cpp: `yarn`), the generic pre-tokenizer
`default` (gpt-oss tokenizes as `gpt-4o`), and three tensor names of its own:
`attn_out` (`attn_output`), `attn_sinks` (`attn_sinks.weight`), `ffn_norm`
(`post_attention_norm`).  The expert stacks came in three layouts:

- from 93085127f (2025-10-06, "convert: slice gate_up weight") on: gate and
  up stacks apart, MXFP4 as ggml type 39 in ggml's block layout, as in
  llama.cpp's conversion;
- from 59412fbb4 (2025-08-26) to the parent of c00fa9cc2 (2025-10-06,
  "convert: split gate_up bias"): one `ffn_gate_up_exps` weight and bias per
  layer, as the checkpoint's `gate_up_proj`: gate and up rows interleaved
  (gate = rows 0::2, up = rows 1::2, as llama.cpp's converter splits them);
- before 59412fbb4 ("mxfp4 to ggml layout"): fused as above, and MXFP4 stored
  as ggml type 4 (unused by ggml, unknown to every GGUF reader) in the
  checkpoint's block layout: 17-byte blocks of an E8M0 scale and 16 bytes
  whose byte k holds element 2k (low nibble) and 2k+1 (high nibble), where
  ggml's `block_mxfp4` holds elements j and j+16 in byte j.

Departures from Ollama's handler (llama.cpp's conversion is the target):
Ollama translates only the newest layout; BOS and EOS are set by their text
(`<|startoftext|>`, `<|return|>`, as llama.cpp's converter takes them from
the tokenizer config) where Ollama's converter wrote fixed ids of the full
o200k vocabulary (EOS `<|endoftext|>`); the YaRN betas are written with
gpt-oss's config values (llama.cpp's defaults, so unchanged in effect).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
from gguf import GGMLQuantizationType as DT
from gguf import Keys

from compatfs.gguf_source import SourceGGUF, TensorInfo
from compatfs.gguf_values import GGUFError, f32, string
from compatfs.byte_ops import Strided
from compatfs.ops import Op
from compatfs.translation import (
    CopyPrefix, Count, Default, DefaultTokenId, Drop, FromShape, ProducePerBlock, Rename, Set, StoredType,
    Translation, When, arch_is, has_key, has_token,
)

OLLAMA_MXFP4 = 4            # the ggml type number Ollama's converter gave MXFP4 before 59412fbb4
QK, BLOCK = 32, 17          # MXFP4: elements and bytes per block (both layouts)


@dataclass(frozen=True)
class OllamaMXFP4(Op):
    """An MXFP4 stack of Ollama's type 4 in ggml's layout (type MXFP4):
    each block's scale kept, its nibbles reordered; rows (ggml axis 1)
    `start`::`step` of each slab of the slower axes.  The input is the
    blob's bytes of the tensor, sized from its shape (the translation's
    `StoredType` has `plan` check that they lie in the blob's data apart
    from other tensors), as a flat I8 tensor (a view reads an op's inputs
    by their size, which type 4 does not have)."""

    stored: tuple[int, ...] = ()      # the tensor's ggml shape as the blob declares it
    start: int = 0
    step: int = 1

    @classmethod
    def of(cls, t: TensorInfo, start: int = 0, step: int = 1) -> "OllamaMXFP4":
        shape = t.shape
        if len(shape) < 2 or shape[0] % QK or not 0 <= start < step or shape[1] % step:
            raise GGUFError(f"{t.name}: shape {shape} is not an MXFP4 stack whose rows split {step} ways")
        raw = TensorInfo(t.name, (prod(shape) // QK * BLOCK,), DT.I8, t.offset)
        return cls((raw,), (shape[0], shape[1] // step, *shape[2:]), DT.MXFP4, shape, start, step)

    @property
    def description(self) -> str:
        return f"OllamaMXFP4({self.inputs[0].name}, rows {self.start}::{self.step})"

    ranged = True   # a read computes just the blocks it covers
    CHUNK_BLOCKS = 1 << 12  # blocks converted at a time (~70 KB; four times that in scratch): kept in cache

    def _compute(self, data):
        return bytes(self.compute_range(lambda t, start, size: data[0][start:start + size], 0, self.nbytes))

    def compute_range_into(self, read, lo, hi, out):
        """Output row r (of every slab: `step` divides a slab's rows) is
        input row `start + r * step`, so the blocks of [lo, hi) are taken a
        chunk at a time: whole rows from one read of the span they lie in (a
        row cut by the range from its own blocks alone), converted straight
        into `out` (a chunk cut inside a block through one buffer)."""
        per_row = self.stored[0] // QK
        row = per_row * BLOCK
        dst = np.frombuffer(out, np.uint8)
        b, end = lo // BLOCK, -(-hi // BLOCK)            # output blocks covered
        pairs = np.empty(2 * BLOCK * min(end - b, max(self.CHUNK_BLOCKS, per_row)), np.uint16)
        while b < end:
            r, c = divmod(b, per_row)
            if c or end - b < per_row:                     # blocks of one row
                rows, width = 1, min(per_row - c, end - b)
            else:
                rows, width = min(max(1, self.CHUNK_BLOCKS // per_row), (end - b) // per_row), per_row
            first = ((self.start + r * self.step) * per_row + c) * BLOCK
            size = (rows - 1) * self.step * row + width * BLOCK
            span = np.frombuffer(read(self.inputs[0], first, size), np.uint8)
            if len(span) != size:
                raise GGUFError(f"{self.description}: {len(span)} bytes read at {first}, expected {size}")
            blocks = np.lib.stride_tricks.as_strided(span, (rows, width, BLOCK), (self.step * row, BLOCK, 1))
            a, e = b * BLOCK, (b + rows * width) * BLOCK       # the chunk's output bytes
            if a >= lo and e <= hi:
                _to_ggml(blocks, dst[a - lo:e - lo], pairs)
            else:
                whole = np.empty(e - a, np.uint8)
                _to_ggml(blocks, whole, pairs)
                s, t = max(a, lo), min(e, hi)
                dst[s - lo:t - lo] = whole[s - a:t - a]
            b += rows * width


def _to_ggml(blocks: np.ndarray, out: np.ndarray, pairs: np.ndarray) -> None:
    """17-byte MXFP4 `blocks` (last axis; any strides) from the checkpoint's
    nibble order (byte k: elements 2k low, 2k+1 high) into `out` (flat,
    contiguous) in ggml's (byte j: elements j low, j+16 high), through
    `pairs` (uint16 scratch, at least two per byte).  With the checkpoint's
    bytes L = 0-7 and H = 8-15 of a block, ggml's byte 2i is L[i]'s low
    nibble under H[i]'s low nibble and byte 2i+1 L[i]'s high nibble under
    H[i]'s high one: each byte widened to (low nibble, high nibble) as a
    uint16's two bytes, ORed with the same of the byte 8 on shifted up a
    nibble, is the pair of ggml bytes (2i, 2i+1) at L[i].  Each block's
    pairs are then 16 bytes, its scale put in the byte before them, and the
    17 bytes copied out block by block."""
    n = blocks.size
    p, q = pairs[:n], pairs[n:2 * n]
    np.copyto(p.reshape(blocks.shape), blocks)            # widened, gathered from strided rows
    np.left_shift(p, 4, out=q)
    p |= q
    p &= 0x0F0F                                           # the low nibble in the low byte, the high one above
    np.left_shift(p[8:], 4, out=q[:-8])
    p[:-8] |= q[:-8]
    wide = p.view(np.uint8)                                # block j's pairs at bytes 34j + 2 .. 34j + 17
    np.copyto(wide[1::2 * BLOCK].reshape(blocks.shape[:-1]), blocks[..., 0])
    record, count = np.dtype(f"V{BLOCK}"), n // BLOCK
    np.copyto(np.ndarray((count,), record, out, 0, (BLOCK,)), np.ndarray((count,), record, wide, 1, (2 * BLOCK,)))


def from_fused(kind: str, half: int):
    """make(src, i): block i's gate (`half` 0) or up (1) `kind` (weight or
    bias) from its fused, interleaved `ffn_gate_up_exps.<kind>`."""
    def make(src: SourceGGUF, i: int) -> Op | None:
        fused = src.tensors.get(f"blk.{i}.ffn_gate_up_exps.{kind}")
        if fused is None:
            return None
        if fused.dtype == OLLAMA_MXFP4:
            return OllamaMXFP4.of(fused, half, 2)
        return Strided.of(fused, 1 if kind == "weight" else 0, half, 2)
    return make


def repacked(part: str):
    """make(src, i): block i's `ffn_<part>_exps.weight` in ggml's MXFP4 layout
    when the blob stores it as Ollama's type 4."""
    def make(src: SourceGGUF, i: int) -> Op | None:
        t = src.tensors.get(f"blk.{i}.ffn_{part}_exps.weight")
        return OllamaMXFP4.of(t) if t is not None and t.dtype == OLLAMA_MXFP4 else None
    return make


BOS, EOS = "<|startoftext|>", "<|return|>"
BLOCKS = "gptoss.block_count"
FUSED = "blk.{}.ffn_gate_up_exps."

TEXT = Translation(
    name="gptoss",
    detect=arch_is("gptoss"),
    counts=(Count(BLOCKS, "blk."),),
    stored_types=(StoredType(OLLAMA_MXFP4, QK, BLOCK),),
    kv=(
        Set(Keys.General.ARCHITECTURE, string("gpt-oss")),
        CopyPrefix("gptoss.", "gpt-oss."),
        Drop(("gptoss.",)),
        # llama.cpp requires the experts' width: the row length of a down
        # stack (Ollama's handler reads a gate stack, which older blobs lack).
        When(~has_key("gptoss.expert_feed_forward_length"), (
            FromShape("gpt-oss.expert_feed_forward_length", "blk.0.ffn_down_exps.weight", axis=0),
        )),
        Default("gpt-oss.rope.scaling.type", string("yarn")),
        Default("gpt-oss.rope.scaling.yarn_beta_fast", f32(32.0)),
        Default("gpt-oss.rope.scaling.yarn_beta_slow", f32(1.0)),
        Set(Keys.Tokenizer.PRE, string("gpt-4o")),
        # Ids of the full o200k vocabulary, which llama.cpp never reads: it
        # finds the end-of-generation tokens by their text.
        Drop(("tokenizer.ggml.eos_token_ids",)),
        When(has_token(BOS), (Drop((Keys.Tokenizer.BOS_ID,)), DefaultTokenId(Keys.Tokenizer.BOS_ID, BOS))),
        When(has_token(EOS), (Drop((Keys.Tokenizer.EOS_ID,)), DefaultTokenId(Keys.Tokenizer.EOS_ID, EOS))),
    ),
    tensors=(
        # Fused gate/up stacks (before c00fa9cc2) split; type-4 stacks repacked.
        *(ProducePerBlock(BLOCKS, f"blk.{{}}.ffn_{part}_exps.{kind}", from_fused(kind, half),
                          consumes=(FUSED + kind,))
          for kind in ("weight", "bias") for half, part in enumerate(("gate", "up"))),
        *(ProducePerBlock(BLOCKS, f"blk.{{}}.ffn_{part}_exps.weight", repacked(part),
                          consumes=(f"blk.{{}}.ffn_{part}_exps.weight",))
          for part in ("gate", "up", "down")),
        Rename(".attn_out", ".attn_output"),
        Rename(".attn_sinks", ".attn_sinks.weight"),
        Rename(".ffn_norm", ".post_attention_norm"),
    ),
)
