"""A store that changes or turns hostile under a running mount: blobs truncated
or rewritten in place, manifests re-pointed under open readers, blobs that are
not regular files, headers that cannot be parsed; and what `ls -l`, `du` and
`df` show."""

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compatfs.testing import fuzz, gemma3, llama
from compatfs.testing.store import add_model
from compatfs.view.assemble import FileRange
from compatfs.view.segments import Cached, Computed
from compatfs.view.catalog import BlobViews

from conftest import needs_fuse, wait_until
from hostile import vision_and_text_store

pytestmark = needs_fuse


def expected(blob: Path, kind: str = "model.gguf") -> bytes:
    """The view's bytes built in-process (blob ranges read from the file)."""
    view = BlobViews().view(blob, kind)
    data = blob.read_bytes()
    return b"".join(
        data[p.offset : p.offset + p.size] if isinstance(p, FileRange) else bytes(p) for p in view.pieces(0, view.size)
    )


def blob_of(store: Path, name: str, tag: str, media: str = "model") -> Path:
    doc = json.loads((store / "manifests/registry.ollama.ai/library" / name / tag).read_text())
    layer = next(layer for layer in doc["layers"] if layer["mediaType"].endswith(media))
    return store / "blobs" / layer["digest"].replace(":", "-")


@pytest.fixture
def store(tmp_path):
    return vision_and_text_store(tmp_path)


