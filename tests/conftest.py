"""Shared test fixtures: stores built from GGUF files, and real mounts served
by a compatfs daemon in its own process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from compatfs.testing import gemma3, llama, llava
from compatfs.testing.store import add_model

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "fixtures"

# Where compatfs keeps a user's index (`COMPATFS_CACHE_DIR`, `XDG_CACHE_HOME`)
# and state (`XDG_STATE_HOME`: logs, published presets): a folder of the
# run's own from the moment the suite is loaded, so that no test and no
# process a test starts (they inherit this environment) ever uses the
# user's; each test then gets folders of its own (`own_user_dirs`).
USER_DIRS = ("COMPATFS_CACHE_DIR", "XDG_CACHE_HOME", "XDG_STATE_HOME")
_RUN_DIRS = Path(tempfile.mkdtemp(prefix="compatfs-test-dirs-"))


def _use_dirs(base: Path, setenv=os.environ.__setitem__) -> None:
    for name in USER_DIRS:
        d = base / name.lower()
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        setenv(name, str(d))


_use_dirs(_RUN_DIRS)


def pytest_unconfigure(config):
    shutil.rmtree(_RUN_DIRS, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_user_dirs(tmp_path_factory, monkeypatch):
    """Every test has cache and state folders of its own (and so has every
    process it starts), never the user's."""
    _use_dirs(tmp_path_factory.mktemp("user-dirs"), monkeypatch.setenv)


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and bool(shutil.which("fusermount3") or shutil.which("fusermount"))


