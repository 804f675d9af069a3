"""What a manifest carries besides weights: the params, template, system and
license layers beside model.gguf; `compatfs llama-args` and `compatfs run`
from them; `compatfs ls`'s verdict on whether stock llama.cpp loads a model."""

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.format.params import Limits
from compatfs.router.params import flag_argv, translate_params
from compatfs.testing import gemma3, llama, llava
from compatfs.testing.core import T, write
from compatfs.testing.store import add_model, set_layer

import llamacpp
from conftest import needs_fuse

PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
LICENSE = "application/vnd.ollama.image.license"

# As Ollama writes them: params as the JSON object of a Modelfile's PARAMETER
# lines, template and system as plain text.
LLAMA3_PARAMS = b'{"num_ctx":8192,"stop":["<|start_header_id|>","<|end_header_id|>","<|eot_id|>"],"temperature":0.6}'
LLAMA3_TEMPLATE = (
    b"{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
    b"<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>"
)


def compatfs(*args, env=None, check=True):
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


def add_layers(root: Path, manifest: Path, layers: list[tuple[str, bytes]]) -> None:
    """Append layers (media type, content) to a manifest, their blobs by digest."""
    for media_type, data in layers:
        set_layer(root, manifest, media_type, data, append=True)


def mllama_blob(path: Path) -> Path:
    """A tiny blob of architecture `mllama` (llama3.2-vision as Ollama stores it)."""
    import numpy as np

    rng = np.random.default_rng(0)
    kvs = {
        "mllama.block_count": 1,
        "mllama.context_length": 128,
        "mllama.embedding_length": 8,
        "mllama.feed_forward_length": 16,
        "mllama.attention.head_count": 2,
        "mllama.attention.cross_attention_layers": [0],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b"],
        "tokenizer.ggml.token_type": [1, 1],
    }
    tensors = {"token_embd.weight": (rng.standard_normal((2, 8)), T.F32), "blk.0.attn_norm.weight": (np.ones(8), T.F32)}
    return write(path, "mllama", kvs, tensors, ollama_order=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("layers")
    root = d / "store"
    m = add_model(root, "llama3.1", llama.legacy_llama3_instruct(d / "l3.gguf"), tag="8b")
    add_layers(
        root,
        m,
        [
            (TEMPLATE, LLAMA3_TEMPLATE),
            (PARAMS, LLAMA3_PARAMS),
            (SYSTEM, b"You are a helpful assistant."),
            (LICENSE, b"LLAMA 3.1 COMMUNITY LICENSE AGREEMENT\n"),
            (LICENSE, b"Acceptable Use Policy\n"),
        ],
    )
    v = add_model(root, "gemma3", gemma3.legacy_gemma3_vision(d / "g4.gguf"), tag="4b")
    add_layers(
        root,
        v,
        [(PARAMS, b'{"stop":["<end_of_turn>"],"temperature":1,"top_k":64,"top_p":0.95,"use_mmap":false,"tfs_z":1}')],
    )
    add_model(root, "llava", llama.plain_llama_text(d / "t.gguf"), llava.legacy_llava_projector(d / "p.gguf"), tag="7b")
    add_model(root, "llama3.2-vision", mllama_blob(d / "mllama.gguf"), tag="11b")
    return root


# -- the layer files -----------------------------------------------------------


@needs_fuse
def test_layer_files_are_the_blobs_byte_for_byte(store, mount_store):
    m = mount_store(store)
    d = m / "llama3.1:8b"
    assert sorted(os.listdir(d)) == ["license", "license-2", "model.gguf", "params.json", "system", "template"]
    assert (d / "params.json").read_bytes() == LLAMA3_PARAMS
    assert (d / "template").read_bytes() == LLAMA3_TEMPLATE
    assert (d / "system").read_bytes() == b"You are a helpful assistant."
    assert (d / "license-2").read_bytes() == b"Acceptable Use Policy\n"
    assert (d / "params.json").stat().st_size == len(LLAMA3_PARAMS)
    assert os.stat(d / "template").st_mode & 0o222 == 0
    with pytest.raises(OSError):
        open(d / "params.json", "r+b")
    # Layers are not GGUF blobs: no blobs/ directory for them.
    blobs = set(os.listdir(m / "blobs"))
    assert "sha256-" + hashlib.sha256(LLAMA3_PARAMS).hexdigest() not in blobs
    assert sorted(os.listdir(m / "gemma3:4b")) == ["mmproj.gguf", "model.gguf", "params.json"]
    assert sorted(os.listdir(m / "llava:7b")) == ["mmproj.gguf", "model.gguf"]


# -- params -> llama-server flags ------------------------------------------------


def test_params_as_ollama_writes_them_become_llama_server_flags():
    out = translate_params(json.loads(LLAMA3_PARAMS), Limits(8, 8192, 33))
    assert out.argv == [
        "--ctx-size",
        "8192",
        "--reverse-prompt",
        "<|start_header_id|>",
        "--reverse-prompt",
        "<|end_header_id|>",
        "--reverse-prompt",
        "<|eot_id|>",
        "--temp",
        "0.6",
    ]
    assert out.notes == []


def test_every_current_ollama_option_and_what_has_no_equivalent():
    params = {
        "num_ctx": 4096,
        "num_batch": 512,
        "num_gpu": 99,
        "main_gpu": 1,
        "num_thread": 8,
        "num_keep": 24,
        "seed": 42,
        "num_predict": 128,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "temperature": 0.8,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "stop": "###",
        "use_mmap": False,
        "use_mlock": True,
        "mirostat": 2,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "penalize_newline": True,
        "draft_num_predict": 4,
        "num_ctx_typo": 1,
    }
    out = translate_params(params, Limits(8, 4096, 100))
    pairs = dict(zip(out.argv[::2], out.argv[1::2], strict=True))
    assert pairs == {
        "--ctx-size": "4096",
        "--batch-size": "512",
        "--n-gpu-layers": "99",
        "--main-gpu": "1",
        "--threads": "8",
        "--keep": "24",
        "--seed": "42",
        "--n-predict": "128",
        "--top-k": "40",
        "--top-p": "0.9",
        "--min-p": "0.05",
        "--typical": "1.0",
        "--repeat-last-n": "64",
        "--temp": "0.8",
        "--repeat-penalty": "1.1",
        "--presence-penalty": "0.5",
        "--frequency-penalty": "0.25",
        "--reverse-prompt": "###",
        "--load-mode": "mlock",
        "--mirostat": "2",
        "--mirostat-ent": "5.0",
        "--mirostat-lr": "0.1",
    }
    noted = sorted(n.split("=")[0].split()[1] for n in out.notes)
    assert noted == ["draft_num_predict", "num_ctx_typo", "penalize_newline"]


def test_bad_values_are_reported_not_passed():
    out = translate_params({"num_ctx": "lots", "temperature": 0.7, "stop": [1, 2], "use_mmap": "no"})
    assert out.argv == ["--temp", "0.7"]
    assert len(out.notes) == 3 and all("not passed" in n for n in out.notes)


def test_llama_server_knows_every_flag_we_emit():
    from compatfs.format.params import OPTIONS

    text = llamacpp.source("common/arg.cpp").read_text()
    sample = {"stop": ["x"], "numa": True}
    flags = {f for key, opt in OPTIONS.items() for f in flag_argv(opt, sample.get(key, 1))[::2]}
    flags |= {"--load-mode", "-m", "--mmproj"}
    missing = [f for f in sorted(flags) if f'"{f}"' not in text]
    assert not missing, missing


def test_llama_args_for_a_model(store, tmp_path):
    res = compatfs("llama-args", "llama3.1:8b", "--source", store, "--mount", "/mnt/compat")
    argv = shlex.split(res.stdout)
    assert argv[:2] == ["-m", "/mnt/compat/llama3.1:8b/model.gguf"] and "--mmproj" not in argv
    assert argv[argv.index("--ctx-size") + 1] == "8192" and argv[argv.index("--temp") + 1] == "0.6"
    assert argv.count("--reverse-prompt") == 3
    # Its template and system layers are model.gguf's chat template: nothing says they are not applied.
    assert res.stderr == "", res.stderr
    g = json.loads(compatfs("llama-args", "gemma3:4b", "--source", store, "--mount", "/m", "--json").stdout)
    assert g["args"][:4] == ["-m", "/m/gemma3:4b/model.gguf", "--mmproj", "/m/gemma3:4b/mmproj.gguf"]
    assert g["args"][g["args"].index("--load-mode") + 1] == "none"
    assert any("tfs_z" in n for n in g["not_passed"])
    lines = compatfs("llama-args", "llava:7b", "--source", store, "--mount", "/m", "--lines").stdout.splitlines()
    assert lines == ["-m", "/m/llava:7b/model.gguf", "--mmproj", "/m/llava:7b/mmproj.gguf"]
    bad = compatfs("llama-args", "nosuch", "--source", store, "--mount", "/m", check=False)
    assert bad.returncode == 1 and bad.stderr.strip() == f"compatfs: error: no model nosuch:latest in {store}"


@needs_fuse
def test_run_execs_llama_server_on_the_mounted_files(store, mount_store, tmp_path):
    m = mount_store(store)
    fake = tmp_path / "llama-server"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    res = compatfs("run", "llama3.1:8b", "--source", store, "--llama-server", fake, "--", "--port", "8081")
    argv = res.stdout.splitlines()
    assert argv[:2] == ["-m", str(m / "llama3.1:8b/model.gguf")]  # found the mount by itself
    assert argv[-2:] == ["--port", "8081"] and "--ctx-size" in argv
    # The mounted model really is what -m names.
    assert Path(argv[1]).read_bytes()[:4] == b"GGUF"
    env = {"PATH": str(tmp_path)}
    on_path = compatfs("run", "gemma3:4b", "--source", store, "--mount", m.path, env=env)
    assert on_path.stdout.splitlines()[:4] == [
        "-m",
        str(m / "gemma3:4b/model.gguf"),
        "--mmproj",
        str(m / "gemma3:4b/mmproj.gguf"),
    ]
    missing = compatfs(
        "run",
        "gemma3:4b",
        "--source",
        store,
        "--mount",
        m.path,
        "--llama-server",
        "/nonexistent/llama-server",
        check=False,
    )
    assert missing.returncode == 1 and "/nonexistent/llama-server: not an executable file" in missing.stderr


# -- ls: will stock llama.cpp load it? ----------------------------------------------


def test_ls_says_whether_llama_cpp_loads_each_model(store):
    doc = json.loads(compatfs("ls", store, "--json").stdout)
    rows = {r["name"]: r for r in doc["models"]}
    assert rows["llama3.1:8b"]["loads"]["model.gguf"] == {
        "loads": "translated",
        "handler": "llama3",
        "reason": None,
        "adds": ["general.sampling.temp", "tokenizer.chat_template"],
    }
    assert rows["gemma3:4b"]["loads"]["mmproj.gguf"]["handler"] == "gemma3-clip"
    assert rows["llava:7b"]["loads"]["model.gguf"]["loads"] == "as-is"
    assert rows["llava:7b"]["loads"]["mmproj.gguf"] == {
        "loads": "translated",
        "handler": "llava-mlp",
        "reason": None,
        "adds": [],
    }
    mllama = rows["llama3.2-vision:11b"]["loads"]["model.gguf"]
    assert mllama["loads"] == "no" and "'mllama' is not in llama.cpp" in mllama["reason"]
    text = compatfs("ls", store).stdout
    line = next(x for x in text.splitlines() if x.startswith("llama3.2-vision:11b"))
    assert line.endswith("no: architecture 'mllama' is not in llama.cpp")
    assert "translated (llama3)" in next(x for x in text.splitlines() if x.startswith("llama3.1:8b"))
    # Untranslated, a legacy model is judged by its architecture alone.
    plain = json.loads(compatfs("ls", store, "--json", "--no-translate").stdout)
    assert {r["name"]: r for r in plain["models"]}["llama3.1:8b"]["loads"]["model.gguf"]["loads"] == "as-is"
