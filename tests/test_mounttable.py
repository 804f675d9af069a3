"""The one mount-table parser: /proc/self/mountinfo lines, octal escapes undone."""

from pathlib import Path

from compatfs.files import mounttable

SAMPLE = (
    rb"22 1 0:21 / /proc rw,nosuid - proc proc rw"
    b"\n"
    rb"40 22 0:40 / /mnt/with\040space\134x rw,nosuid shared:5 - fuse.compatfs /srv/my\040store ro"
    b"\n"
    rb"41 22 0:41 / /mnt/tab\011here rw master:1 - fuse.compatfs compatfs ro"
    b"\n"
    b"garbage line\n"
    rb"42 22 0:42 / /mnt/with\040space\134x rw - tmpfs tmpfs rw"
    b"\n"
)


def test_fields_and_escapes(tmp_path):
    f = tmp_path / "mountinfo"
    f.write_bytes(SAMPLE)
    ms = mounttable.mounts(f)
    assert [m.point for m in ms] == [
        Path("/proc"),
        Path("/mnt/with space\\x"),
        Path("/mnt/tab\there"),
        Path("/mnt/with space\\x"),
    ]
    assert ms[1].source == "/srv/my store" and ms[1].fstype == "fuse.compatfs" and ms[1].device == "0:40"
    assert mounttable.points_of("fuse.compatfs", f) == [Path("/mnt/with space\\x"), Path("/mnt/tab\there")]
    # The last mount over a point is the one seen there.
    assert mounttable.fstype_at(Path("/mnt/with space\\x"), f) == "tmpfs"
    assert mounttable.fstype_at(Path("/nowhere"), f) is None
    assert mounttable.mounts(tmp_path / "absent") == []


def test_this_process_sees_proc():
    assert mounttable.fstype_at(Path("/proc")) == "proc"
