"""The rescan thread: the store is rescanned in the background, and the
kernel's cached attributes and pages of what changed are invalidated at once
(a changed folder, its files and parents; the folders, not their files,
that mirror a store folder whose owner, mode or time changed; a path that
kept its view for open files once they closed).  The remembered attributes are dropped before the
kernel is told; the changed folders are dropped again at the next look (the
kernel keeps a folder's listing: one made before the change whose reply
came after the first drop goes too).

This thread is the only sender of kernel notifications: other threads queue
them (`stale` after a release, `invalidate` from an open, which waits until
it is sent, a wrong index entry found while a view is built), and the thread
sends what is queued each time it wakes, before it looks at the store.  The
pages reads queue for the kernel's page cache (`pages`, a
`pagecache.PageStores`) wake it at once and are sent first, before any
invalidation of the same wake, each only while the path still serves the
view they were made from; a wake for them alone looks at nothing else.

The thread looks every `LOOK_SECONDS` (a tenth of a second after a scan
during which a change was reported).  It rescans when the folders the last
scan read report a change, or those it named files in a change of one of
those files (`watch`: a file downloaded beside them costs nothing), at most
once a second (a change reported sooner after the last scan waits for that
second), when a path kept for open files is released, and otherwise on a
timer: every second while a rescan costs at most `IDLE_SHARE` of a second
of CPU, else as seldom as keeps the rescans to that share (a store of
thousands of models, or one whose changes inotify does not see, is still
rescanned, less often).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from collections.abc import Callable

from . import ending, libfuse, readgate
from .pagecache import PageStores
from .paths import OpenFile, Paths
from .wakeup import Wakeup
from ..tree import Snapshot, Tree
from ..names import MMPROJ_FILE, MODEL_FILE
from ..files.watch import Watch

log = logging.getLogger(__name__)


class _Busy:
    """Whether the process's other threads (the FUSE workers) used more than
    a fifth of a core since the last call: CPU time of the process less the
    calling thread's, over the time between calls."""

    SHARE = 0.2

    def __init__(self) -> None:
        self._at, self._cpu, self._own = time.monotonic(), time.process_time(), time.thread_time()

    def __call__(self) -> bool:
        at, cpu, own = time.monotonic(), time.process_time(), time.thread_time()
        others = (cpu - self._cpu) - (own - self._own)
        busy = others > self.SHARE * (at - self._at)
        self._at, self._cpu, self._own = at, cpu, own
        return busy


