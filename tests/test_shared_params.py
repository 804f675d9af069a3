"""A params layer reaches the files the mount shows to many (models.ini, a
model folder's model.gguf with sampling keys) only where every caller who may
read those could read the layer in the store itself, through every folder on
the way and whatever a symlink resolves to; the daemon never reads it on
their behalf with its own rights.  Through a real root mount (allow_other),
uid 65534 as the attacker."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from compatfs.files.access import Recorder, everyone_who_may
from compatfs.files.lookup import status
from compatfs.format.params import read_params
from compatfs.sources.ollama import PARAMS
from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import Mount, needs_fuse, wait_until
from test_router import SERVING
from test_sampling import set_params

pytestmark = [needs_fuse, pytest.mark.skipif(os.getuid() != 0, reason="needs root (allow_other, another user)")]

SECRET = b'{"num_ctx":2048,"seed":424242,"temperature":0.25,"stop":["SECRETSTOP"]}'
PUBLIC = b'{"num_ctx":1024,"temperature":0.75,"stop":["OPENSTOP"]}'


def as_nobody(path: Path) -> bytes | None:
    """What uid/gid 65534 (no other groups) reads at `path`; None when refused."""
    res = subprocess.run(["cat", str(path)], user=65534, group=65534, extra_groups=[], capture_output=True, timeout=30)
    assert res.returncode == 0 or b"Permission denied" in res.stderr, res.stderr
    return res.stdout if res.returncode == 0 else None


def params_blob(root: Path, manifest: Path) -> Path:
    digest = next(x["digest"] for x in json.loads(manifest.read_text())["layers"] if x["mediaType"] == PARAMS)
    return root / "blobs" / digest.replace(":", "-")


def _chmod_all(root: Path, owner: int | None = None) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
        if owner is not None:
            os.lchown(p, owner, owner)


def test_everyone_who_may_tries_every_caller_the_permissions_name(open_tmp):
    d = open_tmp / "d"
    d.mkdir()
    f = d / "f"
    f.write_text("x")
    d.chmod(0o755)

    def chain(path: Path, bit: int) -> list:
        r = Recorder()
        status(path, r, bit)
        return r.chain

    f.chmod(0o644)
    assert everyone_who_may(chain(d, 1), chain(f, 4))
    f.chmod(0o640)  # others may reach d, not read f
    assert not everyone_who_may(chain(d, 1), chain(f, 4))
    d.chmod(0o750)  # only d's owner and group reach it: f's group bits are theirs
    assert everyone_who_may(chain(d, 1), chain(f, 4))
    os.chown(f, 0, 4242)  # a group d does not name: d's group members need not hold it
    assert not everyone_who_may(chain(d, 1), chain(f, 4))


def test_private_and_symlinked_params_never_reach_the_shared_files(open_tmp):
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    # (a) A root store: a model whose params blob is private (0600) beside an open one.
    root = open_tmp / "store"
    secret = add_model(root, "secret", blob, tag="1b")
    set_params(root, secret, SECRET)
    opened = add_model(root, "open", blob, tag="1b")
    set_params(root, opened, PUBLIC)
    _chmod_all(root)
    params_blob(root, secret).chmod(0o600)
    # (b) A store uid 65534 owns, whose params blob is a symlink to a root-only file.
    mine = open_tmp / "mine"
    linked = add_model(mine, "linked", blob, tag="1b")
    set_params(mine, linked, b'{"temperature":0.5}')
    hidden = open_tmp / "rootonly"
    hidden.mkdir(mode=0o700)
    (hidden / "p.json").write_bytes(SECRET)
    (hidden / "p.json").chmod(0o600)
    link = params_blob(mine, linked)
    link.unlink()
    link.symlink_to(hidden / "p.json")
    _chmod_all(mine, owner=65534)
    assert as_nobody(hidden / "p.json") is None and as_nobody(params_blob(root, secret)) is None
    assert b"OPENSTOP" in (as_nobody(params_blob(root, opened)) or b"")

    for store, secret_model in ((root, "secret:1b"), (mine, "linked:1b")):
        m = Mount(store, open_tmp / f"mnt-{store.name}", env={"XDG_STATE_HOME": str(open_tmp / f"state-{store.name}")})
        try:
            wait_until(lambda m=m: (m / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
            ini = as_nobody(m / "models.ini")
            assert ini is not None
            for word in (b"SECRETSTOP", b"424242", b"2048", b"temp"):
                assert word not in ini, (store.name, word, ini.decode())
            assert b"not readable by everyone" in ini, ini.decode()
            model = as_nobody(m / secret_model / "model.gguf")
            assert model is not None and b"general.sampling" not in model[: 1 << 16]
            if store is root:  # the open model keeps its params, in both files
                assert b"reverse-prompt = OPENSTOP" in ini
                assert b"general.sampling.temp" in (as_nobody(m / "open:1b" / "model.gguf") or b"")
            assert m.alive
        finally:
            m.close()


def test_a_layer_is_read_from_the_file_its_permissions_were_decided_on(open_tmp):
    """read_params decides on the descriptor it reads: a symlink flipped to a
    private file after a public one was read gives that file's refusal."""
    tmp_path = open_tmp
    store = tmp_path / "s"
    store.mkdir(mode=0o755)
    public, private = tmp_path / "pub.json", tmp_path / "priv.json"
    public.write_bytes(PUBLIC)
    public.chmod(0o644)
    private.write_bytes(SECRET)
    private.chmod(0o600)
    layer = store / ("sha256-" + hashlib.sha256(b"x").hexdigest())
    layer.symlink_to(public)
    assert read_params(layer)["stop"] == ["OPENSTOP"]
    layer.unlink()
    layer.symlink_to(private)
    with pytest.raises(ValueError, match="not readable by everyone"):
        read_params(layer)


