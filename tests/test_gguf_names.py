"""Every translated view speaks gguf-py's vocabulary.

Over every translated view (text and projector) of every fixture in
../shared/fixtures/ollama and every legacy writer (compatfs.testing): each
tensor name is gguf-py's name of a tensor of the view's architecture
(`MODEL_TENSORS`, with a block number where the name has one, and a suffix
llama.cpp's loaders ask for), and each key is one gguf-py names (`Keys`, with
the architecture filled in) or one of the architecture's own (`<arch>.*`).
What is not is listed below, with the llama.cpp build that reads it
(b11434: `src/llama-arch.cpp` names it) or None where no build does.

And the handlers write what llama.cpp reads through gguf-py: run against a
gguf-py whose every name a handler makes (a name the view has and its blob
does not) has moved, the views move with it (`test_made_names_follow_gguf_py`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES, Keys

from compatfs.format.header import SourceGGUF
from compatfs.testing import LEGACY
from compatfs.translate import plan
from compatfs.view.claims import classify

from conftest import ROOT, SHARED

T = MODEL_TENSOR
ARCHS = {MODEL_ARCH_NAMES[a]: a for a in MODEL_ARCH}

# What llama.cpp's loaders append to a tensor's name (`tn(tensor, suffix, bid)`).
SUFFIXES = ("", ".weight", ".bias", ".scale")
# Names with another suffix: tensor -> (suffix, where llama.cpp reads it).
OTHER_SUFFIXES = {
    T.V_ENC_EMBD_PATCH: (
        ".weight.1",
        "b11434 tools/mtmd/clip-impl.h TN_PATCH_EMBD_1: the second temporal frame of a Conv3D patch embedding",
    )
}


@dataclass(frozen=True)
class Departure:
    """Names a view of architecture `arch` (None: of any) holds that gguf-py's
    vocabulary does not give it: tensors (gguf-py's names, of another
    architecture's list) or keys."""

    arch: str | None
    tensors: tuple[MODEL_TENSOR, ...] = ()
    keys: tuple[str, ...] = ()
    build: str | None = None  # the llama.cpp build that reads them; None: none does
    why: str = ""


LAGUNA = (
    T.TOKEN_EMBD,
    T.OUTPUT_NORM,
    T.OUTPUT,
    T.ATTN_NORM,
    T.ATTN_Q,
    T.ATTN_K,
    T.ATTN_V,
    T.ATTN_OUT,
    T.ATTN_Q_NORM,
    T.ATTN_K_NORM,
    T.ATTN_GATE,
    T.FFN_NORM,
    T.FFN_GATE,
    T.FFN_DOWN,
    T.FFN_UP,
    T.FFN_GATE_INP,
    T.FFN_EXP_PROBS_B,
    T.FFN_GATE_EXP,
    T.FFN_DOWN_EXP,
    T.FFN_UP_EXP,
    T.FFN_GATE_SHEXP,
    T.FFN_UP_SHEXP,
    T.FFN_DOWN_SHEXP,
)
MTP = (T.NEXTN_EH_PROJ, T.NEXTN_ENORM, T.NEXTN_HNORM, T.NEXTN_SHARED_HEAD_NORM)

DEPARTURES = (
    Departure(
        "laguna",
        tensors=LAGUNA,
        build="b11434",
        why="LLM_ARCH_LAGUNA (src/llama-arch.cpp, tensors in src/models/laguna.cpp); the gguf-py release "
        "compatfs pins has no laguna architecture",
    ),
    *(
        Departure(
            a,
            tensors=MTP,
            build="b11434",
            why="the multi-token-prediction head, blk.%d.nextn.* (src/models/qwen35.cpp, qwen35moe.cpp); "
            "the pinned gguf-py lists no nextn tensors for Qwen3.5",
        )
        for a in ("qwen35", "qwen35moe")
    ),
    Departure(
        None,
        keys=("tokenizer.ggml.cls_token_id",),
        build="b11434",
        why="LLM_KV_TOKENIZER_CLS_ID (src/llama-arch.cpp, no longer read: the BOS stands for it); gguf-py "
        "dropped the key; Ollama's BERT blobs carry it",
    ),
    Departure(
        None,
        keys=("tokenizer.ggml.eos_token_ids",),
        why="Ollama's list of end-of-generation tokens, which its runner reads; its converters write it and "
        "the llama3 handler sets it with the EOS it changes; llama.cpp reads tokenizer.ggml.eos_token_id",
    ),
    Departure(
        None,
        keys=("tokenizer.ggml.add_padding_token", "tokenizer.ggml.add_unknown_token"),
        why="written by Ollama's converters, passed through, read by llama.cpp never",
    ),
    Departure(
        "clip",
        keys=("clip.has_text_encoder",),
        why="written by llama.cpp's own legacy LLaVA converter (tools/mtmd/legacy-models), which Ollama's "
        "LLaVA projectors come from; clip.cpp reads no text encoder",
    ),
)


def _strings(group: type):
    for value in vars(group).values():
        if isinstance(value, str):
            yield value
        elif isinstance(value, type):
            yield from _strings(value)


def _key_pattern(template: str, arch: str) -> re.Pattern:
    """A gguf-py key as a pattern: `{arch}` the architecture, any other field one component."""
    return re.compile(re.sub(r"\\\{[a-z_]+\\\}", r"[^.]+", re.escape(template.replace("{arch}", arch))))


def _tensor_pattern(t: MODEL_TENSOR) -> re.Pattern:
    suffixes = [*SUFFIXES, *(s for tt, (s, _) in OTHER_SUFFIXES.items() if tt == t)]
    name = re.escape(TENSOR_NAMES[t]).replace(r"\{bid\}", r"\d+")
    return re.compile(name + "(" + "|".join(re.escape(s) for s in suffixes) + ")")


KEY_TEMPLATES = tuple(_strings(Keys))


def vocabulary(arch: str) -> tuple[list[re.Pattern], list[re.Pattern]]:
    """The tensor names and keys a view of `arch` may hold: gguf-py's and the departures'."""
    tensors = list(MODEL_TENSORS.get(ARCHS[arch], ())) if arch in ARCHS else []
    keys = [_key_pattern(k, arch) for k in KEY_TEMPLATES]
    for d in DEPARTURES:
        if d.arch in (None, arch):
            tensors += d.tensors
            keys += [re.compile(re.escape(k)) for k in d.keys]
    return [_tensor_pattern(t) for t in dict.fromkeys(tensors)], keys


def departures_of(arch: str, tensor_names: list[str], keys: list[str]) -> dict:
    """The tensor names and keys of a view of `arch` outside its vocabulary."""
    tensors, key_patterns = vocabulary(arch)
    return {
        "tensors": sorted(n for n in tensor_names if not any(p.fullmatch(n) for p in tensors)),
        "keys": sorted(
            k for k in keys if not k.startswith(arch + ".") and not any(p.fullmatch(k) for p in key_patterns)
        ),
    }


def corpus(d: Path) -> dict[str, Path]:
    """Every legacy writer's blobs and every Ollama fixture: label -> path."""
    blobs = {}
    for label, entry in LEGACY.items():
        blobs[f"writer:{label}"] = entry.model(d / f"{label}.gguf")
        if entry.projector:
            blobs[f"writer:{label}/projector"] = entry.projector(d / f"{label}-proj.gguf")
    if SHARED.is_dir():
        for p in sorted((SHARED / "ollama").glob("*.gguf")):
            blobs[f"ollama:{p.stem}"] = p
    return blobs


def _any_block(name: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".N", name)


def made(spec, source: SourceGGUF) -> list[str]:
    """The tensor names of a view its handler made: those its blob holds in
    no block (a block moved to another number keeps the blob's names), and
    those of tensors it computes (`Produce`: no blob tensor of its own)."""
    held = {_any_block(n) for n in source.tensors}
    return [t.name for t in spec.tensors if _any_block(t.name) not in held or t.source is None]


def views(blobs: dict[str, Path]) -> dict[str, dict]:
    """Every translated view of `blobs`: label#handler -> architecture, tensor
    names, keys, the names its handler made."""
    out = {}
    for label, path in blobs.items():
        info = classify(SourceGGUF(path))
        for tr in (info.text, info.clip):
            if tr is not None:
                spec = plan(tr, info.source)
                kvs = dict(spec.kvs)
                out[f"{label}#{tr.name}"] = {
                    "arch": kvs["general.architecture"].decode(),
                    "tensors": [t.name for t in spec.tensors],
                    "keys": list(kvs),
                    "made": made(spec, info.source),
                }
    return out


@pytest.fixture(scope="module")
def all_views(tmp_path_factory) -> dict[str, dict]:
    return views(corpus(tmp_path_factory.mktemp("names")))


def test_every_view_speaks_gguf_pys_vocabulary(all_views):
    assert len(all_views) >= 30
    unknown = {
        label: v["arch"]
        for label, v in all_views.items()
        if v["arch"] not in ARCHS and not any(d.arch == v["arch"] for d in DEPARTURES)
    }
    assert unknown == {}
    outside = {
        label: found
        for label, v in all_views.items()
        if any((found := departures_of(v["arch"], v["tensors"], v["keys"])).values())
    }
    assert outside == {}


@pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/fixtures is not present: the writers alone do not hold every departure"
)
def test_every_departure_is_needed(all_views):
    """A departure no view has any more (gguf-py caught up, a handler
    changed) is taken off the list."""
    idle = []
    for d in DEPARTURES:
        archs = {v["arch"] for v in all_views.values()} if d.arch is None else {d.arch}
        for t in d.tensors:
            held = (n for v in all_views.values() if v["arch"] in archs for n in v["tensors"])
            pattern = _tensor_pattern(t)
            in_gguf_py = all(arch in ARCHS and t in MODEL_TENSORS[ARCHS[arch]] for arch in archs)
            if in_gguf_py or not any(pattern.fullmatch(n) for n in held):
                idle.append((d.arch, t.name))
        for k in d.keys:
            if not any(k in v["keys"] for v in all_views.values() if v["arch"] in archs):
                idle.append((d.arch, k))
    assert idle == []


