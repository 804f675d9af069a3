"""A params layer's options that size an allocation are bounded by what the
machine and the model allow (threads by the CPUs, the context by the
model's trained context, batches by that context, GPU layers by the model's
layers, a sampler's memory by a ceiling), each with a note: stock
llama-server's router then starts the model's child instead of failing to
allocate."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote

import llamacpp
from compatfs.format.header import SourceGGUF
from compatfs.format.params import Limits, sampling
from compatfs.router.params import machine_cpus, model_limits, translate_params
from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import needs_fuse, wait_until
from test_router import SERVING, ask, router
from test_sampling import set_params

HUGE = (1 << 31) - 1
PARAMS = {
    "num_thread": HUGE,
    "num_ctx": HUGE,
    "num_batch": HUGE,
    "num_gpu": HUGE,
    "num_keep": HUGE,
    "num_predict": HUGE,
    "repeat_last_n": HUGE,
    "temperature": 0.5,
}


def test_options_that_size_allocations_are_bounded_with_a_note():
    out = translate_params(PARAMS, Limits(cpus=2, context=4096, layers=3))
    pairs = dict(zip(out.argv[::2], out.argv[1::2], strict=True))
    assert pairs == {
        "--threads": "2",
        "--ctx-size": "4096",
        "--batch-size": "4096",
        "--n-gpu-layers": "3",
        "--keep": "4096",
        "--n-predict": "4096",
        "--repeat-last-n": "4096",
        "--temp": "0.5",
    }
    assert len(out.notes) == 7 and all(": bounded to " in n for n in out.notes), out.notes
    # A batch follows the context the params ask for; llama.cpp's own defaults pass as they are.
    out = translate_params(
        {"num_ctx": 1024, "num_batch": 2048, "num_thread": -1, "num_predict": -2},
        Limits(cpus=2, context=4096, layers=3),
    )
    assert dict(zip(out.argv[::2], out.argv[1::2], strict=True)) == {
        "--ctx-size": "1024",
        "--batch-size": "1024",
        "--threads": "-1",
        "--n-predict": "-2",
    }
    # The model's limits not at hand: ceilings stand in for them.
    out = translate_params({"num_ctx": HUGE, "num_thread": 1})
    assert out.argv == ["--ctx-size", str(1 << 20), "--threads", "1"] and "not at hand" in out.notes[0]
    s = sampling({"repeat_last_n": HUGE})
    assert [int(v.decode()) for _, v in s.kvs] == [1 << 20] and "bounded" in s.notes[0]


def test_the_models_limits_come_from_its_header(tmp_path):
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    src = SourceGGUF(blob)
    limits = model_limits(blob, {"num_ctx": 1})
    assert limits.context == src.get("llama.context_length") and limits.layers == len(src.block_ids()) + 1
    assert limits.cpus == machine_cpus()


@needs_fuse
def test_huge_params_reach_the_router_bounded(tmp_path, mount_store):
    llamacpp.tool("llama-server")  # (skips without one, before anything is mounted)
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    trained = SourceGGUF(blob).get("llama.context_length")
    manifest = add_model(root, "tiny", blob, tag="1b")
    set_params(root, manifest, json.dumps(PARAMS).encode())
    mnt = mount_store(root, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    wait_until(lambda: (mnt / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
    text = (mnt / "models.ini").read_text()
    assert f"threads = {machine_cpus()}\n" in text and f"ctx-size = {trained}\n" in text, text
    assert f"batch-size = {trained}\n" in text and f"; params num_thread={HUGE}: bounded to" in text, text
    header = SourceGGUF(mnt / "tiny:1b" / "model.gguf")
    assert header.get("general.sampling.penalty_last_n") == 1 << 20
    ls = subprocess.run([sys.executable, "-m", "compatfs", "ls", str(root)], capture_output=True, text=True, timeout=60)
    assert f"params repeat_last_n={HUGE}: bounded to {1 << 20}" in ls.stdout, ls.stdout + ls.stderr
    with router(mnt / "models.ini", tmp_path / "server.log") as port:
        r = ask(port, "/completion", {"model": "tiny:1b", "prompt": "Hello", "n_predict": 2})
        assert r["tokens_predicted"] > 0, r
        gen = ask(port, f"/props?model={quote('tiny:1b')}")["default_generation_settings"]
        assert gen["n_ctx"] == trained
