"""How the loop's workers take requests from the FUSE device.

A caller listing folder after folder (`ls -l` of every model folder) sends
its requests one at a time, each right after the last answer.  When every
idle worker waits in read, each request wakes one of them; on a virtual
machine an idle core's wake-up costs more than answering the request.  So
(`_accel.polling_io`):

- a request answered in C with nothing to wait for (root opening a folder,
  where `_accel.opendir_gate` answers it; a folder closed, where the
  filesystem has no releasedir; a node forgotten) starts listing mode: the
  worker that read it has the turn, answers it, and then polls the device
  for up to `SPIN_NS` before it waits in read, so a caller's next request
  is taken by a thread still running;
- in listing mode only the worker with the turn reads the device, the
  others wait for it: the kernel has no sleeping reader to wake;
- another listing's request (a lookup, a folder's attributes or entries,
  answered in Python) keeps the turn with its reader too, under a watch:
  one whose answer takes longer than `WATCH_NS` ends listing mode, so it
  holds up no other request longer than that; any other request (a read,
  an open) ends listing mode, and every idle worker waits in read again.

A worker that ended while it had the turn would leave the others waiting for
good: this is done only where the loop's workers run until it ends
(`libfuse.workers_stay`).  Where they may end, compatfs._accel is not
built, or libfuse's session is not laid out as expected, every idle worker
waits in read, as libfuse has it.
"""

from __future__ import annotations

from ..translate import accel
from . import libfuse

SPIN_NS = 50_000  # the reader polls this long after a request it answered in C, at most
WATCH_NS = 1_000_000  # a listing's request answered in Python keeps the turn this long, at most


def poll_after_listings(ptr: int, mountpoint: str, operations, workers_stay: bool) -> str:
    """Have session `ptr`'s workers take requests as the module says, for
    the filesystem `operations` (mfusepy's rule: a `releasedir` that is None
    or marked `libfuse_ignore` is not handed to libfuse), where they run
    until the loop ends (`workers_stay`); call while no request but INIT is
    answered.  Returns the line to log."""
    if accel.native is None:
        return "every idle worker waits for a request (compatfs._accel not built)"
    if not workers_stay:
        return "every idle worker waits for a request (the loop may end idle workers)"
    releasedir = getattr(operations, "releasedir", None)
    try:
        io = accel.native.polling_io(
            SPIN_NS, WATCH_NS, releasedir is None or getattr(releasedir, "libfuse_ignore", False)
        )
    except ValueError:
        return "every idle worker waits for a request (another mount in this process polls)"
    except OSError as e:
        return f"every idle worker waits for a request (no watch on the turns: {e})"
    if not libfuse.use_io(ptr, mountpoint, io):
        return (
            f"every idle worker waits for a request (libfuse {libfuse.libfuse_version()}'s session is not as expected)"
        )
    return (
        f"listings take turns, polling up to {SPIN_NS // 1000} us after a request answered in C,"
        f" keeping the turn up to {WATCH_NS // 1000} us for one answered in Python"
    )


def polled() -> int:
    """The requests a polling worker found so far (0 without compatfs._accel)."""
    return accel.native.polled() if accel.native is not None else 0
