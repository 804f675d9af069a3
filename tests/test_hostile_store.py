"""Hostile store contents, in process: files that are not regular (FIFOs,
devices) never block a reader, manifests are read with a size cap and in
time linear in their layers, names that collide are left out with a reason,
and a handler that fails (whatever it raises) refuses only its own view."""

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import compatfs.tree as tree_module
from compatfs import handlers
from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.router.models import model_files
from compatfs.sources.base import SourceError
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import fuzz, llama
from compatfs.testing.store import add_blob, add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from compatfs.view.summaries import summarize
from compatfs.names import MMPROJ_FILE, MODEL_FILE

from hostile import ends_within, fifo_writer_release, vision_and_text_store

LIB = "manifests/registry.ollama.ai/library"


@pytest.fixture
def store(tmp_path):
    return vision_and_text_store(tmp_path)


def _blob(store: Path, name: str, tag: str) -> Path:
    doc = json.loads((store / LIB / name / tag).read_text())
    return store / "blobs" / doc["layers"][0]["digest"].replace(":", "-")


@pytest.fixture
def fifo(tmp_path):
    made = []

    def make(path: Path) -> Path:
        if path.exists():
            path.unlink()
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:  # release whatever the code under test left blocked on it
        fifo_writer_release(path)


def test_no_reader_of_store_contents_blocks_on_a_fifo(store, fifo):
    """Measured on the landed code: the header parser opened blobs blocking
    (a FIFO put in place hung the thread until someone wrote it), and so did
    manifests in a rescan."""
    blob = _blob(store, "text", "1b")
    parsed = SourceGGUF(blob)
    fifo(blob)
    for _what, call in [
        ("parse", lambda: SourceGGUF(blob)),
        ("read", lambda: parsed.read(0, 16)),
        ("summary", lambda: BlobViews().summary(blob)),
        ("view", lambda: BlobViews().view(blob, MODEL_FILE)),
    ]:
        with pytest.raises(GGUFError, match="not a regular file"):
            ends_within(call, 5)
    fifo(store / LIB / "text" / "1b")
    scan = ends_within(OllamaStore(store).manifests, 5)
    assert "not a regular file" in scan.skipped["text:1b"] and "vision:4b" in scan.models


def test_a_manifest_that_is_a_device_or_too_large_is_left_out(store, tmp_path):
    """Measured on the landed code: a manifest symlinked to /dev/zero was
    read whole (3.2 GB in the daemon, MemoryError in `compatfs ls`).  Run in
    a process limited to 1 GiB of address space, so that a regression fails
    rather than fills the machine."""
    (store / LIB / "zero").mkdir()
    (store / LIB / "zero" / "latest").symlink_to("/dev/zero")
    big = store / LIB / "big" / "latest"
    big.parent.mkdir()
    big.write_bytes(b" " * (5 << 20))
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
        "from compatfs.sources.ollama import OllamaStore; s = OllamaStore(sys.argv[1]).manifests();"
        "print(sorted(s.models)); print(s.skipped['zero:latest']); print(s.skipped['big:latest'])"
    )
    res = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    models, zero, big_reason = res.stdout.splitlines()
    assert models == "['text:1b', 'vision:4b']"
    assert "not a regular file" in zero and "more than" in big_reason


def test_a_folder_with_many_layers_is_listed_in_linear_work(store, monkeypatch):
    """Measured on the landed code: every lookup in a model folder made
    every file of the folder again (2,500 license layers: 4.8 s of daemon
    CPU to list the folder, 10,000: 88 s).  Counted here: file references
    made while listing the folder and looking up each of its files."""
    n = 2000
    manifest = store / LIB / "text" / "1b"
    doc = json.loads(manifest.read_text())
    for i in range(n):
        f = store / f"license{i}.txt"
        f.write_text(f"license {i}")
        doc["layers"].append({"mediaType": "application/vnd.ollama.image.license", **add_blob(store, f)})
    manifest.write_text(json.dumps(doc))
    made = []
    real = tree_module.FileRef
    monkeypatch.setattr(tree_module, "FileRef", lambda *a: made.append(1) or real(*a))
    tree = Tree(OllamaStore(store), BlobViews())
    names = tree.lookup("text:1b")
    assert len(names) == n + 1 and "license-2000" in names
    for name in names:
        assert isinstance(tree.lookup(f"text:1b/{name}"), real)
    assert len(made) <= 3 * (n + 10), f"{len(made)} file references for a folder of {n + 1} files"


