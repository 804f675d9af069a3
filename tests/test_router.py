"""`compatfs serve`: stock llama-server's router over a mount, every model
by its Ollama name (nested ones too), with its params: the preset's options
and model.gguf's sampling defaults; the preset follows the store."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import llamacpp
from compatfs.router.preset import Entry, render, section
from compatfs.router.serve import Router
from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import needs_fuse, wait_until
from test_sampling import set_params

NESTED = "hf.co/some-org/Some-Repo-GGUF:Q4_K_M"


def test_sections_are_named_so_llama_cpp_keeps_them_and_alias_the_ollama_name(tmp_path):
    params = tmp_path / "params.json"
    params.write_text(
        json.dumps(
            {
                "num_ctx": 4096,
                "temperature": 0.3,
                "stop": ["<|im_end|>", "<|endoftext|>"],
                "num_predict": 64,
                "seed": 7,
                "tfs_z": 1,
            }
        )
    )
    e = Entry("llama3.1:8b-instruct-q4_K_M", Path("/m/llama3.1:8b-instruct-q4_K_M"), True, params)
    s = section(e)
    assert s.name == "llama3.1@8b-instruct-q4_K_M" and ":" not in s.name
    assert s.options == [
        ("alias", "llama3.1:8b-instruct-q4_K_M"),
        ("model", "/m/llama3.1:8b-instruct-q4_K_M/model.gguf"),
        ("mmproj", "/m/llama3.1:8b-instruct-q4_K_M/mmproj.gguf"),
        ("ctx-size", "4096"),
        ("n-predict", "64"),
        ("seed", "7"),
        ("reverse-prompt", "<|im_end|>"),
    ]
    # temperature is model.gguf's; what a preset cannot hold is said in the section.
    assert any("tfs_z" in n for n in s.notes) and any("'<|endoftext|>'" in n for n in s.notes)
    params.write_text(json.dumps({"stop": ["### Human:"]}))
    assert ("reverse-prompt", "### Human:") not in section(e).options
    text = render([e, Entry("bad]name:1", Path("/m/x"), False, None), Entry("ok:1", Path("/m/a#b"), False, None)])
    assert "[llama3.1@8b-instruct-q4_K_M]" in text and "; bad]name:1: left out" in text
    assert "; ok:1: left out" in text and "[ok@1]" not in text


def test_serve_takes_the_mounts_own_preset_and_reloads_it_when_it_changes(tmp_path):
    mnt, own = tmp_path / "mnt", tmp_path / "own.ini"
    mnt.mkdir()
    (mnt / "models.ini").write_text("[a@1]\nalias = a:1\n")
    r = Router(mnt, "llama-server", own, "127.0.0.1", 8080, [])
    assert r.argv[1:3] == ["--models-preset", str(mnt / "models.ini")]
    assert r.refresh() == ([], True) and r.refresh() == ([], False)
    (mnt / "models.ini").write_text("[b@1]\nalias = b:1\n")  # the mount rewrote it: the router reads it again
    assert r.refresh() == ([], True)
    assert not own.exists()
    # A mount that shows none: serve writes its own from the mount.
    (mnt / "models.ini").unlink()
    r = Router(mnt, "llama-server", own, "127.0.0.1", 8080, [])
    assert r.argv[1:3] == ["--models-preset", str(own)]
    assert r.refresh() == ([], True) and own.read_text() == render([])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, path: str, body: dict | None = None, timeout: float = 120) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        headers={"Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None,
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


# What asking a server or a mount that is not there yet raises (for wait_until: not yet).
SERVING = (OSError, ValueError, KeyError)


@contextlib.contextmanager
def router(preset: Path, log: Path, *extra: str):
    """Stock llama-server's router on `preset` (its output in `log`), up and
    answering /health; yields its port, and stops it after."""
    port = free_port()
    out = open(log, "wb")  # noqa: SIM115 (closed with the process, by llamacpp.stop)
    proc = subprocess.Popen(
        [
            str(llamacpp.tool("llama-server")),
            "--models-preset",
            str(preset),
            "--port",
            str(port),
            "--models-max",
            "1",
            "--no-webui",
            *extra,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: ask(port, "/health", timeout=2)["status"] == "ok",
            60,
            what="the router answering /health",
            tolerate=SERVING,
        )
        yield port
    finally:
        llamacpp.stop(proc, out)


@needs_fuse
def test_serve_answers_every_model_by_its_ollama_name(tmp_path, mount_store):
    server = llamacpp.tool("llama-server")
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    nested = add_model(root, "Some-Repo-GGUF", blob, host="hf.co", namespace="some-org", tag="Q4_K_M")
    set_params(root, nested, b'{"temperature":0.25,"top_k":5,"num_ctx":256,"stop":["</s>"]}')
    add_model(root, "tiny", blob, tag="1b")
    mnt = mount_store(root)
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compatfs",
            "serve",
            "--mount",
            str(mnt.path),
            "--llama-server",
            str(server),
            "--port",
            str(port),
            "--",
            "--models-max",
            "1",
            "-t",
            "1",
            "--no-webui",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until(
            lambda: ask(port, "/health", timeout=2)["status"] == "ok",
            60,
            what="the server answering /health",
            tolerate=SERVING,
        )
        listed = ask(port, "/v1/models")["data"]
        aliases = {a for m in listed for a in m["aliases"]}
        assert {NESTED, "tiny:1b"} <= aliases
        for name in (NESTED, "tiny:1b"):
            r = ask(port, "/completion", {"model": name, "prompt": "Hello", "n_predict": 4})
            assert r["tokens_predicted"] > 0, r
        # The params layer: sampling defaults from model.gguf, num_ctx from the preset.
        props = ask(port, f"/props?model={urllib.request.quote(NESTED)}")
        gen = props["default_generation_settings"]
        assert gen["params"]["temperature"] == pytest.approx(0.25) and gen["params"]["top_k"] == 5
        assert gen["n_ctx"] == 256
        # The store changes while serving: the preset follows, and the model restarts with the new params.
        set_params(root, nested, b'{"temperature":1.5,"top_k":9,"num_ctx":512}')
        preset = mnt / "models.ini"  # the mount's own, which serve runs the router with
        assert not list((tmp_path / "state").glob("compatfs/models-*.ini"))
        wait_until(
            lambda: "ctx-size = 512" in preset.read_text(),
            15,
            what="models.ini showing the new num_ctx 512",
            tolerate=SERVING,
        )

        def new_props():
            ask(port, "/completion", {"model": NESTED, "prompt": "Hi", "n_predict": 1})
            p = ask(port, f"/props?model={urllib.request.quote(NESTED)}")["default_generation_settings"]
            return p["params"]["top_k"] == 9 and p["n_ctx"] == 512 and p

        p = wait_until(new_props, 60, what="the restarted model serving the new params", tolerate=SERVING)
        assert p["params"]["temperature"] == pytest.approx(1.5)
    finally:
        llamacpp.stop(proc, log)
    assert proc.returncode is not None


@needs_fuse
def test_print_preset_shows_every_model_of_the_mount(tmp_path, mount_store):
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    nested = add_model(root, "Some-Repo-GGUF", blob, host="hf.co", namespace="some-org", tag="Q4_K_M")
    set_params(root, nested, b'{"num_ctx":2048,"temperature":0.5}')
    add_model(root, "tiny", blob, tag="1b")
    mnt = mount_store(root)
    run = lambda *a, **kw: subprocess.run(
        [sys.executable, "-m", "compatfs", "serve", *map(str, a)],  # noqa: E731
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )
    res = run("--mount", mnt.path, "--print-preset")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert (
        f"[hf.co/some-org/Some-Repo-GGUF@Q4_K_M]\nalias = {NESTED}\nmodel = {mnt.path}/{NESTED}/model.gguf\n"
        "ctx-size = 2048\n" in text
    )
    assert f"[tiny@1b]\nalias = tiny:1b\nmodel = {mnt.path}/tiny:1b/model.gguf\n" in text
    assert "temp" not in text and "blobs" not in text
    missing = run("--mount", mnt.path, "--llama-server", "/nonexistent/llama-server")
    assert (
        missing.returncode == 1
        and missing.stderr.strip()
        == "compatfs: error: --llama-server /nonexistent/llama-server: not an executable file"
    )
