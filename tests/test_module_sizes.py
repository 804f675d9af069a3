"""No module of the FUSE layer, the file layer, the tree or the read-ahead
is over 450 lines: a module that grows past that holds more than one thing,
and is split by what it holds."""
from __future__ import annotations

from conftest import ROOT

LIMIT = 450
PACKAGE = ROOT / "compatfs"


def test_no_module_is_over_the_limit():
    modules = [*(PACKAGE / "fuse").glob("*.py"), *(PACKAGE / "files").glob("*.py"), PACKAGE / "tree.py",
               PACKAGE / "view" / "ahead.py"]
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not long, long