def test_names_that_collide_are_left_out_with_the_reason(store, tmp_path):
    """A namespace (or host) named `blobs` would hide in the mount's blobs/
    folder, and a host spelled in another case takes the usual host's name:
    each is left out naming why; the first keeps its name."""
    odd = tmp_path / "odd.gguf"
    llama.plain_llama_text(odd)
    add_model(store, "text", odd, host="Registry.Ollama.AI", tag="1b")
    add_model(store, "hidden", odd, namespace="blobs")
    tree = Tree(OllamaStore(store), BlobViews())
    snap = tree.snapshot()
    assert snap.models["text:1b"].model == _blob(store, "text", "1b")  # the usual spelling wins
    other = str(store / "manifests/Registry.Ollama.AI/library/text/1b")
    assert (
        "already that of" in snap.listing.skipped[other]
        and str(store / LIB / "text" / "1b") in snap.listing.skipped[other]
    )
    assert "blobs/" in snap.listing.skipped["blobs/hidden:latest"]
    assert tree.lookup("blobs/hidden:latest") is None and tree.lookup("blobs/hidden:latest/model.gguf") is None
    assert "hidden:latest" not in tree.lookup("blobs")


class Boom(Exception):
    """What a handler that is not total might raise: anything."""


def _failing_plan(monkeypatch, kinds: str):
    """Make planning with the handlers of `kinds` (TEXT or CLIP) raise Boom."""
    import compatfs.view.claims as views_module

    real_plan = views_module.plan

    def plan(tr, src):
        if tr in getattr(handlers, kinds):
            raise Boom("plan")
        return real_plan(tr, src)

    monkeypatch.setattr(views_module, "plan", plan)


@pytest.mark.parametrize("kinds, refused, kept", [("TEXT", MODEL_FILE, MMPROJ_FILE), ("CLIP", MMPROJ_FILE, MODEL_FILE)])
def test_a_failing_plan_refuses_only_its_view(store, monkeypatch, kinds, refused, kept):
    blob = _blob(store, "vision", "4b")
    want = BlobViews().view(blob, kept).size
    _failing_plan(monkeypatch, kinds)
    _stamp, s = summarize(blob, True)
    size = {MODEL_FILE: s.model_size, MMPROJ_FILE: s.mmproj_size}
    error = {MODEL_FILE: s.model_error, MMPROJ_FILE: s.mmproj_error}
    assert s.error is None and size[refused] == 0 and size[kept] == want
    assert str(blob) in error[refused] and "Boom: plan" in error[refused] and error[kept] is None
    views = BlobViews()
    with pytest.raises(GGUFError, match="Boom: plan") as e:
        views.view(blob, refused)
    assert str(blob) in str(e.value)
    assert views.view(blob, kept).size == want


def test_a_failing_claim_refuses_only_its_view(store, monkeypatch):
    import compatfs.view.claims as views_module

    blob = _blob(store, "vision", "4b")
    want = BlobViews().view(blob, MMPROJ_FILE).size
    real = views_module.first_claim

    def first_claim(translations, src):
        if translations is handlers.TEXT:
            raise Boom("claim")
        return real(translations, src)

    monkeypatch.setattr(views_module, "first_claim", first_claim)
    info = views_module.classify(SourceGGUF(blob))
    # Told apart from a refusal the handler meant (the fuzzer reports these as findings).
    assert isinstance(info.text_error, views_module.HandlerFailure) and isinstance(info.text_error.__cause__, Boom)
    _stamp, s = summarize(blob, True)
    assert s.model_size == 0 and "Boom: claim" in s.model_error and s.mmproj_size == want
    assert BlobViews().view(blob, MMPROJ_FILE).size == want
    # The text-only blob beside it: its only view refused, nothing else.
    _stamp, t = summarize(_blob(store, "text", "1b"), True)
    assert t.model_size == 0 and t.mmproj_size is None and "Boom: claim" in t.model_error


