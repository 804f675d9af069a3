"""Gemma 3n as Ollama's converter wrote it (f63eea3): through the mount,
`model.gguf` equals llama.cpp's conversion of the same weights (the per-layer
embedding padded to the full vocabulary), tokenizes as it does and
generates; untranslated llama.cpp refuses the per-layer embedding.  Then,
in-process, what the fixture lacks: embedded towers, a quantized per-layer
embedding.  Then the legacy writer's blob, which needs no ../shared."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT
from gguf import TokenType as TT

from compatfs import handlers
from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.handlers import gemma3n
from compatfs.view.opcache import OpCache
from compatfs.testing import gemma3n as writer
from compatfs.testing.core import form
from compatfs.translate import first_claim, plan
from compatfs.view.layout import View

from chat import assert_refused
from compare import assert_same_tensors, kvs, tensors
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from ggufs import write_gguf
from xlc_client import run_job

BLOB = SHARED / "ollama/gemma3n.gguf"
UPSTREAM = SHARED / "upstream/gemma3n/model.gguf"
TEXT = "hello world, Hello there!\n\u00e9\u4e16 ok <start_of_turn>user"


store = one_model_store("gemma3n", "e2b", BLOB)


@needs_fuse
@needs_shared
def test_text_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / "gemma3n:e2b/model.gguf"
    got, want, raw = kvs(mounted), kvs(UPSTREAM), kvs(BLOB)
    assert sorted(got) == sorted(want)
    loose = {
        # Float32 rounding of the same normal quantiles (Go's float64 vs torch's float32).
        "gemma3n.activation_sparsity_scale",
        # A scalar where llama.cpp's converter writes one entry per layer; the
        # loader reads either.
        "gemma3n.feed_forward_length",
        # Ollama scored the special tokens 0 and its padding slots -1
        # (llama.cpp's converter: -1000 and -10000); SentencePiece never
        # merges into control or unused tokens.
        "tokenizer.ggml.scores",
        # Checked below.
        "tokenizer.ggml.token_type",
    }
    assert {k: v for k, v in got.items() if k not in loose} == {k: v for k, v in want.items() if k not in loose}
    np.testing.assert_allclose(
        got["gemma3n.activation_sparsity_scale"], want["gemma3n.activation_sparsity_scale"], rtol=1e-6
    )
    assert [got["gemma3n.feed_forward_length"]] * got["gemma3n.block_count"] == want["gemma3n.feed_forward_length"]

    # Token types: the image markers and the padding slots are typed as
    # llama.cpp's converter types them.  Left as Ollama typed them: <unk>
    # (unknown), <mask>, [multimodal] and <unusedN> (normal), which
    # llama.cpp's converter makes control from the checkpoint's
    # tokenizer_config, which the blob does not carry.
    tokens = want["tokenizer.ggml.tokens"]
    got_t, want_t, raw_t = (
        got["tokenizer.ggml.token_type"],
        want["tokenizer.ggml.token_type"],
        raw["tokenizer.ggml.token_type"],
    )
    fixed = {tokens[i] for i in range(len(tokens)) if got_t[i] != raw_t[i]}
    assert {"<start_of_image>", "<end_of_image>", "[PAD512]", "[PAD639]"} <= fixed
    kept = {tokens[i] for i in range(len(tokens)) if got_t[i] != want_t[i]}
    assert kept == {"<unk>", "<mask>", "[multimodal]"} | {t for t in tokens if t.startswith("<unused")}

    assert_same_tensors(mounted, UPSTREAM)
    per_layer = {t.name: t for t in gguf.GGUFReader(mounted).tensors}["per_layer_token_embd.weight"]
    rows = {t.name: t for t in gguf.GGUFReader(BLOB).tensors}["per_layer_token_embd.weight"].shape[1]
    assert not np.asarray(per_layer.data)[rows:].any()


@needs_fuse
@needs_shared
def test_tokenizes_and_generates_as_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / "gemma3n:e2b/model.gguf"
    jobs = [
        {"op": "tokenize", "text": TEXT},
        {"op": "tokenize", "text": "hello"},
        {"op": "props"},
        {"op": "complete", "prompt": "hello", "n_predict": 6},
    ]
    through, reference = (run_job({"model": str(p), "actions": jobs}) for p in (mounted, UPSTREAM))
    assert through["ok"], through.get("error")
    assert reference["ok"], reference.get("error")
    (text, hello, props, complete), (ref_text, ref_hello, ref_props, ref_complete) = (
        through["results"],
        reference["results"],
    )
    assert text["ids"] == ref_text["ids"] and hello["ids"] == ref_hello["ids"]
    assert complete["tokens_predicted"] > 0 and complete["tokens"] == ref_complete["tokens"]
    # <end_of_turn> ends generation (llama.cpp finds it by its text).
    end_of_turn = kvs(UPSTREAM)["tokenizer.ggml.tokens"].index("<end_of_turn>")
    assert end_of_turn in props["eog_ids"] and props["eog_ids"] == ref_props["eog_ids"]

    # Untranslated: llama.cpp refuses the blob (the per-layer embedding's
    # shape; not asserted, the client's copy of llama.cpp's log sometimes
    # misses it), and its tokenizer prepends a space.
    assert not run_job({"model": str(BLOB), "actions": jobs[3:]})["ok"]
    raw = run_job({"model": str(BLOB), "actions": jobs[1:2]})
    assert raw["ok"], raw.get("error")
    assert raw["results"][0]["ids"] != hello["ids"]


@needs_shared
def test_claims_ollama_files_only():
    assert first_claim(handlers.TEXT, SourceGGUF(BLOB)) is gemma3n.TEXT
    assert first_claim(handlers.TEXT, SourceGGUF(UPSTREAM)) is None


# -- what the fixture lacks, in-process ---------------------------------------------------


def q8(a: np.ndarray):
    return gguf.quants.quantize(a.astype(np.float32), DT.Q8_0), DT.Q8_0


def synthetic(path, per_layer_rows: int):
    rng = np.random.default_rng(3)
    return write_gguf(
        path,
        "gemma3n",
        kvs={
            "gemma3n.block_count": 1,
            "gemma3n.rope.freq_base_local": 10000.0,
            "gemma3n.head_dim": 16,
            "tokenizer.ggml.model": "llama",
        },
        tensors={
            "token_embd.weight": rng.standard_normal((12, 32)).astype(np.float16),
            "per_layer_token_embd.weight": q8(rng.standard_normal((per_layer_rows, 64))),
            "v.blk.0.attn_q.weight": rng.standard_normal((8, 8)).astype(np.float16),
            "a.blk.0.attn_q.weight": rng.standard_normal((8, 8)).astype(np.float16),
            "mm.input_projection.weight": rng.standard_normal((8, 8)).astype(np.float16),
        },
    )


def test_towers_hidden_and_quantized_per_layer_embedding_padded(tmp_path):
    src = SourceGGUF(synthetic(tmp_path / "g3n.gguf", per_layer_rows=8))
    spec = plan(gemma3n.TEXT, src)
    assert sorted(t.name for t in spec.tensors) == ["per_layer_token_embd.weight", "token_embd.weight"]
    out = tmp_path / "view.gguf"
    view = View.translated(src, spec, OpCache(), key="k")
    out.write_bytes(view.read(0, view.size))
    padded = {t.name: t for t in gguf.GGUFReader(out).tensors}["per_layer_token_embd.weight"]
    assert padded.tensor_type == DT.Q8_0 and [int(x) for x in padded.shape] == [64, 12]
    values = gguf.quants.dequantize(np.asarray(padded.data), DT.Q8_0)
    stored = {t.name: t for t in gguf.GGUFReader(src.path).tensors}["per_layer_token_embd.weight"]
    np.testing.assert_array_equal(values[:8], gguf.quants.dequantize(np.asarray(stored.data), DT.Q8_0))
    assert not values[8:].any()
    kv = dict(spec.kvs)
    assert kv["gemma3n.rope.freq_base_swa"].decode() == 10000.0 and kv["gemma3n.attention.key_length"].decode() == 16
    assert "gemma3n.rope.freq_base_local" not in kv


def test_per_layer_embedding_longer_than_the_vocabulary_is_refused(tmp_path):
    src = SourceGGUF(synthetic(tmp_path / "g3n.gguf", per_layer_rows=16))
    with pytest.raises(GGUFError, match="per_layer_token_embd"):
        plan(gemma3n.TEXT, src)


# -- the legacy writer (f63eea3's form): no ../shared needed -------------------------------


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return writer.legacy_gemma3n(tmp_path_factory.mktemp("gemma3n-writer") / "gemma3n.gguf")


written = one_model_store("gemma3n", "e2b")


@needs_shared
def test_writer_writes_the_converters_form(blob):
    assert form(blob) == form(BLOB)


@needs_fuse
def test_legacy_writer_translates_and_generates(blob, written, mount_store):
    mounted = mount_store(written) / "gemma3n:e2b/model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    p = writer.GEMMA3N
    # llama.cpp's names for the SWA rope base and head size, its tokenizer settings.
    assert got["gemma3n.rope.freq_base_swa"] == raw["gemma3n.rope.freq_base_local"] == p["rope_freq_base_local"]
    assert got["gemma3n.attention.key_length"] == got["gemma3n.attention.value_length"] == p["head_dim"]
    assert got["gemma3n.final_logit_softcapping"] == 30.0
    assert got["tokenizer.ggml.add_space_prefix"] is False
    dropped = {
        "gemma3n.rope.freq_base_local",
        "gemma3n.head_dim",
        "gemma3n.altup.correct_scale",
        "gemma3n.altup.lr_multiplier",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.eos_token_ids",
        "tokenizer.ggml.add_padding_token",
        "tokenizer.ggml.add_unknown_token",
    }
    assert dropped <= set(raw) and not dropped & set(got)
    # The image markers control, the image/audio slots named by id and unused.
    tokens, types, raw_types = (
        got["tokenizer.ggml.tokens"],
        got["tokenizer.ggml.token_type"],
        raw["tokenizer.ggml.token_type"],
    )
    assert [types[tokens.index(t)] for t in ("<start_of_image>", "<end_of_image>")] == [TT.CONTROL] * 2
    n_text = writer.gemma3n_tokens()[4]
    assert tokens[n_text:] == [f"[PAD{i}]" for i in range(n_text, p["n_vocab"])]
    assert set(types[n_text:]) == {TT.UNUSED} and set(raw_types[n_text:]) == {TT.USER_DEFINED}

    # The per-layer embedding: the blob's rows, then zero rows up to the vocabulary.
    mine, theirs = tensors(mounted), tensors(blob)
    assert sorted(mine) == sorted(theirs)
    padded, stored = (
        np.asarray(mine["per_layer_token_embd.weight"].data),
        np.asarray(theirs["per_layer_token_embd.weight"].data),
    )
    assert padded.shape == (p["n_vocab"], stored.shape[1]) and stored.shape[0] == n_text
    np.testing.assert_array_equal(padded[:n_text], stored)
    assert not padded[n_text:].any()
    assert all(bytes(mine[n].data) == bytes(theirs[n].data) for n in theirs if n != "per_layer_token_embd.weight")

    hello = {"op": "tokenize", "text": "hello"}
    r = run_job(
        {
            "model": str(mounted),
            "actions": [{"op": "props"}, hello, {"op": "complete", "prompt": "hello", "n_predict": 4}],
        }
    )
    assert r["ok"], r
    props, ids, complete = r["results"]
    assert tokens.index("<end_of_turn>") in props["eog_ids"]
    assert complete["tokens_predicted"] == 4
    # Untranslated: the per-layer embedding is refused (where llama.cpp's log
    # is captured, for its shape), and a space is prepended.
    assert_refused(run_job({"model": str(blob)}), "per_layer_token_embd")
    untranslated = run_job({"model": str(blob), "actions": [hello]})
    assert untranslated["ok"], untranslated
    assert untranslated["results"][0]["ids"] != ids["ids"]
