"""No module of the package is over 450 lines: a module that grows past that
holds more than one thing, and is split by what it holds."""

from __future__ import annotations

from conftest import ROOT

LIMIT = 450
PACKAGE = ROOT / "compatfs"


def test_no_module_is_over_the_limit():
    modules = [*PACKAGE.rglob("*.py"), *(ROOT / "handlers").glob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not long, long