def fds_of(path) -> int:
    """How many of this process's descriptors hold the file at `path`."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            continue
    return n


def wait_until(cond, seconds: float = 4.0, *, what: str, tolerate: tuple[type[Exception], ...] = ()):
    """`cond()` once it is truthy, asked every 50 ms for at most `seconds`;
    AssertionError saying that `what` did not happen within them when it
    never is.  An exception of a `tolerate` type counts as not yet (the last
    one is named in the failure)."""
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except tolerate as e:
            last = e
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s" + (f" (last: {last!r})" if last else "")
        time.sleep(0.05)


needs_fuse = pytest.mark.skipif(not fuse_available(), reason="FUSE (/dev/fuse, fusermount3) not available")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/fixtures is not present")


class Mount:
    """A compatfs daemon serving `store` at `path`, in a separate process."""

    def __init__(self, store: Path, path: Path, *extra: str, env: dict | None = None):
        self.store, self.path = store, path
        self.log = path.parent / (path.name + ".log")
        path.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "compatfs", "mount", "-f", "-v", str(store), str(path), *extra]
        self._log = open(self.log, "wb")
        # Each mount has its own index unless the test shares one.
        env = {"COMPATFS_CACHE_DIR": str(path.parent / (path.name + ".cache")), **(env or {})}
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **env}, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while not os.path.ismount(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"mount did not come up: {self.log.read_text()}")
            time.sleep(0.05)

    def __truediv__(self, rel: str) -> Path:
        return self.path / rel

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and os.path.ismount(self.path)

    def log_text(self) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")

    def changes_seen(self) -> int:
        """How many rescans have logged a change of the store (the mount runs
        with -v): one more than before a change means a rescan has seen it."""
        return self.log_text().count("store changed: ")

    def close(self) -> None:
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # a thread stuck in the kernel: fail, never hang
                self.proc.wait(timeout=20)
        self._log.close()


@pytest.fixture
def mount_store(tmp_path):
    """mount_store(store, *args, env=...) -> Mount; unmounted after the test."""
    mounts = []

    def make(store: Path, *extra: str, env: dict | None = None) -> Mount:
        m = Mount(store, tmp_path / f"mnt{len(mounts)}", *extra, env=env)
        mounts.append(m)
        return m

    yield make
    for m in mounts:
        m.close()


def one_model_store(model: str, tag: str = "latest", blob: Path | None = None):
    """A module-scoped `store` fixture: a store holding `blob` as `model:tag`
    (without `blob`, the file the module's own `blob` fixture gives)."""
    if blob is not None:
        made = blob

        @pytest.fixture(scope="module")
        def store(tmp_path_factory):
            root = tmp_path_factory.mktemp(model) / "store"
            add_model(root, model, made, tag=tag)
            return root
    else:

        @pytest.fixture(scope="module")
        def store(blob):
            root = blob.parent / "store"
            add_model(root, model, blob, tag=tag)
            return root

    return store


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    """A store of the legacy writers' models, and the files: name -> path."""
    d = tmp_path_factory.mktemp("legacy")
    files = {
        "gemma3": gemma3.legacy_gemma3_text(d / "g1.gguf"),
        "gemma3v": gemma3.legacy_gemma3_vision(d / "g4.gguf"),
        "llama3": llama.legacy_llama3_instruct(d / "l3.gguf"),
        "llava": llama.plain_llama_text(d / "llava.gguf"),
        "llava-proj": llava.legacy_llava_projector(d / "llava-proj.gguf"),
    }
    store = d / "store"
    add_model(store, "gemma3", files["gemma3"], tag="1b")
    add_model(store, "gemma3", files["gemma3v"], tag="4b")
    add_model(store, "llama3", files["llama3"], tag="8b")
    add_model(store, "llava", files["llava"], files["llava-proj"], tag="7b")
    return store, files


@pytest.fixture
def open_tmp():
    """A folder every user may traverse (pytest's own tmp folders are root-only);
    mounts left in it are detached and it is removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="compatfs-open-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for p in d.iterdir():
        if os.path.ismount(p):
            subprocess.run(["fusermount3", "-u", "-z", str(p)], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gotmpl(tmp_path_factory):
    """The tests' reference renderer of Ollama's templates (Go's own
    text/template, tests/gotmpl), built once per module; skips without go."""
    from gotmpl_ref import go_binary

    return go_binary(tmp_path_factory.mktemp("gotmpl"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny plain llama GGUF, written once per module."""
    return llama.plain_llama_text(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture
def blob_reads(monkeypatch) -> list[tuple[int, int]]:
    """Every read of a blob asked of a `BlobFile` (offset, size), through the
    page cache or not; a read made through another read counts once."""
    from compatfs.files.blobfile import BlobFile

    seen: list[tuple[int, int]] = []
    inside = [False]
    once, into = BlobFile.read_once_into, BlobFile.read_into

    def counted(read, sized):
        def wrapper(self, *args):
            outer = not inside[0]
            if outer:
                seen.append(sized(*args))
            inside[0] = True
            try:
                return read(self, *args)
            finally:
                inside[0] = not outer

        return wrapper

    monkeypatch.setattr(BlobFile, "read_once_into", counted(once, lambda out, offset: (offset, len(out))))
    monkeypatch.setattr(BlobFile, "read_into", counted(into, lambda out, offset: (offset, len(out))))
    return seen


@pytest.fixture
def nothing_ahead(monkeypatch):
    """No range computed ahead: every one by the read that needs it."""
    from compatfs.view import ahead

    monkeypatch.setattr(ahead, "enabled", False)


@pytest.fixture(scope="module", params=["fused", "mxfp4"])
def gptoss_layer(request, tmp_path_factory) -> Path:
    """One gpt-oss-120b layer (rows as wide as the published model's, 2 experts) in the fused or type-4 form."""
    from compatfs.testing import widths

    path = tmp_path_factory.mktemp("gptoss-layer") / f"gptoss-{request.param}.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=request.param == "mxfp4", n_expert=2), path)


@pytest.fixture(params=["numpy", "compiled"])
def kernel(request, monkeypatch) -> str:
    """The test once with numpy's kernels and once with the compiled ones
    (skipped where compatfs._accel is not built)."""
    from compatfs.translate import accel

    if request.param == "numpy":
        monkeypatch.setattr(accel, "native", None)
    elif accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL is set)")
    return request.param


@pytest.fixture
def store_fs(tmp_path, monkeypatch):
    """Makes the CompatFS of the Ollama store at a path, answered in this
    process (no mount): its requests come from this process, its state is
    under tmp_path, its rescan timer an hour, the store scanned once."""
    from compatfs.files.access import Caller
    from compatfs.fuse import libfuse
    from compatfs.fuse.operations import CompatFS
    from compatfs.sources.ollama import OllamaStore
    from compatfs.tree import Tree
    from compatfs.view.catalog import BlobViews

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))

    def make(store: Path) -> CompatFS:
        (tmp_path / "mnt").mkdir(exist_ok=True)
        fs = CompatFS(Tree(OllamaStore(store), BlobViews(), rescan_seconds=3600), str(tmp_path / "mnt"))
        fs.tree.snapshot()
        return fs

    return make
