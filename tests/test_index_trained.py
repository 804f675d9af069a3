"""A blob's trained context length and block count (what bounds a params
layer's options in models.ini) are in its summary and the index: a remount
answers them with no header parsed; a wrong entry is found and replaced
when model.gguf's view is built, and where the embedding flag is checked."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

import compatfs.view.summaries
from compatfs.names import MODEL_FILE
from compatfs.view.catalog import BlobViews
from compatfs.view.index import Index
from compatfs.view.summaries import Trained, stamp_of, summarize
from ggufs import write_gguf


def _model(path: Path, context: int | None = 4096, blocks: int = 3) -> Path:
    kvs = {"qwen2.block_count": 99}  # a count read from a KV is never the block count
    if context is not None:
        kvs["qwen2.context_length"] = context
    tensors = {"token_embd.weight": np.zeros((4, 16), dtype=np.float32)}
    for i in range(blocks):
        tensors[f"blk.{i}.attn_norm.weight"] = np.ones(16, dtype=np.float32)
    return write_gguf(path, "qwen2", kvs=kvs, tensors=tensors)


@pytest.mark.parametrize("context, expect", [(4096, 4096), (None, None), (0, None)])
def test_the_summary_holds_the_trained_context_and_the_blocks_held(tmp_path, context, expect):
    _, summary = summarize(_model(tmp_path / "m.gguf", context), True)
    assert (summary.context_length, summary.block_count) == (expect, 3)


def test_a_remount_answers_them_from_the_index_without_a_parse(tmp_path, monkeypatch):
    blob, index = _model(tmp_path / "m.gguf"), tmp_path / "index.sqlite3"
    first = BlobViews(index=Index(index, translate=True))
    assert first.trained(blob) == Trained(4096, 3)
    first.close()
    parsed = []
    real = compatfs.view.summaries.SourceGGUF
    monkeypatch.setattr(compatfs.view.summaries, "SourceGGUF", lambda *a, **k: parsed.append(a) or real(*a, **k))
    again = BlobViews(index=Index(index, translate=True))
    assert again.trained(blob) == Trained(4096, 3) and parsed == []
    again.close()


def test_a_wrong_entry_is_replaced_when_the_view_is_built(tmp_path, caplog):
    blob = _model(tmp_path / "m.gguf")
    stamp, true = summarize(blob, True)
    index = Index(None, translate=True)
    views = BlobViews(index=index)
    told: list[Path] = []
    views.on_belied = told.append
    index.put(blob, stamp, dataclasses.replace(true, context_length=1 << 30, block_count=500))
    assert views.trained(blob) == Trained(1 << 30, 500)  # a hint until checked
    with caplog.at_level(logging.ERROR):
        views.view(blob, MODEL_FILE)
    assert views.trained(blob) == Trained(4096, 3) and told == [blob]
    assert "index entry of" in caplog.text


def test_a_wrong_entry_is_replaced_where_the_embedding_flag_is_checked(tmp_path):
    blob = _model(tmp_path / "m.gguf")
    stamp, true = summarize(blob, True)
    index = Index(None, translate=True)
    index.put(blob, stamp, dataclasses.replace(true, context_length=8, block_count=0))
    views = BlobViews(index=index)
    assert views.embedding(blob) is False
    assert views.trained(blob) == Trained(4096, 3) and index.get(blob, stamp_of(blob)) == true


def test_a_blob_that_cannot_be_read_has_none(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert BlobViews().trained(bad) == Trained(None, 0)
    assert BlobViews().trained(tmp_path / "missing") is None
