"""One worker at a time reads the FUSE device; after a request it answered
in C (root opening a folder, a folder closed) it keeps the turn and polls
the device for a while before it waits in read (`compatfs.fuse.polling`,
`_accel.polling_io`): a caller listing folder after folder finds its next
request taken by a thread still running.  Listings stay what they were, a
mount polling ends on SIGTERM and on fusermount -u while a caller keeps
listing, and without compatfs._accel every idle worker waits in read."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from compatfs.fuse import polling
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.translate import accel
from conftest import Mount, needs_fuse

MODELS = 12

# Lists every folder of the mount at argv[1] (and stats its files) until killed.
_LISTER = """
import os, sys
root = sys.argv[1]
while True:
    for name in os.listdir(root):
        folder = os.path.join(root, name)
        if os.path.isdir(folder):
            for f in os.listdir(folder):
                os.lstat(os.path.join(folder, f))
"""


@pytest.fixture
def store(open_tmp):
    root = open_tmp / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    for i in range(MODELS):
        add_model(root, f"m{i:02d}", blob, tag="1b")
    return root


# Prints what `ls -l` of every folder of the mount at argv[1] finds (names
# and sizes), argv[2] times over, one line a time.
_LIST = """
import json, os, sys
root = sys.argv[1]
for _ in range(int(sys.argv[2])):
    print(json.dumps({
        name: sorted((f, os.lstat(os.path.join(root, name, f)).st_size) for f in os.listdir(os.path.join(root, name)))
        for name in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, name))
    }, sort_keys=True))
"""

# Prints a hash of each file named in argv[1:], in turn, argv[1] rounds over.
_READ = """
import hashlib, sys
for _ in range(int(sys.argv[1])):
    print(" ".join(hashlib.sha256(open(p, "rb").read()).hexdigest() for p in sys.argv[2:]))
"""


def _run(code: str, *args) -> list[str]:
    """The lines `code` prints, run with `args` in a process of its own (a mount that hangs fails the test)."""
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def _found(log: str) -> int | None:
    found = re.search(r"(\d+) requests found by a polling worker", log)
    return int(found.group(1)) if found else None


@needs_fuse
@pytest.mark.parametrize("compiled", [True, False], ids=["accel", "no-accel"])
def test_listings_are_answered_by_a_polling_worker(store, open_tmp, compiled):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built")
    env = {"XDG_STATE_HOME": str(open_tmp / "state"), "COMPATFS_NO_ACCEL": "0" if compiled else "1"}
    m = Mount(store, open_tmp / "mnt", env=env)
    try:
        listings = _run(_LIST, m.path, 20)
        first = json.loads(listings[0])
        assert len([n for n in first if n.endswith(":1b")]) == MODELS
        assert all(files == first["m00:1b"] for n, files in first.items() if n.endswith(":1b"))
        assert listings == listings[:1] * 20
        assert m.alive
    finally:
        m.close()
    log = m.log.read_text(errors="replace")
    if compiled:
        assert (
            f"listings take turns, polling up to {polling.SPIN_NS // 1000} us after a request answered in C" in log
        ), log
        assert (_found(log) or 0) > 0, log  # (hundreds of requests, each sent right after the last answer)
    else:
        assert "every idle worker waits for a request (compatfs._accel not built)" in log, log
        assert _found(log) == 0, log


@needs_fuse
@pytest.mark.parametrize("how", ["SIGTERM", "fusermount"])
def test_a_polling_mount_ends_while_a_caller_keeps_listing(store, open_tmp, how):
    """The loop's end cancels its workers, a polling one included."""
    m = Mount(store, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    lister = subprocess.Popen(
        [sys.executable, "-c", _LISTER, str(m.path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(1.0)
        assert lister.poll() is None and m.alive
        if how == "SIGTERM":
            m.proc.send_signal(signal.SIGTERM)
        else:
            subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True, check=True)  # (busy: lazily)
        m.proc.wait(timeout=20)
        assert m.proc.returncode == 0, m.log_text()
        assert not os.path.ismount(m.path)
    finally:
        lister.kill()
        lister.wait(timeout=20)
        m.close()


@needs_fuse
def test_reads_alongside_a_caller_listing_give_the_same_bytes(store, open_tmp):
    """Reads end listing mode and listings start it again, over and over:
    every read still gives the bytes it gave with nothing else going on."""
    m = Mount(store, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    files = [m / f"m{i:02d}:1b/model.gguf" for i in range(MODELS)]
    (want,) = _run(_READ, 1, files[0])
    lister = subprocess.Popen(
        [sys.executable, "-c", _LISTER, str(m.path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)
        assert _run(_READ, 3, *files) == [" ".join([want] * MODELS)] * 3
        assert lister.poll() is None and m.alive
    finally:
        lister.kill()
        lister.wait(timeout=20)
        m.close()
    assert (_found(m.log.read_text(errors="replace")) or 0) > 0


@pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")
def test_one_spin_per_process():
    """The io's address is the process's one (the same for the same spin and
    releasedir); another one, or a spin out of (0, 1 s], is refused."""
    code = (
        "from compatfs.translate import accel; n = accel.native\n"
        "a = n.polling_io(50_000, True); assert a and n.polling_io(50_000, True) == a and n.polled() == 0\n"
        "for bad, rd in ((20_000, True), (50_000, False), (0, True), (-1, True), (2_000_000_000, True)):\n"
        "    try: n.polling_io(bad, rd)\n"
        "    except ValueError: pass\n"
        "    else: raise SystemExit(f'{bad} taken')\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
