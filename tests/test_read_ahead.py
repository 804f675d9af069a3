"""The mount's read-ahead: raised by the daemon, and still raised after the
kernel has taken libfuse's INIT reply (which lowers it to 128 KiB when the
daemon's write landed first)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from compatfs import fusefs
from compatfs.testing import llama
from compatfs.testing.store import add_model

from conftest import needs_fuse


def test_a_reset_after_the_write_is_undone(tmp_path):
    knob = tmp_path / "read_ahead_kb"
    knob.write_text("2048\n")
    keeper = threading.Thread(target=fusefs._keep_read_ahead, args=(knob, 2048))
    keeper.start()
    time.sleep(0.2)
    knob.write_text("128\n")               # what processing the INIT reply does
    deadline = time.monotonic() + 2
    while knob.read_text().strip() != "2048" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert knob.read_text().strip() == "2048"
    keeper.join(timeout=fusefs.READ_AHEAD_SETTLE + 2)
    assert not keeper.is_alive()


def test_the_knob_is_left_alone_once_it_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(fusefs, "READ_AHEAD_SETTLE", 0.3)
    knob = tmp_path / "read_ahead_kb"
    knob.write_text("2048\n")
    fusefs._keep_read_ahead(knob, 2048)    # returns after the settle time, nothing changed
    knob.write_text("512\n")               # a later change by the administrator stays
    time.sleep(0.2)
    assert knob.read_text().strip() == "512"


@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a mount's read_ahead_kb")
def test_every_mount_keeps_its_read_ahead(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "llama3", llama.legacy_llama3_instruct(tmp_path / "l3.gguf"))
    for i in range(4):     # the race with the INIT reply went either way, about one mount in two
        m = mount_store(store, "--read-ahead-kb", "4096")
        st = os.stat(m.path)
        knob = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
        time.sleep(0.5)
        assert knob.read_text().strip() == "4096", m.log_text()
        m.close()
