"""A fault of the system (out of descriptors or memory, an I/O error) while a
view is built or its blob opened is EIO for that open only: nothing
remembers it, the next open tries again, each is logged (at most a line per
blob every few seconds, as are failed reads); a verdict on the blob's bytes
is still remembered.
An open that fails leaves no descriptor behind, and the daemon raises its
own limit on open files at start."""

import errno
import logging
import os
import resource
from pathlib import Path
from types import SimpleNamespace

import pytest

from compatfs.fuse import current, libfuse, throttle
from compatfs.view import catalog as views_module, claims, summaries
from compatfs.files.access import Caller
from compatfs.files.lookup import Transient
from compatfs.fuse.operations import CompatFS
from compatfs.view.index import Index
from compatfs.sources.ollama import OllamaStore
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews

from conftest import fds_of, needs_fuse
from hostile import vision_and_text_store
from test_hostile_mount import expected

MODEL = "/vision:4b/model.gguf"


class Once:
    """Raises `fault` on the first call once armed, then calls `real`."""

    def __init__(self, real, fault: BaseException):
        self.real, self.fault, self.armed, self.fired = real, fault, False, 0

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            self.fired += 1
            raise self.fault
        return self.real(*args, **kwargs)


@pytest.fixture
def mounted(tmp_path, monkeypatch):
    """A CompatFS over a store of two models, in process (no kernel mount),
    its first scan made and the model's summary known; `scans` counts the
    store scans made after that."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    store = vision_and_text_store(tmp_path)
    source = OllamaStore(store)
    (tmp_path / "mnt").mkdir()
    fs = CompatFS(Tree(source, BlobViews(), rescan_seconds=3600), str(tmp_path / "mnt"))
    fs.tree.snapshot()
    assert fs.tree.lookup(MODEL[1:]) is not None  # the summary is made (and kept) here
    scans: list[int] = []
    scan = source.scan
    monkeypatch.setattr(source, "scan", lambda: scans.append(1) or scan())
    return SimpleNamespace(fs=fs, store=store, scans=scans)


def _open(fs: CompatFS, path: str = MODEL) -> int:
    """fs.open of `path`: its handle (OSError as the open fails)."""
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(path, fi) == 0
    return fi.fh


def _fault(monkeypatch, how: str) -> Once:
    """Arm fault `how` for the next view build."""
    if how == "EMFILE parsing":
        once = Once(views_module.SourceGGUF, OSError(errno.EMFILE, os.strerror(errno.EMFILE)))
        monkeypatch.setattr(views_module, "SourceGGUF", once)
    elif how == "MemoryError parsing":
        once = Once(views_module.SourceGGUF, MemoryError())
        monkeypatch.setattr(views_module, "SourceGGUF", once)
    elif how == "EIO reading the header":  # a real read, turned into blobfile's own error
        once = Once(os.preadv, OSError(errno.EIO, os.strerror(errno.EIO)))
        monkeypatch.setattr(os, "preadv", once)
    elif how == "MemoryError in a handler":
        once = Once(claims.first_claim, MemoryError("a handler's array"))
        monkeypatch.setattr(claims, "first_claim", once)
    elif how == "ENFILE in a handler":
        once = Once(claims.first_claim, OSError(errno.ENFILE, os.strerror(errno.ENFILE)))
        monkeypatch.setattr(claims, "first_claim", once)
    else:
        raise AssertionError(how)
    once.armed = True
    return once


@pytest.mark.parametrize(
    "how",
    [
        "EMFILE parsing",
        "MemoryError parsing",
        "EIO reading the header",
        "MemoryError in a handler",
        "ENFILE in a handler",
    ],
)
def test_a_transient_fault_is_not_remembered(mounted, monkeypatch, caplog, how):
    """On 5ea7fe0 the failed build was remembered for the blob's identity:
    every later open of the model was EIO until the blob changed."""
    fs = mounted.fs
    once = _fault(monkeypatch, how)
    with caplog.at_level(logging.ERROR, logger="compatfs"), pytest.raises(OSError) as e:
        _open(fs)
    assert e.value.errno == errno.EIO and once.fired == 1
    fh = _open(fs)  # tried again: served
    assert "just now" in caplog.text and "not remembered, tried again the next time" in caplog.text
    assert mounted.scans == []  # no scan of the store for it
    handle = fs._paths.get(fh)
    assert handle is not None
    blob = handle.file.path
    assert handle.view.size == len(expected(blob)) and handle.view.read(0, handle.view.size, handle.file) == expected(
        blob
    )
    fs.release(MODEL, SimpleNamespace(fh=fh))


def test_a_handler_crash_is_still_remembered(mounted, monkeypatch):
    """A verdict on the blob (a contained handler crash) stays EIO without
    building the view again."""
    fs = mounted.fs
    once = Once(claims.first_claim, KeyError("general.name"))
    monkeypatch.setattr(claims, "first_claim", once)
    once.armed = True
    for _ in range(2):
        with pytest.raises(OSError) as e:
            _open(fs)
        assert e.value.errno == errno.EIO
    assert once.fired == 1


def test_an_open_tries_again_a_blob_written_anew_as_it_failed(mounted, monkeypatch):
    """The blob removed as its view is built, and written anew at the same
    path before the open judges the failure (a re-pull cycling its blobs):
    tried again, served.  On 5ea7fe0 the failure was judged against the
    blob's state after it, the new file's, and the open gave EIO."""
    fs = mounted.fs
    blob = fs.tree.lookup(MODEL[1:]).blob
    data = blob.read_bytes()
    real = fs.tree.views.view
    calls: list[int] = []

    def view(path, kind, params=None):
        calls.append(1)
        if len(calls) == 1:
            blob.unlink()
            try:
                return real(path, kind, params)
            finally:
                blob.write_bytes(data)  # another file at that path
        return real(path, kind, params)

    monkeypatch.setattr(fs.tree.views, "view", view)
    fh = _open(fs)
    assert len(calls) == 2
    fs.release(MODEL, SimpleNamespace(fh=fh))


def test_classify_raises_a_fault_of_the_system(tmp_path, monkeypatch):
    """Not kept in a BlobInfo as the blob's refusal (on 5ea7fe0 a
    MemoryError became a HandlerFailure, the text view's error)."""
    from compatfs.format.header import SourceGGUF
    from compatfs.testing import gemma3

    source = SourceGGUF(gemma3.legacy_gemma3_text(tmp_path / "g.gguf"))
    once = Once(claims.first_claim, MemoryError())
    monkeypatch.setattr(claims, "first_claim", once)
    once.armed = True
    with pytest.raises(Transient, match="claiming model.gguf: MemoryError"):
        claims.classify(source)
    info = claims.classify(source)
    assert info.text is not None and info.text_error is None


