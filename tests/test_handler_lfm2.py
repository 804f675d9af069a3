"""LFM2 as Ollama's converter writes it: through the mount it equals llama.cpp's
conversion of the same weights and loads."""
from compatfs.testing.store import add_model

from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

pytestmark = [needs_fuse, needs_shared]


def test_lfm2_matches_llama_cpp_conversion(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "lfm2", SHARED / "ollama/lfm2.gguf", tag="1.2b")
    m = mount_store(store)
    mounted, upstream, raw = m / "lfm2:1.2b/model.gguf", SHARED / "upstream/lfm2/model.gguf", SHARED / "ollama/lfm2.gguf"
    got, want = kvs(mounted), kvs(upstream)
    assert got["lfm2.attention.head_count_kv"] == want["lfm2.attention.head_count_kv"] != kvs(raw)["lfm2.attention.head_count_kv"]
    loose = {"tokenizer.ggml.add_sep_token"}   # not written by Ollama; llama.cpp defaults it to false
    assert {k: got.get(k) for k in want if k not in loose} == {k: v for k, v in want.items() if k not in loose}
    assert_same_tensors(mounted, upstream)
    job = {"actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}]}
    assert run_job({"model": str(mounted), **job})["ok"]
    assert not run_job({"model": str(raw), **job})["ok"]
