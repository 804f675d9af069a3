"""Real mounts, served by a daemon process: tree, byte-exactness, read-only,
store changes, bad input."""

import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from compatfs.testing.store import add_blob, add_model
from compatfs.view.assemble import FileRange
from compatfs.view.catalog import BlobViews

from conftest import needs_fuse, wait_until
from ggufs import plain_model, synthetic_gemma3, write_gguf

pytestmark = needs_fuse


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    add_model(root, "gemma3x", synthetic_gemma3(tmp_path / "g.gguf"), tag="4b")
    add_model(root, "plain", plain_model(tmp_path / "p.gguf"))
    add_model(root, "repo", plain_model(tmp_path / "p.gguf"), host="hf.co", namespace="org", tag="Q4")
    return root


def render(blob: Path, kind: str) -> bytes:
    """The view rendered in-process, without FUSE."""
    view = BlobViews().view(blob, kind)
    data = blob.read_bytes()
    return b"".join(
        data[p.offset : p.offset + p.size] if isinstance(p, FileRange) else bytes(p) for p in view.pieces(0, view.size)
    )


def blob_of(store: Path, manifest_rel: str, media="model") -> Path:
    doc = json.loads((store / "manifests" / manifest_rel).read_text())
    layer = next(l for l in doc["layers"] if l["mediaType"].endswith(media))
    return store / "blobs" / layer["digest"].replace(":", "-")


def test_tree_names_like_ollama_list(store, mount_store, tmp_path):
    # An adapter layer (a LoRA GGUF) is a blob of its own too.
    manifest = store / "manifests/registry.ollama.ai/library/plain/latest"
    doc = json.loads(manifest.read_text())
    adapter = write_gguf(tmp_path / "lora.gguf", "llama", kvs={"adapter.type": "lora"})
    doc["layers"].append({"mediaType": "application/vnd.ollama.image.adapter", **add_blob(store, adapter)})
    manifest.write_text(json.dumps(doc))
    m = mount_store(store)
    assert sorted(os.listdir(m.path)) == ["blobs", "gemma3x:4b", "hf.co", "models.ini", "plain:latest"]
    assert os.listdir(m / "hf.co/org") == ["repo:Q4"]
    assert sorted(os.listdir(m / "gemma3x:4b")) == ["mmproj.gguf", "model.gguf"]
    assert sorted(os.listdir(m / "plain:latest")) == ["adapter.gguf", "model.gguf"]  # the adapter byte for byte
    assert (m / "plain:latest/adapter.gguf").read_bytes() == adapter.read_bytes()
    blobs = os.listdir(m / "blobs")
    assert len(blobs) == 3 and all(b.startswith("sha256-") for b in blobs)
    lora = next(b for b in blobs if (m / "blobs" / b / "model.gguf").read_bytes() == adapter.read_bytes())
    assert os.listdir(m / "blobs" / lora) == ["model.gguf"]
    gem = blob_of(store, "registry.ollama.ai/library/gemma3x/4b")
    assert sorted(os.listdir(m / "blobs" / gem.name)) == ["mmproj.gguf", "model.gguf"]


def test_views_are_byte_exact(store, mount_store):
    m = mount_store(store)
    gem = blob_of(store, "registry.ollama.ai/library/gemma3x/4b")
    r = random.Random(7)
    for kind in ("model.gguf", "mmproj.gguf"):
        expect = render(gem, kind)
        path = m / "gemma3x:4b" / kind
        assert path.stat().st_size == len(expect)
        assert path.read_bytes() == expect
        assert (m / "blobs" / gem.name / kind).read_bytes() == expect
        with open(path, "rb", buffering=0) as f:
            for _ in range(1500):
                off = r.randrange(0, len(expect) + 64)
                size = r.choice([1, 7, 100, 4096, 65536, 300000])
                f.seek(off)
                assert f.read(size) == expect[off : off + size], (kind, off, size)


