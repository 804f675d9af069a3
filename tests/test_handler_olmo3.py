"""OLMo 3 as Ollama's converter wrote it (`olmo3`, f63eea3) and writes it
(`olmo2`): through the mount both equal llama.cpp's conversion of the same
weights, tokenize and generate as it does.  Then the legacy writer's blob,
which needs no ../shared: it is the genuine blob's form, and through the
mount it is `olmo2` with the attention factor llama.cpp reads, and generates."""

import gguf
import pytest

from compatfs.testing import olmo3 as writer
from compatfs.testing.core import form
from compatfs.testing.store import add_model
from compatfs.testing.tokenizers import CORPUS

from chat import load_failure
from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

# Keys the views leave as Ollama wrote them, and why that is the same model:
LOOSE = {
    # Ollama-only tokenizer keys llama.cpp does not read (scores of a BPE
    # vocabulary, the HF end-of-sequence list, add flags it has no use for).
    "tokenizer.ggml.scores",
    "tokenizer.ggml.eos_token_ids",
    "tokenizer.ggml.add_padding_token",
    "tokenizer.ggml.add_unknown_token",
    # Written by llama.cpp's converter from the HF config, which the blob does
    # not carry; the OLMo 2 loader reads none of them (its SWA layers use
    # rope.freq_base, llama.cpp's defaults for the YaRN betas are these).
    "olmo2.rope.freq_base_swa",
    "olmo2.rope.scaling.yarn_beta_fast",
    "olmo2.rope.scaling.yarn_beta_slow",
    # The current upstream conversion names the pre-tokenizer `dbrx`: the same
    # split expression as `llama-bpe` (tokenization compared below).
    "tokenizer.ggml.pre",
}

PROMPTS = [line.strip() for line in CORPUS.splitlines() if line.strip()]


def tokenize_all(model) -> list:
    job = {
        "model": str(model),
        "actions": [{"op": "tokenize", "text": text, "add_special": True} for text in PROMPTS + [CORPUS]],
    }
    r = run_job(job)
    assert r["ok"], r
    return [a["ids"] for a in r["results"]]


@needs_fuse
@needs_shared
@pytest.mark.parametrize("name", ["olmo3_legacy", "olmo3"])
def test_olmo3_matches_llama_cpp_conversion(name, tmp_path, mount_store):
    store = tmp_path / "store"
    raw = SHARED / f"ollama/{name}.gguf"
    add_model(store, "olmo3", raw, tag="7b")
    m = mount_store(store)
    mounted, upstream = m / "olmo3:7b/model.gguf", SHARED / f"upstream/{name}/model.gguf"
    got, want = kvs(mounted), kvs(upstream)
    assert {k: v for k, v in got.items() if k not in LOOSE} == {k: v for k, v in want.items() if k not in LOOSE}
    assert "olmo2.rope.scaling.attn_factor" not in got
    assert_same_tensors(mounted, upstream)

    assert tokenize_all(mounted) == tokenize_all(upstream)
    mine, ref = (complete(p, "The capital of France is") for p in (mounted, upstream))
    assert mine["tokens"] == ref["tokens"]
    assert_close_top(mine["top"], ref["top"])


def complete(model, prompt, n: int = 8) -> dict:
    r = run_job({"model": str(model), "actions": [{"op": "complete", "prompt": prompt, "n_predict": n, "n_probs": 3}]})
    assert r["ok"], r
    return r["results"][0]


def logprobs(top) -> list:
    return [[(t["id"], t["logprob"]) for t in step] for step in top]


def assert_close_top(mine, ref) -> None:
    """Same candidates, log-probabilities within the rounding of Ollama's
    BF16 weights against llama.cpp's F16 ones (measured: about 0.01)."""
    assert [[i for i, _ in step] for step in logprobs(mine)] == [[i for i, _ in step] for step in logprobs(ref)]
    for a, b in zip(logprobs(mine), logprobs(ref), strict=True):
        assert all(abs(x - y) < 0.05 for (_, x), (_, y) in zip(a, b, strict=True)), (a, b)


@needs_fuse
@needs_shared
def test_olmo3_legacy_fails_untranslated():
    r = run_job({"model": str(SHARED / "ollama/olmo3_legacy.gguf"), "actions": []})
    assert not r["ok"] and "olmo3" in r["error"]


@needs_fuse
@needs_shared
def test_olmo3_current_untranslated_adds_a_bos_and_scales_attention_twice(tmp_path, mount_store):
    """What the current form gets wrong although it loads: an extra BOS, and,
    with the same weight bytes and a prompt of token ids (no BOS either way),
    other probabilities than its translated view (the YaRN factor applied twice)."""
    raw, upstream = SHARED / "ollama/olmo3.gguf", SHARED / "upstream/olmo3/model.gguf"
    assert tokenize_all(raw) != tokenize_all(upstream)
    store = tmp_path / "store"
    add_model(store, "olmo3", raw, tag="7b")
    mounted = mount_store(store) / "olmo3:7b/model.gguf"
    ids = tokenize_all(upstream)[0]
    assert ids[0] != 480  # no BOS
    assert logprobs(complete(raw, ids, 1)["top"]) != logprobs(complete(mounted, ids, 1)["top"])


# -- the legacy writer (f63eea3's form): no ../shared needed -------------------------------


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return writer.legacy_olmo3(tmp_path_factory.mktemp("olmo3-writer") / "olmo3.gguf")


written = one_model_store("olmo3", "7b")


@needs_shared
def test_writer_writes_the_converters_form(blob):
    assert form(blob) == form(SHARED / "ollama/olmo3_legacy.gguf")


@needs_fuse
def test_legacy_writer_is_olmo2_through_the_mount_and_generates(blob, written, mount_store):
    mounted = mount_store(written) / "olmo3:7b/model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "olmo2"
    # Every olmo3 key as olmo2's, the YaRN attention factor under llama.cpp's name.
    factor = raw.pop("olmo3.rope.scaling.attn_factor")
    assert factor == pytest.approx(writer.yarn_attn_factor(writer.OLMO3["rope_factor"]))
    want = {k.replace("olmo3.", "olmo2.", 1): v for k, v in raw.items()}
    assert got == {**want, "olmo2.rope.scaling.yarn_attn_factor": factor}
    # The tensors are the blob's.
    assert_same_tensors(mounted, blob)

    r = run_job(
        {
            "model": str(mounted),
            "actions": [
                {"op": "tokenize", "text": "hello world", "add_special": True},
                {"op": "complete", "prompt": "The capital of France is", "n_predict": 4},
            ],
        }
    )
    assert r["ok"], r
    tokenized, complete = r["results"]
    assert tokenized["ids"][0] != raw["tokenizer.ggml.bos_token_id"]  # OLMo adds no BOS
    assert complete["tokens_predicted"] == 4
    assert "olmo3" in load_failure(blob)
