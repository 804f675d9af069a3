"""A plain folder tree of GGUF files as a source: the folders it shows, what
it leaves out, and (mounted with the same command as an Ollama store) the
same bytes the Ollama store's mount serves for the same files; stock
llama-server loads a monolithic vision blob's model.gguf and mmproj.gguf."""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from compatfs.sources.folder import GGUFFolder
from compatfs.sources.base import SourceError
from compatfs.sources.choose import open_source
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.tree import FileRef, Tree
from compatfs.view.catalog import BlobViews

import llamacpp
from conftest import ROOT, needs_fuse, wait_until


@pytest.fixture(scope="module")
def lms(legacy, tmp_path_factory):
    """An LM Studio-like tree of the legacy writers' files (copies: the Ollama
    store of `legacy` holds the same bytes), with what a folder also holds."""
    root = tmp_path_factory.mktemp("lms") / "models"
    files = legacy[1]
    layout = {
        "google/gemma3-1b/gemma-3-1b-Q8_0.gguf": files["gemma3"],
        "google/gemma3-4b/gemma-3-4b-it.gguf": files["gemma3v"],  # Ollama's monolithic vision blob
        "liuhaotian/llava/llava-7b.gguf": files["llava"],
        "liuhaotian/llava/mmproj-llava-f16.gguf": files["llava-proj"],
        "meta/llama3/llama3-8b-Q4.gguf": files["llama3"],
        "meta/llama3/llama3-8b-Q8.gguf": files["llama3"],
        "loose.gguf": files["gemma3"],
        "meta/llama3/README.md": None,
        ".hidden/x.gguf": files["gemma3"],
        "split/big-00001-of-00002.gguf": files["gemma3"],
        "twoproj/m.gguf": files["llava"],
        "twoproj/mmproj-a.gguf": files["llava-proj"],
        "twoproj/mmproj-b.gguf": files["llava-proj"],
        "onlyproj/mmproj-x.gguf": files["llava-proj"],
    }
    for rel, src in layout.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if src is None:
            (root / rel).write_text("not a model\n")
        else:
            shutil.copyfile(src, root / rel)
    return root


def test_folders_models_and_projectors(lms):
    tree = Tree(open_source(lms), BlobViews())
    assert isinstance(tree.source, GGUFFolder)
    snap = tree.snapshot()
    assert sorted(snap.models) == [
        "google/gemma3-1b",
        "google/gemma3-4b",
        "liuhaotian/llava",
        "loose",
        "meta/llama3/llama3-8b-Q4",
        "meta/llama3/llama3-8b-Q8",
        "twoproj",
    ]
    assert tree.lookup("") == ["google", "liuhaotian", "loose", "meta", "twoproj"]
    assert tree.lookup("google/gemma3-1b") == ["model.gguf"]
    assert tree.lookup("google/gemma3-4b") == ["mmproj.gguf", "model.gguf"]  # from the blob's own contents
    assert tree.lookup("google/gemma3-4b/mmproj.gguf") == FileRef(
        lms / "google/gemma3-4b/gemma-3-4b-it.gguf", "mmproj.gguf"
    )
    assert tree.lookup("liuhaotian/llava/mmproj.gguf") == FileRef(
        lms / "liuhaotian/llava/mmproj-llava-f16.gguf", "mmproj.gguf"
    )
    assert tree.lookup("meta/llama3") == ["llama3-8b-Q4", "llama3-8b-Q8"]  # README.md left out
    assert tree.lookup("twoproj") == ["model.gguf"]
    skipped = snap.listing.skipped
    assert "split GGUF" in skipped["split/big-00001-of-00002.gguf"]
    assert "which belongs to which" in skipped["twoproj/mmproj-a.gguf"]
    assert "without a model" in skipped["onlyproj/mmproj-x.gguf"]
    assert not any(".hidden" in k for k in skipped) and tree.lookup(".hidden") is None


