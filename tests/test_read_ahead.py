"""The mount's read-ahead: raised by the daemon, and still raised after the
kernel has taken libfuse's INIT reply (which lowered it to the reply's
max_readahead, 128 KiB, when the daemon's write landed first: about one
mount in two)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compatfs.testing import llama
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until


@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a mount's read_ahead_kb")
def test_every_mount_keeps_its_read_ahead(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "llama3", llama.legacy_llama3_instruct(tmp_path / "l3.gguf"))
    for _i in range(4):  # the race with the INIT reply went either way, about one mount in two
        m = mount_store(store, "--read-ahead-kb", "4096")
        st = os.stat(m.path)
        knob = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
        wait_until(lambda m=m: "read-ahead " in m.log_text(), what="the daemon logging the read-ahead it set")
        assert knob.read_text().strip() == "4096", m.log_text()
        m.close()
