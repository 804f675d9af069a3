"""Every section of a mount's models.ini denotes exactly one model to stock
llama-server's router, whatever a folder or model is named: a folder named
`*` (llama.cpp's preset reader takes `[*]` as every model's options) is left
out with why, and never changes another model's child's arguments."""

from __future__ import annotations

import shutil
from pathlib import Path

import llamacpp
from compatfs.router.preset import Entry, refusal, render
from compatfs.testing import llama, llava
from conftest import needs_fuse, wait_until
from test_router import SERVING, ask, router


def test_names_llama_cpp_reads_specially_get_no_section():
    assert "every model" in (refusal("*") or "")
    assert refusal("") is not None and refusal(" x") is not None
    assert refusal("default") is None and refusal("tiny") is None and refusal("a/b:1b") is None
    text = render([Entry("*", Path("/m/*"), True, None, True), Entry("tiny", Path("/m/tiny"), False, None)])
    assert "[*]" not in text and "; *: left out of models.ini (llama-server reads a section named '*'" in text
    assert "[tiny]\nalias = tiny\n" in text


def test_a_section_name_or_alias_is_never_written_twice():
    text = render([Entry("a:b", Path("/m/a:b"), False, None), Entry("a:b", Path("/m/x"), False, None)])
    assert text.count("[a@b]") == 1 and "; a:b: left out (its section name or alias is another model's)" in text


@needs_fuse
def test_a_folder_named_star_never_steers_another_model(tmp_path, mount_store):
    llamacpp.tool("llama-server")  # (skips without one, before anything is mounted)
    root = tmp_path / "models"
    (root / "*").mkdir(parents=True)
    (root / "tiny").mkdir()
    (root / "default").mkdir()
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    shutil.copyfile(blob, root / "*" / "m.gguf")
    llava.legacy_llava_projector(root / "*" / "mmproj-x.gguf")
    shutil.copyfile(blob, root / "tiny" / "m.gguf")
    shutil.copyfile(blob, root / "default" / "m.gguf")
    mnt = mount_store(root, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    wait_until(lambda: (mnt / "models.ini").exists(), 10, what="models.ini published", tolerate=SERVING)
    assert (mnt / "*" / "mmproj.gguf").exists()
    text = (mnt / "models.ini").read_text()
    assert "[*]" not in text and "; *: left out of models.ini" in text and "[tiny]" in text, text
    with router(mnt / "models.ini", tmp_path / "server.log", "-t", "1") as port:
        models = {m["id"]: m for m in ask(port, "/models")["data"]}
        assert {"tiny", "default"} <= set(models) and "*" not in models, sorted(models)
        for name in ("tiny", "default"):
            args = models[name]["status"]["args"]
            assert "--mmproj" not in args and "--embeddings" not in args, (name, args)
            assert str(mnt / name / "model.gguf") in args, (name, args)
