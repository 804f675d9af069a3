"""The `compatfs` command: mount, umount, ls, inspect, llama-args, run, serve, export, demo-store."""

from __future__ import annotations

import argparse
import os
import sys

from .. import PROG
from ..errors import GGUFError
from ..view.index import IndexPathError
from .launch import LaunchError
from ..view.opcache import DEFAULT_MB
from ..sources.base import SourceError
from ..files.statedir import StateDirError
from . import CliError
from .commands import cmd_demo_store, cmd_export, cmd_llama_args, cmd_mount, cmd_run, cmd_serve, cmd_umount
from .listing import cmd_inspect, cmd_ls
from ..files.lookup import KEEP_OUT_ENV


# -- entry point ------------------------------------------------------------------


def _version() -> str:
    from .. import __version__

    try:
        from ..fuse.libfuse import libfuse_version

        fuse = f"libfuse {libfuse_version()}"
    except OSError as e:
        fuse = f"libfuse 3 not found: {e}"
    return f"{PROG} {__version__} ({fuse})"


class _Version(argparse.Action):
    """--version: compatfs's version and the libfuse it runs on (found only when asked)."""

    def __init__(self, option_strings, dest, **_kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the version and the libfuse it runs on")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


SOURCE_HELP = (
    "an Ollama store, a folder of GGUF files, or a compatfs mountpoint (the source mounted there); "
    "default: the compatfs mount there is, else $OLLAMA_MODELS, ~/.ollama/models, the demo store "
    "scripts/mount.sh writes"
)
SERVER_HELP = (
    "the llama-server to run (default: llama-server on PATH, else the compatfs[serve] extra's, "
    "$LLAMA_CPP_DIR/build/bin's, scripts/e2e's build)"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Present the models of an Ollama store, or of a folder of GGUF files, as llama.cpp-compatible GGUF files "
            "(read-only FUSE): <model>/model.gguf and, where the model has one, <model>/mmproj.gguf."
        ),
        epilog="In /etc/fstab (type compatfs or fuse.compatfs) mount(8) runs mount.compatfs, or mount.fuse3 "
        "runs `compatfs SOURCE DIR -o OPTIONS`; see `mount.compatfs --help`.",
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("mount", help="mount a store (returns once mounted; -f stays attached)")
    m.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="an Ollama store, or a folder of GGUF files (default: $OLLAMA_MODELS, else ~/.ollama/models, "
        "else the demo store scripts/mount.sh writes)",
    )
    m.add_argument("mountpoint", metavar="MOUNTPOINT")
    m.add_argument("-f", "--foreground", action="store_true", help="stay attached (logging to stderr unless --log)")
    m.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="opt[,opt]",
        help="FUSE mount options, e.g. -o allow_other,attr_timeout=600",
    )
    m.add_argument(
        "--op-cache-mb",
        type=int,
        default=DEFAULT_MB,
        metavar="N",
        help=f"keep up to N MiB of tensors computed whole (default {DEFAULT_MB})",
    )
    m.add_argument(
        "--read-ahead-kb",
        type=int,
        default=2048,
        metavar="N",
        help="the kernel's read-ahead for the mount, as root (default 2048; 0: the kernel's 128)",
    )
    m.add_argument(
        "--index",
        metavar="FILE",
        help="the persistent index of view sizes (default $XDG_CACHE_HOME/compatfs/index.sqlite3)",
    )
    m.add_argument("--no-index", action="store_true", help="keep the index in memory only")
    m.add_argument(
        "--no-translate", action="store_true", help="serve every blob unchanged (also: OLLAMA_LLAMA_CPP_COMPAT=0)"
    )
    m.add_argument(
        "--log",
        metavar="FILE",
        help="log file (default: stderr with -f or under systemd, else "
        "$XDG_STATE_HOME/compatfs/, i.e. ~/.local/state/compatfs/)",
    )
    m.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    m.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar while the mount comes up (shown only on a terminal: the store's GGUF "
        "blobs the index holds)",
    )
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount a compatfs mount (also cleans up after a daemon that was killed)")
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.set_defaults(func=cmd_umount)

    ls = sub.add_parser(
        "ls",
        help="list every model: the files it shows, the handlers that claim it, which of its "
        "Modelfile layers are applied and how (what is not, and why), whether stock "
        "llama.cpp loads it, or why it is left out",
    )
    ls.add_argument("source", nargs="?", metavar="SOURCE", help=SOURCE_HELP)
    ls.add_argument("--no-translate", action="store_true", help="as a mount with --no-translate shows it")
    ls.add_argument("--json", action="store_true", help="as JSON")
    ls.set_defaults(func=cmd_ls)

    i = sub.add_parser("inspect", help="show the translation of a model, blob or GGUF file")
    i.add_argument(
        "target",
        metavar="MODEL|BLOB-DIGEST|FILE.gguf",
        help="MODEL (as ollama names it), BLOB-DIGEST (sha256-<hex>) or FILE.gguf",
    )
    i.add_argument("--clip", action="store_true", help="the mmproj.gguf view instead of model.gguf")
    i.add_argument("--source", metavar="SOURCE", help=SOURCE_HELP)
    i.add_argument("--json", action="store_true", help="as JSON")
    i.set_defaults(func=cmd_inspect)

    la = sub.add_parser(
        "llama-args",
        help="print the llama-server arguments for a model: its files, adapters and params layer",
        description="Print llama-server's -m, --mmproj and --lora (its adapters) for MODEL's mounted "
        "files, and the manifest's params (num_ctx, temperature, stop, ...) as "
        "llama-server flags. What is not passed (an option without a llama-server "
        "equivalent, an adapter llama.cpp would refuse, a value bounded) is listed on "
        "stderr.",
    )
    _model_args(la)
    la.add_argument("--json", action="store_true", help="as JSON: the arguments and what is not passed")
    la.add_argument("--lines", action="store_true", help="one argument per line (for mapfile/readarray)")
    la.set_defaults(func=cmd_llama_args)

    r = sub.add_parser(
        "run",
        help="exec llama-server on a model with the arguments llama-args prints",
        usage="compatfs run MODEL [--source SOURCE] [--mount MOUNTPOINT] [--llama-server PATH] [-- EXTRA ...]",
        description="Exec llama-server on MODEL's mounted files with the arguments `compatfs "
        "llama-args` prints, then EXTRA (which override them: -- --port 8080).",
    )
    _model_args(r)
    r.add_argument("--llama-server", metavar="PATH", help=SERVER_HELP)
    r.set_defaults(func=cmd_run)

    sv = sub.add_parser(
        "serve",
        help="run llama-server's router over a mount: every model by its Ollama name",
        usage="compatfs serve [--mount MOUNTPOINT] [--llama-server PATH] [--host HOST] "
        "[--port PORT] [--print-preset] [-- EXTRA ...]",
        description="Run stock llama-server in router mode with a preset of every model folder "
        "of the mount (the mount's own models.ini, which follows the store; for a "
        "mount without one, one written from the mount): each model is requested by "
        'its Ollama name ("model": "gemma3:4b") and started on first use, with '
        "its params layer's options and its adapters; its sampling defaults and chat "
        "template are in its model.gguf. "
        "EXTRA goes to llama-server and overrides every model's own "
        "settings (-- --models-max 2 -t 8).",
    )
    sv.add_argument("--mount", metavar="MOUNTPOINT", help="the compatfs mount (default: the one there is)")
    sv.add_argument("--llama-server", metavar="PATH", help=SERVER_HELP)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    sv.add_argument(
        "--print-preset",
        action="store_true",
        help="print the preset (the mount's models.ini, for llama-server --models-preset FILE) and stop",
    )
    sv.set_defaults(func=cmd_serve)

    e = sub.add_parser(
        "export",
        help="write a model's files to a directory as real files (no FUSE needed)",
        description="Write MODEL's files (model.gguf, mmproj.gguf, adapter.gguf, params.json, template, "
        "system, license) into DIRECTORY, byte-identical to the mounted ones, "
        "and print each file's sha256. Each file is written under a temporary "
        "name and renamed when complete.",
    )
    e.add_argument("model", metavar="MODEL", help="MODEL as ollama names it (gemma3:4b, hf.co/org/repo:tag)")
    e.add_argument("directory", metavar="DIR", help="where to write (created if missing)")
    e.add_argument("--source", metavar="SOURCE", help=SOURCE_HELP)
    e.add_argument(
        "--reflink",
        dest="reflink",
        action="store_const",
        const="always",
        default="auto",
        help="share all tensor data read from the blobs with them (btrfs, XFS), or fail; by default "
        "data is shared where the filesystem and the file's layout allow and copied elsewhere",
    )
    e.add_argument("--no-reflink", dest="reflink", action="store_const", const="never", help="always copy")
    e.add_argument(
        "--no-checksum", action="store_true", help="skip the sha256 (data shared by reflink is then not read)"
    )
    e.add_argument(
        "--no-translate", action="store_true", help="export the blobs unchanged (also: OLLAMA_LLAMA_CPP_COMPAT=0)"
    )
    e.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="nothing on stderr: no progress bar (shown only on a terminal) and no line per file written",
    )
    e.set_defaults(func=cmd_export)

    d = sub.add_parser("demo-store", help="write a small store of tiny legacy Ollama models")
    d.add_argument("directory", metavar="DIR")
    d.set_defaults(func=cmd_demo_store)
    return p


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="MODEL as ollama names it (gemma3:4b, hf.co/org/repo:tag)")
    p.add_argument("--source", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument(
        "--mount",
        metavar="MOUNTPOINT",
        help="where llama-server sees the mount (default: the compatfs mount that shows MODEL; "
        "a mount that does not answer within 2 s is left out)",
    )


MOUNT_HELPER_USAGE = """\
usage: mount.compatfs SOURCE DIR [-sfnv] [-o OPTIONS]

Mount the Ollama store (or folder of GGUF files) SOURCE at DIR, as
`compatfs mount SOURCE DIR` does: mount(8) runs this for /etc/fstab entries
of type compatfs (mount.fuse3 runs `compatfs SOURCE DIR -o OPTIONS` for type
fuse.compatfs), e.g.

  /usr/share/ollama/.ollama/models  /mnt/compat  compatfs  ro,allow_other,nofail  0 0

  -o OPTIONS  comma-separated: FUSE's (allow_other, uid=, gid=, umask=,
              attr_timeout=, fsname=, ...) and compatfs's own: op_cache_mb=N,
              read_ahead_kb=N, index=FILE, no_index, no_translate, log=FILE,
              verbose. Options mount(8) or systemd act on (noauto, user,
              _netdev, nofail, x-systemd.*, ...) are accepted and ignored;
              any other is an error. The mount is read-only (rw is ignored).
  -s          sloppy: an unknown option is a warning, not an error
  -f          fake: check the options, mount nothing
  -n, -v      accepted (no mtab is written; -v is mount(8)'s)

See docs/deploy.md for fstab, systemd and containers."""


def mount_helper(argv: list[str] | None = None) -> int:
    """Entry point of `mount.compatfs SOURCE DIR [-sfnv] [-o OPTIONS]` (mount(8)
    and /etc/fstab), and of mount.fuse3's `compatfs SOURCE DIR -o OPTIONS`:
    the `compatfs mount` call they mean, run by `main`."""
    from . import fstab

    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        try:
            print(MOUNT_HELPER_USAGE, flush=True)
        except BrokenPipeError:
            return _closed_pipe()
        return 0
    try:
        cmd, warnings = fstab.mount_argv(argv)
    except fstab.OptionError as e:
        print(f"{fstab.PROG}: error: {e}", file=sys.stderr)
        return 1
    for w in warnings:
        print(f"{fstab.PROG}: {w}", file=sys.stderr)
    return 0 if cmd is None else main(cmd)


def main(argv: list[str] | None = None) -> int:
    from .fstab import is_helper_call

    argv = sys.argv[1:] if argv is None else list(argv)
    if is_helper_call(argv):  # mount.fuse3's `compatfs SOURCE DIR -o OPTIONS` (fstab)
        return mount_helper(argv)
    extra = []
    if argv[:1] in (["run"], ["serve"]) and "--" in argv:  # llama-server's own arguments, passed on as they are
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    try:
        args = build_parser().parse_args(argv)  # --help and --version print here
    except BrokenPipeError:
        return _closed_pipe()
    args.extra = extra
    kept = os.environ.get(KEEP_OUT_ENV)  # `_open` adds the mounts of the source read
    try:
        return args.func(args)
    except (CliError, LaunchError, SourceError, GGUFError, IndexPathError, StateDirError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()
    finally:  # as it was, for a caller that runs commands in-process (the tests)
        if kept is None:
            os.environ.pop(KEEP_OUT_ENV, None)
        else:
            os.environ[KEEP_OUT_ENV] = kept


def _closed_pipe() -> int:
    """The reader of stdout went away (`compatfs ls | head -1`): stop quietly,
    as a tool killed by SIGPIPE does (status 141), with stdout pointed at
    /dev/null so that Python's own flush at exit finds no pipe to fail on."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13
