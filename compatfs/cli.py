"""The `compatfs` command: mount, umount, ls, inspect, demo-store."""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .gguf_values import GGUFError
from .opcache import DEFAULT_MB
from .store import Store, StoreError, default_source

PROG = "compatfs"


class CliError(Exception):
    """One clear line for the user; exit status 1."""


# -- mount / umount -----------------------------------------------------------

def _parse_options(values: list[str]) -> dict:
    opts: dict = {}
    for value in values:
        for item in filter(None, value.split(",")):
            key, eq, val = item.partition("=")
            opts[key] = val if eq else True
    return opts


def _check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise CliError("/dev/fuse is missing: load the fuse kernel module (or run the container with --device /dev/fuse)")
    try:
        import mfusepy  # noqa: F401  (loading it finds libfuse)
    except OSError as e:
        raise CliError(f"libfuse not found ({e}): install it, e.g. `apt-get install fuse3`") from None


def _check_mountpoint(path: Path) -> None:
    if not path.exists():
        raise CliError(f"mountpoint {path} does not exist")
    if not path.is_dir():
        raise CliError(f"mountpoint {path} is not a directory")
    if os.path.ismount(path):
        raise CliError(f"mountpoint {path} is busy: something is already mounted there")


def _log_path(mountpoint: Path) -> Path:
    tag = str(mountpoint.resolve()).strip("/").replace("/", "_") or "root"
    return Path(tempfile.gettempdir()) / f"compatfs-{tag}.log"


def cmd_mount(args) -> int:
    source = Path(args.source).expanduser() if args.source else default_source()
    store = Store(source.absolute())
    mnt = Path(args.mountpoint).absolute()
    _check_mountpoint(mnt)
    _check_fuse()
    from .views import translation_enabled
    translate = translation_enabled(args.no_translate)
    if args.foreground:
        return _serve(store, mnt, args, translate)

    log_file = Path(args.log) if args.log else _log_path(mnt)
    cmd = [sys.executable, "-m", "compatfs", "mount", "-f", str(store.root), str(mnt),
           "--op-cache-mb", str(args.op_cache_mb), "--log", str(log_file)]
    cmd += ["--index", str(Path(args.index).absolute())] if args.index else []
    cmd += ["--no-index"] if args.no_index else []
    cmd += ["-v"] * args.verbose
    cmd += [x for o in args.options for x in ("-o", o)]
    if not translate:
        cmd.append("--no-translate")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.ismount(mnt):
            print(f"{PROG}: mounted {store.root} at {mnt} (pid {proc.pid}, log {log_file})")
            return 0
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace").strip().splitlines()[-5:]
            raise CliError(f"mount failed: {' | '.join(tail) or 'the daemon exited'}")
        time.sleep(0.05)
    proc.terminate()
    raise CliError(f"mount of {mnt} did not come up within 30 s (log {log_file})")


def _serve(store: Store, mnt: Path, args, translate: bool) -> int:
    from . import fusefs
    from .opcache import OpCache
    from .tree import Tree
    from .views import BlobViews
    handlers = [logging.StreamHandler()] if not args.log else [logging.FileHandler(args.log)]
    level = logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, handlers=handlers, format="%(asctime)s compatfs %(levelname)s %(message)s")
    logging.getLogger("compatfs").setLevel(min(level, logging.INFO))
    from .index import Index, default_path
    index_path = None if args.no_index else Path(args.index).absolute() if args.index else default_path()
    if index_path is not None and index_path.resolve().is_relative_to(store.root.resolve()):
        raise CliError(f"the index {index_path} would be inside the store {store.root}: compatfs never writes there")
    views = BlobViews(translate=translate, op_cache=OpCache(args.op_cache_mb << 20),
                      index=Index(index_path, translate), workers=os.cpu_count() or 1)
    logging.getLogger("compatfs").info("serving %s at %s (translation %s)", store.root, mnt,
                                       "on" if translate else "off")
    fusefs.mount(Tree(store, views), str(mnt), foreground=True, options=_parse_options(args.options))
    return 0


def cmd_umount(args) -> int:
    mnt = Path(args.mountpoint)
    if not os.path.ismount(mnt):
        raise CliError(f"{mnt} is not mounted")
    errors = []
    for tool in (["fusermount3", "-u"], ["fusermount", "-u"], ["umount"]):
        if shutil.which(tool[0]):
            res = subprocess.run(tool + [str(mnt)], capture_output=True, text=True)
            if res.returncode == 0:
                return 0
            errors.append(res.stderr.strip())
    raise CliError(f"cannot unmount {mnt}: {errors[0] if errors else 'no fusermount or umount found'}")


# -- ls / inspect ---------------------------------------------------------------

