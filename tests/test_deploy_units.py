"""The files under contrib/: systemd units (checked by systemd-analyze where
present, and for what they must name), sd_notify readiness of `compatfs mount
-f`, the Dockerfile, the compose file and the Kubernetes manifests."""

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import needs_fuse

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = ROOT / "contrib"
MNT = "/mnt/compat"
STORE = "/usr/share/ollama/.ollama/models"


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values]}} (keys may repeat)."""
    out: dict = {}
    section = None
    for line in (CONTRIB / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def test_compatfs_unit_mounts_and_is_ready_only_when_mounted():
    u = unit("compatfs.service")
    svc = u["Service"]
    assert svc["Type"] == ["notify"]
    start = shlex.split(svc["ExecStart"][0])
    assert Path(start[0]).name == "compatfs" and start[1:3] == ["mount", "-f"]
    assert start[3:5] == [STORE, MNT] and "allow_other" in start
    assert any(MNT in s and "fusermount3 -u -z" in s for s in svc["ExecStartPre"])  # stale mount cleared
    assert "llama-server.service" in u["Unit"]["Before"][0].split()
    assert STORE in u["Unit"]["RequiresMountsFor"][0]
    # Nothing that would give the service a mount namespace of its own.
    for key in ("PrivateTmp", "ProtectHome", "ProtectSystem", "PrivateMounts", "ReadOnlyPaths", "TemporaryFileSystem"):
        assert key not in svc, key
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.parametrize("name", ["llama-server.service", "llama-server@.service"])
def test_llama_server_units_need_the_mount(name):
    u = unit(name)
    assert u["Unit"]["Requires"] == ["compatfs.service"]
    assert "compatfs.service" in u["Unit"]["After"][0].split()
    start = shlex.split(u["Service"]["ExecStart"][0])
    if name == "llama-server.service":
        assert Path(start[0]).name == "llama-server"
        assert start[start.index("-m") + 1] == f"{MNT}/gemma3:4b/model.gguf"
        assert start[start.index("--mmproj") + 1] == f"{MNT}/gemma3:4b/mmproj.gguf"
    else:
        assert Path(start[0]).name == "compatfs" and start[1:3] == ["run", "%I"]
        assert start[start.index("--mount") + 1] == MNT and start[start.index("--source") + 1] == STORE


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    """The units as systemd reads them; compatfs and llama-server (not
    installed system-wide here) are stand-ins at the units' paths' names."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for exe in ("compatfs", "llama-server"):
        (bin_dir / exe).write_text("#!/bin/sh\n")
        (bin_dir / exe).chmod(0o755)
    names = ["compatfs.service", "llama-server.service", "llama-server@.service"]
    for name in names:
        text = (CONTRIB / "systemd" / name).read_text().replace("/usr/local/bin/", f"{bin_dir}/")
        (tmp_path / name).write_text(text)
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def test_fstab_example_lines_parse_as_the_helper_takes_them():
    from compatfs.cli import fstab

    lines = [
        line.lstrip("#").split()
        for line in (CONTRIB / "systemd" / "fstab.example").read_text().splitlines()
        if line.lstrip("#").startswith(("/", "compatfs#"))
    ]
    assert {f[2] for f in lines} == {"fuse.compatfs", "compatfs", "fuse"}
    for source, target, _type, opts, *_ in lines:
        cmd, warnings = fstab.mount_argv([source, target, "-o", opts])
        assert cmd == ["mount", STORE, MNT, "-o", "ro,allow_other"] and not warnings


