"""An administered store: a blob's metadata changed (chmod, chown, an ACL, a
hard link added and removed, as `chown -R`, `cp -al` or `setfacl` do) never
disturbs a file open on it, even one a process maps and reads again after
its pages were dropped; any write of its bytes does, whatever is done to its
times and links around it (measured on 0c32945: the first gave EIO and
SIGBUS, the second served the new bytes after the old)."""

import errno
import hashlib
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compatfs.files.blobfile import BlobFile
from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until
from test_hostile_mount import blob_of, expected

_NONE = 0xFFFFFFFF
ACL_XATTR = "system.posix_acl_access"


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def _set_acl(path: Path) -> None:
    """user:65534:r-- on `path` (as `setfacl -m u:65534:r` does)."""
    os.setxattr(
        path, ACL_XATTR, _acl((0x01, 6, _NONE), (0x02, 4, 65534), (0x04, 4, _NONE), (0x10, 4, _NONE), (0x20, 4, _NONE))
    )


# A reader in its own process that maps the file, reads all of it through the
# mapping at each line on stdin and answers the bytes' digest (a SIGBUS ends it).
_MAPPER = textwrap.dedent("""
    import hashlib, mmap, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    for _ in sys.stdin:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        print(hashlib.sha256(m[:]).hexdigest(), flush=True)
""")


class Mapper:
    def __init__(self, path: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MAPPER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def digest(self) -> str:
        """The digest of all of the mapping, read now; AssertionError naming the signal when the reader died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.proc.stdout.readline().strip()
        if not line:
            code = self.proc.wait(timeout=10)
            raise AssertionError(f"the process mapping the file ended with {code} (-7: SIGBUS)")
        return line

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def _drop(*paths: Path) -> None:
    """Drop the page cache of each file (what `echo 3 > /proc/sys/vm/drop_caches`
    does to them, without emptying the shared machine's cache)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    (tmp_path / "backup").mkdir()
    return root


def _changes(store: Path, tmp_path: Path):
    """(what, change) of every change of metadata an administrator makes."""
    blob = blob_of(store, "text", "1b")
    copy = tmp_path / "backup" / blob.name
    return [
        ("chmod", lambda: os.chmod(blob, 0o600)),
        ("chown", lambda: os.chown(blob, 65534, 65534)),
        ("setfacl", lambda: _set_acl(blob)),
        ("a hard link (cp -al)", lambda: os.link(blob, copy)),
        ("the hard link removed", lambda: copy.unlink()),
        ("chmod back", lambda: os.chmod(blob, 0o644)),
    ]


@needs_fuse
@pytest.mark.parametrize("mode", ["translated", "--no-translate"])
def test_metadata_changes_leave_open_and_mapped_files_reading(store, tmp_path, mount_store, mode):
    blob = blob_of(store, "text", "1b")
    m = mount_store(store, *([mode] if mode != "translated" else []))
    path = m / "text:1b/model.gguf"
    want = blob.read_bytes() if mode != "translated" else expected(blob)
    assert (want != blob.read_bytes()) == (mode == "translated")  # (each view is the one meant)
    digest = hashlib.sha256(want).hexdigest()
    mapper = Mapper(path)
    try:
        with open(path, "rb", buffering=0) as f:
            assert mapper.digest() == digest
            for what, change in _changes(store, tmp_path):
                seen = m.changes_seen()
                change()
                wait_until(lambda seen=seen: m.changes_seen() > seen, what=f"a rescan seeing the {what}")
                _drop(blob, path)
                assert mapper.digest() == digest, what
                f.seek(0)
                assert f.read() == want, what
            with open(path, "rb") as again:  # a file opened now reads the same
                assert again.read() == want
    finally:
        mapper.close()
    assert m.alive
    assert "changed under an open file" not in m.log_text()


@needs_fuse
@pytest.mark.parametrize("mode", ["translated", "--no-translate"])
def test_a_rewrite_with_its_times_and_links_restored_is_eio(store, tmp_path, mount_store, mode):
    """The blob has a second name; its bytes are rewritten in place (same size),
    its mtime set back, and the second name removed: reads of the open file
    are EIO."""
    blob = blob_of(store, "text", "1b")
    copy = tmp_path / "backup" / blob.name
    os.link(blob, copy)
    m = mount_store(store, *([mode] if mode != "translated" else []))
    path = m / "text:1b/model.gguf"
    want = blob.read_bytes() if mode != "translated" else expected(blob)
    with open(path, "rb", buffering=0) as f:
        assert f.read(4096) == want[:4096]
        st = blob.stat()
        with open(copy, "r+b") as w:
            w.seek(st.st_size - 64)
            w.write(bytes(b ^ 0xFF for b in blob.read_bytes()[-64:]))
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
        copy.unlink()
        assert blob.stat().st_mtime_ns == st.st_mtime_ns and blob.stat().st_nlink == st.st_nlink - 1
        _drop(blob, path)
        f.seek(len(want) - 4096)
        with pytest.raises(OSError) as e:
            f.read(4096)
        assert e.value.errno == errno.EIO
    assert m.alive
    assert "changed under an open file" in m.log_text()


def test_an_open_followed_file_tells_metadata_from_content(tmp_path):
    """In-process: each change of metadata leaves a followed file intact
    (and its duplicate); a writer that had the file open and mapped before
    it was opened, writing through the mapping and setting the mtime back,
    does not."""
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(1 << 16))
    (tmp_path / "backup").mkdir()
    with BlobFile(path, follow=True) as f:
        for what, change in [
            ("chmod", lambda: os.chmod(path, 0o600)),
            ("chown", lambda: os.chown(path, 1, 1)),
            ("acl", lambda: _set_acl(path)),
            ("xattr", lambda: os.setxattr(path, "user.a", b"1")),
            ("link", lambda: os.link(path, tmp_path / "backup/x")),
            ("unlink", lambda: (tmp_path / "backup/x").unlink()),
        ]:
            ctime = path.stat().st_ctime_ns
            change()
            assert path.stat().st_ctime_ns != ctime or what == "chown"
            assert f.intact(), what
        again = f.duplicate()
        try:
            assert again.intact()
        finally:
            again.close()
    import mmap

    with open(path, "r+b") as w:
        mapped = mmap.mmap(w.fileno(), 4096)
        with BlobFile(path, follow=True) as f:
            st = path.stat()
            mapped[:4] = b"abcd"
            mapped.flush()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            assert not f.intact()
        mapped.close()
