"""The scripts import compatfs's names inside their functions (a section
imports what it needs when it runs); every such name must still be where
the script looks for it, or a section fails only when someone runs it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


def _imports(path: Path) -> list[tuple[int, str, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("compatfs"):
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_script_imports_is_there(script):
    imports = _imports(script)
    missing = []
    for line, module, name in imports:
        held = importlib.import_module(module)
        if not hasattr(held, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{script.name}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
    assert imports or script.name not in ("bench.py", "e2e.py")
