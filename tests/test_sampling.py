"""A model's params layer as llama.cpp's `general.sampling.*` keys in its
model folder's model.gguf: per tag (two tags of one blob differ), never in
blobs/, followed while mounted, and a hostile layer leaves the model served
without them."""

import os
import time
from pathlib import Path

import pytest
from gguf import GGUFReader, Keys

from compatfs.format.params import sampling
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.testing.store import add_model, set_layer
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews

from conftest import needs_fuse, wait_until

PARAMS = "application/vnd.ollama.image.params"
S = Keys.General


def set_params(root: Path, manifest: Path, data: bytes | None) -> None:
    """Give the manifest this params layer (None: none), its blob by digest."""
    set_layer(root, manifest, PARAMS, data)


def sampling_keys(path: Path) -> dict:
    """The general.sampling.* KVs of a GGUF file, as gguf-py reads them."""
    r = GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if k.startswith("general.sampling.")}


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return llama.plain_llama_text(tmp_path_factory.mktemp("blob") / "t.gguf")


@pytest.fixture
def store(tmp_path, blob):
    root = tmp_path / "store"
    a = add_model(root, "tiny", blob, tag="hot")
    b = add_model(root, "tiny", blob, tag="cold")
    set_params(
        root,
        a,
        b'{"temperature":1.5,"top_k":7,"top_p":0.5,"min_p":0.1,"repeat_penalty":1.2,'
        b'"repeat_last_n":32,"mirostat":2,"mirostat_tau":4.5,"mirostat_eta":0.2,"stop":["x"]}',
    )
    set_params(root, b, b'{"temperature":0.1,"num_ctx":4096}')
    return root


def test_each_ollama_option_becomes_its_key_with_llama_cpp_types():
    s = sampling(
        {
            "temperature": 1,
            "top_k": 64.0,
            "top_p": 0.95,
            "min_p": 0,
            "repeat_penalty": 1.1,
            "repeat_last_n": -1,
            "mirostat": 1,
            "mirostat_tau": 5,
            "mirostat_eta": 0.1,
            "num_ctx": 8192,
            "stop": ["<end_of_turn>"],
        }
    )
    assert s.notes == ()
    got = {k: (v.vtype.name, v.decode()) for k, v in s.kvs}
    assert got == {
        S.SAMPLING_TEMP: ("FLOAT32", 1.0),
        S.SAMPLING_TOP_K: ("INT32", 64),
        S.SAMPLING_TOP_P: ("FLOAT32", pytest.approx(0.95)),
        S.SAMPLING_MIN_P: ("FLOAT32", 0.0),
        S.SAMPLING_PENALTY_REPEAT: ("FLOAT32", pytest.approx(1.1)),
        S.SAMPLING_PENALTY_LAST_N: ("INT32", -1),
        S.SAMPLING_MIROSTAT: ("INT32", 1),
        S.SAMPLING_MIROSTAT_TAU: ("FLOAT32", 5.0),
        S.SAMPLING_MIROSTAT_ETA: ("FLOAT32", pytest.approx(0.1)),
    }


@pytest.mark.parametrize(
    "params, bad",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"mirostat": 3}, "mirostat"),
        ({"temperature": -1}, "temperature"),
        ({"top_k": True}, "top_k"),
        ({"repeat_last_n": 1 << 40}, "repeat_last_n"),
        ({"temperature": 1e39}, "temperature"),
        ({"temperature": None}, "temperature"),
        ({"top_p": [0.9]}, "top_p"),
    ],
)
def test_a_bad_value_is_left_out_and_said(params, bad):
    s = sampling({**params, "top_k" if bad != "top_k" else "temperature": 3})
    assert [k for k, _ in s.kvs] == [S.SAMPLING_TOP_K if bad != "top_k" else S.SAMPLING_TEMP]
    assert len(s.notes) == 1 and s.notes[0].startswith(f"params {bad}: not in model.gguf")


def view_bytes(tree: Tree, path: str, tmp_path: Path) -> Path:
    ref = tree.lookup(path)
    v = tree.views.view(ref.blob, ref.kind, ref.params)
    out = tmp_path / (path.replace("/", "_").replace(":", "_"))
    # An identity view is the blob itself (read by descriptor, not in-process).
    out.write_bytes(v.read(0, v.size) if v.source is not None else ref.blob.read_bytes())
    return out


