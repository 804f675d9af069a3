"""Issue 32 pt 3: a model's adapter layers (LoRA GGUF as Ollama's converter
writes them) are shown in its folder and passed as llama-server's --lora
(llama-args, run, models.ini), those llama.cpp's loader would refuse left out
with why; a messages layer is said to be not applied.  Pt 6: `ls` tells
which Modelfile layers are applied and how."""

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import llamacpp
from compatfs.router.adapters import lora_value, refusal
from compatfs.sources.ollama import ADAPTER, MESSAGES
from compatfs.testing.adapter import llama_adapter
from compatfs.testing.core import T, write
from compatfs.testing.llama import PLAIN_LLAMA, plain_llama_text
from compatfs.testing.store import add_model, add_params, set_layer
from conftest import Mount, needs_fuse, wait_until
from test_router import SERVING, ask, free_port

MESSAGES_LAYER = b'[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"}]'


def compatfs(*args, check=True):
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """tuned:1b: a tiny llama with two adapters llama.cpp loads, one for
    another architecture, a messages layer and a num_ctx past its context."""
    d = tmp_path_factory.mktemp("adapters")
    root = d / "store"
    m = add_model(root, "tuned", plain_llama_text(d / "m.gguf"), tag="1b")
    set_layer(root, m, ADAPTER, llama_adapter(d / "a.gguf"), append=True)
    set_layer(root, m, ADAPTER, llama_adapter(d / "b.gguf", seed=1, targets=("attn_k", "ffn_down")), append=True)
    set_layer(root, m, ADAPTER, llama_adapter(d / "g.gguf", arch="gemma2"), append=True)
    set_layer(root, m, MESSAGES, MESSAGES_LAYER)
    add_params(root, m, {"num_ctx": 100000, "temperature": 0.3})
    add_model(root, "plain", plain_llama_text(d / "m.gguf"), tag="1b")
    return root


def test_llama_args_passes_the_adapters_llama_cpp_loads(store):
    doc = json.loads(compatfs("llama-args", "tuned:1b", "--source", store, "--mount", "/m", "--json").stdout)
    args = doc["args"]
    assert args[args.index("--lora") + 1] == "/m/tuned:1b/adapter.gguf,/m/tuned:1b/adapter-2.gguf"
    assert any(
        n.startswith("adapters: adapter-3.gguf not passed (it adapts architecture 'gemma2', the model is 'llama')")
        for n in doc["not_passed"]
    ), doc
    # Bounded by the model's own context (4096), as models.ini is.
    assert args[args.index("--ctx-size") + 1] == str(PLAIN_LLAMA["context_length"])
    assert any("num_ctx=100000: bounded to 4096" in n for n in doc["not_passed"])
    plain = shlex.split(compatfs("llama-args", "plain:1b", "--source", store, "--mount", "/m").stdout)
    assert "--lora" not in plain


def test_ls_says_which_layers_are_applied_and_how(store):
    doc = json.loads(compatfs("ls", store, "--json").stdout)
    row = next(r for r in doc["models"] if r["name"] == "tuned:1b")
    assert row["files"] == [
        "adapter-2.gguf",
        "adapter-3.gguf",
        "adapter.gguf",
        "messages.json",
        "model.gguf",
        "params.json",
    ]
    applied = {(a["layer"], a["how"]) for a in row["layers"]["applied"]}
    assert ("params", "sampling defaults in model.gguf: general.sampling.temp") in applied
    assert ("params", "models.ini and llama-args flags: ctx-size 4096") in applied
    assert (
        "adapters",
        "llama-server's --lora (models.ini lora, llama-args, run): adapter.gguf, adapter-2.gguf",
    ) in applied
    notes = row["layers"]["not_applied"]
    assert any(n.startswith("adapters: adapter-3.gguf not passed") for n in notes)
    assert any(n.startswith("messages: not applied") for n in notes)
    assert any("bounded to 4096" in n for n in notes)
    text = compatfs("ls", store).stdout.splitlines()
    assert text[0].split() == ["NAME", "FILES", "TEXT", "CLIP", "LAYERS", "LLAMA.CPP"]
    line = next(x for x in text if x.startswith("tuned:1b"))
    assert "params,adapters" in line.split()
    below = text[text.index(line) + 1 :]
    assert any(x.strip().startswith("messages: not applied") for x in below)
    assert next(x for x in text if x.startswith("plain:1b")).split()[-3] == "-"  # no layers


def test_ls_names_a_model_models_ini_leaves_out(tmp_path):
    root = tmp_path / "store"
    add_model(root, "a@b", plain_llama_text(tmp_path / "m.gguf"))
    row = json.loads(compatfs("ls", root, "--json").stdout)["models"][0]
    assert any(
        n.startswith("models.ini: left out of models.ini (its name cannot be a section name")
        for n in row["layers"]["not_applied"]
    ), row


