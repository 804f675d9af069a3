"""The command line: mount/umount in the background, ls, inspect, clear errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from compatfs.testing.store import add_model

from conftest import needs_fuse
from ggufs import plain_model, synthetic_gemma3


def compatfs(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "compatfs", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    add_model(root, "gemma3x", synthetic_gemma3(tmp_path / "g.gguf"), tag="4b")
    add_model(root, "plain", plain_model(tmp_path / "p.gguf"))
    empty = root / "manifests/registry.ollama.ai/library/configonly/latest"
    empty.parent.mkdir(parents=True)
    empty.write_text(
        json.dumps(
            {
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "ab" * 32, "size": 3}
                ]
            }
        )
    )
    return root


def test_errors_are_one_clear_line(store, tmp_path):
    (tmp_path / "empty").mkdir()
    cases = [
        (("mount", store, tmp_path / "nowhere"), "mountpoint"),
        (("mount", tmp_path / "empty", tmp_path), "not an Ollama model store"),  # tmp_path itself holds .gguf files
        (("mount", tmp_path / "missing", tmp_path), "no such directory"),
        (("ls", tmp_path / "missing"), "no such directory"),
        (("umount", tmp_path), "is not mounted"),
        (("inspect", "nosuchmodel:1b", "--source", store), "no model nosuchmodel:1b"),
        (("inspect", store / "manifests/registry.ollama.ai/library/configonly/latest"), "not a GGUF file"),
    ]
    for args, words in cases:
        res = compatfs(*args)
        assert res.returncode != 0, args
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("compatfs: error:") and words in lines[0], (args, res.stderr)
        assert "Traceback" not in res.stderr


@needs_fuse
def test_an_unusable_state_folder_is_one_line(store, tmp_path):
    """The state folder (logs, presets) cannot be made: `mount` and `serve`
    say so and name it; `mount --log FILE` does not need it."""
    (tmp_path / "state").write_text("a file, not a folder")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "mnt").mkdir()
    cases = [
        (("mount", store, tmp_path / "mnt"), "not logging there (pass --log FILE)"),
        (("serve", "--mount", tmp_path / "mnt", "--llama-server", "/bin/true"), "cannot create the state folder"),
    ]
    for args, words in cases:
        res = compatfs(*args, env=env)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith("compatfs: error:") and words in lines[0] and str(tmp_path / "state") in lines[0]
    res = compatfs("mount", store, tmp_path / "mnt", "--log", tmp_path / "log", env=env)
    try:
        assert res.returncode == 0, res.stderr
    finally:
        compatfs("umount", tmp_path / "mnt")


def test_ls_reports_handlers_and_what_is_left_out(store):
    res = compatfs("ls", store, "--json")
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["models"]}
    assert rows["gemma3x:4b"]["text"] == "gemma3" and rows["gemma3x:4b"]["clip"] == "gemma3-clip"
    assert rows["gemma3x:4b"]["files"] == ["mmproj.gguf", "model.gguf"]
    assert rows["plain:latest"]["text"] == "-" and rows["plain:latest"]["files"] == ["model.gguf"]
    assert doc["left_out"] == [
        {"name": "configonly:latest", "reason": "no GGUF model layer (application/vnd.ollama.image.license)"}
    ]
    text = compatfs("ls", store).stdout
    assert "configonly:latest  left out: no GGUF model layer" in text


def test_inspect_shows_the_translation(store):
    r = json.loads(compatfs("inspect", "gemma3x:4b", "--source", store, "--json").stdout)
    assert r["handler"] == "gemma3"
    assert r["kv"]["added"]["gemma3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert r["kv"]["added"]["gemma3.rope.scaling.type"] == "linear"
    assert r["kv"]["changed"]["tokenizer.ggml.tokens"] == {"before": "[STRING x 40]", "after": "[STRING x 37]"}
    assert "v.patch_embedding.weight" in r["tensors"]["hidden"]
    c = json.loads(compatfs("inspect", "gemma3x:4b", "--source", store, "--clip", "--json").stdout)
    assert c["architecture"] == {"before": "gemma3", "after": "clip"}
    assert c["tensors"]["renamed"]["v.blk.0.mlp.fc1.weight"] == "v.blk.0.ffn_up.weight"
    assert c["tensors"]["ops"]["v.patch_embd.weight"]["dtype"] == "F32"
    assert "token_embd.weight" in c["tensors"]["hidden"]
    plain = compatfs("inspect", store / "blobs" / os.listdir(store / "blobs")[0]).stdout
    assert "handler:" in plain


@needs_fuse
def test_background_mount_and_umount(store, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = compatfs("mount", store, mnt, "--log", tmp_path / "daemon.log")
    try:
        assert res.returncode == 0, res.stderr
        assert os.path.ismount(mnt) and "gemma3x:4b" in os.listdir(mnt)
        busy = compatfs("mount", store, mnt)
        assert busy.returncode == 1 and "busy" in busy.stderr
    finally:
        assert compatfs("umount", mnt).returncode == 0
    assert not os.path.ismount(mnt)


def _bounded(*args, seconds: float = 30):
    """compatfs ARGS, failing (not hanging) when it has not ended within `seconds`."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "compatfs", *map(str, args)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"compatfs {' '.join(map(str, args))} hung") from None


