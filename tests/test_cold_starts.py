"""What a cold start (llama-server's MAP_POPULATE of a mounted model) leans
on: as many read-ahead requests in flight as the daemon has workers
(`libfuse.background`, sent in the INIT reply), and page-aligned reply
buffers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from compatfs.fuse import libfuse
from compatfs.files.libc import LIBC, PAGE, malloc_aligned
from compatfs.testing.store import add_model

from conftest import needs_fuse
from ggufs import write_gguf

MiB = 1 << 20


@pytest.mark.parametrize(
    "options, expect",
    [
        ({"max_threads": 64, "max_idle_threads": 64}, (64, 48)),  # what the daemon sets
        ({"max_threads": "200"}, (200, 150)),  # as -o gives it
        ({"max_threads": 4}, (12, 9)),  # never below the kernel's own
        ({}, (12, 9)),  # libfuse's 10 workers
        ({"max_threads": "many"}, (12, 9)),
    ],
)
def test_requests_in_flight_follow_the_workers(options, expect):
    assert libfuse.background(options) == expect


def _connection(path: Path) -> Path:
    """The mount's folder in fusectl (skips where it is not to be seen)."""
    conn = Path("/sys/fs/fuse/connections") / str(os.minor(os.stat(path).st_dev))
    if not conn.is_dir():
        pytest.skip(f"{conn} missing: fusectl not mounted there (mount -t fusectl none {conn.parent})")
    return conn


@needs_fuse
def test_the_mount_lets_the_kernel_keep_a_request_in_flight_per_worker(tmp_path, mount_store):
    blob = write_gguf(
        tmp_path / "m.gguf", "llama", {"llama.block_count": 1}, {"token_embd.weight": np.zeros(1024, np.float32)}
    )
    store = tmp_path / "store"
    add_model(store, "m", blob)
    m = mount_store(store, "-o", "max_threads=40")
    conn = _connection(m.path)
    assert (conn / "max_background").read_text().strip() == "40", m.log_text()
    assert (conn / "congestion_threshold").read_text().strip() == "30"


def test_reply_buffers_are_page_aligned():
    mem = malloc_aligned(MiB, PAGE)
    assert mem and mem % PAGE == 0
    LIBC.free(mem)
