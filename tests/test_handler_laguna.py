"""Laguna as Ollama's converter writes it: untranslated llama.cpp refuses it
(no `attn_gate`); through the mount it has llama.cpp's tensor and rope key
names (the YaRN attention factor as `yarn_attn_factor`, which llama.cpp does
not multiply in a second time), the same tensor values, and generates."""
import gguf
import pytest

from compatfs.gguf_source import SourceGGUF
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
    raw, got = kvs(blob), kvs(mounted)
    p = "laguna."
    assert got[p + "rope.dimension_count_swa"] == raw[p + "rope.swa.dimension_count"]
    assert got[p + "rope.freq_base_swa"] == raw[p + "rope.swa.freq_base"]
    assert got[p + "rope.scaling.yarn_attn_factor"] == raw[p + "rope.scaling.attn_factor"]
    assert got[p + "rope.scaling.yarn_beta_fast"] == raw[p + "rope.scaling.beta_fast"]
    assert not any(k.startswith((p + "rope.swa.", p + "rope.scaling.attn_factor", p + "rope.scaling.beta_"))
                   for k in got)

    mine = {t.name: t for t in gguf.GGUFReader(mounted).tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(blob).tensors}
    assert sorted(mine) == sorted(n.replace(".attn_g.", ".attn_gate.") for n in theirs)
    for name, t in theirs.items():
        assert (as_f32(mine[name.replace(".attn_g.", ".attn_gate.")]) == as_f32(t)).all(), name

    r = run_job({"model": str(mounted), "actions": JOB})
    assert r["ok"], r
    complete, chat = r["results"]
    assert len(complete["tokens"]) == 8 and chat["completion_tokens"] > 0
