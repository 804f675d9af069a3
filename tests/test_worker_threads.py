"""libfuse's worker threads: when they run until unmount (`workers_stay`), and
the Python thread state such a thread keeps between callbacks
(`keep_thread_state`), driven here from a thread C started, as libfuse's are."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading

import pytest

from compatfs.fuse import libfuse

_TWICE = r"""
#include <pthread.h>
typedef void (*callback)(int);
static void *run(void *arg) { callback cb = (callback)arg; cb(0); cb(1); return 0; }
int twice_in_a_thread(callback cb) {
    pthread_t t;
    if (pthread_create(&t, 0, run, (void *)cb)) return -1;
    return pthread_join(t, 0);
}
"""


@pytest.mark.parametrize(
    "options, stay",
    [
        ({"max_threads": 64, "max_idle_threads": 64}, True),  # what the daemon sets
        ({"max_threads": "8", "max_idle_threads": "8"}, True),  # as -o gives them
        ({"max_threads": 64, "max_idle_threads": 10}, False),  # idle ones beyond 10 end
        ({"max_threads": 4}, True),  # libfuse's default: never end one
        ({"max_idle_threads": 10}, True),  # libfuse's 10 workers at most
        ({"max_idle_threads": 2}, False),
        ({"max_threads": 64, "max_idle_threads": -1}, True),  # rejected by libfuse: its default
        ({"max_threads": 64, "max_idle_threads": "many"}, False),
    ],
)
def test_workers_stay_as_libfuse_takes_the_options(monkeypatch, options, stay):
    monkeypatch.setattr(libfuse, "libfuse_tuple", lambda: (3, 14))
    assert libfuse.workers_stay(options) is stay


def test_workers_end_when_idle_before_libfuse_3_12(monkeypatch):
    monkeypatch.setattr(libfuse, "libfuse_tuple", lambda: (3, 10))
    assert not libfuse.workers_stay({"max_threads": 64, "max_idle_threads": 64})


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """A C function that starts a thread calling a callback twice, then joins it."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    work = tmp_path_factory.mktemp("twice")
    (work / "twice.c").write_text(_TWICE)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(work / "twice.so"), str(work / "twice.c"), "-lpthread"], check=True
    )
    fn = ctypes.CDLL(str(work / "twice.so")).twice_in_a_thread
    fn.argtypes = [ctypes.c_void_p]
    return fn


def _seen_again(twice, keep: bool) -> bool:
    """Whether the second callback in a C thread sees what the first set."""
    local, seen = threading.local(), []

    def callback(call: int) -> None:
        seen.append(hasattr(local, "mark"))
        local.mark = call
        if keep:
            libfuse.keep_thread_state()

    cb = ctypes.CFUNCTYPE(None, ctypes.c_int)(callback)
    assert twice(ctypes.cast(cb, ctypes.c_void_p)) == 0
    assert seen[0] is False
    return seen[1]


def test_a_c_thread_keeps_its_thread_state_between_callbacks(twice):
    # ctypes gives each callback from a C thread a new thread state...
    assert not _seen_again(twice, keep=False)
    # ...unless the thread keeps the one it has.
    assert _seen_again(twice, keep=True)


@pytest.mark.parametrize("request_name", ["opendir", "readdir"])
def test_a_worker_that_lists_a_folder_keeps_its_thread_state(twice, tmp_path, monkeypatch, request_name):
    """Listings come as an OPENDIR and READDIRPLUS per folder, each answered
    by some worker: like a read, each keeps the worker's thread state (the
    thread-local values its first callback set are there at its second)."""
    from compatfs.files.access import Caller
    from compatfs.fuse.operations import CompatFS
    from compatfs.sources.ollama import OllamaStore
    from compatfs.testing import llama
    from compatfs.testing.store import add_model
    from compatfs.tree import Tree
    from compatfs.view.catalog import BlobViews

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(0, 0, 1))
    store = tmp_path / "store"
    add_model(store, "chat", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    (tmp_path / "mnt").mkdir()
    fs = CompatFS(Tree(OllamaStore(store), BlobViews()), str(tmp_path / "mnt"), keep_thread_states=True)
    local, seen = threading.local(), []

    def callback(call: int) -> None:
        seen.append(hasattr(local, "mark"))
        local.mark = call
        if request_name == "opendir":
            fs.opendir("/chat:1b")
        else:
            fs.readdir("/chat:1b", 0)

    cb = ctypes.CFUNCTYPE(None, ctypes.c_int)(callback)
    assert twice(ctypes.cast(cb, ctypes.c_void_p)) == 0
    assert seen == [False, True]
