"""An open file keeps serving its blob when a name of the blob is removed
(`ollama rm`: the manifest and the blob file deleted), whatever the blob's
link count, and only then: a rewrite in place is still EIO.  The blobs here
are regular files (a symlink's removal would leave its target's change time
alone and test nothing)."""

import errno
import os
import shutil
from pathlib import Path

import pytest

from compatfs.files.blobfile import BlobFile
from compatfs.testing import gemma3, llama, llava
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until
from test_hostile_mount import blob_of, expected

MANIFESTS = "manifests/registry.ollama.ai/library"


def _blob(tmp_path: Path, links: int) -> tuple[Path, bytes]:
    """A regular file of random bytes with `links` names."""
    path = tmp_path / "blob"
    data = os.urandom(1 << 16)
    path.write_bytes(data)
    for i in range(1, links):
        os.link(path, tmp_path / f"name{i}")
    assert path.stat().st_nlink == links and not path.is_symlink()
    return path, data


@pytest.mark.parametrize("links", [1, 2])
def test_a_removed_name_leaves_an_open_blob_intact(tmp_path, links):
    path, data = _blob(tmp_path, links)
    with BlobFile(path) as f:
        ctime = os.fstat(f.fd).st_ctime_ns
        path.unlink()
        assert os.fstat(f.fd).st_ctime_ns != ctime or links == 1  # (the test means something)
        assert f.intact()
        f.check()
        assert f.read(0, len(data)) == data
        again = f.duplicate()  # a duplicate judges alike
        try:
            assert again.intact()
        finally:
            again.close()


@pytest.mark.parametrize("links", [1, 2])
def test_a_rewrite_in_place_is_a_change_after_a_name_was_removed(tmp_path, links):
    """Same size, the mtime set back, through a descriptor opened before the
    removal: only the change time tells, and it moved with the link count
    unchanged since the removal was seen (on 5ea7fe0 a file with no name
    left passed any such rewrite as intact)."""
    path, data = _blob(tmp_path, links)
    with open(path, "r+b", buffering=0) as w, BlobFile(path) as f:
        path.unlink()
        assert f.intact()
        st = os.fstat(w.fileno())
        w.write(bytes(b ^ 0xFF for b in data[:16]))
        os.utime(w.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.fstat(w.fileno()).st_mtime_ns == st.st_mtime_ns
        assert not f.intact()
        with pytest.raises(Exception, match="changed since it was opened"):
            f.check()


def test_a_name_added_is_a_change(tmp_path):
    """The change time may move only with the link count going down."""
    path, _ = _blob(tmp_path, 1)
    with BlobFile(path) as f:
        os.link(path, tmp_path / "added")
        assert not f.intact()


def _store(tmp_path: Path, links: int) -> tuple[Path, list[Path]]:
    """A store of a monolithic vision model and a model with a projector
    layer; with `links` 2 each blob has a second name outside the store."""
    root = tmp_path / "store"
    add_model(root, "vision", gemma3.legacy_gemma3_vision(tmp_path / "gv.gguf"), tag="4b")
    add_model(
        root,
        "llava",
        llama.plain_llama_text(tmp_path / "lt.gguf"),
        llava.legacy_llava_projector(tmp_path / "lp.gguf"),
        tag="7b",
    )
    blobs = [blob_of(root, "vision", "4b"), blob_of(root, "llava", "7b"), blob_of(root, "llava", "7b", "projector")]
    if links == 2:
        (tmp_path / "kept").mkdir()
        for blob in blobs:
            os.link(blob, tmp_path / "kept" / blob.name)
    assert all(b.stat().st_nlink == links and not b.is_symlink() for b in blobs)
    return root, blobs


def _drop_cached(fd: int) -> None:
    """Drop the page cache of what `fd` holds (the effect `echo 3 >
    /proc/sys/vm/drop_caches` has on it, without emptying the shared
    machine's cache)."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


@needs_fuse
@pytest.mark.parametrize("links", [1, 2])
def test_ollama_rm_while_files_are_open(tmp_path, mount_store, links):
    """Open model.gguf and mmproj.gguf of both models, `ollama rm` them
    (manifests and blob files deleted), drop the pages, read to the end:
    the bytes of the views opened (measured on 5ea7fe0 with two links: EIO
    at offset 0, "changed under an open file")."""
    store, blobs = _store(tmp_path, links)
    files = {
        "vision:4b/model.gguf": (blobs[0], "model.gguf"),
        "vision:4b/mmproj.gguf": (blobs[0], "mmproj.gguf"),
        "llava:7b/model.gguf": (blobs[1], "model.gguf"),
        "llava:7b/mmproj.gguf": (blobs[2], "mmproj.gguf"),
    }
    want = {rel: expected(blob, kind) for rel, (blob, kind) in files.items()}
    m = mount_store(store)
    held = [os.open(blob, os.O_RDONLY) for blob in blobs]  # to drop their pages once they are gone
    opened = {rel: open(m / rel, "rb", buffering=0) for rel in files}
    try:
        for rel, f in opened.items():
            assert f.read(4096) == want[rel][:4096]
        for name in ("vision", "llava"):
            shutil.rmtree(store / MANIFESTS / name)
        for blob in blobs:
            blob.unlink()
        wait_until(lambda: not {"vision:4b", "llava:7b"} & set(os.listdir(m.path)), what="the removed models leaving")
        for fd in held + [f.fileno() for f in opened.values()]:
            _drop_cached(fd)
        for rel, f in opened.items():
            f.seek(0)
            assert f.read() == want[rel], rel
    finally:
        for f in opened.values():
            f.close()
        for fd in held:
            os.close(fd)
    assert m.alive
    assert "changed under an open file" not in m.log_text()


@needs_fuse
def test_a_rewrite_in_place_after_ollama_rm_is_eio(tmp_path, mount_store):
    """A blob with a second name, removed from the store while open, then
    rewritten in place through that name (same size, mtime set back): its
    open file reads on until the rewrite, then gives EIO."""
    store, blobs = _store(tmp_path, 2)
    blob = blobs[0]
    kept = tmp_path / "kept" / blob.name
    want = expected(blob)
    m = mount_store(store)
    with open(m / "vision:4b/model.gguf", "rb", buffering=0) as f:
        assert f.read(4096) == want[:4096]
        shutil.rmtree(store / MANIFESTS / "vision")
        blob.unlink()
        f.seek(len(want) // 2)
        assert f.read(4096) == want[len(want) // 2 : len(want) // 2 + 4096]
        st = kept.stat()
        with open(kept, "r+b") as w:
            w.seek(st.st_size - 16)
            w.write(b"\xff" * 16)
        os.utime(kept, ns=(st.st_atime_ns, st.st_mtime_ns))
        _drop_cached(f.fileno())
        f.seek(len(want) - 4096)
        with pytest.raises(OSError) as e:
            f.read(4096)
        assert e.value.errno == errno.EIO
    assert m.alive
    assert "changed under an open file" in m.log_text()
