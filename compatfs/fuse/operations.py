"""The FUSE layer: the `fuse.Operations` adapter, turning each request into
calls on the modules that decide:

- `attributes`: what getattr and readdir answer;
- `paths`: everything kept per path, with one owner (`Paths`): the open
  files, the view a path keeps for them, the sizes getattr gave the kernel,
  getattr's and readdir's answers between rescans;
- `current`: the store's current view of a file (failures logged once);
- `openfiles`: what an open snapshots (the view and the blob's descriptor it
  is read through) and what a release closes;
- `readpath`: a read's reply, one malloc'ed buffer filled by `view.assemble`;
- `pagecache`: the pages of op tensors' kin a read makes too, queued for the
  kernel's page cache (sent by `rescan`'s thread);
- `rescan`: the background rescan, and the only sender of the kernel's
  invalidations (operations queue them to its thread);
- `listings`: folders' listings kept for the readdir gate in C, under the
  generation of what `paths` remembers;
- `inodes`: inode numbers; `libfuse`: the libfuse 3 binding;
- `files.access` and `files.blobfile`: permissions, decided on the store
  files themselves.

Every decision about what a file contains lives in `tree` and the `view`
package (`view.catalog`'s BlobViews); the mount's lifecycle (options,
signals, read-ahead, unmount) in `daemon`.  What the mount guarantees:
- libfuse 3, chosen explicitly (mfusepy would take libfuse 2 first).
- A file shows its blob's owner and mode (minus write bits); opening it also
  needs the caller to be able to reach and read the blob in the store itself.
  Only regular files are served (a blob symlink counts as what it points to).
- Every read checks the open file's blob against the view's stamp, before and
  after reading it: a blob that was truncated or rewritten gives EIO and a
  log line, never bytes of another file and never a short reply.
- A path keeps serving the view its open files read (the kernel keeps one
  page cache per path), and switches to the store's new one when they close.
- The store is looked at every quarter second in the background and
  rescanned on a change inotify reports or on a timer (`rescan`); the
  kernel's cached attributes, pages and listings of changed folders are
  invalidated at once.
- The kernel keeps each folder's listing and gets its entries' attributes
  with it (`libfuse.FUSE`: READDIRPLUS, getattr's answers): `ls -l` looks
  up no entry, and a folder listed again costs the daemon its `opendir`
  alone, where who may list it is decided.
- SIGTERM, SIGINT and SIGHUP unmount cleanly (`daemon`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from pathlib import Path

from . import libfuse, pagecache, polling, readgate, readpath
from .libfuse import fuse
from ..tree import FileRef, Tree
from ..files.access import READ
from ..files.lookup import Denied, identity, keep_out, status
from ..files.walkscope import scope
from .attributes import Attributes, file_attrs
from .listings import Listings
from .paths import Paths, fstat
from .rescan import Rescan
from .openfiles import CannotOpen, OpenFiles
from .current import CurrentViews, Unavailable
from ..router.preset import RootPreset

log = logging.getLogger(__name__)


def _erofs(*_args, **_kwargs):
    raise fuse.FuseOSError(errno.EROFS)


def _blob_state(ref: FileRef) -> tuple | int | None:
    """What tells whether `ref`'s blob changed: its identity, or the errno of
    its status."""
    try:
        return identity(status(ref.blob))
    except OSError as e:
        return e.errno


class CompatFS(fuse.Operations):
    """Read-only operations over a `Tree`."""

    use_ns = True
    # `opendir` lets root list any folder with nothing looked up (the
    # libfuse layer may answer root's opens itself: `libfuse.FUSE`).
    root_lists_all = True
    _OPEN_ATTEMPTS = 8  # an open racing re-pulls tries the path's newest blob this often
    _INVALIDATE_WAIT = 10.0  # seconds an open waits at most for the rescan thread to invalidate its path

    def __init__(
        self,
        tree: Tree,
        mountpoint: str,
        read_ahead_kb: int = 0,
        on_start=None,
        keep_thread_states: bool = False,
        background: tuple[int, int] | None = None,
    ):
        self.tree = tree
        self._background = background  # the INIT reply's max_background and congestion_threshold (`libfuse.background`)
        self._keep_states = keep_thread_states  # libfuse's workers run until unmount (`libfuse.workers_stay`)
        keep_out(mountpoint)  # nothing is ever looked up through it (a request to this very daemon)
        preset = RootPreset.at(Path(os.path.abspath(mountpoint)))
        if preset is not None:
            tree.publish(preset)  # its root shows models.ini, paths under the mountpoint
        self._read_ahead_kb = read_ahead_kb
        self._mountpoint = os.path.realpath(mountpoint)  # as libfuse's session names it
        self.root = tree.source.root
        self._paths = Paths()  # everything kept per path
        self._current = CurrentViews(tree)  # the store's current views, failures logged once
        self._opening = [threading.Lock() for _ in range(64)]  # opens of one path, one at a time
        self._files = OpenFiles(tree, self._current, self._paths)
        self._attrs = Attributes(tree, self._current, self._paths)
        self._rescan = Rescan(tree, self._paths, on_start)

    # -- lifetime ------------------------------------------------------------
    def init_with_config(self, conn, config):
        # The kernel lowers the mount's read-ahead to the INIT reply's
        # max_readahead when it takes the reply (sent after this returns):
        # allowing `read_ahead_kb` keeps set_read_ahead's value, whenever it lands.
        if self._read_ahead_kb:
            conn.max_readahead = max(conn.max_readahead, self._read_ahead_kb << 10)
        if self._background:
            conn.max_background, conn.congestion_threshold = self._background
        libfuse.want_listings_with_attributes(conn)
        log.info("%s", libfuse.keep_listings(libfuse.session(), self._mountpoint))
        log.info("%s", pagecache.learn_nodes(libfuse.session(), self._mountpoint))
        log.info("%s", polling.poll_after_listings(libfuse.session(), self._mountpoint, self, self._keep_states))
        self.init("/")

    def init(self, path):
        self._rescan.start(libfuse.session())

    def destroy(self, path):
        self._rescan.stop()
        log.info("%d requests found by a polling worker", polling.polled())
        if readgate.installed():
            log.info("%d reads answered in C", readgate.served())
        if self.listings_followed:
            log.info("%d folders' listings answered in C", Listings.served())

    @property
    def session(self) -> int | None:
        """The FUSE session while the loop runs (set in `init`), else None."""
        return self._rescan.session

    @property
    def open_files(self) -> int:
        return self._paths.count

    # -- lookups -------------------------------------------------------------
    def getattr(self, path, fh=None):
        opened = self._paths.get(fh.fh) if fh is not None else None
        attrs: dict | None
        if opened is not None:
            attrs = file_attrs(path, opened.view.stamp, opened.view.size, fstat(opened.file.fd))
        else:
            attrs = self._paths.attrs(path, self._attrs.of)
        if attrs is None:
            raise fuse.FuseOSError(errno.ENOENT)
        if stat.S_ISREG(attrs["st_mode"]):
            attrs = dict(attrs)
            self._paths.gave_size(path, attrs.pop("st_stamp", None), attrs["st_size"])
        return attrs

    def opendir(self, path):
        # Every open of a folder comes here (the kernel keeps its listing,
        # not who may read it): listing needs what listing the store folder
        # it comes from needs (a folder gone from the store lists for nobody
        # but root until the next scan drops it).  Root may list anything
        # (nothing to look up for it).  Like a read, a listing's requests
        # keep the worker's thread state (else ctypes makes one per request).
        if self._keep_states:
            libfuse.keep_thread_state()
        caller = libfuse.caller()
        if caller.uid == 0:
            return 0
        try:
            status(self.tree.owner(path.strip("/")), caller, READ)
        except Denied:
            raise fuse.FuseOSError(errno.EACCES) from None
        except OSError as e:
            raise fuse.FuseOSError(e.errno or errno.EIO) from None
        return 0

    def readdir(self, path, fh):
        if self._keep_states:
            libfuse.keep_thread_state()
        return self.listing(path)

    def listing(self, path: str) -> list:
        """The entries of the folder at `path` (name, type and inode number, 0)."""
        return self._paths.listing(path, self._attrs.listing)

    # -- listings kept for C (`listings`) -----------------------------------
    listings_followed = False

    def follow_changes(self, on_change) -> None:
        """`on_change` told the generation of what is remembered, now and at each change."""
        self.listings_followed = True
        self._paths.follow(on_change)

    @property
    def generation(self) -> int:
        """What is remembered (attributes, listings) holds until the generation changes."""
        return self._paths.generation

    def is_open(self, path: str) -> bool:
        """Whether files are open on `path` (its attributes then follow their view)."""
        return self._paths.open_stamp(path) is not None

    def entry_attrs(self, path: str) -> dict | None:
        """What a listing with attributes (READDIRPLUS) gives for `path`:
        getattr's answer; None where getattr fails (the kernel then looks
        the entry up itself, and meets the error)."""
        try:
            return self.getattr(path)
        except fuse.FuseOSError:
            return None

    def statfs(self, path):
        try:
            sv = os.statvfs(self.root)
        except OSError:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}
        return {
            k: getattr(sv, k)
            for k in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    # -- files ---------------------------------------------------------------
    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise fuse.FuseOSError(errno.EROFS)
        node = self._attrs.node(path)
        if isinstance(node, list):
            raise fuse.FuseOSError(errno.EISDIR)
        with self._opening[hash(path) % len(self._opening)]:
            return self._open(path, node, fi)

    def _open(self, path: str, node: FileRef, fi) -> int:
        """`open` of `path`, one at a time per path: what it serves is chosen
        knowing every file opened on it before."""
        caller = libfuse.caller()
        for _attempt in range(self._OPEN_ATTEMPTS):
            with scope():  # (the attempt's walks to its blob share the folders they pass: `walkscope.scope`)
                before = _blob_state(node)  # what this attempt finds (a failure is judged against it)
                try:
                    opened = self._files.open_view(path, node, caller)
                except fuse.FuseOSError as e:
                    if e.errno != errno.EIO:
                        raise
                    opened, failed = None, e
                else:
                    failed = None
            if opened is not None or isinstance(failed, Unavailable):
                break  # served, or a transient fault (logged, not remembered: no scan for it)
            # The blob changed as it was opened, or the store moved on since
            # the last scan (a model pulled again, its old blob removed):
            # the path's current blob, from a scan made now.  A blob that
            # cannot be served (EIO), not changed since this attempt began,
            # whose model folder's files are as the last scan marked them
            # (a blob already known to be broken) fails without a scan;
            # after a scan it is not tried again unless the folder is still
            # moving (its marks differ from the scan before: a blob removed
            # and written anew meanwhile).
            folder = path.strip("/").rpartition("/")[0]
            snap = self.tree.snapshot()
            marked = snap.marks.get(folder)
            if (
                failed is not None
                and _blob_state(node) == before
                and self._attrs.node(path) == node
                and self.tree.mark_now(snap, folder) == marked
            ):
                break
            moving = self.tree.snapshot(fresh=True).marks.get(folder) != marked
            now = self._attrs.node(path)
            if failed is not None and now == node and _blob_state(now) == before and not moving:
                break
            node = now
        if opened is None:
            if isinstance(failed, CannotOpen):
                log.error("cannot open blob: %s", failed.message)
            elif failed is None:
                log.error("blob %s changes while it is opened: not served", node.blob)
            raise failed or fuse.FuseOSError(errno.EIO)
        view, file = opened
        fh, keep_cache, stale = self._paths.add(path, node, view, file)
        now_open = self._paths.get(fh)
        self._rescan.pages.opened(fh, now_open, pagecache.opening_node())
        fi.keep_cache = int(keep_cache)
        if stale:
            # Since this was last done, getattr gave the kernel another view's
            # size for this path (it may hold it, or a reply still on its way
            # may set it): it must ask again (getattr with this open file)
            # before it serves any byte of this view, or it would cut it
            # short or mix the two.  Invalidating also discards replies sent
            # before.  The rescan thread sends it; the open waits for that.
            self._rescan.invalidate({path}, wait=self._INVALIDATE_WAIT)
        else:
            # Building the view may have found the index entry it was sized
            # by wrong (`BlobViews.on_belied`): the kernel must drop that
            # size before it serves a byte of this open, as above.
            self._rescan.sent(path, wait=self._INVALIDATE_WAIT)
        fi.fh = fh
        if now_open is not None:
            # (its first read, too, answered in C where the plan holds)
            readgate.plan(fh, now_open, self._rescan.pages.storing(fh))
        return 0

    def release(self, path, fi):
        readgate.forget(fi.fh)  # no read is answered in C for it from now on
        self._rescan.pages.closed(fi.fh)  # no page is stored for it from now on
        opened, outdated = self._files.release(fi.fh)
        if opened is not None and outdated:
            # The path kept its view for open files: now the kernel learns the
            # store's current one, told by the rescan thread once this release
            # is answered.
            self._rescan.stale(opened.path)
        return 0

    def read_buf(self, path, bufpp, size, offset, fi):
        if self._keep_states:
            libfuse.keep_thread_state()
        opened = self._files.reading(fi.fh)
        recheck = lambda: self._files.reading(fi.fh)  # noqa: E731
        readpath.reply(opened, bufpp, size, offset, recheck, self._rescan.pages.gather(fi.fh, opened))
        readgate.plan(fi.fh, opened, self._rescan.pages.storing(fi.fh))  # (where the gate has no plan for it alive)
        return 0

    # -- everything that would write -------------------------------------------
    write = create = mkdir = mknod = unlink = rmdir = rename = _erofs
    chmod = chown = truncate = utimens = symlink = link = setxattr = removexattr = _erofs
