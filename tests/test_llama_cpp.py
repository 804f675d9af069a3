"""A real llama.cpp (xllamacpp, in a child process) on legacy blobs: through
the mount they load and generate; untranslated they fail or misbehave."""

import pytest

from compatfs.testing.llama import LLAMA3_EOT_ID

from conftest import needs_fuse
from xlc_client import run_job

pytestmark = needs_fuse

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def mounted(legacy, tmp_path_factory):
    from conftest import Mount

    m = Mount(legacy[0], tmp_path_factory.mktemp("mnt") / "mnt")
    yield m
    m.close()


def generates(res: dict) -> bool:
    return res["ok"] and all(r["ok"] for r in res["results"])


def test_gemma3_text_loads_only_translated(legacy, mounted):
    job = {"actions": [{"op": "complete", "prompt": "hello", "n_predict": 6}]}
    res = run_job({"model": str(mounted / "gemma3:1b/model.gguf"), **job})
    assert generates(res), res.get("error")
    assert res["results"][0]["tokens_predicted"] == 6
    raw = run_job({"model": str(legacy[1]["gemma3"]), **job})
    assert not raw["ok"] and "layer_norm_rms_epsilon" in raw["error"]


def test_gemma3_vision_model_and_mmproj(legacy, mounted):
    chat = {"op": "chat", "messages": [{"role": "user", "content": "What is this?"}], "image_png": True, "n_predict": 4}
    res = run_job(
        {
            "model": str(mounted / "gemma3:4b/model.gguf"),
            "mmproj": str(mounted / "gemma3:4b/mmproj.gguf"),
            "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}, chat],
        }
    )
    assert generates(res), res.get("error") or res["results"]
    assert res["results"][1]["completion_tokens"] > 0
    raw = legacy[1]["gemma3v"]
    assert not run_job({"model": str(raw)})["ok"]
    assert not run_job({"model": str(mounted / "gemma3:4b/model.gguf"), "mmproj": str(raw), "actions": [chat]})["ok"]


def test_llama3_end_of_turn(legacy, mounted):
    """Through the mount llama.cpp reports <|eot_id|> as EOS and EOT, and a chat
    completion (the fixture's greedy token is <|eot_id|>) stops there."""
    actions = [{"op": "props", "ids": [LLAMA3_EOT_ID]}, {"op": "chat", "messages": HELLO, "n_predict": 8}]
    res = run_job({"model": str(mounted / "llama3:8b/model.gguf"), "actions": actions})
    assert generates(res), res.get("error")
    props, chat = res["results"]
    assert props["eos_id"] == props["eot_id"] == LLAMA3_EOT_ID
    assert LLAMA3_EOT_ID in props["eog_ids"]
    assert chat["finish_reason"] == "stop" and chat["completion_tokens"] <= 1 and chat["content"] == ""
    raw = run_job({"model": str(legacy[1]["llama3"]), "actions": actions})
    assert raw["ok"]
    assert raw["results"][0]["eos_id"] == raw["results"][0]["eot_id"] == 128001  # <|end_of_text|>


def test_llama3_pre_tokenizer(legacy, mounted):
    """`llama-bpe` splits text as Llama 3 does; the legacy file falls back to 'default'."""
    tok = [{"op": "tokenize", "text": text} for text in ("x.get(y)", "I'M SURE", "lines.\n\n\nLike")]
    fixed = run_job({"model": str(mounted / "llama3:8b/model.gguf"), "actions": tok})
    raw = run_job({"model": str(legacy[1]["llama3"]), "actions": tok})
    assert fixed["ok"] and raw["ok"]
    for f, r in zip(fixed["results"], raw["results"], strict=True):
        # Llama 3's split keeps ".get", "'M" and runs of newlines together, so
        # the merges learned for them apply: fewer tokens than the legacy split.
        assert len(f["ids"]) < len(r["ids"]), (f["pieces"], r["pieces"])


def test_llava_projector_without_type(legacy, mounted):
    chat = {"op": "chat", "messages": [{"role": "user", "content": "What is this?"}], "image_png": True, "n_predict": 4}
    res = run_job(
        {
            "model": str(mounted / "llava:7b/model.gguf"),
            "mmproj": str(mounted / "llava:7b/mmproj.gguf"),
            "actions": [chat],
        }
    )
    assert generates(res), res.get("error") or res["results"]
    raw = run_job(
        {"model": str(mounted / "llava:7b/model.gguf"), "mmproj": str(legacy[1]["llava-proj"]), "actions": [chat]}
    )
    assert not raw["ok"] and any("unknown projector type" in line for line in raw["log_errors"])


def test_mmap_through_the_mount(mounted):
    """llama.cpp maps the mounted files like any other (its default): a model
    whose views have op tensors (gemma3 vision: its projector's F32 patch and
    position embeddings) and one without; each generates the same with mmap
    on and off."""
    chat = {"op": "chat", "messages": [{"role": "user", "content": "What is this?"}], "image_png": True, "n_predict": 4}
    for files, actions in (
        ({"model": "gemma3:1b/model.gguf"}, [{"op": "complete", "prompt": "hello", "n_predict": 8}]),
        ({"model": "gemma3:4b/model.gguf", "mmproj": "gemma3:4b/mmproj.gguf"}, [chat]),
    ):
        job = {k: str(mounted / v) for k, v in files.items()} | {"actions": actions + [{"op": "maps"}]}
        with_mmap, without = run_job({**job, "mmap": True}), run_job({**job, "mmap": False})
        assert generates(with_mmap) and generates(without), (with_mmap.get("error"), without.get("error"))
        assert job["model"] in with_mmap["results"][-1]["files"]  # really mapped through FUSE
        assert job["model"] not in without["results"][-1]["files"]
        assert with_mmap["results"][0]["tokens"] == without["results"][0]["tokens"]