def test_unclaimed_blob_reads_back_identical(store, mount_store):
    m = mount_store(store)
    blob = blob_of(store, "registry.ollama.ai/library/plain/latest")
    digest = hashlib.sha256((m / "plain:latest/model.gguf").read_bytes()).hexdigest()
    assert f"sha256-{digest}" == blob.name


def test_everything_is_read_only(store, mount_store):
    m = mount_store(store)
    before = {p: p.stat().st_mtime_ns for p in store.rglob("*")}
    target = m / "plain:latest/model.gguf"
    for attempt in (
        lambda: open(target, "r+b"),
        lambda: open(m / "new.gguf", "wb"),
        lambda: os.mkdir(m / "d"),
        lambda: os.chmod(target, 0o777),
        lambda: os.truncate(target, 0),
        lambda: os.unlink(target),
        lambda: os.rename(target, m / "x"),
    ):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert before == {p: p.stat().st_mtime_ns for p in store.rglob("*")}


def test_tree_follows_the_store(store, mount_store, tmp_path):
    m = mount_store(store)
    assert "late:latest" not in os.listdir(m.path)
    add_model(store, "late", plain_model(tmp_path / "late.gguf"))
    wait_until(lambda: "late:latest" in os.listdir(m.path), 5, what="the new model late:latest listed")
    assert (m / "late:latest/model.gguf").read_bytes()[:4] == b"GGUF"
    shutil.rmtree(store / "manifests/registry.ollama.ai/library/plain")
    wait_until(lambda: "plain:latest" not in os.listdir(m.path), 5, what="the removed model plain:latest gone")


def test_no_translate_serves_blobs_unchanged(store, mount_store):
    gem = blob_of(store, "registry.ollama.ai/library/gemma3x/4b")
    for m in (mount_store(store, "--no-translate"), mount_store(store, env={"OLLAMA_LLAMA_CPP_COMPAT": "0"})):
        assert (m / "gemma3x:4b/model.gguf").read_bytes() == gem.read_bytes()
        assert os.listdir(m / "gemma3x:4b") == ["model.gguf"]


def test_bad_input_keeps_the_mount_up(store, mount_store, tmp_path):
    good = plain_model(tmp_path / "good.gguf")
    add_model(store, "truncated", good)
    blob_of(store, "registry.ollama.ai/library/truncated/latest").unlink()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(synthetic_gemma3(tmp_path / "g2.gguf").read_bytes()[:3000])
    add_model(store, "cut", cut)
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(np.random.default_rng(3).bytes(5000))
    add_model(store, "noise", noise)
    garbage = store / "manifests/registry.ollama.ai/library/garbage/latest"
    garbage.parent.mkdir(parents=True)
    garbage.write_text("{not json")
    baddigest = store / "manifests/registry.ollama.ai/library/baddigest/latest"
    baddigest.parent.mkdir(parents=True)
    baddigest.write_text(
        json.dumps(
            {"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:1234", "size": 1}]}
        )
    )
    snapshot = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}

    m = mount_store(store)
    names = os.listdir(m.path)
    assert "garbage:latest" not in names and "baddigest:latest" not in names
    cut_blob = blob_of(store, "registry.ollama.ai/library/cut/latest")
    for name in ("cut:latest", "noise:latest", "truncated:latest"):
        with pytest.raises(OSError) as e:
            (m / name / "model.gguf").read_bytes()
        assert e.value.errno == errno.EIO, name
    # The unparsable blob is not claimed by any handler for the mmproj side.
    assert os.listdir(m / "cut:latest") == ["model.gguf"]
    assert m.alive
    assert (m / "gemma3x:4b/model.gguf").read_bytes() == render(
        blob_of(store, "registry.ollama.ai/library/gemma3x/4b"), "model.gguf"
    )
    log = m.log_text()
    assert cut_blob.name in log and "runs past the end" in log
    assert snapshot == {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
