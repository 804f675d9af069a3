"""A permission refusal is EACCES naming the file, never a verdict on its
bytes (a GGUFError) nor EIO: for a caller that may not search a folder on
the way, one that may not read the file, and an open through the mount."""

import errno
import os

import pytest

from compatfs.errors import GGUFError
from compatfs.files.access import Caller
from compatfs.files.blobfile import BlobFile
from compatfs.fuse import libfuse

from test_transient_faults import _open, mounted  # noqa: F401  (the fixture)

NOBODY = Caller(65534, 65534, os.getpid())


@pytest.mark.parametrize("denial", ["folder", "file"])
def test_a_refusal_is_eacces_naming_the_file(open_tmp, denial):
    folder = open_tmp / "blobs"
    folder.mkdir()
    blob = folder / "sha256-00"
    blob.write_bytes(b"GGUF")
    if denial == "file":
        blob.chmod(0o600)
    else:
        folder.chmod(0o700)
    with pytest.raises(PermissionError) as e:
        BlobFile(blob, caller=NOBODY)
    assert e.value.errno == errno.EACCES
    assert not isinstance(e.value, GGUFError)
    assert str(folder if denial == "folder" else blob) in str(e.value)
    assert "may not" in str(e.value)


def test_a_denied_open_through_the_mount_is_eacces(mounted, monkeypatch):  # noqa: F811
    os.chmod(mounted.store, 0o700)
    monkeypatch.setattr(libfuse, "caller", lambda: NOBODY)
    with pytest.raises(OSError) as e:
        _open(mounted.fs)
    assert e.value.errno == errno.EACCES
