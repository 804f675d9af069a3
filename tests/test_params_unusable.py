"""A params layer that is not JSON costs only its own settings, as README
says: the model is served, its model.gguf without sampling keys (as a model
without a params layer), its models.ini section without the layer's options
and with a comment saying why, the other sections untouched; the layer
itself is still shown as params.json, byte for byte."""

from __future__ import annotations


from compatfs.files.lookup import status
from compatfs.fuse.current import CurrentViews
from compatfs.router.preset import RootPreset
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import FileRef, Tree
from compatfs.view.catalog import BlobViews
from test_sampling import set_params

BROKEN = b'{"temperature": 0.5, "num_ctx": 2048'


def test_a_layer_that_is_not_json_leaves_the_model_served_without_its_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    set_params(root, add_model(root, "broken", blob, tag="1b"), BROKEN)
    set_params(root, add_model(root, "good", blob, tag="1b"), b'{"temperature": 0.5, "num_ctx": 2048}')
    add_model(root, "plain", blob, tag="1b")
    tree = Tree(open_source(root), BlobViews())
    preset = RootPreset.at(tmp_path / "mnt")
    assert preset is not None
    tree.publish(preset)
    tree.rescan()
    presented = CurrentViews(tree)

    def size(path: str) -> int | None:
        ref = tree.lookup(path)
        assert isinstance(ref, FileRef)
        return presented.size(ref, status(ref.blob))

    assert tree.lookup("broken:1b") == ["model.gguf", "params.json"]
    layer = tree.lookup("broken:1b/params.json")
    assert isinstance(layer, FileRef) and layer.blob.read_bytes() == BROKEN
    assert size("broken:1b/model.gguf") == size("plain:1b/model.gguf") != size("good:1b/model.gguf")
    ini = tree.lookup("models.ini")
    assert isinstance(ini, FileRef)
    sections = {s.split("]", 1)[0]: s for s in ini.blob.read_text().split("\n[")[1:]}
    broken = sections["broken@1b"].splitlines()
    assert any(line.startswith("; params layer sha256-") and "is not JSON" in line for line in broken)
    assert [line.split(" = ")[0] for line in broken if " = " in line] == ["alias", "model"]
    assert "ctx-size = 2048" in sections["good@1b"]
