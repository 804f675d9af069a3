"""The daemon's lifecycle: set up what a mount serves (logging, malloc
tuning, the index, the views), mount it with compatfs's options, raise the
kernel's read-ahead once it is up, and unmount cleanly on SIGTERM, SIGINT
and SIGHUP (lazily when files stay open); `serve` is what `compatfs mount -f`
runs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from . import ending, libfuse
from ..files import mounttable
from ..files.libc import tune_malloc
from .operations import CompatFS
from .libfuse import fuse, libfuse_tuple
from ..sources.base import Source
from ..tree import Tree

log = logging.getLogger(__name__)


class MountError(Exception):
    """The mount could not be set up or ended in an error; one line for the user."""


def raise_open_files_limit() -> str:
    """Raise this process's soft limit on open descriptors (RLIMIT_NOFILE) to
    its hard limit: every open file holds its blob's descriptor, so the usual
    soft limit of 1024 runs out before a thousand open files.  Returns the
    line to log."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if hard == resource.RLIM_INFINITY:  # the kernel's ceiling for one process
        try:
            want = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            want = soft
    if want <= soft:
        return f"open files: at most {soft}"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as e:
        return f"open files: at most {soft}, cannot raise it to {want} ({e})"
    return f"open files: at most {want} (raised from {soft})"


def serve(
    store: Source,
    mnt: Path,
    *,
    translate: bool,
    options: dict,
    log_file: str | None,
    verbose: int,
    index: str | None,
    no_index: bool,
    op_cache_mb: int,
    read_ahead_kb: int,
) -> int:
    """Serve `store` at `mnt` in the foreground until unmounted or signalled;
    MountError when the index would be in the store, and (logged) when the mount fails."""
    # Large allocations (parsed and rendered headers, whole op tensors) mapped
    # on their own, so that freeing them returns the memory: glibc otherwise
    # raises that threshold as blocks are freed and keeps them in a heap that
    # only grows over a long-running mount.  Read replies (up to 1 MiB, and the
    # op inputs behind them) stay below the threshold and reuse heap memory: a
    # fresh mapping per reply would fault in every page of it again.  Two
    # arenas keep at most a few MiB free at their tops; what is free inside
    # them (replies of many reads in flight at once) goes back to the system
    # when the last open file closes (`OpenFiles.release`).
    tune_malloc(mmap_threshold=(1 << 20) + (64 << 10), trim_threshold=4 << 20, arenas=2)
    from ..view.opcache import OpCache
    from ..view.catalog import BlobViews

    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler()
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler], format="%(asctime)s compatfs %(levelname)s %(message)s")
    logging.getLogger("compatfs").setLevel(min(level, logging.INFO))  # every module logs under it
    from ..view.index import Index, default_path

    index_path = None if no_index else Path(index).absolute() if index else default_path()
    if index_path is not None and index_path.resolve().is_relative_to(store.root.resolve()):
        raise MountError(f"the index {index_path} would be inside the store {store.root}: compatfs never writes there")
    views = BlobViews(
        translate=translate,
        op_cache=OpCache(op_cache_mb << 20),
        index=Index(index_path, translate),
        workers=os.cpu_count() or 1,
    )
    log.info("%s", raise_open_files_limit())
    log.info(
        "serving %s at %s (translation %s, libfuse %s, %s reads, pid %d)",
        store.root,
        mnt,
        "on" if translate else "off",
        libfuse.libfuse_version(),
        libfuse.READ_REPLIES,
        os.getpid(),
    )
    from .sdnotify import notify_when_mounted

    notify_when_mounted(mnt)  # READY=1 for a systemd Type=notify unit
    tree = Tree(store, views)
    try:
        mount(tree, str(mnt), options=options, read_ahead_kb=read_ahead_kb)
    except MountError as e:
        log.error("%s", e)
        raise
    finally:
        tree.unpublish()  # the mount's models.ini goes with it
        views.close()
    log.info("unmounted %s", mnt)
    return 0


