"""A do-nothing mfusepy filesystem shaped like a store listing (N folders of
one `model.gguf` each, attributes from a dict): what listing it costs in
Python FUSE round trips alone, the floor under compatfs's listing figures.

    python listing_floor.py MOUNTPOINT N [FUSE options as -o k=v,...]
"""

import os
import stat
import sys

if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy as fuse  # noqa: E402


class Floor(fuse.Operations):
    use_ns = True

    def __init__(self, n: int):
        self.names = [f"model{i:03d}:latest" for i in range(n)]
        self.known = set(self.names)

    def getattr(self, path, fh=None):
        parts = path.strip("/").split("/") if path != "/" else []
        if len(parts) == 0 or (len(parts) == 1 and parts[0] in self.known):
            return {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2, "st_ino": hash(path) & 0xFFFFFFF | 2}
        if len(parts) == 2 and parts[0] in self.known and parts[1] == "model.gguf":
            return {
                "st_mode": stat.S_IFREG | 0o444,
                "st_nlink": 1,
                "st_size": 11 << 20,
                "st_ino": hash(path) & 0xFFFFFFF | 2,
            }
        raise fuse.FuseOSError(2)

    def readdir(self, path, fh):
        dot = [(".", {"st_mode": stat.S_IFDIR, "st_ino": 2}, 0), ("..", {"st_mode": stat.S_IFDIR, "st_ino": 2}, 0)]
        if path == "/":
            return dot + [
                (n, {"st_mode": stat.S_IFDIR, "st_ino": hash("/" + n) & 0xFFFFFFF | 2}, 0) for n in self.names
            ]
        return dot + [
            ("model.gguf", {"st_mode": stat.S_IFREG, "st_ino": hash(path + "/model.gguf") & 0xFFFFFFF | 2}, 0)
        ]


def main() -> None:
    mnt, n = sys.argv[1], int(sys.argv[2])
    opts = dict(kv.split("=", 1) for arg in sys.argv[3:] if arg != "-o" for kv in arg.split(","))
    fuse.FUSE(Floor(n), mnt, foreground=True, ro=True, use_ino=True, max_idle_threads=10, **opts)


if __name__ == "__main__":
    main()