@needs_fuse
def test_mount_f_notifies_systemd_once_mounted(tmp_path):
    store = tmp_path / "store"
    add_model(store, "gemma3", gemma3.legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sock_path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(30)
    proc = subprocess.Popen(
        [sys.executable, "-m", "compatfs", "mount", "-f", str(store), str(mnt)],
        env={**os.environ, "NOTIFY_SOCKET": str(sock_path)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        msg = sock.recv(4096).decode()
        assert os.path.ismount(mnt)  # READY=1 only once mounted
        assert "READY=1" in msg.splitlines() and f"MAINPID={proc.pid}" in msg.splitlines()
        assert (mnt / "gemma3:1b" / "model.gguf").read_bytes()[:4] == b"GGUF"
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        proc.wait(timeout=20)
        sock.close()


# -- containers -------------------------------------------------------------------


def test_dockerfile():
    lines = [line.strip() for line in (CONTRIB / "docker" / "Dockerfile").read_text().splitlines()]
    base = next(line for line in lines if line.startswith("FROM "))
    assert base.startswith("FROM python:") and base.endswith("-slim")
    assert any("apt-get install" in line and "fuse3" in line for line in lines)
    entry = next(line for line in lines if line.startswith("ENTRYPOINT "))
    assert json.loads(entry.split(" ", 1)[1]) == ["compatfs", "mount", "-f"]
    # Everything `pip install .` needs is copied in.
    copied = {p for line in lines if line.startswith("COPY ") for p in line.split()[1:-1]}
    assert {"pyproject.toml", "README.md", "compatfs", "handlers"} <= copied
    assert all((ROOT / p).exists() for p in copied)


def test_compose_sidecar_and_llama_server():
    doc = yaml.safe_load((CONTRIB / "docker" / "compose.yaml").read_text())
    side, server = doc["services"]["compatfs"], doc["services"]["llama-server"]
    assert "/dev/fuse:/dev/fuse" in side["devices"] and "SYS_ADMIN" in side["cap_add"]
    assert side["build"]["dockerfile"] == "contrib/docker/Dockerfile"
    assert (CONTRIB / "docker" / side["build"]["context"] / side["build"]["dockerfile"]).is_file()
    shared = next(v for v in side["volumes"] if v.get("target") == "/mnt/compat")
    assert shared["type"] == "bind" and shared["bind"]["propagation"] == "rshared"
    store = next(v for v in side["volumes"] if v["type"] == "volume")
    assert store["read_only"] and store["source"] in doc["volumes"]
    assert side["command"][:2] == [store["target"] + "/models", "/mnt/compat"]
    assert server["image"].startswith("ghcr.io/ggml-org/llama.cpp:server")
    seen = next(v for v in server["volumes"] if v["source"] == shared["source"])
    assert seen["bind"]["propagation"] in ("rslave", "rshared") and seen["read_only"]
    args = server["command"]
    assert args[args.index("-m") + 1].startswith(seen["target"] + "/") and args[args.index("-m") + 1].endswith(
        "/model.gguf"
    )
    assert server["depends_on"]["compatfs"]["condition"] == "service_healthy"
    assert side["pid"] == "host"  # its callers' pids (and so their groups) are known to it


def _containers(pod_spec: dict) -> dict:
    return {c["name"]: c for c in pod_spec.get("initContainers", []) + pod_spec["containers"]}


def _mount(container: dict, volume: str) -> dict:
    return next(m for m in container["volumeMounts"] if m["name"] == volume)


def test_kubernetes_pod_with_a_sidecar():
    (pod,) = yaml.safe_load_all((CONTRIB / "kubernetes" / "pod.yaml").read_text())
    assert pod["kind"] == "Pod"
    cs = _containers(pod["spec"])
    side, server = cs["compatfs"], cs["llama-server"]
    assert side["securityContext"]["privileged"] is True
    assert _mount(side, "compat")["mountPropagation"] == "Bidirectional"
    assert _mount(server, "compat")["mountPropagation"] == "HostToContainer"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "persistentVolumeClaim" in volumes[_mount(side, "ollama")["name"]]
    assert side["args"][:2] == [_mount(side, "ollama")["mountPath"] + "/models", _mount(side, "compat")["mountPath"]]
    model = server["args"][server["args"].index("-m") + 1]
    assert model.startswith(_mount(server, "compat")["mountPath"] + "/") and model.endswith("/model.gguf")
    assert side.get("restartPolicy") == "Always" and "startupProbe" in side  # native sidecar, ready once mounted
    assert pod["spec"]["shareProcessNamespace"] is True  # llama-server's pid (and so its groups) known to it


def test_kubernetes_daemonset_mounts_on_the_node():
    docs = {d["kind"]: d for d in yaml.safe_load_all((CONTRIB / "kubernetes" / "daemonset.yaml").read_text())}
    ds = docs["DaemonSet"]["spec"]["template"]["spec"]
    side = _containers(ds)["compatfs"]
    assert side["securityContext"]["privileged"] is True and ds["hostPID"] is True
    assert _mount(side, "compat")["mountPropagation"] == "Bidirectional"
    vols = {v["name"]: v for v in ds["volumes"]}
    assert vols["compat"]["hostPath"]["path"] == MNT and vols["ollama"]["hostPath"]["path"] == STORE
    dep = docs["Deployment"]["spec"]["template"]["spec"]
    server = _containers(dep)["llama-server"]
    assert _mount(server, "compat")["mountPropagation"] == "HostToContainer"
    assert {v["name"]: v for v in dep["volumes"]}["compat"]["hostPath"]["path"] == MNT
