"""Which handler claims which blob: every handler against every fixture in
../shared/fixtures, every legacy writer's output and near misses made here,
one table; no blob claimed by two translations of a table but the listed
overlaps, which go to the translation dispatched first.  llama.cpp's
own conversions are never claimed; every `Rename` of a handler renames
something in at least one blob it claims; every translation plans."""

from pathlib import Path

import numpy as np
import pytest

from compatfs import handlers
from compatfs.format.header import SourceGGUF
from compatfs.testing import LEGACY
from compatfs.translate import Rename, plan
from compatfs.view.claims import classify

from conftest import SHARED
from ggufs import write_gguf

# Genuine Ollama conversions: file -> (text handler, clip handler).
OLLAMA = {
    "embeddinggemma": ("embeddinggemma", None),
    "gemma3": ("gemma3", None),
    "gemma3_vision": ("gemma3", "gemma3-clip"),
    "gemma3n": ("gemma3n", None),
    "gemma4_vision": ("gemma4", "gemma4-clip"),
    "glm4_moe_lite": (None, None),
    "glm4_moe_lite_legacy": ("glm4moelite", None),
    "gpt_oss": ("gptoss", None),
    "lfm2": ("lfm2", None),
    "llama3": (None, None),
    "mistral3": ("mistral3", "mistral3-clip"),
    "nemotron_h": (None, None),
    "olmo3": ("olmo3", None),
    "olmo3_legacy": ("olmo3", None),
    "qwen2_5_vl": ("qwen25vl", "qwen25vl-clip"),
    "qwen3_5_legacy": ("qwen35", "qwen35-clip"),
    "qwen3_vl_legacy": ("qwen3vl", "qwen3vl-clip"),
}

# The legacy writers' models (compatfs.testing.LEGACY): name -> (text, clip)
# of the model blob, and of the projector blob where there is one.
WRITERS = {
    "gemma3": ("gemma3", None),
    "gemma3-vision": ("gemma3", "gemma3-clip"),
    "llama3.1": ("llama3", None),
    "llava": (None, None),
    "llava/projector": (None, "llava-mlp"),
    "embeddinggemma": ("embeddinggemma", None),
    "snowflake-arctic-embed2": ("bert", None),
    "qwen3-next": ("qwen3next", None),
    "qwen3-next-q35": ("qwen3next", None),
    "laguna": ("laguna", None),
    "deepseek-ocr": ("deepseekocr", "deepseekocr-clip"),
    "nemotron-3-super": ("nemotron_h_moe", None),
    "nemotron3": ("nemotron_h_omni", "nemotron_h_omni-clip"),
    "llama4": ("llama4", "llama4-clip"),
    "glm-ocr": ("glmocr", "glmocr-clip"),
    "qwen3-vl": ("qwen3vlmoe", "qwen3vlmoe-clip"),
    "qwen3.5": ("qwen35moe", "qwen35moe-clip"),
    "gemma4-moe": ("gemma4", "gemma4-clip"),
    "gpt-oss": ("gptoss", None),
    "gpt-oss-mxfp4": ("gptoss", None),
    "gemma3n": ("gemma3n", None),
    "glm-4.7-flash": ("glm4moelite", None),
    "lfm2": ("lfm2", None),
    "mistral-small3.1": ("mistral3", "mistral3-clip"),
    "olmo-3": ("olmo3", None),
    "qwen2.5vl": ("qwen25vl", "qwen25vl-clip"),
}

# Layouts no fixture has, written here: Gemma 4's audio conformer (with a
# vision tower, as in the published models) and the older per-expert scale,
# as Ollama's converter names them; LFM2's older `output_norm`.
GEMMA4_AUDIO = (
    "a.pre_encode.out.weight",
    "mm.a.fc.weight",
    "a.blk.0.ln1.weight",
    "a.blk.0.ln2.weight",
    "a.blk.0.layer_pre_norm.weight",
    "a.blk.0.linear_pos.weight",
    "v.blk.0.attn_q.weight",
    "blk.0.ffn_gate_inp.per_expert_scale",
)


