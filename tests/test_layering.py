"""The package's layers as docs/architecture.md's Layers section lists them: each of compatfs'
subpackages and top modules imports only those listed before it (and the
handlers, installed as compatfs.handlers)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "compatfs"


def listed_order() -> list[str]:
    """The units (`errors`, `format`, `tree`, ...) in the order the Layers section lists them."""
    layout = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^  - `([a-z_]+)(?:/|\.py)`", layout, re.M)]


def unit(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def arrows() -> set[tuple[str, str, str]]:
    """(importing unit, imported unit, importing file) of every relative import between units."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        here = list(path.relative_to(PACKAGE).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = here[: len(here) - node.level + 1]
            targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
            for target in targets:
                if target and target[0] != unit(path):
                    out.add((unit(path), target[0], str(path.relative_to(PACKAGE))))
    return out


def test_every_unit_imports_only_those_listed_before_it():
    order = listed_order()
    assert order[:3] == ["errors", "names", "files"] and "tree" in order and order[-1] == "cli", order
    rank = {name: i for i, name in enumerate(order)}
    upward = sorted(f"{f}: {a} -> {b}" for a, b, f in arrows() if a in rank and b in rank and rank[b] > rank[a])
    assert not upward, upward


def test_the_tree_renders_no_preset():
    """The tree shows the files the FUSE layer hands it; it imports nothing of the router."""
    imported = {b for a, b, _ in arrows() if a == "tree"}
    assert "router" not in imported and imported <= {"errors", "names", "files", "sources", "view"}, imported
