"""The README's five-minute tour runs as written, against the demo store.

The commands are read from the README's tour block (the ```sh block after
`<!-- tour -->`), so this fails when the README and the command line
disagree.  They run, from the checkout as a newcomer runs them, in a mount
namespace of their own (the tour mounts at /mnt/compat, and `compatfs ls`
without SOURCE takes the compatfs mount there is: other compatfs mounts on
the machine are detached inside that namespace, and only there), with HOME
a temporary folder (the mount's log and index, the export's `~`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, needs_fuse

README = ROOT / "README.md"
DEMO_MANIFEST = ROOT / ".cache/demo-store/manifests/hf.co/demo/tiny-llama/Q8_0"

needs_root_namespaces = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1) for a mount namespace of its own"
)


def tour_commands(text: str) -> list[str]:
    """The command lines of the README's tour block (comments after `#` kept:
    the shell ignores them)."""
    after = text.split("<!-- tour -->", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", after, re.S)
    assert block is not None, "no ```sh block after <!-- tour --> in the README"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


# Inside the tour's own mount namespace: no other compatfs mount there, and
# whatever the tour leaves mounted is unmounted at the end.
PRELUDE = """\
.venv/bin/python -c 'from compatfs.files.mounttable import points_of
for p in points_of("fuse.compatfs"): print(p)' | while read -r point; do umount -l "$point"; done
trap '.venv/bin/compatfs umount /mnt/compat >/dev/null 2>&1 || true' EXIT
"""

# scripts/mount.sh run again while mounted says so and changes nothing.
AGAIN = f"""
scripts/mount.sh /mnt/compat demo >/dev/null
before=$(stat -c %y {DEMO_MANIFEST})
echo "AGAIN: $(scripts/mount.sh /mnt/compat demo 2>&1 | head -1)"
[ "$before" = "$(stat -c %y {DEMO_MANIFEST})" ] && echo "DEMO STORE UNCHANGED"
"""


def test_the_tour_block_is_what_a_newcomer_runs():
    commands = tour_commands(README.read_text())
    assert commands[0].startswith("scripts/mount.sh") and commands[-1].startswith("compatfs umount")
    used = {c.split()[1] for c in commands if c.startswith("compatfs ")}
    assert {"ls", "inspect", "llama-args", "export", "serve", "umount"} <= used


@needs_fuse
@needs_root_namespaces
def test_the_readme_tour_runs_as_written(tmp_path):
    commands = tour_commands(README.read_text())
    script = tmp_path / "tour.sh"
    script.write_text(PRELUDE + "\n".join(commands) + "\n" + AGAIN)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OLLAMA_MODELS", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-e", "-x", str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, f"the tour stopped:\n{res.stderr[-3000:]}"
    out = res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    for shown in (
        "models.ini",
        "gemma3-vision:4b",
        "GGUF",
        "hf.co/demo/tiny-llama:Q8_0",
        "as is + sampling defaults",
        "general.sampling.temp",
        "--embeddings",
        "alias = ",
        "--lora /mnt/compat/hf.co/demo/tiny-llama:Q8_0/adapter.gguf",
        str(home / "gemma3-1b" / "model.gguf"),
    ):
        assert shown in out, (shown, out[-3000:])
    assert "AGAIN: mount: /mnt/compat is already a compatfs mount of" in out and "nothing changed" in out
    assert "DEMO STORE UNCHANGED" in out
    assert (home / "gemma3-1b" / "model.gguf").stat().st_size > 0