def test_faults_are_logged_at_most_once_per_blob_a_while(mounted, monkeypatch, caplog):
    fs = mounted.fs
    clock = [1000.0]
    monkeypatch.setattr(throttle.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.ERROR, logger="compatfs"):
        for _ in range(3):
            _fault(monkeypatch, "EMFILE parsing")
            with pytest.raises(OSError):
                _open(fs)
        assert caplog.text.count("just now") == 1
        clock[0] += current.TRANSIENT_LOG_SECONDS
        _fault(monkeypatch, "EMFILE parsing")
        with pytest.raises(OSError):
            _open(fs)
    assert caplog.text.count("just now") == 2 and "(2 more since the last such line)" in caplog.text


@pytest.mark.parametrize("fault", ["denied", "gone"])
def test_a_refused_open_leaves_no_descriptor(mounted, monkeypatch, fault):
    """models.ini opened while it is open already: the open handle's
    descriptor duplicated, then the check of its folder raises (on 5ea7fe0
    the duplicate stayed open, and an OSError went out as it was)."""
    from compatfs.fuse import openfiles
    from compatfs.files.lookup import Denied

    fs = mounted.fs
    ref = fs.tree.lookup("models.ini")
    assert ref is not None and ref.readable_as is not None
    fh = _open(fs, "/models.ini")
    assert fds_of(ref.blob) == 1
    real = openfiles.status

    def status(path, *args, **kwargs):
        if Path(path) == ref.readable_as:
            raise Denied(f"{path}: refused") if fault == "denied" else FileNotFoundError(errno.ENOENT, "gone")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(openfiles, "status", status)
    with pytest.raises(OSError) as e:
        _open(fs, "/models.ini")
    assert e.value.errno == (errno.EACCES if fault == "denied" else errno.ENOENT)
    assert fds_of(ref.blob) == 1
    fs.release("/models.ini", SimpleNamespace(fh=fh))
    assert fds_of(ref.blob) == 0


