"""`compatfs serve`: stock llama-server in router mode over a compatfs mount,
as `ollama serve` is for Ollama: every model folder of the mount is a model
of the router (`--models-preset`, see `preset`), requested by its Ollama
name and started on the first request that names it.

The preset is the mount's own `models.ini` when its root shows one (the
mount keeps it up to date); else one written here from a walk of the mount.
Every `POLL` seconds the mount's model folders are walked and the preset
read: when either changed the router is told to read the preset again
(`GET /models?reload=1`), and a model whose model.gguf or params layer
changed is unloaded, so that its next request starts it with its new files
and settings.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from .preset import Entry, render, scan_mount, section
from ..names import MODEL_FILE, PRESET_FILE

log = logging.getLogger(__name__)

POLL = 1.0


def _stamp(entry: Entry) -> tuple:
    """What a running model must restart for: its model.gguf or its params
    layer (the mount gives a file a new inode number when its bytes change)."""
    out = []
    for path in (entry.folder / MODEL_FILE, entry.params):
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append(st and (st.st_ino, st.st_size, st.st_mtime_ns))
    return (entry.mmproj, *out)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _ask(base: str, method: str, path: str, body: dict | None = None) -> dict | None:
    req = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        log.debug("%s %s: %s", method, path, e)
        return None


class Router:
    def __init__(self, mnt: Path, exe: str, own_preset: Path, host: str, port: int, extra: list[str]):
        self.mnt, self.exe = mnt, exe
        published = mnt / PRESET_FILE
        self.published = published.is_file()
        self.preset_file = published if self.published else own_preset
        self.base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
        self.argv = [exe, "--models-preset", str(self.preset_file), "--host", host, "--port", str(port), *extra]
        self.entries: dict[str, tuple] = {}
        self.text: str | None = None

    def refresh(self) -> tuple[list[str], bool]:
        """Look at the mount again (and rewrite the preset made here if it
        changed): the models whose section or files changed, and whether the
        preset did."""
        entries = scan_mount(self.mnt)
        sections = [section(e) for e in entries]
        now = {e.name: (_stamp(e), s.options) for e, s in zip(entries, sections, strict=True)}
        changed = sorted(n for n in now.keys() | self.entries.keys() if now.get(n) != self.entries.get(n))
        if self.published:
            text = self.preset_file.read_text()
        else:
            text = render(entries, sections)
            if text != self.text or not self.preset_file.exists():
                _write(self.preset_file, text)
        reload = text != self.text
        self.entries, self.text = now, text
        return changed, reload

    def run(self) -> int:
        self.refresh()
        mine = "the mount's own" if self.published else "written by compatfs serve"
        n = len(self.entries)
        print(
            f"compatfs: serving {n} model{'s' if n != 1 else ''} of {self.mnt} at {self.base} "
            f"(preset {self.preset_file}, {mine})",
            file=sys.stderr,
        )
        print(
            f"compatfs: running llama-server's router (stopped with compatfs serve): {shlex.join(self.argv)}",
            file=sys.stderr,
            flush=True,
        )
        proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
        stop = []

        def forward(signum, _frame):
            stop.append(signum)
            proc.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        while True:
            try:
                return proc.wait(timeout=POLL)
            except subprocess.TimeoutExpired:
                pass
            if stop:
                continue
            try:
                changed, reload = self.refresh()
            except OSError as e:  # the mount went away: the router keeps what it has
                log.warning("cannot read %s: %s", self.mnt, e)
                continue
            if changed or reload:
                print(
                    f"compatfs: the mount changed ({', '.join(changed) or PRESET_FILE}): preset reloaded",
                    file=sys.stderr,
                )
                _ask(self.base, "GET", "/models?reload=1")
                for name in changed:
                    _ask(self.base, "POST", "/models/unload", {"model": name})
