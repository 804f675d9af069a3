"""A model's name reaches the mount's listings and models.ini only where
every caller who may list the folder they mirror could list the folders the
name is read from in the store: a model whose manifest folder is 0700 is
left out for everyone (every caller sees the same listings, as the kernel
caches them), and shown again once its folder is opened.  Through a real
root mount (allow_other), uid 65534 as the attacker."""

from __future__ import annotations

import os
import subprocess

import pytest

from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import Mount, needs_fuse, wait_until
from test_router import SERVING

pytestmark = [needs_fuse, pytest.mark.skipif(os.getuid() != 0, reason="needs root (allow_other, another user)")]


def ls_as_nobody(path) -> list[str]:
    res = subprocess.run(
        ["ls", "-a", str(path)], user=65534, group=65534, extra_groups=[], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_a_private_models_name_is_in_no_listing(open_tmp):
    root = open_tmp / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    secret = add_model(root, "secret", blob, tag="1b")
    add_model(root, "open", blob, tag="1b")
    add_model(root, "hidden", blob, host="hf.co", namespace="someone", tag="q4")
    unread = add_model(root, "unread", blob, tag="1b")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    secret.parent.chmod(0o700)
    unread.chmod(0o600)  # its folder listed, its layers not readable
    (root / "manifests" / "hf.co" / "someone").chmod(0o711)  # may be passed, not listed
    m = Mount(root, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    try:
        wait_until(lambda: (m / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
        for listing in (ls_as_nobody(m.path), os.listdir(m.path)):
            assert "open:1b" in listing and "hf.co" not in listing, listing
            assert "secret:1b" not in listing and "unread:1b" not in listing, listing
        ini = (m / "models.ini").read_text()
        assert "open@1b" in ini and "secret" not in ini and "someone" not in ini and "unread" not in ini, ini
        assert not os.path.exists(m / "secret:1b")
        secret.parent.chmod(0o755)
        wait_until(lambda: "secret:1b" in ls_as_nobody(m.path), 5, what="the model listed once its folder opens")
        assert m.alive
    finally:
        m.close()


def test_a_pull_decides_only_the_new_name_and_a_shared_folder_opened_again_shows_all(open_tmp, monkeypatch):
    """A pull moves the shared folders' times, never what they grant: the
    names already decided are not walked or decided again.  A shared folder
    closed hides every name below it; opened again, shows them all again."""
    import compatfs.tree
    from compatfs.sources.choose import open_source
    from compatfs.tree import HiddenNames, Tree
    from compatfs.view.catalog import BlobViews

    root = open_tmp / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    for i in range(5):
        add_model(root, f"m{i}", blob, tag="1b")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    walks: list = []
    decisions: list = []
    real_walk, real_decide = HiddenNames._walk, compatfs.tree.everyone_who_may
    monkeypatch.setattr(HiddenNames, "_walk", lambda self, p: walks.append(p) or real_walk(self, p))
    monkeypatch.setattr(compatfs.tree, "everyone_who_may", lambda *a: decisions.append(1) or real_decide(*a))
    tree = Tree(open_source(root), BlobViews(index=None))
    assert len(tree.rescan().models) == 5
    walks.clear(), decisions.clear()
    umask = os.umask(0o022)  # a pull's files and folders are readable by all
    try:
        add_model(root, "pulled", blob, tag="1b")  # library/ and its new folder: new times
    finally:
        os.umask(umask)
    assert len(tree.rescan().models) == 6
    library = root / "manifests" / "registry.ollama.ai" / "library"
    assert len(decisions) <= 1, decisions  # (none: its permissions are those of a name decided)
    assert set(walks) <= {library, library / "pulled", library / "pulled" / "1b"}, walks
    library.chmod(0o700)  # closed: no one else may list the names below it
    assert tree.rescan().models == {}
    library.chmod(0o755)  # opened again: every name below it shown again
    assert len(tree.rescan().models) == 6