def test_truncated_blob_is_eio_not_eof(store, mount_store):
    m = mount_store(store)
    blob = blob_of(store, "vision", "4b")
    want = expected(blob)
    path = m / "vision:4b/model.gguf"
    with open(path, "rb", buffering=0) as f:
        assert os.fstat(f.fileno()).st_size == len(want)
        got = bytearray(f.read(len(want) // 4))
        seen = m.changes_seen()
        os.truncate(blob, blob.stat().st_size // 2)
        with pytest.raises(OSError) as e:
            while True:
                chunk = f.read(1 << 16)
                assert chunk, f"silent end of file at {len(got)} of {len(want)}"
                got += chunk
        assert e.value.errno == errno.EIO
        assert len(got) < len(want) and got == want[: len(got)]
        # The open file keeps its size (its reads fail) rather than ending early, after the rescan too.
        wait_until(lambda: m.changes_seen() > seen, what="a rescan seeing the truncated blob")
        assert os.fstat(f.fileno()).st_size == len(want)
    assert m.alive
    log = m.log_text()
    assert blob.name in log and "changed under an open file" in log
    assert (m / "text:1b/model.gguf").read_bytes() == expected(blob_of(store, "text", "1b"))


def test_blob_rewritten_in_place(store, mount_store, tmp_path):
    m = mount_store(store)
    blob = blob_of(store, "text", "1b")
    old = expected(blob)
    path = m / "text:1b/model.gguf"
    other = llama.plain_llama_text(tmp_path / "other.gguf")
    with open(path, "rb", buffering=0) as f:
        assert f.read(4096) == old[:4096]
        with open(blob, "r+b") as w:  # same inode, new bytes and size
            w.truncate(0)
            w.write(other.read_bytes())
        f.seek(len(old) - 10000)
        with pytest.raises(OSError) as e:
            f.read(4096)
        assert e.value.errno == errno.EIO
        new = expected(blob)
        assert len(new) != len(old)
        wait_until(lambda: path.stat().st_size == len(new), what="stat shows the rewritten blob")
        assert path.read_bytes() == new  # a new open sees the new blob
    assert blob.name in m.log_text()


def test_repointed_manifest_under_an_open_reader(store, mount_store, tmp_path):
    m = mount_store(store)
    first = blob_of(store, "text", "1b")
    before = expected(first)
    path = m / "text:1b/model.gguf"
    ino_before = path.stat().st_ino
    with open(path, "rb", buffering=0) as a:
        got = a.read(len(before) // 2)
        seen = m.changes_seen()
        add_model(store, "text", llama.plain_llama_text(tmp_path / "p.gguf"), tag="1b")  # `ollama pull` again
        second = blob_of(store, "text", "1b")
        after = expected(second)
        assert second != first and len(after) != len(before)
        wait_until(lambda: m.changes_seen() > seen, what="a rescan seeing the re-pulled text:1b")
        # While the first reader is open the path keeps its view (one kernel
        # inode per path: mixing two views would mix their pages), whole.
        with open(path, "rb") as b:
            assert b.read() == before
        got += a.read()
        assert bytes(got) == before
        # The new blob is served at once under blobs/.
        assert (m / "blobs" / second.name / "model.gguf").read_bytes() == after
    # Closed: new opens see the new blob, as a new inode number.
    wait_until(lambda: path.stat().st_size == len(after), what="the path switching to the new blob")
    assert path.read_bytes() == after
    assert path.stat().st_ino != ino_before


def test_blobs_that_are_not_regular_files(store, mount_store, tmp_path):
    fifo_blob = blob_of(store, "text", "1b")
    fifo_blob.unlink()
    os.mkfifo(fifo_blob)
    dev_blob = blob_of(store, "vision", "4b")
    dev_blob.unlink()
    dev_blob.symlink_to("/dev/zero")
    m = mount_store(store)
    # A listing and stat return at once: nothing opens the FIFO.
    res = subprocess.run(["ls", "-lR", str(m.path)], capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    for name in ("text:1b", "vision:4b"):
        assert (m / name / "model.gguf").stat().st_size == 0
        with pytest.raises(OSError) as e:
            (m / name / "model.gguf").read_bytes()
        assert e.value.errno == errno.EIO
    log = m.log_text()
    assert f"blob {fifo_blob} is not a regular file" in log and f"blob {dev_blob} is not a regular file" in log
    assert m.alive


def test_ls_of_hostile_blobs_is_prompt_and_logged(store, mount_store, tmp_path):
    bad = {}
    good = gemma3.legacy_gemma3_vision(tmp_path / "gv2.gguf", seed=3).read_bytes()
    variants = {
        "cut": good[:200_000],  # tensors past the end
        "noise": os.urandom(300_000),
        "counts": b"GGUF" + (3).to_bytes(4, "little") + (2**62).to_bytes(8, "little") * 2 + bytes(64),
        "empty": b"",
    }
    for name, data in variants.items():
        f = tmp_path / f"{name}.bin"
        f.write_bytes(data)
        add_model(store, name, f)
        bad[name] = blob_of(store, name, "latest")
    m = mount_store(store)
    for _ in range(3):
        t = time.monotonic()
        res = subprocess.run(["ls", "-lR", str(m.path)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        assert time.monotonic() - t < 10
    for name in bad:
        assert (m / f"{name}:latest/model.gguf").stat().st_size == 0, name
        with pytest.raises(OSError) as e:
            (m / f"{name}:latest/model.gguf").read_bytes()
        assert e.value.errno == errno.EIO
    log = m.log_text()
    for name, blob in bad.items():
        # One line per bad view, however often it is looked at.
        assert log.count(f"cannot present model.gguf of {blob}") == 1, (name, log)
    assert m.alive


def test_du_df_and_folder_times(store, mount_store):
    manifests = store / "manifests/registry.ollama.ai/library"
    os.utime(manifests / "vision/4b", ns=(1_600_000_000 * 10**9,) * 2)
    os.utime(manifests / "text/1b", ns=(1_700_000_000 * 10**9,) * 2)
    m = mount_store(store)
    st = (m / "vision:4b/model.gguf").stat()
    assert st.st_blocks == -(-st.st_size // 512)
    du = subprocess.run(["du", "-sk", str(m / "vision:4b")], capture_output=True, text=True, check=True)
    total = sum(p.stat().st_size for p in (m / "vision:4b").iterdir())
    assert abs(int(du.stdout.split()[0]) - total / 1024) <= 4
    sv, mv = os.statvfs(store), os.statvfs(m.path)
    assert (mv.f_blocks, mv.f_frsize, mv.f_files) == (sv.f_blocks, sv.f_frsize, sv.f_files)
    assert (m / "vision:4b").stat().st_mtime_ns == 1_600_000_000 * 10**9
    assert (m / "text:1b").stat().st_mtime_ns == 1_700_000_000 * 10**9
    assert m.path.stat().st_mtime_ns == max((store / "manifests").stat().st_mtime_ns, 1_700_000_000 * 10**9)
    blob = blob_of(store, "vision", "4b")
    assert (m / "blobs" / blob.name).stat().st_mtime_ns == blob.stat().st_mtime_ns
    # Folder link counts are 2 + subfolders; find sees every file.
    assert m.path.stat().st_nlink == 2 + 3 and (m / "blobs").stat().st_nlink == 2 + 2
    found = subprocess.run(["find", str(m.path), "-type", "f"], capture_output=True, text=True, check=True)
    assert (
        len(found.stdout.split()) == 3 + 3 + 1
    )  # vision: model + mmproj, text: model; the same under blobs/; models.ini


def test_truncation_under_an_op_tensor_read(store, mount_store):
    """Measured on the landed code: the daemon died of SIGBUS reading an op
    tensor of a truncated blob, taking the whole mount with it.  Op inputs
    are read with pread now: EIO for that file, the mount lives."""
    m = mount_store(store)
    blob = blob_of(store, "vision", "4b")
    view = BlobViews().view(blob, "mmproj.gguf")
    op_at = next(s.at for s in view.segments if isinstance(s, (Cached, Computed)))
    with open(m / "vision:4b/mmproj.gguf", "rb", buffering=0) as f:
        f.read(4)
        os.truncate(blob, op_at // 2)
        f.seek(op_at)
        with pytest.raises(OSError) as e:
            f.read(1 << 16)
        assert e.value.errno == errno.EIO
    assert m.alive
    assert (m / "text:1b/model.gguf").read_bytes() == expected(blob_of(store, "text", "1b"))


# -- round 2: never a hang, a refused view stays one view, index rows are hints -------------

from hostile import bounded, fifo_writer_release, with_value  # noqa: E402


def test_a_fifo_manifest_appearing_while_mounted_blocks_nothing(store, mount_store):
    """Measured on the landed code: the rescan opened the FIFO (blocking)
    while it held the tree's lock; every lookup not yet answered hung in D
    state, surviving SIGKILL, until somebody wrote the FIFO."""
    m = mount_store(store)
    fifo = store / "manifests/registry.ollama.ai/library/fifo/latest"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    try:
        # A model added after the FIFO: listed once a whole rescan has read the manifests, the FIFO's too.
        seen = m.changes_seen()
        add_model(store, "after", blob_of(store, "text", "1b"))
        wait_until(lambda: m.changes_seen() > seen, what="a rescan past the FIFO manifest seeing the model after it")
        res = bounded(["stat", "-c", "%s", str(m / "text:1b/model.gguf")], 10, m.path)
        assert res.returncode == 0 and int(res.stdout) == len(expected(blob_of(store, "text", "1b")))
        assert bounded(["ls", "-lR", str(m.path)], 10, m.path).returncode == 0
        res = bounded([sys.executable, "-m", "compatfs", "ls", str(store)], 30)
        assert res.returncode == 0, res.stderr
        assert "fifo:latest" in res.stdout and "not a regular file" in res.stdout
        assert m.alive
    finally:
        fifo_writer_release(fifo)


def test_a_blob_flipping_between_file_and_fifo_never_hangs_a_request(store, mount_store, tmp_path):
    """Measured on the landed code: within seconds a thread was stuck
    opening the FIFO (only the FUSE layer's own open was non-blocking).
    The blob is swapped (rename) between a regular file and a FIFO while
    the mount is asked for its files; then it is left a FIFO."""
    import threading

    m = mount_store(store)
    blob = blob_of(store, "vision", "4b")
    kept = blob.read_bytes()
    stop = threading.Event()

    def swap(fifo: bool) -> None:
        new = Path(f"{blob}.new")
        if fifo:
            os.mkfifo(new)
        else:
            new.write_bytes(kept)
        os.replace(new, blob)

    def flip():
        i = 0
        while not stop.is_set():
            swap(fifo=bool(i % 2))
            i += 1
            time.sleep(0.005)  # on purpose: a swap every 5 ms

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            folder = m / "vision:4b"
            res = bounded(
                [
                    "sh",
                    "-c",
                    f"stat {folder}/model.gguf {folder}/mmproj.gguf; head -c 100000 {folder}/model.gguf; "
                    f"head -c 100000 {folder}/mmproj.gguf; head -c 1000 {m / 'blobs' / blob.name}/model.gguf; "
                    "true",
                ],
                10,
                m.path,
                stdout_null=True,
            )
            assert res.returncode == 0
    finally:
        stop.set()
        t.join(5)
        swap(fifo=True)

    def eio(rel: str) -> bool:
        res = bounded(["cat", str(m / rel)], 10, m.path)
        return res.returncode != 0 and "Input/output error" in res.stderr

    try:
        for rel in ("vision:4b/model.gguf", f"blobs/{blob.name}/model.gguf"):
            wait_until(lambda rel=rel: eio(rel), what=f"{rel} read as EIO, its blob left a FIFO")
        assert bounded(["ls", "-lR", str(m.path)], 10, m.path).returncode == 0
        assert m.alive
    finally:
        fifo_writer_release(blob)


def _wrong_types(tmp_path: Path) -> dict[str, bytes]:
    """Blobs whose handlers read a value of the wrong type: the token types
    as strings (gemma3 vision: the text handler reads them, its projector
    view does not), and a vision block index that is text."""
    from compatfs.format.header import SourceGGUF
    from compatfs.format.values import VT, array, string

    good = gemma3.legacy_gemma3_vision(tmp_path / "wt.gguf", seed=5)
    n = SourceGGUF(good).kvs["tokenizer.ggml.token_type"].count
    return {
        "tokentypes": with_value(good, "tokenizer.ggml.token_type", array(VT.STRING, ["normal"] * n)),
        "blocks": with_value(good, "gemma3.vision.block_count", string("many")),
    }


def test_values_of_the_wrong_type_refuse_one_view_at_most(store, mount_store, tmp_path):
    """Measured on the landed code: the model folder and its blobs/ folder
    answered EINVAL, a traceback was logged on every stat, and the good
    files of the folder were lost with it.  Whatever the handler makes of
    the value (it may be refused, or tolerated), each view is either served
    whole or refused alone (size 0, EIO, one log line), and everything
    else reads on."""
    blobs = {}
    for name, data in _wrong_types(tmp_path).items():
        f = tmp_path / f"{name}.bin"
        f.write_bytes(data)
        add_model(store, name, f)
        blobs[name] = blob_of(store, name, "latest")
    m = mount_store(store)
    for _ in range(2):
        res = bounded(["ls", "-lR", str(m.path)], 30, m.path)
        assert res.returncode == 0 and "?" not in res.stdout, res.stdout + res.stderr
    refused = 0
    for name, blob in blobs.items():
        fuzz.views_of(blob)  # raises HandlerFailure where a refusal is a handler's crash (the mount's EIO hides it)
        for folder in (m / f"{name}:latest", m / "blobs" / blob.name):
            files = sorted(p.name for p in folder.iterdir())
            assert "model.gguf" in files, (folder, files)
            for f in files:
                path = folder / f
                size = path.stat().st_size
                try:
                    data = path.read_bytes()
                except OSError as e:
                    assert e.errno == errno.EIO and size == 0, (path, size)
                    refused += 1
                    continue
                assert data == expected(blob, f), path
    assert refused, "no view refused: the test no longer exercises a failing handler"
    log = m.log_text()
    assert "Traceback" not in log, log
    for blob in blobs.values():
        for kind in ("model.gguf", "mmproj.gguf"):
            assert log.count(f"cannot present {kind} of {blob}") <= 1, log
    assert (m / "text:1b/model.gguf").read_bytes() == expected(blob_of(store, "text", "1b"))
    assert m.alive


def test_index_rows_that_lie_are_hints(store, mount_store, tmp_path):
    """Measured on the landed code: a row with the blob's identity and too
    small a size served a short file and stat kept it; a forged error gave
    EIO for good; a size that is text gave EINVAL; a phantom mmproj.gguf was
    listed.  Now: the rows are checked against the view on open, rebuilt,
    and the kernel's attributes dropped."""
    import sqlite3
    from contextlib import closing

    cache = tmp_path / "cache"
    env = {"COMPATFS_CACHE_DIR": str(cache)}
    extra = tmp_path / "other.gguf"
    llama.plain_llama_text(extra)
    add_model(store, "plain", extra)
    add_model(store, "third", gemma3.legacy_gemma3_text(tmp_path / "g3.gguf", seed=7), tag="1b")
    first = mount_store(store, env=env)
    for name in ("text:1b", "vision:4b", "plain:latest", "third:1b"):
        for f in (first / name).iterdir():
            f.stat()

    def table_of(db: sqlite3.Connection) -> str:
        return db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name DESC").fetchone()[0]

    def rows() -> int:
        with closing(sqlite3.connect(cache / "index.sqlite3")) as db:
            return db.execute(f"SELECT COUNT(*) FROM {table_of(db)}").fetchone()[0]

    wait_until(lambda: rows() >= 4, what="the four models' rows in the index", tolerate=(sqlite3.Error, TypeError))
    first.close()
    text, vision = blob_of(store, "text", "1b"), blob_of(store, "vision", "4b")
    plain, third = blob_of(store, "plain", "latest"), blob_of(store, "third", "1b")
    assert rows() >= 4
    db = sqlite3.connect(cache / "index.sqlite3")
    table = table_of(db)
    db.execute(f"UPDATE {table} SET model_size = model_size - 5000 WHERE path = ?", (str(text),))
    db.execute(f"UPDATE {table} SET error = 'forged' WHERE path = ?", (str(vision),))
    db.execute(f"UPDATE {table} SET model_size = 'abc' WHERE path = ?", (str(plain),))
    db.execute(f"UPDATE {table} SET mmproj_size = 4096 WHERE path = ?", (str(third),))
    db.commit()
    db.close()
    m = mount_store(store, env=env)
    want = expected(text)
    path = m / "text:1b/model.gguf"
    path.stat()  # the kernel may keep the lying size: until the open
    assert path.read_bytes() == want
    assert path.stat().st_size == len(want)
    assert (m / "blobs" / text.name / "model.gguf").stat().st_size == len(want)
    assert (m / "vision:4b/model.gguf").read_bytes() == expected(vision)
    assert (m / "plain:latest/model.gguf").stat().st_size == len(expected(plain))
    phantom = m / "third:1b/mmproj.gguf"
    if "mmproj.gguf" in os.listdir(m / "third:1b"):
        with pytest.raises(OSError):
            phantom.read_bytes()
    wait_until(lambda: "mmproj.gguf" not in os.listdir(m / "third:1b"), what="the phantom mmproj.gguf gone")
    assert not phantom.exists()
    log = m.log_text()
    assert f"index entry of {text} said" in log and "Traceback" not in log and m.alive
