"""What each `compatfs` command does with its parsed arguments (`main`
parses them and calls it): mount, umount, llama-args, run, serve, export,
demo-store (`ls` and `inspect` are in `listing`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import PROG
from ..errors import GGUFError
from ..files.statedir import mount_file
from ..sources.base import Source
from ..sources.choose import open_source
from . import CliError, launch
from .launch import MountRequest
from .locate import find_source, model_tree, mount_of


# -- mount / umount -----------------------------------------------------------


def cmd_mount(args) -> int:
    from ..view.catalog import translation_enabled

    found = find_source(args.source, mounts=False)
    if found.why:
        print(f"{PROG}: source {found.path} ({found.why})", file=sys.stderr)
    source = open_source(found.path.absolute())
    request = MountRequest(
        _naming(source, args.options),
        translation_enabled(args.no_translate),
        args.op_cache_mb,
        args.read_ahead_kb,
        args.index,
        args.no_index,
        args.log,
        args.verbose,
        args.quiet,
    )
    return launch.mount(source, Path(args.mountpoint).absolute(), request, args.foreground)


def _naming(source: Source, options: list[str]) -> tuple[str, ...]:
    """The -o options, with `fsname` the source's path unless given: the mount
    table then names the source of the mount (`locate`), as `df` shows it.
    (A path holding a comma cannot be an option's value: such a mount keeps
    the name compatfs.)"""
    if any(item.split("=", 1)[0] == "fsname" for o in options for item in o.split(",")):
        return tuple(options)
    root = str(source.root)
    return (*options, f"fsname={root}") if "," not in root else tuple(options)


def cmd_umount(args) -> int:
    launch.umount(Path(args.mountpoint).absolute())
    return 0


# -- llama-args / run / export ------------------------------------------------------


def _server_args(args):
    from ..router.llama_args import find_model_dir, server_args
    from ..router.models import model_files
    from ..names import MODEL_FILE

    # --mount names the source too when it is a compatfs mount here (not a
    # path only llama-server sees, in a container say).
    mounted = args.mount and mount_of(Path(args.mount))
    tree = model_tree(args.source or (args.mount if mounted else None))
    name, files = model_files(tree, args.model)
    try:
        model_dir = find_model_dir(name, args.mount)
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        summary = tree.views.summary(files[MODEL_FILE].blob)
    except GGUFError:  # a blob that cannot be read: its mount refuses it too
        return server_args(files, model_dir)
    return server_args(files, model_dir, summary.embedding, summary.arch, summary.text is not None)


def cmd_llama_args(args) -> int:
    import shlex

    out = _server_args(args)
    for note in out.notes:
        print(f"# {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"args": out.argv, "not_passed": out.notes}, indent=2))
    elif args.lines:
        print("\n".join(out.argv))
    else:
        print(shlex.join(out.argv))
    return 0


def _llama_server(named: str | None) -> str:
    """The llama-server to run: `--llama-server`, else the one `llama_server.find` finds."""
    from ..router.llama_server import NotFound, find

    try:
        return str(find(named))
    except NotFound as e:
        raise CliError(str(e)) from None


def cmd_run(args) -> int:
    import shlex

    extra = args.extra
    exe = _llama_server(args.llama_server)
    out = _server_args(args)
    for note in out.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    argv = [exe, *out.argv, *extra]
    print(f"{PROG}: exec {shlex.join(argv)}", file=sys.stderr)
    sys.stderr.flush()
    try:
        os.execv(exe, argv)
    except OSError as e:
        raise CliError(f"cannot run {exe}: {e.strerror}") from None


def _serve_mount(mount: str | None) -> Path:
    """The mount `serve` uses: `mount`, else the one compatfs mount there is."""
    from ..files.mounttable import points_of

    if mount:
        mnt = Path(mount).absolute()
        if not mnt.is_dir():
            raise CliError(f"{mnt} is not a folder")
        return mnt
    mounts = points_of("fuse.compatfs")
    if len(mounts) == 1:
        return mounts[0]
    if not mounts:
        raise CliError("no compatfs mount: mount the store (compatfs mount), or name it with --mount")
    raise CliError(f"several compatfs mounts ({', '.join(map(str, mounts))}): choose one with --mount")


def cmd_serve(args) -> int:
    from ..names import PRESET_FILE
    from ..router.preset import render, scan_mount
    from ..router.serve import Router

    mnt = _serve_mount(args.mount)
    if args.print_preset:
        published = mnt / PRESET_FILE
        print(published.read_text() if published.is_file() else render(scan_mount(mnt)), end="")
        return 0
    exe = _llama_server(args.llama_server)
    preset = mount_file("models", mnt, ".ini")
    return Router(mnt, exe, preset, args.host, args.port, args.extra).run()


def cmd_export(args) -> int:
    from .export import export_model
    from ..router.models import model_files

    tree = model_tree(args.source, args.no_translate)
    name, files = model_files(tree, args.model)
    export_model(
        tree.views,
        name,
        files,
        Path(args.directory),
        reflink=args.reflink,
        checksum=not args.no_checksum,
        quiet=args.quiet,
    )
    return 0


def cmd_demo_store(args) -> int:
    from .demo import write_demo_store

    root = write_demo_store(Path(args.directory))
    print(f"{PROG}: demo store written to {root}")
    return 0
