"""Blob bytes an open file reads with O_DIRECT ahead of its reader
(`Window`), for reads into memory where they do not lie as in the blob (an
mmproj view's tensors, behind a header of another size): a read that
continues the one before is answered from the blocks read last, and once it
is, the next `AHEAD` bytes of the blob are asked of the kernel at once,
with Linux's asynchronous I/O (no thread; the disk reads them while the
mount answers and the kernel sends the next read), so that the reads that
follow copy them, most often without waiting for the disk.  A read that
finds none of its bytes there reads them itself, synchronously; one that
does not continue the one before starts nothing ahead.  Where the kernel
gives no asynchronous I/O, every read is its own.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading
from collections.abc import Callable

import numpy as np

from .libc import LIBC
from .scratch import give, take

ALIGN = 4096  # O_DIRECT offsets and sizes: whole 4 KiB blocks (as `blobfile.ALIGN`)
AHEAD = 2 << 20  # blob bytes read ahead at once: the mount's read-ahead (2 MiB)

ReadBlocks = Callable[[memoryview, int, int], int]  # (page-aligned buffer, aligned offset, bytes wanted) -> bytes read

# Linux's asynchronous I/O system calls: io_setup, io_destroy, io_submit, io_getevents.
_AIO_CALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4), "riscv64": (0, 1, 2, 4)}.get(platform.machine())
_IOCB_CMD_PREAD = 0


class _Iocb(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("key", ctypes.c_uint32),  # (little-endian order of aio_key and aio_rw_flags)
        ("rw_flags", ctypes.c_int32),
        ("opcode", ctypes.c_uint16),
        ("reqprio", ctypes.c_int16),
        ("fildes", ctypes.c_uint32),
        ("buf", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("offset", ctypes.c_int64),
        ("reserved2", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("resfd", ctypes.c_uint32),
    ]


class _Event(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64), ("res2", ctypes.c_int64)]


class _Ahead:
    """One O_DIRECT read of blob bytes [start, stop) into `buf`, submitted to
    the kernel and not yet reaped."""

    def __init__(self, ctx: int, fd: int, start: int, stop: int):
        self.ctx, self.start, self.stop = ctx, start, stop
        self.buf = take(stop - start)
        self._iocb = _Iocb(opcode=_IOCB_CMD_PREAD, fildes=fd, buf=self.buf.ctypes.data, nbytes=stop - start)
        self._iocb.offset = start
        self._list = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb))

    def submit(self) -> bool:
        """Whether the kernel took the read (else the buffer is given back)."""
        assert _AIO_CALLS is not None
        if LIBC.syscall(_AIO_CALLS[2], ctypes.c_ulong(self.ctx), ctypes.c_long(1), self._list) == 1:
            return True
        give(self.buf)
        return False

    def reap(self) -> int:
        """Wait for the read: how many bytes it gave (negative: an errno)."""
        assert _AIO_CALLS is not None
        event = _Event()
        while True:
            n = LIBC.syscall(
                _AIO_CALLS[3], ctypes.c_ulong(self.ctx), ctypes.c_long(1), ctypes.c_long(1), ctypes.byref(event), None
            )
            if n == 1:
                return event.res
            if ctypes.get_errno() != errno.EINTR:
                return -ctypes.get_errno()


class Window:
    """The blocks of one open file last read with O_DIRECT (`held`: blob
    bytes [start, end) at the start of a scratch buffer) and the read asked
    of the kernel ahead of them (`ahead`), for the file's reads through `fd`
    (its O_DIRECT descriptor; the file `size` bytes long)."""

    def __init__(self, fd: int, size: int):
        self._fd, self._size = fd, size
        self._cond = threading.Condition()
        self._held: tuple[int, int, np.ndarray] | None = None
        self._ahead: _Ahead | None = None
        self._reaping = False  # a read waits for `_ahead` to land
        self._ctx: int | None = None  # the asynchronous I/O context: None not set up yet, 0 none to be had
        self._last_end = -1  # where the last read served ended

    def read(self, out: memoryview, offset: int, read_blocks: ReadBlocks) -> int:
        """Blob bytes at `offset` into `out`, from the blocks read before or
        ahead, the rest read with `read_blocks`; how many bytes it gave
        (fewer than asked only where the file ends first)."""
        size, done = len(out), 0
        with self._cond:
            sequential = offset == self._last_end
            while done < size:
                n = self._copied(out[done:], offset + done)
                if n:
                    done += n
                    continue
                ahead = self._ahead
                if ahead is None or not ahead.start <= offset + done < ahead.stop:
                    break
                if self._reaping:
                    self._cond.wait()
                    continue
                self._land(ahead)
            if done == size or (done and self._held is not None and self._held[1] >= self._size):
                self._last_end = offset + done
                if sequential:
                    self._read_ahead()
                return done
        at = offset + done
        start = at - at % ALIGN
        stop = min(-(-(offset + size) // ALIGN) * ALIGN, -(-self._size // ALIGN) * ALIGN)
        stop = max(stop, start + ALIGN)
        buf = take(stop - start)
        try:
            got = read_blocks(buf.data[: stop - start], start, offset + size - start)
        except BaseException:
            give(buf)
            raise
        n = max(0, min(size - done, start + got - at))
        if n:
            _copy(out[done:], buf, at - start, n)
        with self._cond:
            old, self._held = self._held, (start, start + got, buf)
            self._last_end = at + n
            if sequential:
                self._read_ahead()
        if old is not None:
            give(old[2])
        return done + n

    def _land(self, ahead: _Ahead, keep: bool = True) -> None:
        """Wait for the read ahead (the lock held, let go meanwhile) and hold
        its blocks (with `keep`; else give them back); a read that failed
        is dropped (the reads it would have served read for themselves, and
        meet its error)."""
        self._reaping = True
        self._cond.release()
        try:
            got = ahead.reap()
        finally:
            self._cond.acquire()
            self._reaping = False
            self._ahead = None
            self._cond.notify_all()
        if got <= 0 or not keep:
            give(ahead.buf)
            return
        old, self._held = self._held, (ahead.start, ahead.start + got, ahead.buf)
        if old is not None:
            give(old[2])

    def _read_ahead(self) -> None:
        """Ask the kernel for the `AHEAD` bytes after the held blocks (the
        lock held), unless the file ends there or a read ahead of them is
        under way; one of other bytes (the reader went elsewhere) is waited
        for and dropped first."""
        held = self._held
        if held is None or held[1] >= self._size or held[1] % ALIGN:
            return
        if self._ahead is not None:
            if self._ahead.start == held[1] or self._reaping:
                return
            self._land(self._ahead, keep=False)
            return self._read_ahead()  # (the lock was let go meanwhile)
        ctx = self._context()
        if not ctx:
            return
        ahead = _Ahead(ctx, self._fd, held[1], min(held[1] + AHEAD, -(-self._size // ALIGN) * ALIGN))
        if ahead.submit():
            self._ahead = ahead

    def _context(self) -> int:
        """The asynchronous I/O context, set up on first use; 0 where there is none."""
        if self._ctx is None:
            ctx = ctypes.c_ulong(0)
            ok = _AIO_CALLS is not None and LIBC.syscall(_AIO_CALLS[0], ctypes.c_uint(1), ctypes.byref(ctx)) == 0
            self._ctx = ctx.value if ok else 0
        return self._ctx

    def _copied(self, out: memoryview, offset: int) -> int:
        """The held bytes at `offset` copied into `out` (the lock held): how many."""
        held = self._held
        if held is None or not held[0] <= offset < held[1]:
            return 0
        n = min(len(out), held[1] - offset)
        _copy(out, held[2], offset - held[0], n)
        return n

    def close(self) -> None:
        """Wait for a read ahead under way, let go of the asynchronous I/O
        context and give the buffers back."""
        with self._cond:
            held, self._held = self._held, None
            ahead, self._ahead = self._ahead, None
            ctx, self._ctx = self._ctx, 0
        if ahead is not None:
            ahead.reap()
            give(ahead.buf)
        if ctx and _AIO_CALLS is not None:
            LIBC.syscall(_AIO_CALLS[1], ctypes.c_ulong(ctx))
        if held is not None:
            give(held[2])


def _copy(out: memoryview, buf: np.ndarray, at: int, n: int) -> None:
    """`n` bytes of `buf` from `at` into the start of `out` (ctypes lets go of the GIL meanwhile)."""
    target = ctypes.addressof(ctypes.c_char.from_buffer(out))
    ctypes.memmove(target, buf.ctypes.data + at, n)
