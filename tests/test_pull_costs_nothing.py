"""A pull under a running mount: Ollama writes `blobs/sha256-<hex>-partial`
(and its `-partial-N` part files) all through a download, which no manifest
names until the download is done: those writes cause no scan (measured on
0c32945: a scan for each second of the download), and the model is listed
within 2 s of its manifest landing."""
import hashlib
import json
import os
import time

from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until

pytestmark = needs_fuse

SCANNED_FOR_A_CHANGE = "rescanned for a change seen"


def test_a_download_beside_the_blobs_causes_no_scan(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    m = mount_store(store, "-v")      # -v -v: debug, each scan and why
    wait_until(lambda: "rescanned for a first look" in m.log_text(), what="the rescan thread's first look")
    data = gemma3.legacy_gemma3_text(tmp_path / "pulled.gguf", seed=7).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    partial = store / "blobs" / f"sha256-{digest}-partial"
    before = m.log_text().count(SCANNED_FOR_A_CHANGE)
    step = max(1, len(data) // 60)
    with open(partial, "wb") as w:
        for i, at in enumerate(range(0, len(data), step)):     # about 3 s of writing
            w.write(data[at:at + step])
            w.flush()
            (store / "blobs" / f"sha256-{digest}-partial-{i % 4}").write_text(json.dumps({"completed": at}))
            time.sleep(0.05)
    for i in range(4):
        (store / "blobs" / f"sha256-{digest}-partial-{i}").unlink()
    os.rename(partial, store / "blobs" / f"sha256-{digest}")
    time.sleep(1.5)     # a scan would have come by now
    assert m.log_text().count(SCANNED_FOR_A_CHANGE) == before, "the download caused scans"
    add_model(store, "pulled", tmp_path / "pulled.gguf", tag="latest")
    wait_until(lambda: "pulled:latest" in os.listdir(m.path), seconds=2.0, what="the pulled model listed")
    assert m.log_text().count(SCANNED_FOR_A_CHANGE) > before      # (the count means something)
    assert m.alive
