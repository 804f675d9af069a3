"""Issue 32 pt 3: a messages layer (a Modelfile's MESSAGEs) is applied as
Ollama applies it: every chat renders as Ollama's chat handler joins it (the
system layer's message where the chat opens without one, then the layer's
messages, then the chat's own), through the translated chat template in
stock llama-server (`/apply-template`) exactly as Go's text/template renders
it; a messages layer that cannot be used leaves the template without it, and
says why."""
import json
from pathlib import Path

import pytest

from compatfs.names import MODEL_FILE
from compatfs.template import translate
from compatfs.template.translate import parse_messages
from compatfs.testing import llama
from compatfs.view.catalog import BlobViews
from compatfs.view.sampling import Layers, of_layer
from gguf import GGUFReader, Keys

from gotmpl_ref import CHATS, CORPUS, Server, go_binary, go_render

LAYER = [{"role": "user", "content": "Ping {{ .System }}"}, {"role": "assistant", "content": "Pong"}]
SYSTEM = "You are a pirate."


@pytest.fixture(scope="module")
def gotmpl(tmp_path_factory):
    return go_binary(tmp_path_factory.mktemp("gotmpl"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return llama.plain_llama_text(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def as_ollama_joins(chat: dict, system: str, layer: list[dict]) -> dict:
    """The chat Ollama's chat handler renders: the model's messages, then the
    request's; the system layer first where the request opens without one."""
    first = [{"role": "system", "content": system}] if system and chat["messages"][0]["role"] != "system" else []
    return {**chat, "messages": first + layer + chat["messages"]}


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_llama_server_renders_the_messages_layer_as_ollama(path: Path, gotmpl, tiny, tmp_path):
    source = path.read_text()
    result = translate(source.encode(), SYSTEM.encode(), parse_messages(json.dumps(LAYER).encode()))
    assert result.reason is None and result.jinja
    (tmp_path / "t.jinja").write_text(result.jinja)
    server = Server(tiny, tmp_path / "server.log", tmp_path / "t.jinja")
    try:
        for name, chat in CHATS.items():
            assert server.apply(chat) == go_render(gotmpl, source, "", as_ollama_joins(chat, SYSTEM, LAYER)), name
    finally:
        server.close()


def test_model_gguf_carries_them_and_says_so(tiny, tmp_path):
    template = tmp_path / "template"
    template.write_bytes(b"{{ range .Messages }}[{{ .Role }}]{{ .Content }}{{ end }}")
    messages = tmp_path / "messages"
    messages.write_text(json.dumps(LAYER))
    layers = Layers(template=template, messages=messages)
    made = of_layer(layers)
    assert [layer for layer, _ in made.applied] == ["template", "messages"] and made.notes == ()
    view = BlobViews().view(tiny, MODEL_FILE, layers)
    (tmp_path / "m.gguf").write_bytes(view.read(0, view.size))
    jinja = GGUFReader(tmp_path / "m.gguf").fields[Keys.Tokenizer.CHAT_TEMPLATE].contents()
    assert '"content": "Ping {{ .System }}"' in jinja
    # A layer that cannot be used: the template without it, and why.
    for bad, why in ((b"not json", "is not JSON"), (b'[{"role": "tool", "content": "x"}]', "not a role"),
                     (b'[{"role": "user", "content": "x", "images": ["aGk="]}]', "more than a role and a text"),
                     (b"[" + b'{"role": "user", "content": "x"},' * 20000 + b"{}]", "more than the")):
        messages.write_bytes(bad)
        made = of_layer(layers)
        assert [layer for layer, _ in made.applied] == ["template"], bad[:40]
        assert len(made.notes) == 1 and made.notes[0].startswith("messages: not applied (") and why in made.notes[0]
    without = of_layer(Layers(messages=messages))
    assert without.notes == ("messages: not applied (only a translated template layer carries it)",)
