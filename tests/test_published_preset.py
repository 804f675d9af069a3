"""The mount's own router preset, `models.ini` at its root: every model of the
store by its Ollama name with its files and params, made from the mounted
tree, following the store within the rescan, readable as the root is, and
what stock `llama-server --models-preset MNT/models.ini` serves."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import llamacpp
from compatfs.testing import llama, llava
from compatfs.testing.store import add_model
from conftest import Mount, needs_fuse, wait_until
from test_router import NESTED, SERVING, ask, router
from test_sampling import set_params

pytestmark = needs_fuse


def preset(mnt) -> str:
    return (mnt / "models.ini").read_text()


def store_with_models(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A store with a nested model (with a params layer) and a plain one; (store, text blob, nested manifest)."""
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    nested = add_model(root, "Some-Repo-GGUF", blob, host="hf.co", namespace="some-org", tag="Q4_K_M")
    set_params(root, nested, b'{"num_ctx":2048,"temperature":0.5,"stop":["</s>"]}')
    add_model(root, "tiny", blob, tag="1b")
    return root, blob, nested


def mounted(tmp_path: Path, root: Path, mount_store) -> Mount:
    mnt = mount_store(root, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    wait_until(lambda: (mnt / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
    return mnt


def test_models_ini_lists_every_model_with_its_files_and_alias(tmp_path, mount_store):
    root, blob, _ = store_with_models(tmp_path)
    proj = llava.legacy_llava_projector(tmp_path / "p.gguf")
    add_model(root, "withproj", blob, projector=proj, tag="2b")
    mnt = mounted(tmp_path, root, mount_store)
    text = preset(mnt)
    assert (
        f"[hf.co/some-org/Some-Repo-GGUF@Q4_K_M]\nalias = {NESTED}\nmodel = {mnt.path}/{NESTED}/model.gguf\n"
        "ctx-size = 2048\nreverse-prompt = </s>\n" in text
    )
    assert f"[tiny@1b]\nalias = tiny:1b\nmodel = {mnt.path}/tiny:1b/model.gguf\n\n" in text
    assert (
        f"[withproj@2b]\nalias = withproj:2b\nmodel = {mnt.path}/withproj:2b/model.gguf\n"
        f"mmproj = {mnt.path}/withproj:2b/mmproj.gguf\n" in text
    )
    assert "blobs" not in text and "temp" not in text
    # What `serve --print-preset` prints is the mount's own; every path it names is there.
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", "serve", "--mount", str(mnt.path), "--print-preset"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout == text, res.stderr
    for line in text.splitlines():
        if line.startswith(("model = ", "mmproj = ")):
            assert Path(line.split(" = ", 1)[1]).is_file(), line
    # Listed in the root, readable as the root is (its read bits, its owner), size as read.
    assert "models.ini" in os.listdir(mnt.path)
    st, top = os.stat(mnt / "models.ini"), os.stat(mnt.path)
    assert stat_mode(st) == top.st_mode & 0o444 and (st.st_uid, st.st_gid) == (top.st_uid, top.st_gid)
    assert st.st_size == len((mnt / "models.ini").read_bytes())


def stat_mode(st: os.stat_result) -> int:
    return st.st_mode & 0o7777


def test_a_source_without_models_shows_no_models_ini(tmp_path, mount_store):
    root = tmp_path / "store"
    (root / "blobs").mkdir(parents=True)
    (root / "manifests").mkdir()
    mnt = mount_store(root, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    time.sleep(2.5)  # on purpose: no models.ini appears through two rescans (they log no change to wait for)
    assert "models.ini" not in os.listdir(mnt.path)
    with pytest.raises(FileNotFoundError):
        (mnt / "models.ini").read_bytes()


def test_models_ini_follows_the_store(tmp_path, mount_store):
    root, blob, nested = store_with_models(tmp_path)
    mnt = mounted(tmp_path, root, mount_store)
    path = mnt / "models.ini"
    old_size = os.stat(path).st_size
    # A params layer changed: stat alone (no open) sees the new size: the kernel's attributes were dropped.
    set_params(root, nested, b'{"num_ctx":4096,"num_predict":77}')
    wait_until(
        lambda: os.stat(path).st_size != old_size, 5, what="stat showing models.ini's new size", tolerate=SERVING
    )
    text = preset(mnt)
    assert "ctx-size = 4096\nn-predict = 77\n" in text and "ctx-size = 2048" not in text
    assert os.stat(path).st_size == len(text.encode())
    # A file opened before a change keeps the bytes it opened (and its size); once closed, the new ones.
    with open(path, "rb") as held:
        before = held.read()
        seen = mnt.changes_seen()
        set_params(root, nested, b'{"num_ctx":3072}')
        wait_until(lambda: mnt.changes_seen() > seen, what="a rescan seeing the params layer changed")
        held.seek(0)
        assert held.read() == before and os.fstat(held.fileno()).st_size == len(before)
    wait_until(
        lambda: "ctx-size = 3072" in preset(mnt),
        5,
        what="models.ini showing num_ctx 3072 once the held file closed",
        tolerate=SERVING,
    )
    # Removed, added again, a model added and one removed.
    set_params(root, nested, None)
    wait_until(
        lambda: "ctx-size" not in preset(mnt),
        5,
        what="models.ini without the removed params layer's ctx-size",
        tolerate=SERVING,
    )
    set_params(root, nested, b'{"num_ctx":1024}')
    wait_until(
        lambda: "ctx-size = 1024" in preset(mnt),
        5,
        what="models.ini showing the params layer added again",
        tolerate=SERVING,
    )
    add_model(root, "late", blob, tag="3b")
    wait_until(
        lambda: f"[late@3b]\nalias = late:3b\nmodel = {mnt.path}/late:3b/model.gguf\n" in preset(mnt),
        5,
        what="models.ini listing the added late:3b",
        tolerate=SERVING,
    )
    shutil.rmtree(root / "manifests/registry.ollama.ai/library/tiny")
    wait_until(lambda: "tiny:1b" not in preset(mnt), 5, what="models.ini without the removed tiny:1b", tolerate=SERVING)
    assert os.stat(path).st_size == len(path.read_bytes())
    assert mnt.alive


def test_models_ini_goes_with_its_mount(tmp_path, mount_store):
    """The state folder's copy of a mount's models.ini is removed when the
    mount ends; a later mount at the same mountpoint, made while an earlier
    daemon still serves a file held open on its lazily detached mount, keeps
    its own when that daemon ends."""
    root, _, _ = store_with_models(tmp_path)
    state = tmp_path / "state" / "compatfs"
    first = mounted(tmp_path, root, mount_store)
    (published,) = state.glob("*.models.ini")
    held = open(first / "tiny:1b" / "model.gguf", "rb")
    subprocess.run(["fusermount3", "-uz", str(first.path)], check=True)  # detached, still serving `held`
    second = Mount(root, first.path, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    try:
        wait_until(
            lambda: (second / "models.ini").exists(),
            10,
            what="the second mount's models.ini published",
            tolerate=SERVING,
        )
        renewed = os.stat(published).st_ino
        held.close()
        first.proc.wait(timeout=20)  # the first daemon ends with its last file
        assert published.exists() and os.stat(published).st_ino == renewed
        assert "[tiny@1b]" in (second / "models.ini").read_text()
    finally:
        second.close()
    assert not published.exists() and not list(state.glob("*.models.ini"))


@pytest.mark.parametrize(
    "layer",
    [
        b"not json {",
        b'{"num_ctx":"many","temperature":"hot"}',
        b'{"num_ctx":-5,"stop":[1,{"a":2}]}',
        b"[1,2]",
        b"\xff\xfe" * 40,
    ],
)
def test_a_hostile_params_layer_never_breaks_models_ini(tmp_path, mount_store, layer):
    root, blob, nested = store_with_models(tmp_path)
    mnt = mounted(tmp_path, root, mount_store)
    set_params(root, nested, layer)
    wait_until(
        lambda: "ctx-size = 2048" not in preset(mnt),
        5,
        what="models.ini without the hostile params layer's old ctx-size",
        tolerate=SERVING,
    )
    text = preset(mnt)
    # The model stays, with its files, and the section says why its params are not there.
    assert f"alias = {NESTED}\nmodel = {mnt.path}/{NESTED}/model.gguf\n" in text
    assert "[tiny@1b]" in text and "; " in text.split("[hf.co", 1)[1]
    assert mnt.alive and "Traceback" not in mnt.log_text()


def read_as_nobody(path: Path) -> str:
    """What uid/gid 65534 gets reading `path` with cat: "ok", or cat's error."""
    res = subprocess.run(["cat", str(path)], user=65534, group=65534, extra_groups=[], capture_output=True, timeout=30)
    return "ok" if res.returncode == 0 and res.stdout == path.read_bytes() else res.stderr.decode()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (another user reads through the shared mount)")
def test_models_ini_is_readable_as_the_mount_root_is(open_tmp):
    root, _, _ = store_with_models(open_tmp)
    root.chmod(0o755)
    mnt = Mount(root, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    try:
        wait_until(lambda: (mnt / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
        # The daemon's state folder is its own (0700): the file is readable as the store's root is.
        assert stat_mode(os.stat(open_tmp / "state" / "compatfs")) == 0o700
        assert read_as_nobody(mnt / "models.ini") == "ok"
        (root / "manifests").chmod(0o711)  # what the mount root mirrors: others may not list it now
        wait_until(
            lambda: stat_mode(os.stat(mnt.path)) == 0o511,
            5,
            what="the mount root showing the manifests folder's mode 0711",
            tolerate=SERVING,
        )
        wait_until(
            lambda: stat_mode(os.stat(mnt / "models.ini")) == 0o400,
            5,
            what="models.ini showing mode 0400",
            tolerate=SERVING,
        )
        assert "Permission denied" in read_as_nobody(mnt / "models.ini")
        # An access ACL the mode bits do not show refuses it too, as it refuses listing the root.
        if shutil.which("setfacl"):
            (root / "manifests").chmod(0o755)
            subprocess.run(["setfacl", "-m", "u:65534:---", str(root / "manifests")], check=True)
            wait_until(
                lambda: stat_mode(os.stat(mnt / "models.ini")) == 0o444,
                5,
                what="models.ini showing mode 0444 again",
                tolerate=SERVING,
            )
            assert "Permission denied" in read_as_nobody(mnt / "models.ini")
            subprocess.run(["setfacl", "-b", str(root / "manifests")], check=True)
            wait_until(
                lambda: read_as_nobody(mnt / "models.ini") == "ok",
                5,
                what="models.ini readable by others once the ACL is gone",
                tolerate=SERVING,
            )
    finally:
        mnt.close()


def test_stock_llama_server_serves_the_mounts_models_ini(tmp_path, mount_store):
    llamacpp.tool("llama-server")  # (skips without one, before anything is mounted)
    root, _, nested = store_with_models(tmp_path)
    set_params(root, nested, b'{"temperature":0.25,"top_k":5,"num_ctx":256}')
    mnt = mounted(tmp_path, root, mount_store)
    wait_until(lambda: "ctx-size = 256" in preset(mnt), 5, what="models.ini showing num_ctx 256", tolerate=SERVING)
    with router(mnt / "models.ini", tmp_path / "server.log", "-t", "1") as port:
        aliases = {a for m in ask(port, "/v1/models")["data"] for a in m["aliases"]}
        assert {NESTED, "tiny:1b"} <= aliases
        r = ask(port, "/completion", {"model": NESTED, "prompt": "Hello", "n_predict": 4})
        assert r["tokens_predicted"] > 0, r
        from urllib.parse import quote

        gen = ask(port, f"/props?model={quote(NESTED)}")["default_generation_settings"]
        assert gen["n_ctx"] == 256 and gen["params"]["top_k"] == 5
