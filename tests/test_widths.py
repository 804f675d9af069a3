"""compatfs.testing.widths, the benchmark's real-width writer: run at the tiny
writers' own dimensions, it writes the header they write (keys, tensor names,
shapes, types and offsets), with valid data of its own."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from compatfs.format.header import SourceGGUF
from compatfs.testing import gemma4, glmocr, gptoss, qwen3vl, widths


def header(path):
    r = gguf.GGUFReader(path)
    kvs = {name: f.contents() for name, f in r.fields.items() if not name.startswith("GGUF.")}
    tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in r.tensors]
    return kvs, tensors


@pytest.mark.parametrize(
    "module, dims, writer",
    [
        (gemma4, "GEMMA4_MOE", gemma4.legacy_gemma4_moe),
        (qwen3vl, "QWEN3VL_MOE", qwen3vl.legacy_qwen3vl_moe),
        (glmocr, "GLMOCR", glmocr.legacy_glmocr),
    ],
    ids=["gemma4", "qwen3vl", "glmocr"],
)
def test_the_tiny_dimensions_give_the_tiny_writers_header(tmp_path, module, dims, writer):
    tiny = writer(tmp_path / "tiny.gguf")
    mine = widths.write_blob(widths._capture(module, dims, {}, writer), tmp_path / "mine.gguf")
    assert header(mine) == header(tiny)
    assert mine.stat().st_size == tiny.stat().st_size


def test_the_gptoss_shapes_are_the_tiny_writers(tmp_path):
    tiny = gptoss.legacy_gptoss_fused(tmp_path / "tiny.gguf")
    r = gguf.GGUFReader(tiny)
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    for t in r.tensors:
        assert tuple(reversed(widths._gptoss_shape(t.name, gptoss.GPTOSS, n_vocab))) == tuple(
            int(d) for d in t.shape
        ), t.name


def test_blocks_are_valid_and_type4_is_patched(tmp_path):
    def blob(first):
        return widths.Blob(
            "gptoss",
            {"general.architecture": ("gptoss", gguf.GGUFValueType.STRING, None)},
            [
                widths.Tensor("a", (4, 64), first),
                widths.Tensor("b", (3, 64), widths.T.MXFP4),
                widths.Tensor("c", (5, 32), widths.T.BF16),
                widths.Tensor("d", (7,), widths.T.F32),
            ],
        )

    typed4 = widths.write_blob(blob(gptoss.OLLAMA_MXFP4), tmp_path / "typed4.gguf").read_bytes()
    path = widths.write_blob(blob(widths.T.MXFP4), tmp_path / "typed39.gguf")
    typed39 = path.read_bytes()
    differ = [i for i in range(len(typed39)) if typed39[i] != typed4[i]]
    assert len(typed39) == len(typed4) and len(differ) == 1
    assert typed39[differ[0]] == widths.T.MXFP4 and typed4[differ[0]] == gptoss.OLLAMA_MXFP4
    src = SourceGGUF(path)
    for name in ("a", "b"):
        t = src.tensors[name]
        scales = np.frombuffer(src.read(t.offset, t.nbytes), np.uint8).reshape(-1, 17)[:, 0]
        assert ((scales >= 118) & (scales <= 122)).all()
    c = src.tensors["c"]
    bf16 = np.frombuffer(src.read(c.offset, c.nbytes), np.uint16).astype(np.uint32) << 16
    assert np.isfinite(bf16.view(np.float32)).all()
