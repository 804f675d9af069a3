"""Where the tests find stock llama.cpp b11434: the folder `scripts/e2e`
builds it into (its --cache: `src/` the source, `build/bin/` the tools),
named by $LLAMA_CPP_DIR, else e2e's default cache `.cache/llama.cpp-b11434`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIR = Path(os.environ.get("LLAMA_CPP_DIR") or ROOT / ".cache" / "llama.cpp-b11434")
HOW = f"build it with `scripts/e2e --build-only --cache DIR` and set LLAMA_CPP_DIR=DIR (looked in {DIR})"


def source(rel: str) -> Path:
    """A file of llama.cpp's source; the test skips, saying why, without it."""
    path = DIR / "src" / rel
    if not path.is_file():
        pytest.skip(f"llama.cpp b11434 source {rel} not found: {HOW}")
    return path


def tool(name: str) -> Path:
    """A built llama.cpp tool; the test skips, saying why, without it."""
    path = DIR / "build" / "bin" / name
    if not os.access(path, os.X_OK):
        pytest.skip(f"stock {name} not built: {HOW}")
    return path


def stop(proc: subprocess.Popen, log=None) -> None:
    """End a llama-server a test started (SIGTERM, SIGKILL after 20 s), and close its log."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
    if log is not None:
        log.close()
