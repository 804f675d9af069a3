"""A params layer of deeply nested JSON arrays (deeper than Python's JSON
parser goes) costs only its own model's params: the layer is refused with a
one-line reason, `models.ini` keeps every section, and `compatfs ls` says why
under the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.format.params import read_params
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.router.preset import RootPreset
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from test_sampling import set_params

NESTED = b"[" * 200_000 + b"]" * 200_000  # well under the layer's 1 MiB limit


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    set_params(root, add_model(root, "good", blob, tag="1b"), b'{"num_ctx": 2048}')
    set_params(root, add_model(root, "deep", blob, tag="1b"), NESTED)
    return root


def test_a_nested_layer_is_refused_naming_it(tmp_path):
    layer = tmp_path / "sha256-nested"
    layer.write_bytes(NESTED)
    with pytest.raises(ValueError, match="sha256-nested.*too deeply"):
        read_params(layer)


def test_a_nested_layer_leaves_every_other_section_in_models_ini(store, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    tree = Tree(open_source(store), BlobViews())
    tree.publish(RootPreset.at(tmp_path / "mnt"))
    ref = tree.lookup("models.ini")
    assert ref is not None and not isinstance(ref, list), "models.ini is not shown"
    text = ref.blob.read_text()
    assert "[good@1b]" in text and "ctx-size = 2048" in text
    deep = text.split("[deep@1b]", 1)[1].split("\n\n", 1)[0]
    assert "alias = deep:1b" in deep and "too deeply" in deep


def test_ls_says_why_under_the_model(store):
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", "ls", str(store), "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    rows = {m["name"]: m for m in json.loads(res.stdout)["models"]}
    notes = rows["deep:1b"]["params"]["notes"]
    assert len(notes) == 1 and "too deeply" in notes[0] and "\n" not in notes[0]
    assert rows["good:1b"]["params"]["notes"] == []