def test_a_departure_says_which_build_reads_it():
    for d in DEPARTURES:
        assert d.why and (d.build is None or re.fullmatch(r"b\d+", d.build)), d
        assert d.tensors or d.keys, d
    # The vocabulary is gguf-py's: a made-up name is outside it.
    assert departures_of(
        "gemma3",
        ["blk.0.attn_q.weight", "blk.0.attn_qq.weight", "v.blk.0.ln1.weight"],
        ["gemma3.anything", "general.name", "clip.vision.imagesize", "gemma3n.x"],
    ) == {"tensors": ["blk.0.attn_qq.weight", "v.blk.0.ln1.weight"], "keys": ["clip.vision.imagesize", "gemma3n.x"]}
    assert departures_of("clip", ["v.patch_embd.weight.1", "v.post_ln.weight.1"], []) == {
        "tensors": ["v.post_ln.weight.1"],
        "keys": [],
    }


# -- the handlers take the names they make from gguf-py ------------------------------

MOVED = "_moved"

_MOVED_VIEWS = """
import json, sys
from pathlib import Path
import gguf
from gguf import MODEL_TENSOR, TENSOR_NAMES
for name in json.loads(sys.argv[1]):
    TENSOR_NAMES[MODEL_TENSOR[name]] += "{moved}"
sys.path.insert(0, sys.argv[3])
import test_gguf_names
print(json.dumps(test_gguf_names.views(test_gguf_names.corpus(Path(sys.argv[2])))))
"""


