"""`mount.compatfs`: compatfs as mount(8) and /etc/fstab call a filesystem.

mount(8) runs `mount.<type> SOURCE DIR [-sfnv] [-o OPTIONS]`.  Three fstab
forms reach here:

    /usr/share/ollama/.ollama/models  /mnt/compat  compatfs       ro,allow_other  0 0
    /usr/share/ollama/.ollama/models  /mnt/compat  fuse.compatfs  ro,allow_other  0 0
    compatfs#/usr/share/ollama/.ollama/models  /mnt/compat  fuse  ro,allow_other  0 0

The first runs `/sbin/mount.compatfs`; the other two run mount.fuse3, which
runs `compatfs SOURCE DIR -o OPTIONS` from PATH (see `is_helper_call`).  This
module turns either call into the `compatfs mount` arguments it means
(`mount_argv`); `compatfs.cli.main.mount_helper` runs them.

Options: those mount(8) and mount.fuse3 act on themselves (`noauto`,
`user`, `_netdev`, `nofail`, `x-systemd.*`, ...) are ignored here; kernel
mount flags and FUSE options (`allow_other`, `uid=`, `gid=`, `umask=`,
`attr_timeout=`, ...) go to FUSE; compatfs's own are `op_cache_mb=N`,
`read_ahead_kb=N`, `index=FILE`, `no_index`, `no_translate`, `log=FILE` and
`verbose`.  Anything else is an error naming
it (with `-s`, sloppy, a warning).  The mount is always read-only: `rw` is
ignored.
"""

from __future__ import annotations

from typing import TypedDict

PROG = "mount.compatfs"

# Acted on by mount(8), mount.fuse3 or systemd before a helper runs (or
# meaningless for a read-only FUSE mount): accepted and ignored.
IGNORED = {
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "rw",
    "sw",
    "nosymfollow",
    "loud",
    "silent",
    "mand",
    "nomand",
    "iversion",
    "noiversion",
}
IGNORED_PREFIXES = (
    "x-",
    "comment=",
    "setuid=",
    "drop_privileges",
    "context=",
    "fscontext=",
    "defcontext=",
    "rootcontext=",
)

# Passed to FUSE: kernel mount flags, and libfuse 3's mount and high-level options.
FUSE_FLAGS = {
    "ro",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "diratime",
    "nodiratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "sync",
    "async",
    "dirsync",
    "allow_other",
    "allow_root",
    "auto_unmount",
    "default_permissions",
    "kernel_cache",
    "auto_cache",
    "noauto_cache",
}
FUSE_VALUES = {
    "uid",
    "gid",
    "umask",
    "attr_timeout",
    "entry_timeout",
    "negative_timeout",
    "ac_attr_timeout",
    "max_read",
    "fsname",
    "subtype",
}

# compatfs's own, as `compatfs mount` flags.
OWN_VALUES = {"op_cache_mb": "--op-cache-mb", "log": "--log", "read_ahead_kb": "--read-ahead-kb", "index": "--index"}
OWN_FLAGS = {"no_translate": "--no-translate", "verbose": "-v", "no_index": "--no-index"}


class OptionError(ValueError):
    """Options this helper does not know (one line)."""


def split_options(values: list[str], sloppy: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(FUSE options, `compatfs mount` arguments, warnings) for mount(8) `-o` values."""
    fuse, own, unknown = [], [], []
    for value in values:
        for item in filter(None, (x.strip() for x in value.split(","))):
            key, eq, val = item.partition("=")
            if item in IGNORED or item.startswith(IGNORED_PREFIXES):
                continue
            if (key in FUSE_FLAGS and not eq) or (key in FUSE_VALUES and eq and val):
                fuse.append(item)
            elif key in OWN_VALUES and eq and val:
                own += [OWN_VALUES[key], val]
            elif key in OWN_FLAGS and not eq:
                own.append(OWN_FLAGS[key])
            else:
                unknown.append(item)
    if unknown and not sloppy:
        raise OptionError(f"unknown mount option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    warnings = [f"ignoring unknown mount options: {', '.join(unknown)}"] if unknown else []
    return fuse, own, warnings


class HelperArgs(TypedDict):
    """mount(8)'s helper arguments, as `parse_argv` reads them."""

    positional: list[str]  # SOURCE DIR
    options: list[str]  # each -o value
    sloppy: bool  # -s
    fake: bool  # -f
    verbose: bool  # -v


def parse_argv(argv: list[str]) -> HelperArgs:
    """mount(8)'s helper arguments: SOURCE DIR and -s -f -n -v -o OPTS -t TYPE -N NS,
    in any order, with short flags combined (`-sv`)."""
    out: HelperArgs = {"positional": [], "options": [], "sloppy": False, "fake": False, "verbose": False}
    it = iter(argv)
    for arg in it:
        if arg == "-o" or arg == "-t" or arg == "-N":
            val = next(it, None)
            if val is None:
                raise OptionError(f"{arg} needs a value")
            if arg == "-o":
                out["options"].append(val)
        elif arg.startswith("-o") and len(arg) > 2:
            out["options"].append(arg[2:])
        elif arg.startswith("-") and len(arg) > 1 and set(arg[1:]) <= set("sfnvwr"):
            out["sloppy"] |= "s" in arg
            out["fake"] |= "f" in arg
            out["verbose"] |= "v" in arg
        elif arg.startswith("-"):
            raise OptionError(f"unknown argument {arg}")
        else:
            out["positional"].append(arg)
    if len(out["positional"]) != 2:
        raise OptionError(f"usage: {PROG} SOURCE DIR [-sfnv] [-o OPTIONS]")
    return out


def mount_argv(argv: list[str]) -> tuple[list[str] | None, list[str]]:
    """The `compatfs` arguments for a helper call (None for a fake mount, -f),
    and warnings to print."""
    a = parse_argv(argv)
    source, mountpoint = a["positional"]
    if "#" in source:  # compatfs#/path, the old fuse fstab form
        source = source.split("#", 1)[1]
    fuse, own, warnings = split_options(a["options"], a["sloppy"])
    if a["fake"]:
        return None, warnings
    cmd = ["mount", source, mountpoint, *own]
    if fuse:
        cmd += ["-o", ",".join(fuse)]
    return cmd, warnings


def is_helper_call(argv: list[str]) -> bool:
    """Whether `compatfs ARGV` is mount.fuse3's call `compatfs SOURCE DIR -o ...`
    (a source path, which no subcommand name looks like)."""
    return len(argv) >= 2 and not argv[0].startswith("-") and ("/" in argv[0] or "#" in argv[0])