def _one_line_or_ok(res, what):
    assert "Traceback" not in res.stderr, (what, res.stderr)
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("compatfs: error:"), (what, res.stderr)


def _layer_blob(store, name, tag="latest"):
    doc = json.loads((store / "manifests/registry.ollama.ai/library" / name / tag).read_text())
    return store / "blobs" / doc["layers"][0]["digest"].replace(":", "-")


def test_a_fifo_blob_is_one_line_for_ls_inspect_and_export(store, tmp_path):
    """Measured on the landed code: `compatfs ls`, `inspect` and `export`
    hung opening a FIFO put in place of a blob."""
    from hostile import fifo_writer_release

    blob = _layer_blob(store, "plain")
    blob.unlink()
    os.mkfifo(blob)
    try:
        res = _bounded("ls", store)
        assert res.returncode == 0, res.stderr
        row = next(line for line in res.stdout.splitlines() if line.startswith("plain:latest"))
        assert "not a regular file" in row and "gemma3x:4b" in res.stdout
        for args in (
            ("inspect", "plain", "--source", store),
            ("inspect", blob.name, "--source", store),
            ("export", "plain", tmp_path / "out", "--source", store),
        ):
            res = _bounded(*args)
            assert res.returncode == 1, args
            _one_line_or_ok(res, args)
            assert "not a regular file" in res.stderr or "no blob" in res.stderr, (args, res.stderr)
    finally:
        fifo_writer_release(blob)


def test_a_failing_handler_is_one_line_everywhere(store, tmp_path):
    """Measured on the landed code: token types as strings made `compatfs
    ls` die with a traceback (the whole store's listing lost) and `inspect`,
    `export`, `llama-args` print tracebacks; `inspect --clip` of a text-only
    model did too.  Whatever the handlers make of such values, each command
    answers, or fails in one line."""
    from compatfs.format.header import SourceGGUF
    from compatfs.format.values import VT, array
    from compatfs.testing import gemma3
    from hostile import with_value

    good = gemma3.legacy_gemma3_vision(tmp_path / "gv.gguf")
    n = SourceGGUF(good).kvs["tokenizer.ggml.token_type"].count
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(with_value(good, "tokenizer.ggml.token_type", array(VT.STRING, ["x"] * n)))
    add_model(store, "bad", bad, tag="4b")
    res = _bounded("ls", store)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    names = [line.split()[0] for line in res.stdout.splitlines()[1:]]
    assert {"bad:4b", "gemma3x:4b", "plain:latest", "configonly:latest"} <= set(names), res.stdout
    res = _bounded("ls", store, "--json")
    assert res.returncode == 0 and {r["name"] for r in json.loads(res.stdout)["models"]} >= {"bad:4b", "plain:latest"}
    for args in (
        ("inspect", "bad:4b", "--source", store),
        ("inspect", "bad:4b", "--clip", "--source", store),
        ("inspect", "plain", "--clip", "--source", store),
        ("export", "bad:4b", tmp_path / "out", "--source", store, "-q"),
        ("llama-args", "bad:4b", "--source", store, "--mount", tmp_path),
    ):
        _one_line_or_ok(_bounded(*args), args)
    res = _bounded("inspect", "plain", "--clip", "--source", store)
    assert res.returncode == 1 and "no projector view" in res.stderr


