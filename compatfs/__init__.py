"""compatfs: Ollama model blobs as llama.cpp-compatible GGUF files, over FUSE."""

__version__ = "0.1.0"

PROG = "compatfs"  # the command's name in its messages
