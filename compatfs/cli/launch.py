"""Starting and stopping a mount from the command line: the mountpoint and
FUSE checked first (a dead compatfs mount there cleaned up), the daemon run
attached (`-f`) or started in the background with its log until the mount
is up, and unmounting through fusermount3, fusermount or umount, bounded in
time whatever state the daemon is in (see `umount`)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import PROG
from ..files import mounttable
from ..sources.base import Source
from ..files.statedir import StateDirError, mount_file

UP_WITHIN = 30  # seconds a background daemon has to bring the mount up
ANSWER_WITHIN = 5  # seconds `umount` waits on a mount's daemon before it aborts the connection
FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")


class LaunchError(Exception):
    """The mount cannot be started or stopped; one line for the user."""


@dataclass(frozen=True)
class MountRequest:
    """What `compatfs mount` asks for, as its flags give it."""

    options: tuple[str, ...]  # -o values, each opt[,opt]
    translate: bool
    op_cache_mb: int
    read_ahead_kb: int
    index: str | None
    no_index: bool
    log: str | None
    verbose: int
    quiet: bool = False  # -q: no progress bar

    def index_path(self) -> Path | None:
        """The index file the daemon keeps (None: in memory only)."""
        from ..view.index import default_path

        return None if self.no_index else Path(self.index).absolute() if self.index else default_path()

    def daemon_argv(self, store: Source, mnt: Path) -> list[str]:
        """The attached `compatfs mount -f` the background start runs."""
        cmd = [
            sys.executable,
            "-m",
            "compatfs",
            "mount",
            "-f",
            str(store.root),
            str(mnt),
            "--op-cache-mb",
            str(self.op_cache_mb),
            "--read-ahead-kb",
            str(self.read_ahead_kb),
        ]
        cmd += ["--index", str(Path(self.index).absolute())] if self.index else []
        cmd += ["--no-index"] if self.no_index else []
        cmd += ["-v"] * self.verbose
        cmd += [x for o in self.options for x in ("-o", o)]
        return cmd + ([] if self.translate else ["--no-translate"])


def parse_options(values: tuple[str, ...] | list[str]) -> dict:
    """-o values (`opt`, `opt=value`, comma-separated) as a dict; a bare option is True."""
    opts: dict = {}
    for value in values:
        for item in filter(None, value.split(",")):
            key, eq, val = item.partition("=")
            opts[key] = val if eq else True
    return opts


def mount(store: Source, mnt: Path, request: MountRequest, foreground: bool) -> int:
    """Mount `store` at `mnt`: attached when `foreground` (returns when
    unmounted), else in a background daemon, returning once the mount is up."""
    why = store.refuses_mountpoint(mnt)
    if why:
        raise LaunchError(why)
    _check_mountpoint(mnt)
    _check_fuse()
    options = _mount_options(request)
    if foreground:
        return _serve(store, mnt, request, options)
    return _start(store, mnt, request)


def umount(mnt: Path) -> None:
    """Unmount the mount at `mnt`, waiting at most about `ANSWER_WITHIN`
    seconds on it for each step: a compatfs mount whose daemon is gone is
    unmounted lazily; one whose daemon does not answer (stopped, wedged) has
    its FUSE connection aborted and is detached lazily.  Whether `mnt` is a
    mount, and of what, is read from the mount table; the mount itself is
    only asked with a bounded wait."""
    mnt = Path(os.path.realpath(mnt.parent)) / mnt.name  # resolving it would look up the mount's root
    entry = mounttable.last_at(mnt)
    if entry is None:
        raise LaunchError(f"{mnt} is not mounted")
    state = _answers(mnt, ANSWER_WITHIN)
    if state is False:
        _clean_stale(mnt)
        return
    if state is True:
        done, errors = _unmount_tools(mnt, ["-u"])
        if done:
            return
        if errors:
            raise LaunchError(f"cannot unmount {mnt}: {errors[0]}")
    # No answer within the wait (the daemon is stopped or wedged), or the
    # unmount itself waited on it.
    if entry.fstype != "fuse.compatfs":
        raise LaunchError(
            f"{mnt} does not answer and is not a compatfs mount ({entry.fstype}): "
            f"detach it with `fusermount3 -u -z {mnt}` or `umount -l {mnt}`"
        )
    how = "aborted its FUSE connection and detached it" if _abort(entry) else "detached it"
    done, errors = _unmount_tools(mnt, ["-u"]) if how.startswith("aborted") else (False, [])
    if not done:
        done, errors = _unmount_tools(mnt, ["-u", "-z"])
    if not done:
        raise LaunchError(f"cannot unmount {mnt}: {errors[0] if errors else 'no answer from its daemon'}")
    print(f"{PROG}: the daemon of {mnt} did not answer within {ANSWER_WITHIN} s: {how}", file=sys.stderr)


def _answers(mnt: Path, within: float) -> bool | None:
    """Whether the FUSE daemon at `mnt` answers (statvfs, never answered from
    the kernel's caches): True, False when it is gone ("Transport endpoint
    is not connected"), None when it does not answer within `within`
    seconds (the asking thread is left to the kernel; an aborted connection
    releases it)."""
    result: list[bool] = []

    def ask() -> None:
        try:
            os.statvfs(mnt)
            result.append(True)
        except OSError as e:
            result.append(e.errno not in (errno.ENOTCONN, errno.ECONNABORTED))

    asker = threading.Thread(target=ask, name="compatfs-umount-probe", daemon=True)
    asker.start()
    asker.join(within)
    return result[0] if result else None


def _unmount_tools(mnt: Path, args: list[str]) -> tuple[bool, list[str]]:
    """Unmount with fusermount3, fusermount (with `args`) or umount (with
    `-l` for `-z`), each given `ANSWER_WITHIN` seconds: whether one did, and
    the errors of those that failed (one that ran out of time is none)."""
    errors = []
    lazy = "-z" in args
    for tool in (["fusermount3", *args], ["fusermount", *args], ["umount", *(["-l"] if lazy else [])]):
        if not shutil.which(tool[0]):
            continue
        try:
            res = subprocess.run(tool + [str(mnt)], capture_output=True, text=True, timeout=ANSWER_WITHIN)
        except subprocess.TimeoutExpired:
            continue
        if res.returncode == 0:
            return True, []
        errors.append(res.stderr.strip())
    return False, errors


def _abort(entry: mounttable.Mount) -> bool:
    """Abort the FUSE connection of mount `entry` (/sys/fs/fuse/connections/
    <its device number>/abort): every request waiting on its daemon, and every
    later one, then fails at once.  Whether it was aborted."""
    major, _, minor = entry.device.partition(":")
    try:
        conn = (int(major) << 20) | int(minor)  # the kernel's device number, as fusectl names it
        with open(FUSE_CONNECTIONS / str(conn) / "abort", "w") as f:
            f.write("1")
        return True
    except (OSError, ValueError):
        return False


def _check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise LaunchError(
            "/dev/fuse is missing: load the fuse kernel module (or run the container with --device /dev/fuse)"
        )
    try:
        from ..fuse import libfuse  # noqa: F401  (loading it finds libfuse 3)
    except OSError as e:
        raise LaunchError(f"libfuse 3 not found ({e}): install it, e.g. `apt-get install fuse3`") from None


def _clean_stale(path: Path) -> None:
    """Unmount the dead compatfs endpoint at `path` (lazily if it is busy)."""
    from ..fuse.daemon import lazy_unmount
    from ..files.mounttable import fstype_at

    fstype = fstype_at(path)
    if fstype != "fuse.compatfs":
        raise LaunchError(
            f"{path}: transport endpoint is not connected (a dead {fstype or 'FUSE'} mount, "
            f"not compatfs's): unmount it with `fusermount3 -u {path}`"
        )
    if not lazy_unmount(str(path)):
        raise LaunchError(f"{path}: cannot unmount the dead compatfs mount there")
    print(f"{PROG}: cleaned up the dead mount at {path} (its daemon had gone)", file=sys.stderr)


def _check_mountpoint(path: Path) -> None:
    state = _answers(path, ANSWER_WITHIN)
    if state is False:
        _clean_stale(path)
    elif state is None:
        raise LaunchError(
            f"mountpoint {path} does not answer (a mount there whose daemon is stopped or wedged): "
            f"`{PROG} umount {path}` detaches it"
        )
    if not path.exists():
        raise LaunchError(f"mountpoint {path} does not exist")
    if not path.is_dir():
        raise LaunchError(f"mountpoint {path} is not a directory")
    if os.path.ismount(path):
        raise LaunchError(f"mountpoint {path} is busy: something is already mounted there")


def _mount_options(request: MountRequest) -> dict:
    from ..fuse.daemon import MountError, check_options

    opts = parse_options(request.options)
    try:
        check_options(opts)
    except MountError as e:
        raise LaunchError(str(e)) from None
    return opts


def _serve(store: Source, mnt: Path, request: MountRequest, options: dict) -> int:
    from ..fuse import daemon

    try:
        return daemon.serve(
            store,
            mnt,
            translate=request.translate,
            options=options,
            log_file=request.log,
            verbose=request.verbose,
            index=request.index,
            no_index=request.no_index,
            op_cache_mb=request.op_cache_mb,
            read_ahead_kb=request.read_ahead_kb,
        )
    except daemon.MountError as e:
        raise LaunchError(str(e)) from None


def _open_log(path: Path, safe: bool) -> int:
    """An append descriptor of the log file `path`; `safe`: never through a
    symlink, and only a regular file of ours."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    if safe:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise LaunchError(f"cannot open log file {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if safe and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()):
        os.close(fd)
        raise LaunchError(f"log file {path} is not a regular file of yours")
    return fd


def _log_target(request: MountRequest, mnt: Path) -> tuple[Path | None, int | None]:
    """Where the background daemon's stderr goes: the file asked for, the
    journal when run by systemd (None, None), else a file in the per-user
    state folder."""
    if request.log:
        log_file = Path(request.log).absolute()
        return log_file, _open_log(log_file, safe=False)
    if os.environ.get("JOURNAL_STREAM"):
        return None, None
    try:
        log_file = mount_file("mount", mnt, ".log")
    except StateDirError as e:
        raise LaunchError(f"{e}: not logging there (pass --log FILE)") from None
    return log_file, _open_log(log_file, safe=True)


def _start(store: Source, mnt: Path, request: MountRequest) -> int:
    """Run the daemon in its own session and wait for the mount to come up;
    a daemon that exits first is reported with its log's last lines."""
    log_file, out = _log_target(request, mnt)
    start = os.lseek(out, 0, os.SEEK_END) if out is not None else 0
    try:
        proc = subprocess.Popen(
            request.daemon_argv(store, mnt), stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    finally:
        if out is not None:
            os.close(out)
    where = f"log {log_file}" if log_file else "logging to the journal"
    progress = Progress(store, request) if not request.quiet and sys.stderr.isatty() else None
    deadline = time.monotonic() + UP_WITHIN
    try:
        return _wait_up(store, mnt, proc, log_file, start, where, deadline, progress)
    finally:
        if progress is not None:
            progress.close()


class Progress:
    """A bar on stderr while a mount comes up: of the source's GGUF blobs,
    those the index holds at their current identity (what a first mount of a
    big store spends its time on), read from the daemon's index file."""

    EVERY = 0.5  # seconds between looks at the index

    def __init__(self, store: Source, request: MountRequest):
        from tqdm import tqdm

        self.path = request.index_path()
        self.translate = request.translate
        self.blobs: dict[str, tuple] = {}
        if self.path is not None:
            from ..files.lookup import identity, status

            for blob in dict.fromkeys(p for f in store.scan().folders.values() for p in f.ggufs()):
                try:
                    self.blobs[str(blob)] = identity(status(blob))
                except OSError:
                    continue
        self.bar = tqdm(
            total=len(self.blobs), desc="indexing", unit="blob", leave=False, file=sys.stderr, disable=not self.blobs
        )
        self._next = 0.0

    def poll(self) -> None:
        now = time.monotonic()
        if self.bar.disable or now < self._next:
            return
        self._next = now + self.EVERY
        held = self._held()
        if held is not None and held > self.bar.n:
            self.bar.update(held - self.bar.n)

    def _held(self) -> int | None:
        """How many of the blobs the index file holds at their identity (None:
        it cannot be read now)."""
        import sqlite3
        from ..view.index import STARTUP_VIEWS, translation_version

        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=0.2)
        except sqlite3.Error:
            return None
        try:
            rows = db.execute(STARTUP_VIEWS, (translation_version(), int(self.translate))).fetchall()
        except sqlite3.Error:
            return None
        finally:
            db.close()
        return sum(1 for path, *stamp in rows if self.blobs.get(path) == tuple(stamp[:5]))

    def close(self) -> None:
        self.bar.close()


def _wait_up(
    store: Source,
    mnt: Path,
    proc: subprocess.Popen,
    log_file: Path | None,
    start: int,
    where: str,
    deadline: float,
    progress: Progress | None,
) -> int:
    while time.monotonic() < deadline:
        if progress is not None:
            progress.poll()
        if os.path.ismount(mnt):
            if progress is not None:
                progress.close()
            print(f"{PROG}: mounted {store.root} at {mnt} (pid {proc.pid}, {where})")
            return 0
        if proc.poll() is not None:
            tail: list[str] = []
            if log_file:
                with open(log_file, "rb") as f:
                    f.seek(start)
                    tail = f.read().decode(errors="replace").strip().splitlines()[-3:]
            raise LaunchError(f"mount failed: {' | '.join(tail) or 'the daemon exited'} ({where})")
        time.sleep(0.05)
    proc.terminate()
    raise LaunchError(f"mount of {mnt} did not come up within {UP_WITHIN} s ({where})")