def test_ls_columns_stay_aligned_for_any_name_length(tmp_path):
    from compatfs.testing import LEGACY

    root = tmp_path / "store"
    nem = LEGACY["nemotron3"]  # handlers nemotron_h_omni and nemotron_h_omni-clip: the longest names
    add_model(root, "nemotron3", nem.model(tmp_path / "n.gguf"), tag=nem.tag)
    add_model(root, "p", plain_model(tmp_path / "p.gguf"), tag="1")
    add_model(
        root,
        "a-very-long-model-name-indeed",
        plain_model(tmp_path / "p.gguf"),
        host="hf.co",
        namespace="someone-with-a-long-name",
        tag="Q4_K_M",
    )
    manifest = root / "manifests/registry.ollama.ai/library/p/1"
    doc = json.loads(manifest.read_text())
    (root / "blobs" / ("sha256-" + "cd" * 32)).write_bytes(b"{not json")
    doc["layers"].append(
        {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "cd" * 32, "size": 9}
    )
    manifest.write_text(json.dumps(doc))
    lines = compatfs("ls", root).stdout.splitlines()
    header = lines[0]
    starts = [header.index(c) for c in ("FILES", "TEXT", "CLIP", "LLAMA.CPP")]
    rows = [x for x in lines[1:] if not x.startswith(" ")]
    assert len(rows) == 3
    for row in rows:
        for start in starts:  # every column begins where its heading does, after a gap
            assert row[start - 2 : start] == "  " and row[start] != " ", (row, start)
    assert any("nemotron_h_omni-clip" in r for r in rows)
    # The hostile params layer: one line under its model, saying why; the model is still listed.
    note = lines[lines.index(next(r for r in rows if r.startswith("p:1"))) + 1]
    assert note.lstrip().startswith("params layer sha256-") and "is not JSON" in note
    assert note.index("params") == starts[0] + 2
    doc = json.loads(compatfs("ls", root, "--json").stdout)
    p = next(r for r in doc["models"] if r["name"] == "p:1")
    assert p["params"]["in_model_gguf"] == [] and "is not JSON" in p["params"]["notes"][0]


@needs_fuse
def test_llama_args_finds_the_mount_past_a_stopped_daemon(store, mount_store):
    """Without --mount, `llama-args` asks every compatfs mount whether it shows
    the model: a mount whose daemon is stopped is left out after a bounded
    wait (and named when no other shows the model), never a hang."""
    stuck, good = mount_store(store), mount_store(store)
    os.kill(stuck.proc.pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        res = compatfs("llama-args", "gemma3x:4b", "--source", store, "--lines")
        assert res.returncode == 0, res.stderr
        assert str(good.path / "gemma3x:4b" / "model.gguf") in res.stdout.splitlines()
        assert time.monotonic() - t < 60
        good.close()
        res = compatfs("llama-args", "plain", "--source", store)
        assert res.returncode == 1 and f"{stuck.path} did not answer within" in res.stderr, res.stderr
    finally:
        os.kill(stuck.proc.pid, signal.SIGCONT)
