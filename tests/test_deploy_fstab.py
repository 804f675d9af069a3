"""/etc/fstab and mount(8): mount.compatfs's option handling, and real mounts
of the three fstab forms and of `mount -t fuse.compatfs|compatfs` through mount(8), in a private mount namespace whose
/usr/local/bin and /usr/sbin show this checkout's compatfs and mount.compatfs
(as root with unshare; skipped otherwise)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compatfs.cli import fstab
from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import fuse_available

BIN = Path(sys.executable).parent


def test_options_go_where_they_belong():
    fuse, own, warnings = fstab.split_options(
        [
            "ro,allow_other,_netdev,noauto,user,nofail,defaults,x-systemd.automount,comment=x",
            "uid=1000,gid=1000,umask=0022,attr_timeout=600,nodev,nosuid,rw",
            "op_cache_mb=512,no_translate,log=/var/log/compatfs.log",
        ]
    )
    assert fuse == ["ro", "allow_other", "uid=1000", "gid=1000", "umask=0022", "attr_timeout=600", "nodev", "nosuid"]
    assert own == ["--op-cache-mb", "512", "--no-translate", "--log", "/var/log/compatfs.log"]
    assert warnings == []


def test_unknown_options_are_one_error_naming_them():
    with pytest.raises(fstab.OptionError, match=r"^unknown mount options: bogus, uid, cache=yes$"):
        fstab.split_options(["ro,bogus,uid,cache=yes,allow_other"])
    fuse, _, warnings = fstab.split_options(["ro,bogus"], sloppy=True)
    assert fuse == ["ro"] and warnings == ["ignoring unknown mount options: bogus"]


def test_helper_arguments_as_mount_and_mount_fuse3_pass_them():
    cmd, _ = fstab.mount_argv(["/srv/ollama", "/mnt/compat", "-o", "ro,allow_other,_netdev", "-n", "-v"])
    assert cmd == ["mount", "/srv/ollama", "/mnt/compat", "-o", "ro,allow_other"]
    cmd, _ = fstab.mount_argv(["compatfs#/srv/ollama", "/mnt/compat", "-o", "rw,dev,suid", "-t", "compatfs"])
    assert cmd == ["mount", "/srv/ollama", "/mnt/compat", "-o", "dev,suid"]
    cmd, _ = fstab.mount_argv(["/srv/ollama", "/mnt/compat", "-sf", "-o", "whatever"])
    assert cmd is None  # -f: mount(8)'s fake mount
    with pytest.raises(fstab.OptionError, match="usage"):
        fstab.mount_argv(["/srv/ollama"])
    # mount.fuse3 runs `compatfs SOURCE DIR -o ...`; subcommands are never taken for that.
    assert fstab.is_helper_call(["/srv/ollama", "/mnt/compat", "-o", "ro"])
    assert fstab.is_helper_call(["compatfs#/srv/ollama", "/mnt/compat"])
    assert not any(fstab.is_helper_call([c, "/mnt/compat"]) for c in ("mount", "ls", "export"))


def test_unknown_option_from_the_command_line(tmp_path):
    res = subprocess.run(
        [BIN / "mount.compatfs", tmp_path, tmp_path, "-o", "ro,frobnicate"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1
    assert res.stderr.strip() == "mount.compatfs: error: unknown mount option: frobnicate"
    res = subprocess.run(
        [BIN / "compatfs", f"{tmp_path}/", tmp_path, "-o", "ro,frobnicate"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1 and "frobnicate" in res.stderr


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not fuse_available() or not shutil.which("mount.fuse3"):
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare, FUSE and mount.fuse3")
def test_the_three_fstab_forms_through_mount8(tmp_path):
    store = tmp_path / "store"
    add_model(store, "gemma3", gemma3.legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    t = tmp_path
    (t / "fstab").write_text(
        f"{store} {t}/m1 fuse.compatfs ro,allow_other,_netdev,noauto,uid=1234,gid=99 0 0\n"
        f"compatfs#{store} {t}/m2 fuse ro,noauto,nofail,x-systemd.automount 0 0\n"
        f"{store} {t}/m3 compatfs ro,noauto,user,op_cache_mb=64 0 0\n"
        f"{store} {t}/m4 compatfs ro,noauto,cache=always 0 0\n"
    )
    script = f"""
set -u
mkdir -p {t}/m1 {t}/m2 {t}/m3 {t}/m4 {t}/m5 {t}/m6 {t}/bin {t}/sbin {t}/orig
ln -s {BIN}/compatfs {t}/bin/compatfs
mount --bind /usr/sbin {t}/orig
cp -as {t}/orig/. {t}/sbin/
ln -sf {BIN}/mount.compatfs {t}/sbin/mount.compatfs
mount --bind {t}/bin /usr/local/bin
mount --bind {t}/sbin /usr/sbin
trap 'for m in m1 m2 m3 m4 m5 m6; do fusermount3 -u {t}/$m 2>/dev/null; done' EXIT
for m in m1 m2 m3; do mount -T {t}/fstab {t}/$m || echo "FAILED $m"; done
mount -t fuse.compatfs -o ro,allow_other {store} {t}/m5 || echo "FAILED m5"
mount -t compatfs -o ro {store} {t}/m6 || echo "FAILED m6"
echo ===
mount -T {t}/fstab {t}/m4 2>&1 && echo "MOUNTED m4"
echo ===
grep ' {t}/m' /proc/self/mounts
echo ===
stat -c '%u %g' {t}/m1/gemma3:1b/model.gguf
for m in m1 m2 m3 m5 m6; do sha256sum {t}/$m/gemma3:1b/model.gguf; done
"""
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        cwd="/",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    failed, m4, mounts, files = res.stdout.split("===\n")
    assert "FAILED" not in failed and failed.count("compatfs: mounted") == 5, res.stdout + res.stderr
    assert "MOUNTED" not in m4 and "unknown mount option: cache=always" in m4
    types = {line.split()[1]: line.split()[2:4] for line in mounts.splitlines()}
    assert {m: t_[0] for m, t_ in types.items()} == {f"{t}/m{i}": "fuse.compatfs" for i in (1, 2, 3, 5, 6)}
    assert all(o[1].startswith("ro,") for o in types.values())
    assert "nosuid" in types[f"{t}/m3"][1] and "nodev" in types[f"{t}/m3"][1]  # `user` implies them
    owner, *sums = files.strip().splitlines()
    assert owner == "1234 99"
    digests = {line.split()[0] for line in sums}
    assert len(sums) == 5 and len(digests) == 1
    # Nothing is left mounted in this namespace.
    assert not any(os.path.ismount(t / f"m{i}") for i in range(1, 7))