@contextlib.contextmanager
def kept_for_good() -> Iterator[None]:
    """No collection of cyclic garbage while the block runs (the mount's
    start: its first scan makes the tree, and each pass would go over all
    that was made so far); then everything the process holds is left out
    of every later pass (`gc.freeze`): what the mount holds from its start
    lives until unmount, and the passes while it serves (a listing makes
    objects by the thousand) go over what was made since.  A cycle made
    there that is dropped later is never collected: the start makes none,
    nor does a rescan dropping the tree it made (tests/test_no_cyclic_garbage.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


# The kernel keeps attributes and entries this long: the rescan invalidates
# whatever changed within about a second, so a repeat listing is answered by
# the kernel, not by a round trip per file.
ATTR_TIMEOUT = 3600

# Options this layer sets itself (or that mfusepy takes as its own arguments).
RESERVED_OPTIONS = frozenset(
    {"foreground", "nothreads", "raw_fi", "encoding", "errors", "operations", "mountpoint", "use_ino", "rw"}
)

# fuse_main_real's exit codes.
_LIBFUSE_ERRORS = {
    1: "invalid mount options",
    2: "no mountpoint",
    3: "libfuse set-up failed",
    4: "mounting failed",
    5: "cannot daemonize",
    6: "cannot set signal handlers",
    7: "the filesystem loop failed",
    8: "the filesystem loop ended with an error",
}
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def check_options(options: dict) -> None:
    """MountError naming an option the FUSE layer sets itself."""
    bad = sorted(set(options) & RESERVED_OPTIONS)
    if bad:
        hint = " (stay in the foreground with -f)" if "foreground" in bad else ""
        raise MountError(f"option {', '.join('-o ' + b for b in bad)} is set by compatfs itself{hint}")


def lazy_unmount(mountpoint: str) -> bool:
    """`fusermount3 -u`, else `-u -z` (lazily, when busy or its daemon is gone)."""
    for args in (["-u"], ["-u", "-z"]):
        for tool in ("fusermount3", "fusermount"):
            try:
                if subprocess.run([tool, *args, "-q", mountpoint], capture_output=True).returncode == 0:
                    return True
            except FileNotFoundError:
                continue
    return False


def _keep_handler(signum, _handler):
    """Stands in for `signal.signal` in mfusepy while it mounts: mfusepy resets
    SIGINT to SIG_DFL there, and libfuse then installs its own handler, which
    ends the loop only once the main thread notices (and exits with status 8)."""
    return signal.getsignal(signum)


def _exit_loop(fs: CompatFS, mountpoint: str) -> None:
    """End the FUSE loop (libfuse then unmounts) without a request to the
    mount: flag the session, then interrupt the main thread's wait for
    the loop's workers (a signal; its handler is mount()'s, which does
    nothing), so that it sees the flag and ends them."""
    ptr = fs.session
    if ptr:
        ending.ends()  # (libfuse frees its nodes once the loop ends: no path is invalidated from now on)
        libfuse.exit_loop(ptr)
        main = threading.main_thread().ident
        assert main is not None  # the main thread has started
        signal.pthread_kill(main, signal.SIGTERM)
    else:
        lazy_unmount(mountpoint)


def _stop_on_signal(fs: CompatFS, mountpoint: str, wake: int, done: threading.Event) -> None:
    """Wait for SIGTERM/SIGINT/SIGHUP (Python's handler writes its number to
    `wake` from whichever thread it lands on), then unmount; files still open
    after a grace period end with the process."""
    while True:
        sig = os.read(wake, 1)
        if done.is_set() or not sig:
            return
        if sig[0] in _STOP_SIGNALS:
            break
    log.info("%s: unmounting %s", signal.Signals(sig[0]).name, mountpoint)
    _exit_loop(fs, mountpoint)
    if not done.wait(5):
        lazy_unmount(mountpoint)
        log.info("%d file(s) still open at %s: exiting, their readers get ENOTCONN", fs.open_files, mountpoint)
        logging.shutdown()
        os._exit(0)


def set_read_ahead(mountpoint: str, kb: int) -> str:
    """Raise the kernel's read-ahead for the mount (its backing device's
    `read_ahead_kb`): FUSE negotiates 128 KiB, so a cold sequential read
    crosses into the daemon every 128 KiB; with more, every 1 MiB (libfuse's
    largest request).  Root may write it; others keep the kernel's value.
    The device comes from /proc/self/mountinfo: the daemon never stats its own
    mount (a request to itself that a kill would leave unanswered forever).
    The INIT reply allows `kb` as its max_readahead (`CompatFS.init_with_config`),
    else the kernel, taking that reply, would lower a value written before it
    to the 128 KiB it offered.  Returns the line to log."""
    device = _mount_device(mountpoint)
    if device is None:
        return f"read-ahead not set: {mountpoint} is not in /proc/self/mountinfo"
    knob = Path(f"/sys/class/bdi/{device}/read_ahead_kb")
    try:
        knob.write_text(f"{kb}\n")
        return f"read-ahead {kb} KiB ({knob})"
    except OSError as e:
        try:
            current = knob.read_text().strip()
        except OSError:
            current = "?"
        return f"read-ahead left at the kernel's {current} KiB: cannot write {knob} ({e.strerror})"


def _mount_device(mountpoint: str, tries: int = 20) -> str | None:
    """`major:minor` of the mount at `mountpoint` (the last one mounted there)."""
    want = Path(os.path.abspath(mountpoint))
    for _ in range(tries):
        found = mounttable.last_at(want)
        if found is not None:
            return found.device
        time.sleep(0.05)
    return None


def mount(tree: Tree, mountpoint: str, options: dict | None = None, read_ahead_kb: int = 0) -> None:
    """Serve `tree` at `mountpoint` in the foreground until unmounted or
    signalled (blocks; call from the main thread); MountError when libfuse fails."""
    options = dict(options or {})
    check_options(options)
    opts = {
        "ro": True,
        "fsname": "compatfs",
        "subtype": "compatfs",
        "use_ino": True,
        "attr_timeout": ATTR_TIMEOUT,
        "entry_timeout": ATTR_TIMEOUT,
        "default_permissions": True,
    }
    if os.getuid() == 0:
        opts["allow_other"] = True
    if libfuse_tuple() >= (3, 12) and "max_threads" not in options:
        # Readers waiting for an op computation hold a thread each: 64, not
        # libfuse's 10, so listings and other files never queue behind them.
        opts["max_threads"] = 64
        # As many may idle: a worker, once started, runs until unmount (and
        # keeps its Python thread state, `libfuse.keep_thread_state`), as by
        # libfuse 3.12+'s default, which it rejects with a message when this
        # is left unset ("Ignoring invalid max threads value 4294967295").
        opts["max_idle_threads"] = opts["max_threads"]
    opts.update(options)
    on_start = (lambda: log.info(set_read_ahead(mountpoint, read_ahead_kb))) if read_ahead_kb else None
    with kept_for_good():
        fs = CompatFS(
            tree,
            mountpoint,
            read_ahead_kb,
            on_start,
            keep_thread_states=libfuse.workers_stay(opts),
            background=libfuse.background(opts),
        )
    done = threading.Event()
    wake, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    # A Python handler (not SIG_DFL) keeps libfuse from installing its own;
    # the wakeup fd carries the signal to the thread that unmounts.
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old_handlers = {s: signal.signal(s, lambda *_: None) for s in _STOP_SIGNALS}
    watcher = threading.Thread(
        target=_stop_on_signal, args=(fs, mountpoint, wake, done), name="compatfs-signals", daemon=True
    )
    watcher.start()
    saved, fuse.signal = fuse.signal, _keep_handler
    try:
        libfuse.FUSE(fs, mountpoint, foreground=True, raw_fi=True, **opts)
    except RuntimeError as e:
        code = e.args[0] if e.args else 0
        raise MountError(f"libfuse: {_LIBFUSE_ERRORS.get(code, f'error {code}')} (see its message above)") from None
    finally:
        fuse.signal = saved
        done.set()
        os.write(wake_w, b"\0")
        watcher.join(timeout=5)
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        os.close(wake)
        os.close(wake_w)
