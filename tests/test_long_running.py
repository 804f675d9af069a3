"""A mount that runs for months: signals, a daemon killed under its mount, the
store changing while many readers read, removed models leaving nothing held,
logs, libfuse selection and options."""

import errno
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from compatfs.testing import gemma3, llama, llava, nemotron
from compatfs.view.segments import Cached
from compatfs.view.catalog import BlobViews
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until
from test_hostile_mount import blob_of, expected

pytestmark = needs_fuse


def compatfs(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "compatfs", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    add_model(root, "vision", gemma3.legacy_gemma3_vision(tmp_path / "gv.gguf"), tag="4b")
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    add_model(
        root,
        "llava",
        llama.plain_llama_text(tmp_path / "p.gguf"),
        llava.legacy_llava_projector(tmp_path / "lp.gguf"),
        tag="7b",
    )
    return root


def clean_log(text: str) -> None:
    assert "Traceback" not in text and "Ignoring invalid max threads" not in text, text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(store, mount_store, sig):
    m = mount_store(store)
    f = open(m / "vision:4b/model.gguf", "rb")  # an open file does not hold the exit up
    f.read(1000)
    m.proc.send_signal(sig)
    assert m.proc.wait(timeout=15) == 0
    assert not os.path.ismount(m.path)
    log = m.log_text()
    assert f"{sig.name}: unmounting {m.path}" in log and f"unmounted {m.path}" in log
    clean_log(log)
    with pytest.raises(OSError) as e:  # its reader learns the mount is gone
        f.read(1 << 20)
    assert e.value.errno == errno.ENOTCONN
    with pytest.raises(OSError):
        f.close()


def test_remount_after_kill_9(store, mount_store, tmp_path):
    m = mount_store(store)
    m.proc.kill()
    m.proc.wait(timeout=20)
    with pytest.raises(OSError) as e:
        os.listdir(m.path)
    assert e.value.errno == errno.ENOTCONN
    res = compatfs("mount", store, m.path, "--log", tmp_path / "again.log")
    try:
        assert res.returncode == 0, res.stderr
        assert "dead mount" in res.stderr
        assert "vision:4b" in os.listdir(m.path)
    finally:
        assert compatfs("umount", m.path).returncode == 0
    clean_log((tmp_path / "again.log").read_text())
    # `compatfs umount` also clears a dead endpoint.
    m2 = mount_store(store)
    m2.proc.kill()
    m2.proc.wait(timeout=20)
    assert compatfs("umount", m2.path).returncode == 0
    assert os.stat(m2.path) and not os.path.ismount(m2.path)


def test_version_names_libfuse_3(store, mount_store):
    res = compatfs("--version")
    assert res.returncode == 0 and "libfuse 3." in res.stdout, res
    m = mount_store(store)
    assert "libfuse 3." in m.log_text()


def test_reads_across_pieces_are_exact(store, mount_store):
    """Reads at random offsets and sizes, across header, blob ranges and op
    tensors, each answered in one buffer."""
    m = mount_store(store)
    blob = blob_of(store, "vision", "4b")
    r = random.Random(11)
    for kind in ("model.gguf", "mmproj.gguf"):
        want = expected(blob, kind)
        assert (m / "vision:4b" / kind).read_bytes() == want
        with open(m / "vision:4b" / kind, "rb", buffering=0) as f:
            for _ in range(400):
                off = r.randrange(0, len(want))
                size = r.choice([1, 100, 4096, 65536, 300000])
                f.seek(off)
                assert f.read(size) == want[off : off + size], (kind, off, size)


def test_options_the_fuse_layer_sets_are_refused(store, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (("-o", "foreground"), ("-o", "raw_fi"), ("-o", "ro,nothreads"), ("-f", "-o", "raw_fi")):
        res = compatfs("mount", store, mnt, *args)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1 and "set by compatfs itself" in lines[0], (args, res.stderr)
    res = compatfs("mount", store, mnt, "-o", "nosuchoption", "--log", tmp_path / "l.log")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "nosuchoption" in lines[0]
    assert not os.path.ismount(mnt)


def test_logs_go_to_a_private_folder(store, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state), "JOURNAL_STREAM": ""}
    res = compatfs("mount", store, mnt, env=env)
    try:
        assert res.returncode == 0, res.stderr
    finally:
        compatfs("umount", mnt)
    folder = state / "compatfs"
    logs = [p for p in folder.iterdir() if p.suffix == ".log"]  # beside it: the mount's published models.ini
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and len(logs) == 1
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600 and str(logs[0]) in res.stdout
    assert "serving" in logs[0].read_text()
    # A symlink planted at the log's name is not followed.
    target = tmp_path / "elsewhere"
    logs[0].unlink()
    logs[0].symlink_to(target)
    res = compatfs("mount", store, mnt, env=env)
    assert res.returncode == 1 and "cannot open log file" in res.stderr and not target.exists()
    assert not os.path.ismount(mnt)
    # Under systemd the daemon logs to the journal (its stderr): no file.
    logs[0].unlink()
    journal = tmp_path / "journal"
    with open(journal, "w") as out:  # the daemon keeps its stderr: a file, not a pipe to wait on
        rc = subprocess.run(
            [sys.executable, "-m", "compatfs", "mount", store, mnt],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "JOURNAL_STREAM": "8:1234"},
            stdin=subprocess.DEVNULL,
            timeout=60,
        ).returncode
    try:
        assert rc == 0 and "logging to the journal" in journal.read_text()
    finally:
        compatfs("umount", mnt)
    assert "serving" in journal.read_text() and not [p for p in folder.iterdir() if p.suffix == ".log"]