def cmd_ls(args) -> int:
    from .gguf_values import GGUFError
    from .tree import Tree
    from .views import BlobViews, translation_enabled
    store = Store(Path(args.source).expanduser() if args.source else default_source())
    views = BlobViews(translate=translation_enabled(args.no_translate))
    tree = Tree(store, views)
    snap = tree.snapshot()
    rows = []
    for name in sorted(snap.model_dirs):
        listing = tree.lookup(name)
        d = snap.model_dirs[name]
        try:
            summary = views.summary(d.model_blob)
            clip_summary = views.summary(d.projector_blob) if d.projector_blob else summary
            error = summary.error or clip_summary.error
            if error:
                raise GGUFError(error)
            clip = clip_summary.clip or ("-" if "mmproj.gguf" not in listing else "unchanged")
            rows.append({"name": name, "files": listing, "text": summary.text or "-", "clip": clip})
        except GGUFError as e:
            rows.append({"name": name, "files": listing, "error": str(e)})
    left_out = [{"name": n, "reason": r} for n, r in sorted(snap.scan.skipped.items())]
    if args.json:
        print(json.dumps({"source": str(store.root), "models": rows, "left_out": left_out}, indent=2))
        return 0
    width = max([len(r["name"]) for r in rows + left_out] + [4])
    print(f"{'NAME':<{width}}  {'FILES':<23}  {'TEXT':<10}  CLIP")
    for r in rows:
        files = " ".join(r["files"])
        if "error" in r:
            print(f"{r['name']:<{width}}  {files:<23}  error: {r['error']}")
        else:
            print(f"{r['name']:<{width}}  {files:<23}  {r['text']:<10}  {r['clip']}")
    for r in left_out:
        print(f"{r['name']:<{width}}  left out: {r['reason']}")
    return 0


def cmd_inspect(args) -> int:
    from .report import describe, format_report, resolve_target
    path = resolve_target(args.target, args.source, args.clip)
    report = describe(path, "mmproj.gguf" if args.clip else "model.gguf")
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def cmd_demo_store(args) -> int:
    from .demo import write_demo_store
    root = write_demo_store(Path(args.directory))
    print(f"{PROG}: demo store written to {root}")
    return 0


# -- entry point ------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Present the models of an Ollama store as llama.cpp-compatible GGUF files "
        "(read-only FUSE): <model>/model.gguf and, where the model has one, <model>/mmproj.gguf."))
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("mount", help="mount a store (returns once mounted; -f stays attached)")
    m.add_argument("source", nargs="?", help="the Ollama store (default $OLLAMA_MODELS, else ~/.ollama/models)")
    m.add_argument("mountpoint")
    m.add_argument("-f", "--foreground", action="store_true", help="stay attached (logging to stderr unless --log)")
    m.add_argument("-o", dest="options", action="append", default=[], metavar="opt[,opt]",
                   help="FUSE mount options, e.g. -o allow_other,attr_timeout=600")
    m.add_argument("--op-cache-mb", type=int, default=DEFAULT_MB, metavar="N",
                   help=f"keep up to N MiB of tensors computed whole (default {DEFAULT_MB})")
    m.add_argument("--index", metavar="FILE",
                   help="the persistent index of view sizes (default $XDG_CACHE_HOME/compatfs/index.sqlite3)")
    m.add_argument("--no-index", action="store_true", help="keep the index in memory only")
    m.add_argument("--no-translate", action="store_true",
                   help="serve every blob unchanged (also: OLLAMA_LLAMA_CPP_COMPAT=0)")
    m.add_argument("--log", help="log file of the background daemon (default: a file in the temp folder)")
    m.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount a compatfs mount")
    u.add_argument("mountpoint")
    u.set_defaults(func=cmd_umount)

    ls = sub.add_parser("ls", help="list every model: the files it shows, the handler that claims it, or why it is left out")
    ls.add_argument("source", nargs="?", help="the Ollama store (default as for mount)")
    ls.add_argument("--no-translate", action="store_true", help="as the mount would show it untranslated")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)

    i = sub.add_parser("inspect", help="show the translation of a model, blob or GGUF file")
    i.add_argument("target", help="MODEL (as ollama names it), BLOB-DIGEST (sha256-<hex>) or FILE.gguf")
    i.add_argument("--clip", action="store_true", help="the mmproj.gguf view instead of model.gguf")
    i.add_argument("--source", help="the Ollama store for MODEL or DIGEST (default as for mount)")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)

    d = sub.add_parser("demo-store", help="write a small store of tiny legacy Ollama models")
    d.add_argument("directory")
    d.set_defaults(func=cmd_demo_store)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, StoreError, GGUFError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
