"""EmbeddingGemma blobs in the form Ollama first published them (the legacy
form of `handlers/embeddinggemma.py`).

No converter in Ollama's public history wrote this form: embeddinggemma:300m
was published with commit 5994e8e8f (2025-09-04, "embedding gemma model"),
which added only the reader, and Ollama's converter learnt EmbeddingGemma
(as `gemma-embedding`) in 9db4bdbad (2026-05-29).  The layout is therefore
the one that reader and Ollama's compat handler (cd2dcaff4, 2026-04-19,
`llama/compat/llama-ollama-compat.cpp`) describe, with the text model's keys
as the Gemma 3 converter of the time wrote them:

* `model/models/gemma3/embed.go` at 5994e8e8f: a `gemma3` file; the
  sentence-transformers head as `dense.0.weight`/`dense.1.weight` (`gguf:"dense"`),
  `<arch>.pooling_type`; `token_embd`, `blk.N.*`, `output_norm` as for Gemma 3.
* cd2dcaff4: "embeddinggemma:300m files use general.architecture=gemma3 and two
  extra dense layers stored as dense.0.weight / dense.1.weight"; no
  `rope.freq_base_swa` (the handler supplies it).
* `convert/convert_gemma3.go` (f63eea3, 2026-05-24, unchanged for the top-level
  config since 80c7ce381), the Gemma3ForCausalLM branch, which reads the same
  top-level config fields a Gemma3TextModel config has: `rope.freq_base` and
  `rope.local.freq_base`, `attention.key_length`/`value_length`,
  `attention.sliding_window`, `attention.sliding_window_pattern` from
  `layer_types`; no softcapping key (EmbeddingGemma has none).
* `convert/convert.go` ModelParameters.KV and `tokenizer_spm.go` at f63eea3:
  `add_<type>_token` for every special token (`add_padding_token`,
  `add_unknown_token`), merges, `pre` "default", SentencePiece types.

`legacy_embeddinggemma(path, weights_from=blob)` takes the weights, the
tokenizer and the hyperparameters from a current-form Ollama blob (Ollama's
converter after 9db4bdbad, e.g. the shared fixture), so that its translation
is comparable with llama.cpp's conversion of the same checkpoint; without
it the weights are seeded random in the shapes of that fixture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .core import Dims, T, normal, write
from .gemma3 import gemma3_hparams, gemma3_tokens


EMBEDDINGGEMMA: Dims = dict(
    n_layer=6,
    n_embd=96,
    n_ff=144,
    n_head=3,
    n_head_kv=1,
    head_dim=32,
    n_dense=384,
    context_length=2048,
    sliding_window=512,
    rope_base=1_000_000.0,
    rope_local=10_000.0,
    eps=1e-6,
    pooling_type=1,
    bos=2,
    eos=1,
    pad=0,
    unk=3,
)
CURRENT_ARCH = "gemma-embedding"
GLOBAL_EVERY = 6  # Gemma 3's layer_types: every sixth layer attends globally


def _from_current(blob: Path) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, T]]]:
    """Hyperparameters, tokenizer and tensors of a current-form blob, under the legacy names."""
    r = gguf.GGUFReader(blob)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if fields.get("general.architecture") != CURRENT_ARCH:
        raise ValueError(f"{blob}: not a {CURRENT_ARCH} file")
    p = {
        "n_layer": fields[f"{CURRENT_ARCH}.block_count"],
        "context_length": fields[f"{CURRENT_ARCH}.context_length"],
        "n_embd": fields[f"{CURRENT_ARCH}.embedding_length"],
        "n_ff": fields[f"{CURRENT_ARCH}.feed_forward_length"],
        "n_head": fields[f"{CURRENT_ARCH}.attention.head_count"],
        "n_head_kv": fields[f"{CURRENT_ARCH}.attention.head_count_kv"],
        "head_dim": fields[f"{CURRENT_ARCH}.attention.key_length"],
        "sliding_window": fields[f"{CURRENT_ARCH}.attention.sliding_window"],
        "rope_base": fields[f"{CURRENT_ARCH}.rope.freq_base"],
        "rope_local": fields[f"{CURRENT_ARCH}.rope.freq_base_swa"],
        "eps": fields[f"{CURRENT_ARCH}.attention.layer_norm_rms_epsilon"],
        "pooling_type": fields[f"{CURRENT_ARCH}.pooling_type"],
        "tokenizer": {k: v for k, v in fields.items() if k.startswith("tokenizer.")},
    }
    names = {"dense_2.weight": "dense.0.weight", "dense_3.weight": "dense.1.weight"}
    tensors = {}
    for t in r.tensors:
        if t.tensor_type not in (T.F16, T.F32):
            raise ValueError(f"{blob}: {t.name} is {t.tensor_type.name}")
        tensors[names.get(t.name, t.name)] = (np.asarray(t.data, dtype=np.float32), T(t.tensor_type))
    return p, tensors


def _seeded(seed: int) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, T]]]:
    """Random weights in the fixture's shapes, with the Gemma 3 test vocabulary."""
    d = EMBEDDINGGEMMA
    rng = np.random.default_rng(seed)
    toks, scores, types, merges = gemma3_tokens()
    p: dict[str, Any] = {
        **d,
        "tokenizer": {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": d["bos"],
            "tokenizer.ggml.eos_token_id": d["eos"],
            "tokenizer.ggml.padding_token_id": d["pad"],
            "tokenizer.ggml.unknown_token_id": d["unk"],
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": True,
        },
    }
    E, F, hd, D = d["n_embd"], d["n_ff"], d["head_dim"], d["n_dense"]

    def norm(n: int) -> tuple[np.ndarray, T]:  # Gemma RMSNorm weight, +1 applied as Ollama stored it
        return (1.0 + normal(rng, (n,), 0.05)).astype(np.float32), T.F32

    t = {"token_embd.weight": (normal(rng, (len(toks), E), 0.05), T.F16), "output_norm.weight": norm(E)}
    for i in range(d["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_q.weight"] = (normal(rng, (d["n_head"] * hd, E), 0.05), T.F16)
        t[b + "attn_k.weight"] = (normal(rng, (d["n_head_kv"] * hd, E), 0.05), T.F16)
        t[b + "attn_v.weight"] = (normal(rng, (d["n_head_kv"] * hd, E), 0.05), T.F16)
        t[b + "attn_output.weight"] = (normal(rng, (E, d["n_head"] * hd), 0.05), T.F16)
        for n, size in (
            ("attn_q_norm", hd),
            ("attn_k_norm", hd),
            ("attn_norm", E),
            ("post_attention_norm", E),
            ("ffn_norm", E),
            ("post_ffw_norm", E),
        ):
            t[b + n + ".weight"] = norm(size)
        t[b + "ffn_gate.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_up.weight"] = (normal(rng, (F, E), 0.05), T.F16)
        t[b + "ffn_down.weight"] = (normal(rng, (E, F), 0.05), T.F16)
    t["dense.0.weight"] = (normal(rng, (D, E), 0.05), T.F16)  # HF Linear(E -> D): (out, in)
    t["dense.1.weight"] = (normal(rng, (E, D), 0.05), T.F16)
    return p, t


def legacy_embeddinggemma(path: Path, seed: int = 0, *, weights_from: Path | None = None) -> Path:
    """EmbeddingGemma as a `gemma3` blob with `dense.0`/`dense.1` (see the module docstring).

    Untranslated llama.cpp loads it as Gemma 3 and refuses the two dense
    tensors (wrong number of tensors)."""
    p, tensors = _from_current(Path(weights_from)) if weights_from is not None else _seeded(seed)
    kvs: dict[str, Any] = {
        **gemma3_hparams(p),
        "gemma3.attention.layer_norm_rms_epsilon": float(p["eps"]),
        "gemma3.attention.sliding_window_pattern": [(i + 1) % GLOBAL_EVERY != 0 for i in range(p["n_layer"])],
        "gemma3.rope.freq_base": float(p["rope_base"]),
        "gemma3.rope.local.freq_base": float(p["rope_local"]),
        "gemma3.pooling_type": p["pooling_type"],
        **p["tokenizer"],
        # ModelParameters.KV wrote add_<type>_token for every special token.
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.ggml.add_unknown_token": False,
    }
    return write(path, "gemma3", kvs, tensors, ollama_order=True)