def _held(pid: int, blob: Path) -> list[str]:
    """What process `pid` maps or holds open of `blob`."""
    held = [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if blob.name in line]
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if blob.name in target:
            held.append(target)
    return held


def test_removed_model_leaves_nothing_held(store, mount_store):
    m = mount_store(store)
    blob = blob_of(store, "vision", "4b")
    want = expected(blob)
    with open(m / "vision:4b/model.gguf", "rb") as f:
        got = f.read(len(want) // 3)
        assert _held(m.proc.pid, blob)  # the open file holds its blob
        shutil.rmtree(store / "manifests/registry.ollama.ai/library/vision")
        blob.unlink()
        wait_until(lambda: "vision:4b" not in os.listdir(m.path), what="the removed model leaving the listing")
        got += f.read()
    assert got == want  # the reader read on to its end
    wait_until(lambda: not _held(m.proc.pid, blob), what="the daemon letting go of the removed blob")
    assert "vision:4b" not in os.listdir(m.path)


def test_removed_model_keeps_serving_its_op_tensors(tmp_path, mount_store):
    """`ollama rm` while a projector is open, its pages dropped: the op
    tensors computed whole from it (Nemotron-H Omni's resampled position table) are
    read through the open file's descriptor like the rest, never by the
    blob's path (measured on the landed code: EIO there)."""
    store = tmp_path / "store"
    add_model(store, "omni", nemotron.legacy_nemotron_h_omni(tmp_path / "o.gguf"))
    blob = blob_of(store, "omni", "latest")
    want = expected(blob, "mmproj.gguf")
    view = BlobViews().view(blob, "mmproj.gguf")
    op_at = next(s.at for s in view.segments if isinstance(s, Cached))
    m = mount_store(store)
    with open(m / "omni:latest/mmproj.gguf", "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: the op is not read yet
        head = f.read(4096)
        assert len(head) == 4096 < op_at
        shutil.rmtree(store / "manifests/registry.ollama.ai/library/omni")
        blob.unlink()
        wait_until(lambda: "omni:latest" not in os.listdir(m.path), what="the removed model leaving the listing")
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        rest = f.read()
    assert head + rest == want
    assert m.alive
    clean_log(m.log_text())


@pytest.mark.parametrize("options", [(), ("-o", "attr_timeout=0,entry_timeout=0")])
def test_stat_follows_the_store_within_seconds(store, mount_store, tmp_path, options):
    """Whether the kernel keeps attributes (the mount's hour) or asks every
    time (the daemon answers from what it remembers), a removed or re-pulled
    model shows within seconds."""
    m = mount_store(store, *options)
    text = m / "text:1b/model.gguf"
    vision = m / "vision:4b/model.gguf"
    assert text.stat().st_size and vision.stat().st_size  # now in the kernel's caches
    shutil.rmtree(store / "manifests/registry.ollama.ai/library/text")

    def gone():
        try:
            text.stat()
            return False
        except FileNotFoundError:
            return True

    wait_until(gone, seconds=2.5, what="stat of a removed model failing")
    add_model(store, "vision", llama.plain_llama_text(tmp_path / "new.gguf"), tag="4b")
    new = expected(blob_of(store, "vision", "4b"))
    wait_until(lambda: vision.stat().st_size == len(new), seconds=2.5, what="stat showing the re-pulled tag")
    assert vision.read_bytes() == new


def test_readers_during_store_churn(store, mount_store, tmp_path):
    """8 readers read translated views while manifests come and go."""
    m = mount_store(store)
    wants = {}
    for name, tag, kinds in (("vision", "4b", ("model.gguf", "mmproj.gguf")), ("text", "1b", ("model.gguf",))):
        for kind in kinds:
            wants[m / f"{name}:{tag}" / kind] = expected(blob_of(store, name, tag), kind)
    proj = blob_of(store, "llava", "7b", "projector")
    wants[m / "llava:7b/mmproj.gguf"] = expected(proj, "mmproj.gguf")
    extra = [gemma3.legacy_gemma3_text(tmp_path / f"c{i}.gguf", seed=10 + i) for i in range(3)]
    stop = threading.Event()
    mismatched, reads, errors = [0], [0], []

    def reader(seed: int):
        r = random.Random(seed)
        paths = list(wants)
        try:
            while not stop.is_set():
                path = r.choice(paths)
                want = wants[path]
                with open(path, "rb", buffering=0) as f:
                    for _ in range(20):
                        off = r.randrange(0, len(want))
                        size = r.choice([4096, 65536, 1 << 20])
                        f.seek(off)
                        got, exp = f.read(size), want[off : off + size]
                        if got != exp:
                            mismatched[0] += sum(a != b for a, b in zip(got, exp, strict=False)) + abs(
                                len(got) - len(exp)
                            )
                        reads[0] += 1
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    def churn():
        r = random.Random(1)
        i = 0
        while not stop.is_set():
            i += 1
            name = f"churn{i % 5}"
            add_model(store, name, r.choice(extra), tag=str(i % 2))
            gone = store / "manifests/registry.ollama.ai/library" / f"churn{(i + 2) % 5}"
            shutil.rmtree(gone, ignore_errors=True)
            os.listdir(m.path)
            time.sleep(0.05)  # on purpose: a pull and a removal every 50 ms

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)] + [threading.Thread(target=churn)]
    for t in threads:
        t.start()
    time.sleep(8)  # on purpose: readers and churn race for 8 s
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert reads[0] > 100 and mismatched[0] == 0
    assert m.alive
    clean_log(m.log_text())


@pytest.mark.parametrize("options", [(), ("-o", "attr_timeout=0,entry_timeout=0")])
def test_permission_changes_reach_stat_within_seconds(store, mount_store, options):
    """Owner and mode of a blob, and of the store's manifests folder, are
    watched like its identity: the kernel's long-lived attributes and the
    daemon's remembered ones follow within seconds."""
    m = mount_store(store, *options)
    model = m / "text:1b/model.gguf"
    folder = m / "text:1b"
    blob = blob_of(store, "text", "1b")
    assert stat.S_IMODE(model.stat().st_mode) == stat.S_IMODE(os.stat(blob).st_mode) & 0o555
    os.chmod(blob, 0o640)
    wait_until(lambda: stat.S_IMODE(model.stat().st_mode) == 0o440, seconds=3, what="stat showing a blob's new mode")
    os.chmod(store / "manifests", 0o750)
    wait_until(
        lambda: stat.S_IMODE(folder.stat().st_mode) == 0o550, seconds=3, what="a folder showing the store's mode"
    )
