"""Every template of the corpus (Ollama's own, in every form it publishes:
Messages with $last/slice logic, the older Prompt/Response form, tools,
thinking), translated to Jinja, renders each chat in stock llama-server
(`/apply-template`) exactly as Go's text/template renders it on Ollama's data,
with and without a system layer; what cannot be translated exactly is
refused with a one-line reason."""

from pathlib import Path

import pytest

from compatfs.template import translate

from gotmpl_ref import CHATS, CORPUS, REFUSED, Server, go_render


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_llama_server_renders_each_chat_as_ollama(path: Path, gotmpl, tiny, tmp_path):
    source = path.read_text()
    for system in ("", "You are a pirate.\nSpeak like one."):
        result = translate(source.encode(), system.encode())
        assert result.reason is None and result.jinja
        (tmp_path / "t.jinja").write_text(result.jinja)
        server = Server(tiny, tmp_path / "server.log", tmp_path / "t.jinja")
        try:
            for name, chat in CHATS.items():
                assert server.apply(chat) == go_render(gotmpl, source, system, chat), (name, system)
        finally:
            server.close()


REASONS = {
    "command-r": "ranges over a value of Ollama's",
    "define": "{{ define }}",
    "doubling": "could grow without bound",
    "doubling-copy": "could grow without bound",
    "doubling-with": "could grow without bound",
    "is-think-set": "uses .IsThinkSet",
    "json-tools": "calls json",
    "len-string": "len of a string",
    "nested-range": "could grow without bound",
    "no-field": "has no field .Name",
    "print-list": "prints a list",
    "printf-q": "printf %q",
    "response-before-else": "an else follows the .Response",
    "string-order": "lt of strings",
    "unterminated": "no {{ end }}",
}


@pytest.mark.parametrize("path", REFUSED, ids=[p.stem for p in REFUSED])
def test_what_cannot_be_translated_exactly_is_refused_in_one_line(path: Path):
    result = translate(path.read_bytes(), b"system")
    assert result.jinja is None
    assert REASONS[path.stem] in result.reason and "\n" not in result.reason


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"{{ .Prompt }}" * 10000, "more than the"),
        (b"\xff{{ .Prompt }}", "not UTF-8"),
        (b"{{ " * 40 + b"x", "does not end"),
        (b"{{ print " + b"(print " * 100 + b".Prompt" + b")" * 100 + b" }}", "nests ( ) more than 64"),
        (b"{{if .System}}" * 2000 + b"{{end}}" * 2000, "nests if, range and with more than 64"),
        (b"{{ if .System }}" * 60 + b"x" + b"{{ end }}" * 60, None),
    ],
)
def test_hostile_templates_are_refused_or_translated_without_failing(data, reason):
    result = translate(data)
    if reason is not None:
        assert result.jinja is None and reason in result.reason
    else:
        assert (result.jinja is None) != (result.reason is None)
