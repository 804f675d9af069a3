"""Ollama's template layer as a Jinja chat template for llama.cpp: `gotemplate`
parses Go's text/template, `data` is Ollama's template data as Jinja builds it
from llama.cpp's chat variables, `jinja` emits the translation, and
`translate` is the one entry point."""

from .translate import ChatTemplate, translate

__all__ = ["ChatTemplate", "translate"]