class Rescan:
    """Follows the store for a mounted `tree` from its own thread."""

    RESCAN_SECONDS = 1.0  # a store changing all along is rescanned about this often at most
    LOOK_SECONDS = 0.25  # how often the thread looks for a change reported
    IDLE_SHARE = 0.005  # of one core: what the timer's rescans may cost at most
    FOLLOW_UP = 0.1  # seconds to the next look after a scan during which a change was reported
    FIRST_LOOK_WAIT = 5.0  # seconds the first look waits at most while the daemon's other threads are busy

    def __init__(self, tree: Tree, paths: Paths, on_start: Callable[[], None] | None = None):
        self.tree = tree
        self.root = tree.source.root
        self._paths = paths
        self._on_start = on_start  # run by the thread as it starts (the mount is up)
        self._lock = threading.Lock()  # guards what other threads queue (below)
        self._stale_paths: set[str] = set()  # to invalidate after a rescan: they kept a view for open files
        self._now: set[str] = set()  # to invalidate as soon as the thread wakes
        self._sent: list[threading.Event] = []  # set once what was queued before them is sent
        self._fuse_ptr: int | None = None
        self._stop = threading.Event()
        self._kick = Wakeup()  # wake up: something is queued, or rescan now
        self._look = False  # the wake is for more than pages to store: look now
        self.pages = PageStores(self._kick.set)  # pages to store (they wake the thread, sent first)
        self._watcher: threading.Thread | None = None
        tree.views.on_belied = self._wrong_index_entry  # BlobViews takes its callback as an attribute
        # What the first rescan compares against, taken before the mount
        # answers anything (marks are taken from the store as it is when they
        # are made): a change made between the mount's first answers and the
        # thread's start is then a change, and the kernel forgets those answers.
        self._inotify = Watch.open()
        self._restale = False  # an index entry was wrong: models.ini's sections are made again
        self._first = tree.snapshot()
        self._follow(self._first)
        self.rescans = 0  # scans the thread made

    @property
    def session(self) -> int | None:
        """The FUSE session while the thread runs, else None."""
        return self._fuse_ptr

    def start(self, session: int) -> None:
        self._fuse_ptr = session
        ending.begins()
        self.pages.gate_wakes(self._kick.fileno())
        self._watcher = threading.Thread(target=self._watch, name="compatfs-rescan", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._fuse_ptr = None
        with self._lock:
            waiting, self._sent = self._sent, []
        for sent in waiting:  # nothing is sent any more: nobody waits for it
            sent.set()
        if self._watcher is None or not self._watcher.is_alive():  # (else it may be sending one)
            self.pages.clear()
            self._kick.close()
        refused = self.pages.refused + readgate.stores_refused()
        if self.pages.sent or refused:
            log.info("kin pages: %d stores sent, %d not made (the queue full)", self.pages.sent, refused)
        if self._inotify is not None and (self._watcher is None or not self._watcher.is_alive()):
            self._inotify.close()

    def _follow(self, snap: Snapshot) -> bool:
        """Watch the folders where `snap` may change; whether any is newly
        watched (what changed there before is not reported: look again).  In
        a folder the scan did not list, only the files it names count (a
        blob being downloaded beside them, which no manifest names yet, is
        nothing to show: its writes cost no scan)."""
        if self._inotify is None:
            return False
        only: dict[Path, set[str]] = {}
        for f in snap.listing.folders.values():
            for p in (f.model, f.projector, *(p for _, p in f.passed)):
                if p is not None and p.parent not in snap.listing.read:
                    only.setdefault(p.parent, set()).add(p.name)
        return self._inotify.follow(self.tree.watched(snap), only)

    def stale(self, path: str) -> None:
        """`path` kept its view for open files, which closed: the kernel learns
        the store's current one after the rescan this asks for."""
        with self._lock:
            self._stale_paths.add(path)
            self._look = True
        self._kick.set()

    def invalidate(self, paths: set[str], wait: float = 0.0) -> None:
        """Have the kernel drop its attributes and pages of `paths`, sent by
        this thread when it next wakes; with `wait`, return once they are
        sent (or after `wait` seconds, or at once while the thread is not
        running: no kernel to tell)."""
        sent = threading.Event()
        with self._lock:
            self._now |= paths
            self._look = True
            if wait and self._fuse_ptr and not self._stop.is_set():
                self._sent.append(sent)
            else:
                sent.set()
        self._kick.set()
        sent.wait(wait)

    def sent(self, path: str, wait: float) -> None:
        """Return once no invalidation of `path` waits to be sent (or after
        `wait` seconds, or at once while the thread is not running)."""
        sent = threading.Event()
        with self._lock:
            if path not in self._now or not self._fuse_ptr or self._stop.is_set():
                return
            self._sent.append(sent)
            self._look = True
        self._kick.set()
        sent.wait(wait)

    def _send_queued(self) -> None:
        """Send what other threads queued since the last time, and release who waits for it."""
        with self._lock:
            paths, self._now = self._now, set()
            waiting, self._sent = self._sent, []
        try:
            self._invalidate_paths(paths)
        finally:
            for sent in waiting:
                sent.set()

    def _watch(self) -> None:
        """Rescan the store when it may have changed; tell the kernel what changed."""
        if self._on_start is not None:
            self._on_start()
        self.tree.follow()  # from now on only this thread rescans; lookups never wait for it
        old_snap = self._first
        before = old_snap.marks
        del self._first  # the loop keeps it from here on, as the last rescan's
        period, last, again = self.RESCAN_SECONDS, 0.0, True  # the first look always rescans
        wait, pending = self.LOOK_SECONDS, False  # (pending: a change reported, not scanned yet)
        folders: set[str] = set()  # the changed folders the last scan dropped, dropped again at the next look
        first_by = time.monotonic() + self.FIRST_LOOK_WAIT
        busy = _Busy()
        while not self._stop.is_set():
            due, left = time.monotonic() + wait, wait
            while True:  # pages to store are sent as soon as they are queued; the rest waits for its look
                self._kick.wait(left)
                self._kick.clear()
                if self._stop.is_set():
                    return
                self.pages.send(self._fuse_ptr, self._serves)
                with self._lock:
                    look, self._look = self._look, False
                left = due - time.monotonic()
                if look or left <= 0:
                    break
            try:
                self._send_queued()
                # A listing made before that scan whose reply reached the
                # kernel after it dropped the folder would be kept from
                # then on: dropped once more.
                self._invalidate_paths(folders)
                folders = set()
                with self._lock:
                    stale, self._stale_paths = self._stale_paths, set()
                    restale, self._restale = self._restale, False
                pending = pending or (self._inotify is not None and self._inotify.changed())
                seen = pending and time.monotonic() - last >= self.RESCAN_SECONDS
                # The first look (for what changed before the store was
                # watched) waits while the daemon answers requests, rather
                # than take the CPU from them (a remount's first listing).
                first_waits = (
                    not self.rescans and not (seen or stale or restale) and time.monotonic() < first_by and busy()
                )
                if first_waits or not (again or seen or stale or restale or time.monotonic() - last >= period):
                    wait = self.LOOK_SECONDS
                    continue
                pending = False
                if restale:
                    self.tree.stale_root_files()
                why = (
                    "a first look"
                    if not self.rescans
                    else "a second look"
                    if again
                    else "a change seen"
                    if seen
                    else "open files released"
                    if stale
                    else "a wrong index entry"
                    if restale
                    else "the timer"
                )
                cpu = time.thread_time()
                snap = self.tree.rescan()
                self.rescans += 1
                again = self._follow(snap)
                # A change reported while this scan ran may be one it missed:
                # looked at again soon (once, so that a store being written to
                # all along is still scanned at most about once a second).
                wait = (
                    self.FOLLOW_UP
                    if wait != self.FOLLOW_UP and self._inotify is not None and self._inotify.changed()
                    else self.LOOK_SECONDS
                )
                again = again or wait == self.FOLLOW_UP
                last, cpu = time.monotonic(), time.thread_time() - cpu
                period = max(self.RESCAN_SECONDS, cpu / self.IDLE_SHARE)
                log.debug("rescanned for %s: %.3f s of CPU; next on the timer in %.0f s", why, cpu, period)
                now = snap.marks
                changed = {d for d in before.keys() | now.keys() if before.get(d) != now.get(d)}
                dropped = self._paths_of(changed, old_snap, snap, owners=(before, now)) if changed else set()
                before = now
                if changed or stale:
                    self._paths.forget()
                if changed:
                    log.info("store changed: %s", ", ".join(sorted(changed)))
                    self._invalidate_paths(dropped)
                    folders = {p for p in dropped if p.strip("/") in snap.dirs}
                    self.tree.views.retain(set(snap.ggufs))
                old_snap = snap
                self._invalidate_paths(stale)
                self._paths.prune(changed | {p.strip("/").rpartition("/")[0] for p in stale}, now)
            except Exception:  # the mount outlives a failed rescan
                log.exception("rescan of %s failed", self.root)

    def _paths_of(self, folders: set[str], *snaps: Snapshot, owners: tuple[dict, dict] | None = None) -> set[str]:
        """The paths to invalidate for changed `folders`: the folders, their
        files (as either snapshot names them) and parents; for a folder on
        disk whose owner, mode and time folders show (`<path>`), the folders
        that mirror it (`Source.owner`) and none of their files (which show
        their blobs' own: a file downloaded into `blobs/` drops no page of a
        model), and where only its time moved (`owners`: the marks before
        and now say so) only those whose time is its (a pull moves the time
        of `blobs/`, not what the folders mirroring it show)."""
        paths = set()
        moved = {d for d in folders if d.startswith("<")}
        if moved:
            source, snap = self.tree.source, snaps[-1]
            before, now = owners or ({}, {})
            # The owners whose time alone moved (marks: owner, group, mode, time).
            timed = {
                d for d in moved if before.get(d) is not None and now.get(d) is not None and before[d][:3] == now[d][:3]
            }
            keys: dict[Path, str] = {}
            for d in snap.dirs:
                owner = source.owner(d, snap.listing)
                key = keys.get(owner)
                if key is None:
                    key = keys[owner] = f"<{os.path.relpath(owner, self.root)}>"
                if key in moved and (key not in timed or source.time_follows_owner(d, snap.listing)):
                    paths.add(f"/{d}")
            folders = folders - moved
        for d in folders:
            names = {MODEL_FILE, MMPROJ_FILE}
            for snap in snaps:
                names |= set(snap.files.get(d, ()))
            paths |= {f"/{d}/{n}" if d else f"/{n}" for n in names} | {f"/{d}"}
            parts = d.split("/")
            paths |= {"/" + "/".join(parts[:i]) for i in range(len(parts))}
        return paths

    def _wrong_index_entry(self, blob: Path) -> None:
        """The index entry of `blob` was wrong (its sizes, or whether it has an
        mmproj.gguf) and is made again (called by the thread that built a
        view): every remembered answer is dropped, the kernel's attributes of
        the folders that show the blob and their files are queued for this
        thread to drop, and models.ini is made again."""
        snap = self.tree.snapshot()
        folders = {name for name, files in snap.files.items() if any(ref.blob == blob for ref in files.values())}
        self._paths.forget()
        with self._lock:
            self._restale = True  # models.ini is made again from what the index says now
        self.invalidate(self._paths_of(folders, snap))

    def _serves(self, opened: OpenFile) -> bool:
        """Whether `opened`'s path serves its view, from an intact blob."""
        kept = self._paths.kept(opened.path)
        return kept is not None and kept[0].view is opened.view and kept[2]

    def _invalidate_paths(self, paths: set[str]) -> None:
        """Drop the kernel's attributes and pages of `paths` (those it knows),
        while the session goes on (`ending`)."""
        for p in sorted(paths, key=len, reverse=True):
            if self._stop.is_set() or not self._fuse_ptr:
                return
            with ending.going() as going:
                if not going:
                    return
                libfuse.invalidate_path(self._fuse_ptr, p)