def test_indexing_workers_outlive_the_thread_that_started_them(store, tmp_path):
    """The parent-death signal follows the thread that forked a worker, not
    the daemon: a pool started by a thread that then ends must keep
    working (and still end with the daemon: test_index)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing
    import compatfs.view.summaries as views_module

    blob = _blob(store, "text", "1b")
    box = {}

    def start():
        pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=views_module.die_with,
            initargs=(os.getpid(),),
        )
        box["first"] = pool.submit(summarize, blob, True).result(timeout=60)  # the worker is set up
        box["pool"] = pool

    t = threading.Thread(target=start)
    t.start()
    t.join(90)
    pool = box["pool"]
    try:
        assert pool.submit(summarize, blob, True).result(timeout=60) == box["first"]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("value", ["array", "number", "not utf-8"])
def test_an_architecture_of_the_wrong_type_is_an_answer(store, tmp_path, value):
    """general.architecture is read before any handler (is it a projector?):
    an array (which compares elementwise), a number, bytes that are not
    UTF-8: a summary or one GGUFError, never another exception."""
    from compatfs.format.values import VT, Value, array, u32
    from hostile import with_value

    bad = tmp_path / "arch.gguf"
    new = {
        "array": array(VT.UINT32, [1, 2, 3]),
        "number": u32(7),
        "not utf-8": Value(VT.STRING, (3).to_bytes(8, "little") + b"\xff\xfe\xfd"),
    }[value]
    bad.write_bytes(with_value(_blob(store, "vision", "4b"), "general.architecture", new))
    _stamp, s = summarize(bad, True)
    assert s.arch is None if value != "not utf-8" else isinstance(s.arch, str)  # decoded with replacements
    views = BlobViews()
    for kind in (MODEL_FILE, MMPROJ_FILE):
        try:
            views.view(bad, kind)
        except GGUFError as e:
            assert str(bad) in str(e)
    fuzz.views_of(bad)  # raises HandlerFailure where a refusal is a handler's crash (BlobViews' GGUFError hides it)


def test_a_model_removed_between_two_scans_is_no_model(store, monkeypatch):
    """`model_files` (what `compatfs export` reads) finds the model in one
    scan and lists its folder in the next: a model removed in between is "no
    model", as one never there is (measured on the landed code: a TypeError
    iterating the None the second lookup gave)."""
    source = OllamaStore(store)
    tree = Tree(source, BlobViews(), rescan_seconds=0)
    scan = source.scan

    def scan_then_remove():
        listing = scan()
        (store / LIB / "text" / "1b").unlink(missing_ok=True)
        return listing

    monkeypatch.setattr(source, "scan", scan_then_remove)
    with pytest.raises(SourceError, match="no model text:1b"):
        model_files(tree, "text:1b")


def test_ls_leaves_out_a_model_removed_while_it_lists(store, monkeypatch, capsys):
    """`compatfs ls` lists the models of one scan and looks each up again: a
    model removed in between is left out of the table, the others listed
    (measured on the landed code: a TypeError on the None the lookup gave)."""
    from functools import partialmethod
    from compatfs.cli import main as cli

    monkeypatch.setattr(tree_module.Tree, "__init__", partialmethod(tree_module.Tree.__init__, rescan_seconds=0))
    scan = OllamaStore.scan

    def scan_then_remove(self):
        listing = scan(self)
        (store / LIB / "text" / "1b").unlink(missing_ok=True)
        return listing

    monkeypatch.setattr(OllamaStore, "scan", scan_then_remove)
    assert cli.main(["ls", str(store), "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["models"]] == ["vision:4b"]


def test_an_unopenable_blob_is_not_rescanned_for(store, tmp_path, monkeypatch):
    """An open whose blob cannot be opened (a FIFO in its place), as the
    last scan found it, fails with EIO without a scan (measured on earlier
    code: 8 fresh scans of the whole store for each such open, then one)."""
    from types import SimpleNamespace
    from compatfs.fuse import libfuse
    from compatfs.files.access import Caller
    from compatfs.fuse.operations import CompatFS

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    blob = _blob(store, "text", "1b")
    blob.unlink()
    os.mkfifo(blob)
    source = OllamaStore(store)
    (tmp_path / "mnt").mkdir()
    fs = CompatFS(Tree(source, BlobViews(), rescan_seconds=3600), str(tmp_path / "mnt"))
    fs.tree.snapshot()  # the mount's first scan
    scans = []
    scan = source.scan
    monkeypatch.setattr(source, "scan", lambda: scans.append(1) or scan())
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    with pytest.raises(OSError) as e:
        fs.open("/text:1b/model.gguf", fi)
    assert e.value.errno == errno.EIO and len(scans) == 0
    assert fs.open("/vision:4b/model.gguf", fi) == 0 and len(scans) == 0


def test_a_lookup_never_waits_for_a_rescan(store, monkeypatch):
    """Measured on the landed code: the snapshot was rebuilt under the
    tree's lock, so every lookup waited for a rescan (for ever, when the
    rescan hung).  A rescan that takes seconds leaves lookups answering
    from the last snapshot."""
    import time

    tree = Tree(OllamaStore(store), BlobViews(), rescan_seconds=0.1)
    assert tree.lookup("text:1b/model.gguf") is not None
    real = tree.source.scan
    entered = threading.Event()

    def slow_scan():
        entered.set()
        time.sleep(3)  # on purpose: a scan that takes seconds
        return real()

    monkeypatch.setattr(tree.source, "scan", slow_scan)
    time.sleep(0.2)  # on purpose: the snapshot grows older than rescan_seconds
    rescan = threading.Thread(target=tree.snapshot)  # stale: this thread rescans
    rescan.start()
    assert entered.wait(5)
    t = time.monotonic()
    assert ends_within(tree.lookup, 2, "text:1b/model.gguf") is not None
    assert ends_within(tree.lookup, 2, "vision:4b") is not None
    assert time.monotonic() - t < 1.5
    rescan.join(10)