def test_two_tags_of_one_blob_each_carry_their_own(store, tmp_path):
    tree = Tree(OllamaStore(store), BlobViews())
    hot, cold = (
        sampling_keys(view_bytes(tree, "tiny:hot/model.gguf", tmp_path)),
        sampling_keys(view_bytes(tree, "tiny:cold/model.gguf", tmp_path)),
    )
    assert hot[S.SAMPLING_TEMP] == 1.5 and hot[S.SAMPLING_TOP_K] == 7 and hot[S.SAMPLING_MIROSTAT] == 2
    assert hot[S.SAMPLING_MIROSTAT_TAU] == 4.5 and hot[S.SAMPLING_PENALTY_LAST_N] == 32 and len(hot) == 9
    assert cold == {S.SAMPLING_TEMP: pytest.approx(0.1)}
    digest = tree.lookup("tiny:hot/model.gguf").blob.name
    assert sampling_keys(view_bytes(tree, f"blobs/{digest}/model.gguf", tmp_path)) == {}
    # Everything else is the blob's own view, tensor for tensor.
    plain, with_kvs = (
        GGUFReader(view_bytes(tree, f"blobs/{digest}/model.gguf", tmp_path)),
        GGUFReader(view_bytes(tree, "tiny:hot/model.gguf", tmp_path)),
    )
    assert [t.name for t in plain.tensors] == [t.name for t in with_kvs.tensors]
    assert all(bytes(a.data) == bytes(b.data) for a, b in zip(plain.tensors, with_kvs.tensors, strict=True))
    # The size stat shows is the view's.
    ref = tree.lookup("tiny:hot/model.gguf")
    base = tree.views.summary(ref.blob).model_size
    assert tree.views.sampled_size(ref.blob, ref.params, base) == tree.views.view(ref.blob, ref.kind, ref.params).size


HOSTILE = [
    b"not json",
    b"[1, 2]",
    b'{"temperature": "warm", "top_k": -5}',
    b"\xff\xfe{}",
    b"{" * 100000,
    b'{"temperature": 1}' + b" " * (1 << 20),
]


@pytest.mark.parametrize("data", HOSTILE, ids=["text", "array", "types", "binary", "deep", "huge"])
def test_a_hostile_layer_leaves_the_model_served_without_it(store, tmp_path, data):
    m = store / "manifests/registry.ollama.ai/library/tiny/hot"
    set_params(store, m, data)
    tree = Tree(OllamaStore(store), BlobViews())
    assert sampling_keys(view_bytes(tree, "tiny:hot/model.gguf", tmp_path)) == {}
    from compatfs.view.sampling import of_layer

    notes = of_layer(tree.lookup("tiny:hot/model.gguf").params).notes
    assert notes and all(isinstance(n, str) and "\n" not in n for n in notes)


@needs_fuse
def test_the_mount_follows_the_params_layer(store, mount_store, tmp_path):
    mnt = mount_store(store)
    f = mnt / "tiny:hot/model.gguf"
    assert sampling_keys(f)[S.SAMPLING_TOP_K] == 7
    assert os.path.getsize(f) == len(f.read_bytes())
    m = store / "manifests/registry.ollama.ai/library/tiny/hot"

    def seen(want, seconds=10.0):
        start = time.monotonic()
        wait_until(
            lambda: sampling_keys(f) == want and os.path.getsize(f) == len(f.read_bytes()),
            seconds,
            what=f"{f} showing {want}",
            tolerate=(OSError, ValueError),
        )
        return time.monotonic() - start

    set_params(store, m, b'{"top_k": 11}')
    assert seen({S.SAMPLING_TOP_K: 11}) < 3
    set_params(store, m, None)  # removed
    assert seen({}) < 3
    set_params(store, m, b'{"temperature": 2}')  # added
    assert seen({S.SAMPLING_TEMP: 2.0}) < 3
    set_params(store, m, b"garbage")  # hostile: served without, never gone
    assert seen({}) < 3
    assert sorted(os.listdir(mnt / "tiny:hot")) == ["model.gguf", "params.json"]
    assert sampling_keys(mnt / "tiny:cold/model.gguf") == {S.SAMPLING_TEMP: pytest.approx(0.1)}
    assert mnt.alive


@needs_fuse
def test_a_file_held_open_across_a_change_shows_the_new_params_once_reopened(store, mount_store):
    mnt = mount_store(store)
    f = mnt / "tiny:hot/model.gguf"
    m = store / "manifests/registry.ollama.ai/library/tiny/hot"
    with open(f, "rb") as held:
        head = held.read(4096)
        seen = mnt.changes_seen()
        set_params(store, m, b'{"top_k": 3, "temperature": 0.5}')
        wait_until(lambda: mnt.changes_seen() > seen, what="a rescan seeing the params layer changed")
        held.seek(0)
        assert held.read(4096) == head  # an open file keeps the view it opened
    # Reopened: the new view, not the pages the held file had cached.
    wait_until(
        lambda: sampling_keys(f) == {S.SAMPLING_TOP_K: 3, S.SAMPLING_TEMP: 0.5},
        10,
        what="a new open showing the new params",
    )