def made_tensors(all_views: dict[str, dict]) -> set[MODEL_TENSOR]:
    """The gguf-py tensors whose names the handlers make."""
    patterns = {
        t: re.compile(re.escape(TENSOR_NAMES[t]).replace(r"\{bid\}", r"\d+") + r"(\..+)?") for t in MODEL_TENSOR
    }
    out = set()
    for v in all_views.values():
        for n in v["made"]:
            out.update(t for t, p in patterns.items() if p.fullmatch(n))
    return out


def test_made_names_follow_gguf_py(all_views, tmp_path):
    """Every name a handler makes is gguf-py's: with those names moved in
    gguf-py (a suffix appended), every view holds the moved names where it
    held the old ones, and nothing else changes."""
    made = made_tensors(all_views)
    assert len(made) > 40
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _MOVED_VIEWS.replace("{moved}", MOVED),
            json.dumps(sorted(t.name for t in made)),
            str(tmp_path),
            str(ROOT / "tests"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests",
        check=True,
    )
    moved = json.loads(run.stdout)
    assert set(moved) == set(all_views)
    patterns = [(re.compile("(" + re.escape(TENSOR_NAMES[t]).replace(r"\{bid\}", r"\d+") + r")(\..+)?")) for t in made]
    not_moved = {}
    for label, v in all_views.items():
        want = []
        for n in v["tensors"]:
            m = next((m for p in patterns if (m := p.fullmatch(n))), None) if n in v["made"] else None
            want.append(n if m is None else m.group(1) + MOVED + (m.group(2) or ""))
        if moved[label]["tensors"] != want:
            not_moved[label] = sorted(set(moved[label]["tensors"]) ^ set(want))[:6]
    assert not_moved == {}


