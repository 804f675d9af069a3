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

from contextlib import nullcontext
from dataclasses import dataclass
from math import prod

import numpy as np
from gguf import GGMLQuantizationType as DT
from gguf import MODEL_ARCH as A
from gguf import MODEL_TENSOR as T
from gguf import Keys

from compatfs.format.header import SourceGGUF, TensorInfo
from compatfs.errors import GGUFError
from compatfs.format.values import f32, string
from compatfs.translate import accel
from compatfs.translate import CompiledBlocks, Op, SpanGroup, Strided
from compatfs.files.scratch import scratch
from compatfs.translate import (
    ArchKeys,
    CopyPrefixIfAbsent,
    Count,
    Default,
    DefaultTokenId,
    Drop,
    DropPrefix,
    FromShape,
    ProducePerBlock,
    Rename,
    Set,
    StoredType,
    Translation,
    When,
    arch,
    arch_is,
    has_key,
    has_token,
    leaf,
    tensor,
)

OLLAMA_MXFP4 = 4  # the ggml type number Ollama's converter gave MXFP4 before 59412fbb4
QK, BLOCK = 32, 17  # MXFP4: elements and bytes per block (both layouts)


@dataclass(frozen=True)
class OllamaMXFP4(Op):
    """An MXFP4 stack of Ollama's type 4 in ggml's layout (type MXFP4):
    each block's scale kept, its nibbles reordered; rows (ggml axis 1)
    `start`::`step` of each slab of the slower axes.  The input is the
    blob's bytes of the tensor, sized from its shape (the translation's
    `StoredType` has `plan` check that they lie in the blob's data apart
    from other tensors), as a flat I8 tensor (a view reads an op's inputs
    by their size, which type 4 does not have)."""

    stored: tuple[int, ...] = ()  # the tensor's ggml shape as the blob declares it
    start: int = 0
    step: int = 1

    @classmethod
    def of(cls, t: TensorInfo, start: int = 0, step: int = 1) -> OllamaMXFP4:
        shape = t.shape
        if len(shape) < 2 or shape[0] % QK or not 0 <= start < step or shape[1] % step:
            raise GGUFError(f"{t.name}: shape {shape} is not an MXFP4 stack whose rows split {step} ways")
        stored = prod(shape) // QK * BLOCK
        raw = t.part(t.name, (stored,), DT.I8, stored=stored)
        return cls((raw,), (shape[0], shape[1] // step, *shape[2:]), DT.MXFP4, shape, start, step)

    @property
    def description(self) -> str:
        return f"OllamaMXFP4({self.inputs[0].name}, rows {self.start}::{self.step})"

    ranged = True  # a read computes just the blocks it covers
    CHUNK_BLOCKS = 1 << 13  # blocks converted at a time (~140 KB: a 128 KiB read in one; four times that
    #                         in scratch, kept in the CPU's cache)

    SPAN_BYTES = 4 << 20  # a range's input span up to this size is read at once, its chunks converted out of it

    @property
    def reads_inputs_once(self) -> bool:
        """Rows `start`::`step` are read from spans that hold the other rows
        too (which the op of the other half reads again, from the page
        cache): only a whole stack (`step` 1) reads its inputs once."""
        return self.step == 1

    @property
    def span_group(self) -> SpanGroup | None:
        """The `step` ops of one stack (one per `start`): range [lo, hi) of
        each lies in the same span of the stack, give or take `step` - 1 rows."""
        if self.step == 1:
            return None
        raw = self.inputs[0]
        return SpanGroup(("OllamaMXFP4", raw.offset, raw.nbytes, self.stored, self.step), (self.step - 1) * self._row)

    @property
    def compiled_blocks(self) -> CompiledBlocks:
        """Output row r is the compiled kernel's repack (`mxfp4_repack`) of
        the tensor's row `start + r * step` as the blob holds it, block by block."""
        return CompiledBlocks(
            "mxfp4", BLOCK, self.inputs[0].offset + self.start * self._row, self._row, self.step * self._row
        )

    @property
    def _row(self) -> int:
        """Bytes of one stored row (ggml axis 1) of the stack."""
        return self.stored[0] // QK * BLOCK

    @property
    def computes_ahead(self) -> bool:
        """Only with numpy's kernel: the compiled one repacks a range about
        as fast as it is copied."""
        return accel.native is None

    def _compute(self, data):
        return bytes(self.compute_range(lambda t, start, size: data[0][start : start + size], 0, self.nbytes))

    def compute_range_into(self, read, lo, hi, out):
        """Output row r (of every slab: `step` divides a slab's rows) is
        input row `start + r * step`.  The blocks of [lo, hi) are converted a
        chunk of at most `CHUNK_BLOCKS` at a time, each from one read: with
        `step` 1 any run of blocks (the rows lie end to end: the tensor is
        one long row); else whole rows (the ones the range cuts included)
        from the span they lie in, or part of one row when a row is wider
        than a chunk.  A chunk's blocks inside the range go into `out`, those
        cut by the range's ends their bytes in it; by the compiled kernel
        where `accel` has one, else with numpy (`_to_ggml`)."""
        per_row = self.stored[0] // QK if self.step > 1 else self.nbytes // BLOCK
        chunk = self.CHUNK_BLOCKS
        dst = np.frombuffer(out, np.uint8)
        b, end = lo // BLOCK, -(-hi // BLOCK)  # output blocks covered
        row = per_row * BLOCK
        native = accel.native
        with nullcontext(None) if native else scratch(scratch_bytes(min(chunk, end - b + 2 * per_row))) as raw:
            held = self._read_span(read, b, end, per_row)  # (its first byte, its bytes), or None
            while b < end:
                r, c = divmod(b, per_row)
                if per_row <= chunk:  # whole rows
                    c, rows, width = 0, min(chunk // per_row, -(-end // per_row) - r), per_row
                else:  # blocks of one row
                    rows, width = 1, min(chunk, per_row - c, end - b)
                first = ((self.start + r * self.step) * per_row + c) * BLOCK
                size = (rows - 1) * self.step * row + width * BLOCK
                if held is not None:
                    span = held[1][first - held[0] : first - held[0] + size]
                else:
                    span = np.frombuffer(read(self.inputs[0], first, size), np.uint8)
                if len(span) != size:
                    raise GGUFError(f"{self.description}: {len(span)} bytes read at {first}, expected {size}")
                k = r * per_row + c  # the chunk's first output block
                if native is not None:
                    _native_out(native, span, width, self.step * row, k, rows * width, dst, lo, hi)
                else:
                    assert raw is not None
                    blocks = np.ndarray((rows, width, BLOCK), np.uint8, span, 0, (self.step * row, BLOCK, 1))
                    _copy_out(_to_ggml(blocks, raw.view(np.uint16)), k, rows * width, dst, lo, hi)
                b = k + rows * width

    def _read_span(self, read, b: int, end: int, per_row: int) -> tuple[int, np.ndarray] | None:
        """The input span of output blocks [b, end) (rows of `per_row`
        blocks), every byte the chunks of `compute_range_into` read, read at
        once when it is at most `SPAN_BYTES` (one read of the blob per range,
        not one per chunk): where it starts in the input and its bytes; None
        when it is larger (each chunk is read apart)."""
        if b >= end:
            return None
        (r0, c0), (r1, c1) = divmod(b, per_row), divmod(end - 1, per_row)
        if per_row <= self.CHUNK_BLOCKS:  # the chunks read whole rows
            c0, c1 = 0, per_row - 1
        first = ((self.start + r0 * self.step) * per_row + c0) * BLOCK
        last = ((self.start + r1 * self.step) * per_row + c1 + 1) * BLOCK
        if last - first > self.SPAN_BYTES:
            return None
        return first, np.frombuffer(read(self.inputs[0], first, last - first), np.uint8)


def _native_out(
    native, span: np.ndarray, width: int, stride: int, k: int, count: int, dst: np.ndarray, lo: int, hi: int
) -> None:
    """As `_copy_out` of `_to_ggml` of the chunk's `count` blocks (rows of
    `width` blocks, `stride` bytes apart in `span`), by the compiled kernel:
    the blocks wholly inside the range straight into `dst`, a block cut by an
    end of the range through 17 bytes of its own."""
    a, e = max(k, -(-lo // BLOCK)), min(k + count, hi // BLOCK)  # the blocks wholly inside
    if a < e:
        native.mxfp4_repack(dst[a * BLOCK - lo : e * BLOCK - lo], span, width, stride, a - k, e - a)
    for j in {lo // BLOCK, (hi - 1) // BLOCK}:
        s, t = max(j * BLOCK, lo), min(j * BLOCK + BLOCK, hi)
        if k <= j < k + count and t - s < BLOCK:
            one = np.empty(BLOCK, np.uint8)
            native.mxfp4_repack(one, span, width, stride, j - k, 1)
            dst[s - lo : t - lo] = one[s - j * BLOCK : t - j * BLOCK]


def _to_ggml(blocks: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """17-byte MXFP4 `blocks` (last axis; any strides) from the checkpoint's
    nibble order (byte k: elements 2k low, 2k+1 high) into ggml's (byte j:
    elements j low, j+16 high), in `pairs` (uint16 scratch of at least
    `scratch_bytes` of the block count), returned as its bytes: block j's 17
    ggml bytes at 34j + 1 .. 34j + 17.  With the checkpoint's bytes L = 0-7
    and H = 8-15 of a block, ggml's byte 2i is L[i]'s low nibble under H[i]'s
    low nibble and byte 2i+1 L[i]'s high nibble under H[i]'s high one: each
    byte widened to (low nibble, high nibble) as a uint16's two bytes, ORed
    with the same of the byte 8 on shifted up a nibble, is the pair of ggml
    bytes (2i, 2i+1) at L[i]; the scale is put in the byte before a block's
    pairs.  The shifts and masks run on 64-bit views of the uint16s (numpy
    vectorises those, not 16-bit shifts): no bit crosses into the next
    uint16, as every value shifted is below 2^12."""
    n = blocks.size
    m = -(-n // 4) * 4  # whole 64-bit words
    p, q = pairs[:m], pairs[m : 2 * m]
    np.copyto(p[:n].reshape(blocks.shape), blocks)  # widened, gathered from strided rows
    p[n:] = 0
    p64, q64 = p.view(np.uint64), q.view(np.uint64)
    np.left_shift(p64, 4, out=q64)
    p64 |= q64
    p64 &= _LOW_NIBBLES  # the low nibble in the low byte, the high one above
    np.left_shift(p64, 4, out=q64)
    p64[:-2] |= q64[2:]  # the uint16 8 on (two words), a nibble up
    wide = p.view(np.uint8)
    np.copyto(wide[1 : 2 * n : 2 * BLOCK].reshape(blocks.shape[:-1]), blocks[..., 0])
    return wide


def _copy_out(wide: np.ndarray, k: int, count: int, dst: np.ndarray, lo: int, hi: int) -> None:
    """Output blocks k .. k + count - 1, as `_to_ggml` returned them, into
    `dst`, which holds output bytes [lo, hi): the blocks inside the range
    copied 17 bytes at a time, a block cut by an end of the range its bytes
    in it."""
    a, e = max(k, -(-lo // BLOCK)), min(k + count, hi // BLOCK)  # the blocks wholly inside
    if a < e:
        np.copyto(
            np.ndarray((e - a,), _RECORD, dst, a * BLOCK - lo, (BLOCK,)),
            np.ndarray((e - a,), _RECORD, wide, 2 * BLOCK * (a - k) + 1, (2 * BLOCK,)),
        )
    for j in {lo // BLOCK, (hi - 1) // BLOCK}:
        s, t = max(j * BLOCK, lo), min(j * BLOCK + BLOCK, hi)
        if k <= j < k + count and t - s < BLOCK:
            at = 2 * BLOCK * (j - k) + 1 - j * BLOCK  # output byte x of block j is wide[at + x]
            dst[s - lo : t - lo] = wide[at + s : at + t]


_RECORD = np.dtype(f"V{BLOCK}")  # one block, copied as a whole
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)


def scratch_bytes(blocks: int) -> int:
    """The scratch `_to_ggml` needs for `blocks` blocks, in bytes (uint16 pairs)."""
    return 4 * (-(-blocks * BLOCK // 4) * 4)


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
NEW = arch(A.GPT_OSS)
K = ArchKeys(NEW)
FUSED = "blk.{}.ffn_gate_up_exps."

TEXT = Translation(
    name="gptoss",
    detect=arch_is("gptoss"),
    counts=(Count(BLOCKS, "blk."),),
    stored_types=(StoredType(OLLAMA_MXFP4, QK, BLOCK),),
    kv=(
        Set(Keys.General.ARCHITECTURE, string(NEW)),
        CopyPrefixIfAbsent("gptoss.", f"{NEW}."),
        DropPrefix(("gptoss.",)),
        # llama.cpp requires the experts' width: the row length of a down
        # stack (Ollama's handler reads a gate stack, which older blobs lack).
        When(
            ~has_key("gptoss.expert_feed_forward_length"),
            (FromShape(K.LLM.EXPERT_FEED_FORWARD_LENGTH, "blk.0.ffn_down_exps.weight", axis=0),),
        ),
        Default(K.Rope.SCALING_TYPE, string("yarn")),
        Default(K.Rope.SCALING_YARN_BETA_FAST, f32(32.0)),
        Default(K.Rope.SCALING_YARN_BETA_SLOW, f32(1.0)),
        Set(Keys.Tokenizer.PRE, string("gpt-4o")),
        # Ids of the full o200k vocabulary, which llama.cpp never reads: it
        # finds the end-of-generation tokens by their text.
        Drop(("tokenizer.ggml.eos_token_ids",)),
        When(has_token(BOS), (Drop((Keys.Tokenizer.BOS_ID,)), DefaultTokenId(Keys.Tokenizer.BOS_ID, BOS))),
        When(has_token(EOS), (Drop((Keys.Tokenizer.EOS_ID,)), DefaultTokenId(Keys.Tokenizer.EOS_ID, EOS))),
    ),
    tensors=(
        # Fused gate/up stacks (before c00fa9cc2) split; type-4 stacks repacked.
        *(
            ProducePerBlock(BLOCKS, tensor(stack, "{}", kind), from_fused(kind, half), consumes=(FUSED + kind,))
            for kind in ("weight", "bias")
            for half, stack in enumerate((T.FFN_GATE_EXP, T.FFN_UP_EXP))
        ),
        *(
            ProducePerBlock(BLOCKS, tensor(stack, "{}"), repacked(part), consumes=(f"blk.{{}}.ffn_{part}_exps.weight",))
            for part, stack in (("gate", T.FFN_GATE_EXP), ("up", T.FFN_UP_EXP), ("down", T.FFN_DOWN_EXP))
        ),
        Rename(".attn_out", leaf(T.ATTN_OUT)),
        Rename(".attn_sinks", leaf(T.ATTN_SINKS) + ".weight"),
        Rename(".ffn_norm", leaf(T.ATTN_POST_NORM)),
    ),
)