def test_what_llama_cpp_would_refuse_is_named(tmp_path):
    model = plain_llama_text(tmp_path / "m.gguf")
    assert refusal(llama_adapter(tmp_path / "ok.gguf"), model, "llama", False) is None
    wider = dict(PLAIN_LLAMA, n_embd=128, n_ff=256)
    assert "does not fit the model's" in refusal(llama_adapter(tmp_path / "w.gguf", base=wider), model, "llama", False)
    rng_a, rng_b = [[0.1] * 64] * 4, [[0.1] * 4] * 64
    import numpy as np

    a, b = (np.array(rng_a), T.F16), (np.array(rng_b), T.F16)
    base = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0}
    cases = {
        "its general.type is 'model', not 'adapter'": ({**base, "general.type": "model"}, {}),
        "its adapter.lora.alpha is not an f32": ({**base, "adapter.lora.alpha": 8}, {}),
        "its tensor blk.0.attn_q.weight is neither .lora_a, .lora_b nor a norm": (base, {"blk.0.attn_q.weight": a}),
        "its blk.0.attn_v.weight has only lora_a": (base, {"blk.0.attn_v.weight.lora_a": a}),
        "the model has no tensor blk.9.attn_q.weight": (
            base,
            {"blk.9.attn_q.weight.lora_a": a, "blk.9.attn_q.weight.lora_b": b},
        ),
    }
    for i, (why, (kvs, tensors)) in enumerate(cases.items()):
        t = tensors or {"blk.0.attn_q.weight.lora_a": a, "blk.0.attn_q.weight.lora_b": b}
        path = write(tmp_path / f"bad{i}.gguf", "llama", kvs, t, ollama_order=True)
        assert refusal(path, model, "llama", False) == why
    (tmp_path / "junk.gguf").write_bytes(b"not gguf at all, not at all")
    assert refusal(tmp_path / "junk.gguf", model, "llama", False).startswith("not a GGUF file llama.cpp reads")


def test_lora_paths_with_commas_are_quoted_as_llama_cpp_reads_them():
    assert lora_value([Path("/m/a/adapter.gguf"), Path('/m,x/b"c.gguf')]) == '/m/a/adapter.gguf,"/m,x/b""c.gguf"'


@needs_fuse
def test_stock_llama_server_loads_the_adapters_through_the_mount(store, mount_store, tmp_path):
    server = llamacpp.tool("llama-server")
    m = mount_store(store)
    d = m / "tuned:1b"
    assert sorted(os.listdir(d)) == [
        "adapter-2.gguf",
        "adapter-3.gguf",
        "adapter.gguf",
        "messages.json",
        "model.gguf",
        "params.json",
    ]
    assert (d / "messages.json").read_bytes() == MESSAGES_LAYER
    assert (d / "adapter.gguf").read_bytes() == llama_adapter(tmp_path / "again.gguf").read_bytes()
    ini = (m / "models.ini").read_text()
    assert f"lora = {d}/adapter.gguf,{d}/adapter-2.gguf\n" in ini
    # Why is not told to everyone who reads models.ini (it would tell what the adapter holds); `ls` tells.
    assert "; adapters: adapter-3.gguf not passed (llama.cpp's LoRA loader would refuse it" in ini
    assert "requested by its Ollama name" in ini
    port = free_port()
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compatfs",
            "run",
            "tuned:1b",
            "--mount",
            str(m.path),
            "--llama-server",
            str(server),
            "--",
            "--port",
            str(port),
            "-t",
            "1",
            "-c",
            "256",
            "--no-webui",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: ask(port, "/health", timeout=2)["status"] == "ok",
            60,
            what="llama-server answering /health",
            tolerate=SERVING,
        )
        loaded = ask(port, "/lora-adapters")
        assert [(a["path"], a["scale"]) for a in loaded] == [
            (str(d / "adapter.gguf"), 1.0),
            (str(d / "adapter-2.gguf"), 1.0),
        ]
        req = {"prompt": "Hello world", "n_predict": 12, "temperature": 0, "cache_prompt": False}
        with_them = ask(port, "/completion", req)
        without = ask(port, "/completion", {**req, "lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]})
        assert with_them["tokens_predicted"] > 0 and without["tokens_predicted"] > 0
        assert with_them["content"] != without["content"], (with_them["content"], without["content"])
    finally:
        llamacpp.stop(proc, log)


@needs_fuse
def test_models_ini_names_no_adapter_its_readers_may_not_read(open_tmp):
    root = open_tmp / "store"
    m = add_model(root, "private", plain_llama_text(open_tmp / "m.gguf"), tag="1b")
    set_layer(root, m, ADAPTER, llama_adapter(open_tmp / "a.gguf", seed=7))
    set_layer(
        root,
        add_model(root, "open", plain_llama_text(open_tmp / "m.gguf"), tag="1b"),
        ADAPTER,
        llama_adapter(open_tmp / "b.gguf", seed=8),
    )
    for d in (root, root / "blobs", root / "manifests"):
        d.chmod(0o755)
    for d in (root / "manifests").rglob("*"):
        d.chmod(0o755 if d.is_dir() else 0o644)
    private = root / "blobs" / ("sha256-" + hashlib.sha256((open_tmp / "a.gguf").read_bytes()).hexdigest())
    private.chmod(0o600)
    mnt = Mount(root, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    try:
        ini = (mnt / "models.ini").read_text()
    finally:
        mnt.close()
    section = ini[
        ini.index("[private@1b]") : ini.index("[open@1b]")
        if ini.index("[open@1b]") > ini.index("[private@1b]")
        else len(ini)
    ]
    assert "lora =" not in section
    assert "; adapters: adapter.gguf not passed (not readable by everyone who may read models.ini)" in section, ini
    assert f"lora = {mnt / 'open:1b'}/adapter.gguf\n" in ini


@needs_fuse
def test_models_ini_says_how_a_folder_sources_models_are_named(tmp_path, mount_store):
    folder = tmp_path / "ggufs" / "tiny"
    folder.mkdir(parents=True)
    plain_llama_text(folder / "tiny.gguf")
    m = mount_store(tmp_path / "ggufs")
    ini = (m / "models.ini").read_text()
    assert "requested by its folder's path under the mount" in ini and "Ollama" not in ini, ini
