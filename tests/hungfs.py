"""A FUSE filesystem whose lookups hang: its root lists `file`, and looking
`file` up (getattr) sleeps for an hour.  Run in its own process:
`python hungfs.py MOUNTPOINT` (foreground; abort its connection to end it)."""

import errno
import os
import stat
import sys
import time

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy as fuse  # noqa: E402


class Hung(fuse.Operations):
    def getattr(self, path, fh=None):
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path == "/file":
            time.sleep(3600)
        raise fuse.FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", "file"]


if __name__ == "__main__":
    fuse.FUSE(Hung(), sys.argv[1], foreground=True, nothreads=False, allow_other=True, ro=True)
