"""A model folder's model.gguf tells a changed Modelfile layer by its
status as the last scan of the store found it (`sampling.saw_layers`): a
lookup of model.gguf (READDIRPLUS asks one per entry) resolves no layer's
path, and the scan that finds a layer rewritten marks its folder changed
(the FUSE layer then forgets its answers and the kernel's), after which
model.gguf carries what the layer says now."""

from __future__ import annotations

import os

import pytest

from compatfs.files import lookup
from compatfs.fuse.operations import CompatFS
from compatfs.testing import llama
from compatfs.testing.store import add_model, set_layer
from compatfs.view import sampling
from test_sampling import set_params
from test_template_layer import TEMPLATE


@pytest.fixture
def fs(tmp_path, store_fs) -> CompatFS:
    store = tmp_path / "store"
    text = llama.plain_llama_text(tmp_path / "t.gguf")
    manifest = add_model(store, "chat", text, tag="1b")
    set_params(store, manifest, b'{"temperature": 0.3, "num_ctx": 2048}')
    set_layer(store, manifest, TEMPLATE, b"{{ .Prompt }}")
    return store_fs(store)


def _layers(fs: CompatFS) -> set[str]:
    ref = fs.tree.lookup("chat:1b/model.gguf")
    assert ref.params is not None and ref.params.params and ref.params.template
    return {str(p) for p in ref.params.paths()}


def test_a_lookup_of_model_gguf_resolves_no_layer_path(fs, monkeypatch):
    layers = _layers(fs)
    first = fs.getattr("/chat:1b/model.gguf")  # (the layers read and the size counted once)
    fs._paths.forget()  # what the FUSE layer remembered of its answers: asked again
    walked: list[str] = []
    real = lookup._walk
    monkeypatch.setattr(lookup, "_walk", lambda path, caller: walked.append(os.fspath(path)) or real(path, caller))
    assert fs.getattr("/chat:1b/model.gguf") == first
    assert not layers & set(walked), walked


def test_a_layer_rewritten_is_read_again_after_the_scan_that_finds_it(fs):
    params = fs.tree.lookup("chat:1b/model.gguf").params.params
    before = fs.getattr("/chat:1b/model.gguf")["st_size"]
    marks = fs.tree.snapshot().marks["chat:1b"]
    params.write_bytes(b'{"temperature": 0.3, "num_ctx": 2048, "top_k": 7, "stop": ["<end>", "<stop>"]}')
    snap = fs.tree.rescan()
    assert snap.marks["chat:1b"] != marks  # (the rescan thread forgets the folder's answers, the kernel's too)
    fs._paths.forget()
    after = fs.getattr("/chat:1b/model.gguf")["st_size"]
    assert after > before
    kvs = dict(sampling.of_layer(fs.tree.lookup("chat:1b/model.gguf").params).kvs)
    assert "general.sampling.top_k" in kvs