def test_private_template_and_system_layers_never_reach_a_shared_model_gguf(open_tmp):
    """The template and system layers are read under the params layer's rule:
    a private one (0600) adds nothing to the model.gguf others may open, and
    `ls`'s notes say why."""
    from compatfs.view import sampling
    from compatfs.view.sampling import Layers
    from test_template_layer import SYSTEM, TEMPLATE, set_layer

    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    root = open_tmp / "store"
    templates = {"private": b"{{ .System }}SECRETTURN{{ .Prompt }}", "open": b"{{ .System }}OPENTURN{{ .Prompt }}"}
    manifests = {}
    for name, template in templates.items():
        manifests[name] = add_model(root, name, blob, tag="1b")
        set_layer(root, manifests[name], TEMPLATE, template)
        set_layer(root, manifests[name], SYSTEM, f"{name.upper()}SYSTEM".encode())
    _chmod_all(root)
    for layer in (TEMPLATE, SYSTEM):
        digest = next(
            x["digest"] for x in json.loads(manifests["private"].read_text())["layers"] if x["mediaType"] == layer
        )
        (root / "blobs" / digest.replace(":", "-")).chmod(0o600)
    m = Mount(root, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    try:
        private = as_nobody(m / "private:1b" / "model.gguf")
        assert private is not None
        assert b"SECRETTURN" not in private and b"PRIVATESYSTEM" not in private
        opened = as_nobody(m / "open:1b" / "model.gguf") or b""
        assert b"OPENTURN" in opened and b"OPENSYSTEM" in opened
        assert m.alive
    finally:
        m.close()
    blobs = {
        x["mediaType"]: root / "blobs" / x["digest"].replace(":", "-")
        for x in json.loads(manifests["private"].read_text())["layers"]
    }
    notes = sampling.of_layer(Layers(None, blobs[TEMPLATE], blobs[SYSTEM])).notes
    assert any("not readable by everyone" in n for n in notes), notes
