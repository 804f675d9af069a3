"""`compatfs export`: a model's files written out as real files, without FUSE.

Each file is the same view the mount serves (built in-process by `BlobViews`),
assembled by the mount's own code (`view.assemble`) through one open `BlobFile`
of the blob, so the export is byte-identical to the mounted file.
Ranges of a piece that come from the blob are shared with it by
`FICLONERANGE` where the filesystem can (btrfs, XFS) and the range sits at
the same offset modulo the filesystem block size in the view as in the blob;
everything else is copied.  A file is written under a temporary name in the
target directory, fsynced, and renamed: an interrupted export leaves nothing
under the final name.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import signal
import struct
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..files.blobfile import BlobFile
from ..errors import GGUFError
from ..view.layout import View
from ..view.assemble import FileRange
from ..view.catalog import BlobViews
from ..names import MMPROJ_FILE, MODEL_FILE

FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
WINDOW = 64 << 20  # bytes of the view planned at a time
CHUNK = 8 << 20  # bytes copied per read
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}


@dataclass
class Exported:
    """One written file: its path, size, sha256 (None without checksum), how
    many bytes share extents with the blob, and why the rest was copied."""

    path: Path
    size: int
    sha256: str | None
    shared: int = 0
    copied_because: set[str] = field(default_factory=set)


def _clone(dst: int, src: int, src_off: int, length: int, dst_off: int) -> None:
    fcntl.ioctl(dst, FICLONERANGE, struct.pack("<qQQQ", src, src_off, length, dst_off))


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class _Writer:
    """Writes one view to an open file: pieces at their view offsets."""

    def __init__(self, out: int, blob: BlobFile, reflink: str, checksum: bool, bar):
        self.out, self.blob, self.blob_name = out, blob, blob.path.name
        self.reflink, self.bar = reflink, bar
        self.hash = hashlib.sha256() if checksum else None
        self.block = max(os.fstat(out).st_blksize, 4096)
        self.clone_ok = reflink != "never"
        self.kernel_copy = hasattr(os, "copy_file_range")
        self.shared = 0
        self.copied_because: set[str] = set()

    def mem(self, data, at: int) -> None:
        _pwrite_all(self.out, data, at)
        if self.hash:
            self.hash.update(data)
        self.bar.update(len(data))

    def copy(self, r: FileRange, at: int) -> None:
        done = 0
        while done < r.size:
            n = min(CHUNK, r.size - done)
            if self.hash is None and self.kernel_copy:  # no need to see the bytes: the kernel copies
                try:
                    copied = os.copy_file_range(self.blob.fd, self.out, n, r.offset + done, at + done)
                except OSError as e:
                    if e.errno not in _NO_CLONE:
                        raise
                    self.kernel_copy = False
                    continue
                if copied <= 0:
                    raise GGUFError(f"{self.blob_name} is shorter than its header says (read at {r.offset + done})")
                self.bar.update(copied)
                done += copied
                continue
            self.mem(self.blob.read(r.offset + done, n), at + done)
            done += n

    def file(self, r: FileRange, at: int) -> None:
        """Blob bytes `r` at view offset `at`: shared where possible, else copied."""
        if not self.clone_ok:
            return self.copy(r, at)
        shift = (at - r.offset) % self.block
        if shift:
            self._cannot(
                f"tensor data is not at the blob's offsets modulo the {self.block}-byte block size "
                "(the translated header or hidden tensors shift it)"
            )
            return self.copy(r, at)
        head = min(-at % self.block, r.size)
        body = (r.size - head) // self.block * self.block
        if head:
            self.copy(FileRange(r.offset, head), at)
        if body:
            try:
                _clone(self.out, self.blob.fd, r.offset + head, body, at + head)
            except OSError as e:
                if e.errno not in _NO_CLONE:
                    raise
                self.clone_ok = False
                self._cannot(f"the filesystem does not share extents ({os.strerror(e.errno)})")
                return self.copy(FileRange(r.offset + head, r.size - head), at + head)
            self.shared += body
            if self.hash:
                for off in range(0, body, CHUNK):
                    self.hash.update(self.blob.read(r.offset + head + off, min(CHUNK, body - off)))
            self.bar.update(body)
        tail = r.size - head - body
        if tail:
            self.copy(FileRange(r.offset + head + body, tail), at + head + body)

    def _cannot(self, why: str) -> None:
        if self.reflink == "always":
            raise GGUFError(f"--reflink: cannot share {self.blob_name}'s data: {why}")
        self.copied_because.add(why)


def write_view(view: View, blob: Path, dest: Path, reflink: str = "auto", checksum: bool = True, bar=None) -> Exported:
    """Write `view` (of `blob`) to `dest` through a temporary file in its directory."""
    bar = bar or _NoBar()
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with BlobFile(blob, expect=view.stamp) as src:  # GGUFError: the blob changed since the view was built
            w = _Writer(out, src, reflink, checksum, bar)
            for start in range(0, view.size, WINDOW):
                at = start
                for piece in view.pieces(start, WINDOW, src):
                    n = piece.size if isinstance(piece, FileRange) else len(piece)
                    w.file(piece, at) if isinstance(piece, FileRange) else w.mem(piece, at)
                    at += n
            src.check()
            os.ftruncate(out, view.size)
            os.fsync(out)
        os.close(out)
        out = -1
        os.rename(tmp, dest)
    except BaseException:
        if out >= 0:
            os.close(out)
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)
    return Exported(dest, view.size, w.hash.hexdigest() if w.hash else None, w.shared, w.copied_because)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM and SIGHUP end the export as Ctrl-C does (temporary file removed)."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _order(name: str) -> tuple:
    return ({MODEL_FILE: 0, MMPROJ_FILE: 1}.get(name, 2), name)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    x = n / 1024
    for unit in ("KiB", "MiB"):
        if x < 1024:
            return f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GiB"


def export_model(
    views: BlobViews,
    name: str,
    files: dict,
    outdir: Path,
    reflink: str = "auto",
    checksum: bool = True,
    quiet: bool = False,
) -> list[Exported]:
    """Write the files of model `name` (FileRefs by file name, as `models.model_files`
    gives them) into `outdir`; prints a sha256sum line per file (stdout) and,
    unless `quiet`, a progress bar while writing (on a terminal: bytes, rate,
    time left) and a line per file written (stderr)."""
    from tqdm import tqdm

    outdir.mkdir(parents=True, exist_ok=True)
    jobs = [
        (fname, files[fname], views.view(files[fname].blob, files[fname].kind, files[fname].params))
        for fname in sorted(files, key=_order)
    ]
    done: list[Exported] = []
    bar = tqdm(
        total=sum(v.size for _, _, v in jobs),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        disable=True if quiet else None,
        file=sys.stderr,
    )
    try:
        with _terminate_as_interrupt():
            for fname, ref, view in jobs:
                done.append(write_view(view, ref.blob, outdir / fname, reflink, checksum, bar))
    finally:
        bar.close()
    for e in done:
        if e.sha256:
            print(f"{e.sha256}  {e.path}")
        shared = f", {_size(e.shared)} shared with the blob (reflink)" if e.shared else ""
        why = f"; copied: {'; '.join(sorted(e.copied_because))}" if e.copied_because else ""
        if not quiet:
            print(f"compatfs: wrote {e.path} ({_size(e.size)}{shared}){why}", file=sys.stderr)
    return done