@needs_fuse
def test_the_daemon_raises_its_open_files_limit(tmp_path, mount_store):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 512:
        pytest.skip(f"a hard limit of {hard} leaves nothing to raise to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the daemon inherits it
    try:
        m = mount_store(vision_and_text_store(tmp_path))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    limits = Path(f"/proc/{m.proc.pid}/limits").read_text()
    line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert line.split()[3:5] == [str(hard), str(hard)], line
    assert f"open files: at most {hard} (raised from 256)" in m.log_text()


@pytest.mark.parametrize(
    "fault", [OSError(errno.EMFILE, os.strerror(errno.EMFILE)), MemoryError()], ids=["EMFILE", "MemoryError"]
)
def test_a_fault_while_sizing_is_neither_indexed_nor_remembered_by_stat(tmp_path, monkeypatch, fault):
    """A fault of the system while a blob is summarized for `stat` is EIO for
    that stat: no summary records it in the index, and the next stat (no
    rescan in between) shows the view's real size."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    store = vision_and_text_store(tmp_path)
    (tmp_path / "mnt").mkdir()
    views = BlobViews()
    fs = CompatFS(Tree(OllamaStore(store), views, rescan_seconds=3600), str(tmp_path / "mnt"))
    views.index = Index(None, True)  # its first scan summarized the blob (models.ini): known no more
    once = Once(summaries.SourceGGUF, fault)
    monkeypatch.setattr(summaries, "SourceGGUF", once)
    once.armed = True
    with pytest.raises(OSError) as failed:
        fs.getattr(MODEL)
    assert failed.value.errno == errno.EIO and once.fired == 1
    blob = fs.tree.lookup(MODEL[1:]).blob
    assert views.index.get(blob, summaries.stamp_of(blob)) is None  # nothing indexed for the fault
    assert fs.getattr(MODEL)["st_size"] == len(expected(blob))


def test_failed_reads_are_logged_at_most_once_per_blob_a_while(monkeypatch, caplog):
    """A blob whose every read fails logs one line per blob every
    READ_LOG_SECONDS, not one per read; the next line counts the rest."""
    from compatfs.fuse import readpath

    def fail(view, file, offset, out, kin_into=None):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(readpath.assemble, "fill", fail)
    monkeypatch.setattr(readpath, "_failures", throttle.Throttle(readpath.READ_LOG_SECONDS))
    clock = [1000.0]
    monkeypatch.setattr(throttle.time, "monotonic", lambda: clock[0])
    handles = [SimpleNamespace(view=None, file=None, blob=f"/store/blobs/sha256-{n}") for n in "ab"]
    out = memoryview(bytearray(1 << 20))

    def read(handle) -> None:
        with pytest.raises(OSError) as e:
            readpath._fill(handle, 0, out, None)
        assert e.value.errno == errno.EIO

    with caplog.at_level(logging.ERROR, logger="compatfs"):
        for _ in range(3):
            read(handles[0])
        read(handles[1])
        assert caplog.text.count("read of /store/blobs/sha256-a") == 1
        assert caplog.text.count("read of /store/blobs/sha256-b") == 1
        clock[0] += readpath.READ_LOG_SECONDS
        read(handles[0])
    assert caplog.text.count("read of /store/blobs/sha256-a") == 2
    assert "(2 more since the last such line)" in caplog.text