def test_a_folder_mirrors_its_folder_on_disk(lms):
    tree = Tree(GGUFFolder(lms), BlobViews())
    disk = lms / "meta" / "llama3"
    os.chmod(disk, 0o750)
    try:
        for folder in ("meta/llama3", "meta/llama3/llama3-8b-Q4"):
            attrs = tree.folder_attrs(folder)
            assert attrs["st_mode"] & 0o777 == 0o550 and attrs["st_mtime"] == disk.stat().st_mtime_ns
        before = tree.marks(tree.snapshot())
        os.chmod(disk, 0o755)
        assert tree.marks(tree.rescan()) != before  # a rescan sees the mode change
    finally:
        os.chmod(disk, 0o755)


def test_names_taken_on_disk_are_left_out(tmp_path):
    root = tmp_path / "models"
    (root / "pub" / "a").mkdir(parents=True)
    for name in ("a.gguf", "b.gguf"):
        llama.plain_llama_text(root / "pub" / name)
    snap = Tree(GGUFFolder(root), BlobViews()).snapshot()
    assert sorted(snap.models) == ["pub/b"]
    assert "taken by" in snap.listing.skipped["pub/a.gguf"]


def test_a_folder_that_cannot_be_listed_is_left_out_with_why(tmp_path, monkeypatch):
    """A folder whose listing fails (simulated: as root, permissions do not
    keep a listing out) is named in `ls` with the reason; the rest shows."""
    root = tmp_path / "models"
    for name in ("ok", "locked"):
        (root / name).mkdir(parents=True)
        llama.plain_llama_text(root / name / "m.gguf")
    real = os.scandir

    def scandir(path="."):
        if Path(path) == root / "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    listing = GGUFFolder(root).scan()
    assert list(listing.folders) == ["ok"]
    assert listing.skipped[str(root / "locked")] == "cannot be listed (Permission denied)"


def test_what_is_neither_kind_is_one_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="not an Ollama model store .* nor a folder holding .gguf files"):
        open_source(tmp_path / "empty")
    (tmp_path / "half" / "blobs").mkdir(parents=True)
    with pytest.raises(SourceError, match=r"not an Ollama model store \(no manifests/\)"):
        open_source(tmp_path / "half")


def test_only_the_ollama_store_knows_its_layout():
    """The seam: no module but the store's own (and the one that picks a
    source) imports it; the tree and the FUSE layer name none of its folders."""
    pkg = ROOT / "compatfs"
    importers = set()
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").endswith("ollama")
                and node.level <= 2
                and "testing" not in path.parts
            ):
                importers.add(path.relative_to(pkg).as_posix())
    assert importers <= {"sources/choose.py"}, importers
    for name in ("tree.py", "fuse/operations.py", "router/models.py", "cli/report.py", "cli/main.py", "cli/listing.py"):
        text = (pkg / name).read_text()
        assert '"manifests"' not in text and '"blobs"' not in text and "vnd.ollama" not in text, name