# Near misses: blobs at the edges of the detectors, made here: label ->
# (architecture, KVs, tensor names, (text, clip) claims).
NEAR_MISSES = {
    "qwen35moe with ssm_ba and image_token_id": (
        "qwen35moe",
        {"qwen35moe.image_token_id": 5},
        ("blk.0.ssm_ba.weight",),
        ("qwen35moe", None),
    ),
    "qwen35moe with ssm_ba and reordered V heads": (
        "qwen35moe",
        {"qwen35moe.ssm.v_head_reordered": True},
        ("blk.0.ssm_ba.weight",),
        ("qwen35moe", None),
    ),
    "qwen35moe with ssm_ba only": ("qwen35moe", {}, ("blk.0.ssm_ba.weight",), ("qwen3next", None)),
    "qwen35moe with ssm_ba and an MTP head": ("qwen35moe", {}, ("blk.0.ssm_ba.weight", "mtp.fc.weight"), (None, None)),
    "qwen35moe with ssm_ba and vision": (
        "qwen35moe",
        {},
        ("blk.0.ssm_ba.weight", "v.blk.0.attn_q.weight"),
        ("qwen35moe", "qwen35moe-clip"),
    ),
    "qwen3next with a scalar KV head count": (
        "qwen3next",
        {"qwen3next.attention.head_count_kv": 2},
        ("blk.0.ssm_a",),
        (None, None),
    ),
    "gemma3 with a projection head and a vision tower": (
        "gemma3",
        {},
        ("dense.0.weight", "v.blk.0.attn_q.weight"),
        ("embeddinggemma", None),
    ),
    "gemma-embedding with add_space_prefix": (
        "gemma-embedding",
        {"tokenizer.ggml.add_space_prefix": False},
        ("token_embd.weight",),
        (None, None),
    ),
    "gemma4 named llama, no towers": (
        "gemma4",
        {"tokenizer.ggml.model": "llama"},
        ("token_embd.weight",),
        ("gemma4", None),
    ),
    "qwen3vl with sections": (
        "qwen3vl",
        {"qwen3vl.rope.dimension_sections": [24, 20, 20, 0]},
        ("v.blk.0.attn_q.weight",),
        (None, None),
    ),
    "olmo2 with the attention factor": (
        "olmo2",
        {"olmo2.rope.scaling.attn_factor": 1.2},
        ("token_embd.weight",),
        ("olmo3", None),
    ),
    "olmo2 as llama.cpp writes it": (
        "olmo2",
        {"olmo2.rope.scaling.yarn_attn_factor": 1.2},
        ("token_embd.weight",),
        (None, None),
    ),
    "glm4moelite before MLA": (
        "glm4moelite",
        {"glm4moelite.attention.key_length": 192},
        ("blk.0.attn_kv_b.weight",),
        (None, None),
    ),
    "nemotron_h_moe with latents in a late block": (
        "nemotron_h_moe",
        {},
        ("blk.7.ffn_latent_in.weight",),
        ("nemotron_h_moe", None),
    ),
    "clip with a projector type": (
        "clip",
        {"clip.has_vision_encoder": True, "clip.projector_type": "mlp"},
        ("mm.0.weight",),
        (None, None),
    ),
    "mistral3 without rope scaling": (
        "mistral3",
        {"mistral3.rope.scaling.type": "default"},
        ("token_embd.weight",),
        ("mistral3", None),
    ),
    "lfm2 with both norms": ("lfm2", {}, ("output_norm.weight", "token_embd_norm.weight"), (None, None)),
    "llama4 as llama.cpp writes it": ("llama4", {"tokenizer.ggml.pre": "llama4"}, ("token_embd.weight",), (None, None)),
}


