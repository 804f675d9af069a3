"""`compatfs export`: real files byte-identical to the mounted views, a sha256
per file, nothing under the final name when interrupted, and extents shared
with the blob on a filesystem that can (XFS on a loop device, as root)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest

from compatfs.testing import gemma3, llama
from compatfs.testing.store import add_model

from conftest import needs_fuse
from test_deploy_layers import LICENSE, PARAMS, add_layers

ROOT = Path(__file__).resolve().parent.parent


def export(*args, check=True, **kw):
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", "export", *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        **kw,
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


def sha256sums(stdout: str) -> dict[str, str]:
    """`<hex>  <path>` lines -> {file name: hex}."""
    return {Path(path).name: digest for digest, path in (line.split("  ", 1) for line in stdout.splitlines())}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    root = d / "store"
    m = add_model(root, "gemma3", gemma3.legacy_gemma3_vision(d / "g4.gguf"), tag="4b")
    add_layers(root, m, [(PARAMS, b'{"temperature":1,"top_k":64}'), (LICENSE, b"Gemma Terms of Use\n")])
    add_model(root, "tiny", llama.plain_llama_text(d / "t.gguf"))
    return root


@needs_fuse
def test_export_is_byte_identical_to_the_mount(store, mount_store, tmp_path):
    m = mount_store(store)
    for model, files in (
        ("gemma3:4b", ["license", "mmproj.gguf", "model.gguf", "params.json"]),
        ("tiny", ["model.gguf"]),
    ):
        out = tmp_path / model.replace(":", "_")
        res = export(model, out, "--source", store)
        assert sorted(os.listdir(out)) == files  # no temporary file left
        sums = sha256sums(res.stdout)
        assert sorted(sums) == files
        for f in files:
            mounted = (m / (model if ":" in model else model + ":latest") / f).read_bytes()
            assert (out / f).read_bytes() == mounted, f
            assert sums[f] == hashlib.sha256(mounted).hexdigest()
    # The translated view is a loadable GGUF (gguf-py reads it), not the blob.
    r = gguf.GGUFReader(tmp_path / "gemma3_4b" / "mmproj.gguf")
    assert r.fields["general.architecture"].contents() == "clip"
    # Exporting again replaces the files in place; --no-checksum prints no sums.
    again = export("gemma3:4b", tmp_path / "gemma3_4b", "--source", store, "--no-checksum", "--no-reflink")
    assert again.stdout == "" and "wrote" in again.stderr
    assert (tmp_path / "gemma3_4b" / "model.gguf").read_bytes() == (m / "gemma3:4b/model.gguf").read_bytes()


def test_untranslated_export_is_the_blob(store, tmp_path):
    export("gemma3:4b", tmp_path, "--source", store, "--no-translate")
    manifest = json.loads((store / "manifests/registry.ollama.ai/library/gemma3/4b").read_text())
    blob = store / "blobs" / manifest["layers"][0]["digest"].replace(":", "-")
    assert (tmp_path / "model.gguf").read_bytes() == blob.read_bytes()


def test_errors(store, tmp_path):
    res = export("nosuch:1b", tmp_path, "--source", store, check=False)
    assert res.returncode == 1 and res.stderr.strip() == f"compatfs: error: no model nosuch:1b in {store}"
    # --reflink is all or nothing: here (a filesystem without shared extents, or
    # a translated layout) it refuses, and leaves nothing behind.
    if _fs_type(tmp_path) not in ("xfs", "btrfs"):
        res = export("tiny", tmp_path / "r", "--source", store, "--reflink", check=False)
        assert res.returncode == 1 and "--reflink: cannot share" in res.stderr
        assert os.listdir(tmp_path / "r") == []


def _fs_type(path: Path) -> str:
    res = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return res.stdout.strip()


def _big_store(root: Path, mib: int) -> Path:
    """A store with one model whose blob holds `mib` MiB of tensor data (sparse,
    so cheap to make); its blob is named by a made-up digest (compatfs does not
    hash blobs)."""
    (root / "blobs").mkdir(parents=True)
    blob = root / "blobs" / ("sha256-" + "7" * 64)
    n = mib << 18  # float32 values
    w = gguf.GGUFWriter(str(blob), "llama")
    w.add_block_count(0)
    w.add_tensor_info(
        "token_embd.weight", (n // 1024, 1024), gguf.np.dtype("float32"), n * 4, raw_dtype=gguf.GGMLQuantizationType.F32
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    data_start = -(-blob.stat().st_size // 32) * 32  # GGUF's default alignment
    with open(blob, "r+b") as f:
        f.truncate(data_start + n * 4)
    manifest = root / "manifests/registry.ollama.ai/library/big/latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": "sha256:" + "7" * 64,
                        "size": blob.stat().st_size,
                    }
                ]
            }
        )
    )
    return root


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_export_leaves_no_file_under_the_final_name(tmp_path, sig):
    store = _big_store(tmp_path / "store", 256)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "compatfs", "export", "big", str(out), "--source", str(store), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    partial = []
    while time.monotonic() < deadline and proc.poll() is None:
        partial = [p for p in out.iterdir() if p.name.endswith(".partial") and p.stat().st_size > 0]
        if partial:
            break
        time.sleep(0.005)
    assert partial and proc.poll() is None, "the export finished before it could be interrupted"
    assert partial[0].name.startswith(".model.gguf.")
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert not (out / "model.gguf").exists()
    left = os.listdir(out)
    if sig == signal.SIGTERM:
        assert left == []  # cleaned up
        assert proc.stderr.read().decode().strip() == ""
    else:
        assert all(n.startswith(".model.gguf.") and n.endswith(".partial") for n in left)


def _xfs_ok() -> bool:
    return (
        os.geteuid() == 0
        and bool(shutil.which("mkfs.xfs"))
        and bool(shutil.which("filefrag"))
        and bool(shutil.which("unshare"))
        and os.path.exists("/dev/loop-control")
    )


@pytest.mark.skipif(not _xfs_ok(), reason="needs root, mkfs.xfs (xfsprogs), filefrag and loop devices")
def test_reflink_shares_the_blob_extents_on_xfs(store, tmp_path):
    """On XFS the export of an untranslated view shares every full block with
    the blob; a translated view whose data is shifted is copied, and says so."""
    img = tmp_path / "xfs.img"
    with open(img, "wb") as f:
        f.truncate(320 << 20)
    if subprocess.run(["mkfs.xfs", "-q", str(img)], capture_output=True).returncode != 0:
        pytest.skip("mkfs.xfs failed")
    fs = tmp_path / "xfs"
    fs.mkdir()
    compatfs = f"{sys.executable} -m compatfs export"
    script = f"""
set -e
mount -o loop {img} {fs} || exit 77
cp -r {store} {fs}/store
{compatfs} tiny {fs}/a --source {fs}/store --reflink
echo ===
{compatfs} gemma3:4b {fs}/b --source {fs}/store
echo ===
filefrag -v {fs}/a/model.gguf
"""
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    if res.returncode == 77:
        pytest.skip("cannot mount a loop device here")
    assert res.returncode == 0, res.stderr
    a, _b, frag = res.stdout.split("===\n")
    assert "shared with the blob (reflink)" in res.stderr.splitlines()[0]
    assert "shared" in frag.split("ext:", 1)[1]  # filefrag's extent flags
    assert "not at the blob's offsets" in res.stderr  # the translated gemma3 view
    plain = export("tiny", tmp_path / "plain", "--source", store, "--no-reflink")
    assert sha256sums(a)["model.gguf"] == sha256sums(plain.stdout)["model.gguf"]
