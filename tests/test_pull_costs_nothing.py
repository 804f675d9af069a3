"""A pull under a running mount: Ollama writes `blobs/sha256-<hex>-partial`
(and its `-partial-N` part files) all through a download, which no manifest
names until the download is done: those writes cause no scan (measured on
0c32945: a scan for each second of the download), and the model is listed
within 2 s of its manifest landing."""

import hashlib
import json
import os
import time

import pytest

from compatfs.files.libc import cached_pages, pages
from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until

pytestmark = needs_fuse

SCANNED_FOR_A_CHANGE = "rescanned for a change seen"


def test_a_download_beside_the_blobs_causes_no_scan(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    m = mount_store(store, "-v")  # -v -v: debug, each scan and why
    wait_until(lambda: "rescanned for a first look" in m.log_text(), what="the rescan thread's first look")
    data = gemma3.legacy_gemma3_text(tmp_path / "pulled.gguf", seed=7).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    partial = store / "blobs" / f"sha256-{digest}-partial"
    before = m.log_text().count(SCANNED_FOR_A_CHANGE)
    step = max(1, len(data) // 60)
    with open(partial, "wb") as w:
        for i, at in enumerate(range(0, len(data), step)):  # about 3 s of writing
            w.write(data[at : at + step])
            w.flush()
            (store / "blobs" / f"sha256-{digest}-partial-{i % 4}").write_text(json.dumps({"completed": at}))
            time.sleep(0.05)
    for i in range(4):
        (store / "blobs" / f"sha256-{digest}-partial-{i}").unlink()
    os.rename(partial, store / "blobs" / f"sha256-{digest}")
    time.sleep(1.5)  # a scan would have come by now
    assert m.log_text().count(SCANNED_FOR_A_CHANGE) == before, "the download caused scans"
    add_model(store, "pulled", tmp_path / "pulled.gguf", tag="latest")
    wait_until(lambda: "pulled:latest" in os.listdir(m.path), seconds=2.0, what="the pulled model listed")
    assert m.log_text().count(SCANNED_FOR_A_CHANGE) > before  # (the count means something)
    assert m.alive


def test_a_download_drops_no_page_of_a_model(tmp_path, mount_store):
    """A file appearing in `blobs/` changes that folder's time, which the
    mount's folders show: the kernel forgets their attributes, not the
    pages of the models in them (on 0c32945 every model.gguf's pages were
    dropped, each running server reading its model through the mount again)."""
    store = tmp_path / "store"
    add_model(store, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    m = mount_store(store)
    path = m / "text:1b/model.gguf"
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        while os.read(fd, 1 << 20):
            pass
        before = cached_pages(fd, 0, size)
        if before is None:
            pytest.skip("the kernel does not tell what the page cache holds (cachestat)")
        assert before == pages(0, size)
        seen = m.changes_seen()
        (store / "blobs" / "sha256-0123-partial").write_bytes(b"x")
        wait_until(lambda: m.changes_seen() > seen, what="a rescan seeing blobs/ changed")
        assert "<blobs>" in m.log_text().split("store changed: ")[-1].splitlines()[0]
        assert cached_pages(fd, 0, size) == before
    finally:
        os.close(fd)
