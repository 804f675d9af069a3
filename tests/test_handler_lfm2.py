"""LFM2 as Ollama's converter writes it: through the mount it equals llama.cpp's
conversion of the same weights and loads.  Then the first LFM2 converter's
form (01cf7445f), written here without ../shared: its norm and feed-forward
length become llama.cpp's and it generates."""

import numpy as np
import pytest

from compatfs.testing import lfm2 as writer
from compatfs.testing.core import form
from compatfs.testing.store import add_model

from chat import load_failure
from compare import assert_same_tensors, kvs, shapes, tensors
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job


@needs_fuse
@needs_shared
def test_lfm2_matches_llama_cpp_conversion(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "lfm2", SHARED / "ollama/lfm2.gguf", tag="1.2b")
    m = mount_store(store)
    mounted, upstream, raw = (
        m / "lfm2:1.2b/model.gguf",
        SHARED / "upstream/lfm2/model.gguf",
        SHARED / "ollama/lfm2.gguf",
    )
    got, want = kvs(mounted), kvs(upstream)
    assert (
        got["lfm2.attention.head_count_kv"]
        == want["lfm2.attention.head_count_kv"]
        != kvs(raw)["lfm2.attention.head_count_kv"]
    )
    loose = {"tokenizer.ggml.add_sep_token"}  # not written by Ollama; llama.cpp defaults it to false
    assert {k: got.get(k) for k in want if k not in loose} == {k: v for k, v in want.items() if k not in loose}
    assert_same_tensors(mounted, upstream)
    job = {"actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}]}
    assert run_job({"model": str(mounted), **job})["ok"]
    assert not run_job({"model": str(raw), **job})["ok"]


# -- the legacy writer (01cf7445f's form): no ../shared needed ----------------------------


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return writer.legacy_lfm2(tmp_path_factory.mktemp("lfm2-writer") / "lfm2.gguf")


written = one_model_store("lfm2", "1.2b")


@needs_shared
def test_writer_writes_the_converters_form(blob):
    """The current converter's fixture, but for the norm's older name."""
    keys, names = form(blob)
    want_keys, want_names = form(SHARED / "ollama/lfm2.gguf")
    assert keys == want_keys
    assert names - want_names == {("output_norm.weight", "F32", 1)}
    assert want_names - names == {("token_embd_norm.weight", "F32", 1)}


@needs_fuse
def test_legacy_writer_gets_llama_cpp_names_through_the_mount_and_generates(blob, written, mount_store):
    mounted = mount_store(written) / "lfm2:1.2b/model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    # The feed-forward length of the tensors, not the config's; the LFM2 pre-tokenizer.
    assert raw["lfm2.feed_forward_length"] == writer.LFM2["intermediate_size"]
    assert got["lfm2.feed_forward_length"] == shapes(blob)["blk.0.ffn_gate.weight"][1] == writer.LFM2["n_ff"]
    assert (raw["tokenizer.ggml.pre"], got["tokenizer.ggml.pre"]) == ("default", "lfm2")
    changed = {"lfm2.feed_forward_length", "tokenizer.ggml.pre"}
    assert {k: v for k, v in got.items() if k not in changed} == {k: v for k, v in raw.items() if k not in changed}
    assert got["lfm2.attention.head_count_kv"] == [0, 0, writer.LFM2["n_head_kv"]]
    # The embedding norm under llama.cpp's name, with the blob's bytes.
    mine, theirs = tensors(mounted), tensors(blob)
    assert sorted(mine) == sorted(n.replace("output_norm", "token_embd_norm") for n in theirs)
    np.testing.assert_array_equal(mine["token_embd_norm.weight"].data, theirs["output_norm.weight"].data)

    r = run_job({"model": str(mounted), "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}]})
    assert r["ok"], r
    assert r["results"][0]["tokens_predicted"] == 4
    assert "token_embd_norm" in load_failure(blob)