# -- the helpers handlers write names with (compatfs.translate.gguf_names) -----------------------


def test_tensor_names_in_the_forms_a_handler_writes():
    from compatfs.translate import ArchKeys, arch, base, blocks, leaf, tensor

    assert tensor(T.ATTN_Q, 3) == "blk.3.attn_q.weight"
    assert tensor(T.ATTN_Q, "{}", "bias") == "blk.{}.attn_q.bias"  # a template for ProducePerBlock
    assert tensor(T.V_ENC_EMBD_PATCH, suffix="weight.1") == "v.patch_embd.weight.1"
    assert base(T.V_POST_NORM) == "v.post_ln" and base(T.V_MMPROJ, 2) == "mm.2"
    assert leaf(T.V_ENC_ATTN_O) == ".attn_out" and leaf(T.V_SAM_ATTN_OUT) == ".attn.out"
    assert blocks(T.V_SAM_PRE_NORM) == "v.sam.blk."
    with pytest.raises(ValueError, match="ATTN_Q .* without a block"):
        tensor(T.ATTN_Q)
    with pytest.raises(ValueError, match="TOKEN_EMBD .* with a block"):
        tensor(T.TOKEN_EMBD, 0)
    for wrong in (lambda: leaf(T.TOKEN_EMBD), lambda: blocks(T.V_POST_NORM)):
        with pytest.raises(ValueError, match="no block tensor"):
            wrong()
    assert arch(MODEL_ARCH.QWEN2VL) == "qwen2vl" and arch(MODEL_ARCH.GPT_OSS) == "gpt-oss"
    k = ArchKeys("gemma3")
    assert k.Rope.FREQ_BASE == "gemma3.rope.freq_base" and k.LLM.CONTEXT_LENGTH == "gemma3.context_length"
    assert k.Tokenizer.PRE == Keys.Tokenizer.PRE  # no architecture in it
    with pytest.raises(AttributeError):
        _ = k.Rope.NO_SUCH_KEY


def test_rename_end_replaces_only_the_end():
    from gguf import GGMLQuantizationType as DT
    from compatfs.translate import Rename, RenameEnd, ViewTensor

    ts = [ViewTensor(n, (4,), DT.F32) for n in ("blk.0.ssm_dt", "blk.0.ssm_dt.weight", "blk.1.x_ssm_dt", "a.ssm_dt")]
    ts = Rename("a", "b").apply(ts, None)  # renamed once already: left alone
    ts = RenameEnd(".ssm_dt", ".ssm_dt.bias").apply(ts, None)
    assert [t.name for t in ts] == ["blk.0.ssm_dt.bias", "blk.0.ssm_dt.weight", "blk.1.x_ssm_dt", "b.ssm_dt"]