def claims(path: Path) -> tuple:
    info = classify(SourceGGUF(path))
    return (info.text.name if info.text else None, info.clip.name if info.clip else None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """Every blob of the table: label -> path."""
    d = tmp_path_factory.mktemp("claims")
    blobs = {}
    for name, entry in LEGACY.items():
        blobs[f"writer:{name}"] = entry.model(d / f"{name}.gguf")
        if entry.projector:
            blobs[f"writer:{name}/projector"] = entry.projector(d / f"{name}-proj.gguf")
    blobs["synthetic:gemma4-audio"] = write_gguf(
        d / "gemma4-audio.gguf",
        "gemma4",
        kvs={"gemma4.block_count": 1, "gemma4.audio.block_count": 1, "gemma4.vision.block_count": 1},
        tensors={n: np.ones(4, dtype=np.float32) for n in GEMMA4_AUDIO},
    )
    blobs["synthetic:lfm2-output-norm"] = write_gguf(
        d / "lfm2-old.gguf", "lfm2", tensors={"output_norm.weight": np.ones(4, dtype=np.float32)}
    )
    for i, (label, (arch, kvs, names, _)) in enumerate(NEAR_MISSES.items()):
        blobs[f"near:{label}"] = write_gguf(
            d / f"near{i}.gguf", arch, kvs=kvs, tensors={n: np.ones(4, dtype=np.float32) for n in names}
        )
    if SHARED.is_dir():
        for p in sorted((SHARED / "ollama").glob("*.gguf")):
            blobs[f"ollama:{p.stem}"] = p
        for p in sorted((SHARED / "upstream").glob("*/*.gguf")):
            blobs[f"upstream:{p.parent.name}/{p.name}"] = p
    return blobs


def test_writers_are_claimed_as_the_table_says(corpus):
    assert set(WRITERS) == {k.split(":", 1)[1] for k in corpus if k.startswith("writer:")}
    assert {name: claims(corpus[f"writer:{name}"]) for name in WRITERS} == WRITERS


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/fixtures is not present")
def test_shared_fixtures_are_claimed_as_the_table_says(corpus):
    got = {k.split(":", 1)[1]: claims(p) for k, p in corpus.items() if k.startswith("ollama:")}
    assert got == OLLAMA
    upstream = {k: claims(p) for k, p in corpus.items() if k.startswith("upstream:")}
    assert upstream and all(c == (None, None) for c in upstream.values()), upstream


def test_near_misses_are_claimed_as_the_table_says(corpus):
    got = {k.split(":", 1)[1]: claims(p) for k, p in corpus.items() if k.startswith("near:")}
    assert got == {label: want for label, (*_, want) in NEAR_MISSES.items()}


def claimed_by(src: SourceGGUF, table) -> list[str]:
    return [tr.name for tr in table if tr.claims(src)]


def test_no_blob_is_claimed_twice_but_as_listed(corpus):
    """At most one text and one clip translation claim each blob of the
    corpus; the exceptions are `handlers.OVERLAPS`, and each of them occurs."""
    allowed = {frozenset((first, other)) for first, other, *_ in handlers.OVERLAPS}
    twice, seen = {}, set()
    for label, path in corpus.items():
        src = SourceGGUF(path)
        for table in (handlers.TEXT, handlers.CLIP):
            names = claimed_by(src, table)
            if len(names) > 1:
                if frozenset(names) in allowed and len(names) == 2:
                    seen.add(frozenset(names))
                else:
                    twice[label] = names
    assert twice == {}
    assert seen == allowed


def test_listed_overlaps_go_to_the_translation_named_first(corpus):
    """Fails when the dispatch order puts the other first."""
    order = [tr.name for tr in handlers.TEXT + handlers.CLIP]
    for first, other, *_ in handlers.OVERLAPS:
        assert order.index(first) < order.index(other), (first, other)
        for label, path in corpus.items():
            src = SourceGGUF(path)
            if {first, other} <= set(claimed_by(src, handlers.TEXT + handlers.CLIP)):
                assert classify(src).text.name == first, label


@pytest.mark.skipif(
    not SHARED.is_dir(),
    reason="../shared/fixtures is not present: the writers alone do not hold every form a rename is for",
)
def test_every_rename_renames_something_it_claims(corpus):
    used: dict[str, set] = {}
    for path in corpus.values():
        info = classify(SourceGGUF(path))
        for tr in (info.text, info.clip):
            if tr is not None:
                spec = plan(tr, info.source)
                renames = [e for e in tr.tensors if isinstance(e, Rename)]
                used.setdefault(tr.name, set()).update(r for r in renames if r not in spec.idle_renames)
    idle = {
        tr.name: [r for r in tr.tensors if isinstance(r, Rename) and r not in used.get(tr.name, set())]
        for tr in handlers.TEXT + handlers.CLIP
    }
    assert {name: rules for name, rules in idle.items() if rules} == {}


def test_an_edit_in_the_wrong_list_fails_when_the_handler_is_defined():
    from compatfs.translate import ALWAYS, Default, Hide, Translation
    from compatfs.format.values import u32

    with pytest.raises(TypeError, match=r"Hide.*in kv is not a KV edit"):
        Translation("bad", ALWAYS, kv=(Hide(("v.",)),))
    with pytest.raises(TypeError, match=r"Default.*in tensors is not a tensor edit"):
        Translation("bad", ALWAYS, tensors=(Default("k", u32(1)),))
    Translation("good", ALWAYS, kv=(Default("k", u32(1)),), tensors=(Hide(("v.",)),))


def test_every_translated_text_view_has_an_architecture_llama_cpp_knows(corpus):
    """So that `compatfs ls` never says a translated model will not load."""
    from compatfs.cli.verdict import KNOWN_ARCHS

    archs = {}
    for label, path in corpus.items():
        info = classify(SourceGGUF(path))
        if info.text is not None:
            kvs = dict(plan(info.text, info.source).kvs)
            archs[label] = kvs["general.architecture"].decode()
    assert archs and {k: a for k, a in archs.items() if a not in KNOWN_ARCHS} == {}
