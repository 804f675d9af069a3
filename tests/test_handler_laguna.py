"""Laguna as Ollama's converter writes it: untranslated llama.cpp refuses it
(no `attn_gate`); through the mount it has llama.cpp's tensor and rope key
names (the YaRN attention factor as `yarn_attn_factor`, which llama.cpp does
not multiply in a second time), the same tensor values, and generates."""

import math

import gguf
import pytest

from compatfs.format.header import SourceGGUF
from compatfs.testing import laguna
from compatfs.testing.store import add_model

from compare import as_f32, kvs
from conftest import needs_fuse
from xlc_client import run_job

JOB = [
    {"op": "complete", "prompt": "The capital of France is", "n_predict": 8, "n_probs": 3},
    {"op": "chat", "messages": [{"role": "user", "content": "Hello there!"}], "n_predict": 4},
]


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return laguna.legacy_laguna(tmp_path_factory.mktemp("laguna") / "laguna.gguf")


def test_untranslated_fails(blob):
    # Ollama's handler claims it (llama/compat: `rope.swa.*` keys or `attn_g`).
    src = SourceGGUF(blob)
    assert "laguna.rope.swa.dimension_count" in src.kvs and "blk.0.attn_g.weight" in src.tensors
    r = run_job({"model": str(blob), "actions": []})
    assert not r["ok"] and "attn_gate" in r["error"], r["error"]


@needs_fuse
def test_laguna_loads_with_llama_cpp_names(blob, tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "laguna", blob, tag="xs.2")
    mounted = mount_store(store) / "laguna:xs.2/model.gguf"
    got = kvs(mounted)
    # llama.cpp's key names (gguf-py's), with the values of the checkpoint's config.
    rope = {k: getattr(gguf.Keys.Rope, k).format(arch="laguna") for k in dir(gguf.Keys.Rope) if k.isupper()}
    assert got[rope["DIMENSION_COUNT_SWA"]] == laguna.LAGUNA["head_dim"]  # sliding layers: whole heads
    assert got[rope["FREQ_BASE_SWA"]] == pytest.approx(laguna.LAGUNA["swa_rope_theta"])
    assert got[rope["SCALING_YARN_ATTN_FACTOR"]] == pytest.approx(0.1 * math.log(laguna.LAGUNA["rope_factor"]) + 1)
    assert (got[rope["SCALING_YARN_BETA_FAST"]], got[rope["SCALING_YARN_BETA_SLOW"]]) == (32.0, 1.0)
    # Every rope-scaling key is one llama.cpp reads, and no sliding-window key
    # keeps Ollama's own form (llama.cpp's have none under `rope.swa.`).
    assert {k for k in got if k.startswith("laguna.rope.scaling.")} <= set(rope.values())
    assert not [k for k in got if k.startswith("laguna.rope.swa.")]

    # Every tensor has a name llama.cpp knows, and the bytes of one of the blob's.
    known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSOR for i in range(laguna.LAGUNA["n_layer"])}
    mine = {t.name: t for t in gguf.GGUFReader(mounted).tensors}
    theirs = {as_f32(t).tobytes() for t in gguf.GGUFReader(blob).tensors}
    assert len(mine) == len(theirs)
    for name, t in mine.items():
        assert name.rsplit(".", 1)[0] in known and as_f32(t).tobytes() in theirs, name

    r = run_job({"model": str(mounted), "actions": JOB})
    assert r["ok"], r
    complete, chat = r["results"]
    assert len(complete["tokens"]) == 8 and chat["completion_tokens"] > 0
