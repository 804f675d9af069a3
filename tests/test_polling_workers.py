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
            f"listings take turns, polling up to {polling.SPIN_NS // 1000} us after a request answered in C,"
            f" keeping the turn up to {polling.WATCH_NS // 1000} us for one answered in Python" in log
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
        "a = n.polling_io(50_000, 10**6, True); assert a and n.polling_io(50_000, 10**6, True) == a\n"
        "assert n.polled() == 0\n"
        "for bad, watch, rd in ((20_000, 10**6, True), (50_000, 10**6, False), (50_000, 2 * 10**6, True),\n"
        "                       (0, 10**6, True), (-1, 10**6, True), (2 * 10**9, 10**6, True), (50_000, 0, True)):\n"
        "    try: n.polling_io(bad, watch, rd)\n"
        "    except ValueError: pass\n"
        "    else: raise SystemExit(f'{bad} taken')\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# `_accel.polling_io`'s read (a watch of argv[1] ns) over a pipe: `take`
# reads one request as a worker would, `send` writes one (a 40-byte
# fuse_in_header, as the kernel writes it).
_IO_PIPE = """
import ctypes, os, struct, sys, threading, time
from compatfs.translate import accel
io = accel.native.polling_io(50_000, int(sys.argv[1]), True)
READ = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
read = READ(ctypes.c_void_p.from_address(io + ctypes.sizeof(ctypes.c_void_p)).value)  # (after writev)
r, w = os.pipe()

def take():
    buf = ctypes.create_string_buffer(4096)
    n = read(r, buf, 4096, None)
    assert n == 40, n
    return struct.unpack_from("<I", buf.raw, 4)[0]

def send(opcode):
    os.write(w, struct.pack("<IIQQIIIHH", 40, opcode, 1, 1, 0, 0, 0, 0, 0))
"""

# Two workers on `_IO_PIPE`: worker A takes a FORGET (answered in C: listing mode
# starts, A has the turn), then a GETATTR (a listing's, answered in Python:
# A keeps the turn, the watch armed) and never reads again, as if its
# answer never came.  Worker B waits for the turn; a READ written meanwhile
# is B's once the watch ends listing mode.  Prints B's wait and opcode, then
# what A's next read takes (the turn gone: a plain read).
_WATCHED = (
    _IO_PIPE
    + """

got = {}
def worker_a():
    send(2); got["a1"] = take()  # FORGET
    send(3); got["a2"] = take()  # GETATTR
    started.set()
    resume.wait()
    send(16); got["a3"] = take()  # RELEASE (not a listing's)

def worker_b():
    started.wait()
    t = time.monotonic(); got["b"] = take(); got["waited"] = time.monotonic() - t

started, resume = threading.Event(), threading.Event()
a = threading.Thread(target=worker_a); b = threading.Thread(target=worker_b)
a.start(); b.start()
started.wait(); time.sleep(0.05); send(15)  # READ, while A still answers its GETATTR
b.join(30); assert not b.is_alive(), "B still waits for the turn"
resume.set(); a.join(30); assert not a.is_alive(), "A's read hangs"
print(got["a1"], got["a2"], got["b"], got["a3"], round(got["waited"], 3))
"""
)


@pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")
@pytest.mark.parametrize("watch", [0.3, 0.001])
def test_a_listing_answered_in_python_keeps_the_turn_until_the_watch_ends_it(watch):
    """The worker with the turn keeps it through a listing's request
    answered in Python (no other worker reads meanwhile), for `watch`
    seconds at most: then listing mode ends and a waiting worker reads; the
    first worker's next read is a plain one."""
    (line,) = _run(_WATCHED, int(watch * 1e9))
    a1, a2, b, a3, waited = line.split()
    assert (a1, a2, b, a3) == ("2", "3", "15", "16")
    assert float(waited) >= (0.2 if watch > 0.1 else 0.0)  # (the READ came 0.05 s after the GETATTR)


# As _WATCHED, with a watch of 0.2 s: A's watch ends listing mode while A
# still answers its GETATTR; B then starts listing mode again (a FORGET)
# and takes a GETATTR of its own, arming the watch again, and never reads
# again either.  A's next read must leave B's watch armed: A then waits for
# the turn, and a READ sent meanwhile is read (by A) once B's watch ends
# listing mode.  Prints what each read took.
_REARMED = (
    _IO_PIPE
    + """

got = []
a_answers, b_armed = threading.Event(), threading.Event()
def worker_a():
    send(2); got.append(("a", take()))
    send(3); got.append(("a", take()))
    a_answers.set()
    b_armed.wait()
    got.append(("a", take()))  # (B has the turn, its watch armed: A waits for it, then reads the READ)

def worker_b():
    a_answers.wait(); time.sleep(0.5)  # (A's watch has ended listing mode)
    send(2); got.append(("b", take()))
    send(3); got.append(("b", take()))
    b_armed.set()

a = threading.Thread(target=worker_a, daemon=True); b = threading.Thread(target=worker_b, daemon=True)
a.start(); b.start()
b.join(30); assert not b.is_alive(), "B hangs"
time.sleep(0.05); send(15)
a.join(30); assert not a.is_alive(), "A still waits for the turn: B's watch was disarmed"
print(*(f"{who}{op}" for who, op in got))
"""
)


@pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")
def test_a_worker_whose_turn_the_watch_ended_leaves_the_next_watch_armed():
    (line,) = _run(_REARMED, 200_000_000)
    assert line.split() == ["a2", "a3", "b2", "b3", "a15"]