def test_ls_and_inspect_take_a_folder(lms):
    res = subprocess.run(
        [os.sys.executable, "-m", "compatfs", "ls", str(lms), "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["models"]}
    assert rows["google/gemma3-4b"]["files"] == ["mmproj.gguf", "model.gguf"]
    assert rows["google/gemma3-4b"]["text"] == "gemma3" and rows["google/gemma3-4b"]["clip"] == "gemma3-clip"
    assert rows["liuhaotian/llava"]["files"] == ["mmproj.gguf", "model.gguf"]
    assert {r["name"] for r in doc["left_out"]} >= {"twoproj/mmproj-a.gguf", "split/big-00001-of-00002.gguf"}
    res = subprocess.run(
        [os.sys.executable, "-m", "compatfs", "inspect", "google/gemma3-4b", "--clip", "--source", str(lms), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["handler"] == "gemma3-clip"


# -- mounted -------------------------------------------------------------------


@needs_fuse
def test_mounted_folder_serves_what_the_ollama_mount_serves(legacy, lms, mount_store):
    folder, store = mount_store(lms), mount_store(legacy[0])
    assert sorted(os.listdir(folder / "google/gemma3-4b")) == ["mmproj.gguf", "model.gguf"]
    assert sorted(os.listdir(folder / "liuhaotian/llava")) == ["mmproj.gguf", "model.gguf"]
    for mine, theirs in [
        ("google/gemma3-4b/model.gguf", "gemma3:4b/model.gguf"),
        ("google/gemma3-4b/mmproj.gguf", "gemma3:4b/mmproj.gguf"),
        ("google/gemma3-1b/model.gguf", "gemma3:1b/model.gguf"),
        ("liuhaotian/llava/mmproj.gguf", "llava:7b/mmproj.gguf"),
    ]:
        assert (folder / mine).read_bytes() == (store / theirs).read_bytes(), mine
    st = os.stat(folder / "google")
    assert st.st_mode & 0o777 == (lms / "google").stat().st_mode & 0o555


@needs_fuse
def test_models_added_and_removed_while_mounted(legacy, tmp_path, mount_store):
    root = tmp_path / "models"
    (root / "pub" / "a").mkdir(parents=True)
    shutil.copyfile(legacy[1]["gemma3"], root / "pub" / "a" / "a.gguf")
    m = mount_store(root)
    assert os.listdir(m / "pub") == ["a"]
    (root / "pub" / "b").mkdir()
    shutil.copyfile(legacy[1]["gemma3v"], root / "pub" / "b" / "b.gguf")
    wait_until(lambda: sorted(os.listdir(m / "pub")) == ["a", "b"], 10, what="the added folder b listed")
    assert sorted(os.listdir(m / "pub/b")) == ["mmproj.gguf", "model.gguf"]
    shutil.rmtree(root / "pub" / "b")
    wait_until(lambda: os.listdir(m / "pub") == ["a"], 10, what="the removed folder b gone from the listing")
    assert m.alive


@needs_fuse
def test_a_mountpoint_inside_the_folder_is_refused(lms):
    res = subprocess.run(
        [os.sys.executable, "-m", "compatfs", "mount", str(lms), str(lms / "google")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "inside" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


@needs_fuse
@pytest.mark.parametrize("folder", ["google/gemma3-4b", "liuhaotian/llava", "google/gemma3-1b"])
def test_stock_llama_server_loads_the_folders_models(lms, mount_store, tmp_path, folder):
    """A monolithic vision blob (its mmproj.gguf from its own contents), a
    model with a projector file beside it, a text model."""
    llama_server = llamacpp.tool("llama-server")
    m = mount_store(lms)
    port = _free_port()
    d = m / folder
    mmproj = ["--mmproj", str(d / "mmproj.gguf")] if (d / "mmproj.gguf").exists() else []
    assert bool(mmproj) == (folder != "google/gemma3-1b")
    log = open(tmp_path / "llama-server.log", "wb")
    server = subprocess.Popen(
        [
            str(llama_server),
            "-m",
            str(d / "model.gguf"),
            *mmproj,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "-c",
            "512",
            "-t",
            "2",
            "--no-warmup",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline, healthy = time.monotonic() + 120, False
        while time.monotonic() < deadline and server.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(0.5)
        out = (tmp_path / "llama-server.log").read_text(errors="replace")
        assert healthy, out[-3000:]
        res = _post(
            f"http://127.0.0.1:{port}/completion",
            {"prompt": "hello", "n_predict": 3, "ignore_eos": True, "temperature": 0},
            timeout=60,
        )
        assert res["tokens_predicted"] == 3, res
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=10) as r:
            props = json.load(r)
        assert props["modalities"]["vision"] == bool(mmproj), props.get("modalities")  # the projector loaded
    finally:
        llamacpp.stop(server, log)


def test_the_ollama_store_is_picked_for_a_store(legacy):
    assert isinstance(open_source(legacy[0]), OllamaStore)
