"""The index only hints: through a real mount, a tampered index gives the
true size and flag (every value it records is checked before it is served,
the wrong entry replaced with a log line), and an index file someone else
could have written is not used at all (one log line, the file untouched).
Measured before: a lowered size of a model.gguf with sampling keys gave a
silently short file, a flipped embedding flag gave a chat model
`embeddings = true` in models.ini, and an index file writable by anyone or
owned by another user was used as it was."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.view.catalog import BlobViews
from compatfs.view.index import Index

from conftest import needs_fuse, wait_until
from test_sampling import set_params

CHAT, PLAIN = "chat:1b/model.gguf", "plain:1b/model.gguf"


@pytest.fixture
def warm(tmp_path, mount_store):
    """A store of two models (chat with a params layer's sampling keys), the
    cache folder of an index a first mount filled, and the true bytes of
    both model.gguf files."""
    root = tmp_path / "store"
    text = llama.plain_llama_text(tmp_path / "t.gguf")
    set_params(root, add_model(root, "chat", text, tag="1b"), b'{"temperature": 0.3, "top_k": 9, "stop": ["<x>"]}')
    add_model(root, "plain", llama.plain_llama_text(tmp_path / "p.gguf", seed=3), tag="1b")
    cache = tmp_path / "cache"
    first = mount_store(root, env={"COMPATFS_CACHE_DIR": str(cache)})
    true = {f: (first / f).read_bytes() for f in (CHAT, PLAIN)}
    assert all(os.stat(first / f).st_size == len(b) for f, b in true.items())
    first.close()
    return root, cache, true


def _blob(root: Path, name: str) -> str:
    """The model blob of `name` (its GGUF layer's path, as the index keys it)."""
    import json

    doc = json.loads((root / "manifests/registry.ollama.ai/library" / name / "1b").read_text())
    digest = next(x["digest"] for x in doc["layers"] if x["mediaType"].endswith(".model"))
    return str(root / "blobs" / digest.replace(":", "-"))


def _tamper(cache: Path, sql: str, *args) -> None:
    db = sqlite3.connect(cache / "index.sqlite3")
    try:
        assert db.execute(sql, args).rowcount >= 1, sql
        db.commit()
    finally:
        db.close()


def _section(ini: str, name: str) -> str:
    return ini.split(f"[{name}]", 1)[1].split("\n[", 1)[0]


@needs_fuse
def test_a_lowered_size_with_sampling_keys_is_found_before_a_byte_is_served(warm, mount_store):
    root, cache, true = warm
    _tamper(cache, "UPDATE sampled_v1 SET model_size = model_size - 4096")
    m = mount_store(root, env={"COMPATFS_CACHE_DIR": str(cache)})
    assert (m / CHAT).read_bytes() == true[CHAT]
    assert os.stat(m / CHAT).st_size == len(true[CHAT])
    assert "entry replaced" in m.log_text()


@needs_fuse
def test_a_flipped_embedding_flag_is_found(warm, mount_store, tmp_path):
    root, cache, true = warm
    _tamper(cache, "UPDATE views_v5 SET embedding = 1 WHERE path = ?", _blob(root, "plain"))
    # Asked before a view is built, the flag comes from the blob's header.
    index = Index(cache / "index.sqlite3", translate=True)
    assert index.get(Path(_blob(root, "plain")), _stamp(_blob(root, "plain"))).embedding  # as tampered
    views = BlobViews(index=index)
    assert views.embedding(Path(_blob(root, "plain"))) is False
    views.close()
    _tamper(cache, "UPDATE views_v5 SET embedding = 1 WHERE path = ?", _blob(root, "plain"))
    # Through a mount: once model.gguf's view is built, models.ini says the truth.
    m = mount_store(root, env={"COMPATFS_CACHE_DIR": str(cache)})
    assert (m / PLAIN).read_bytes() == true[PLAIN]
    wait_until(
        lambda: "embeddings" not in _section((m / "models.ini").read_text(), "plain@1b"),
        10,
        what="the flag checked against the header reaching models.ini",
    )
    assert "entry replaced" in m.log_text()


def _stamp(path: str):
    from compatfs.files.lookup import identity, status

    return identity(status(Path(path)))


@needs_fuse
@pytest.mark.parametrize("how", ["writable by others", "another user's", "in a folder others may write"])
def test_an_index_someone_else_could_write_is_not_used(warm, mount_store, how):
    root, cache, true = warm
    _tamper(cache, "UPDATE views_v5 SET model_size = model_size - 4096")
    index = cache / "index.sqlite3"
    if how == "writable by others":
        index.chmod(0o666)
    elif how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root (chown)")
        os.chown(index, 65534, 65534)
    else:
        cache.chmod(0o777)
    before = index.read_bytes(), os.stat(index)
    m = mount_store(root, env={"COMPATFS_CACHE_DIR": str(cache)})
    assert {f: os.stat(m / f).st_size for f in true} == {f: len(b) for f, b in true.items()}
    assert (m / PLAIN).read_bytes() == true[PLAIN]
    m.close()
    log = m.log.read_text()
    assert log.count("is not used") == 1 and "without the persistent index" in log, log
    after = os.stat(index)
    assert index.read_bytes() == before[0] and (after.st_mode, after.st_uid, after.st_mtime_ns) == (
        before[1].st_mode,
        before[1].st_uid,
        before[1].st_mtime_ns,
    )


def test_an_index_someone_else_could_write_is_not_opened(tmp_path, caplog):
    """In-process: the same refusal, naming why."""
    path = tmp_path / "index.sqlite3"
    Index(path, translate=True, version="v1").close()
    path.chmod(0o646)
    with caplog.at_level(logging.WARNING, logger="compatfs"):
        index = Index(path, translate=True, version="v1")
    assert "may be written by others" in caplog.text and index._db is None
