"""What a model served through the mount must do in llama.cpp, and what its
untranslated blob must not."""

from xlc_client import run_job

DESCRIBE = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}


def assert_completes_and_sees(model: str, mmproj: str, describe: dict = DESCRIBE, timeout: float = 300) -> None:
    """A completion generates; a chat (`describe`) with a small image answers,
    and its prompt is longer than the same chat's without the image (the
    projector ran)."""
    res = run_job(
        {
            "model": model,
            "mmproj": mmproj,
            "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}, {**describe, "image_png": True}],
        },
        timeout=timeout,
    )
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["tokens_predicted"] > 0
    assert chat["completion_tokens"] > 0
    text_only = run_job({"model": model, "actions": [describe]})
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]


def assert_only_the_views_load(folder, blob, reason: str) -> None:
    """The mounted model `folder`'s model.gguf and mmproj.gguf complete and
    see; the blob as it is loads neither as a model (failing for `reason`)
    nor as the projector of the served model."""
    model, mmproj = str(folder / "model.gguf"), str(folder / "mmproj.gguf")
    assert_completes_and_sees(model, mmproj)
    assert reason in load_failure(blob)
    assert not run_job({"model": model, "mmproj": str(blob)})["ok"]


def load_failure(path) -> str:
    """Why llama.cpp refuses to load `path` (it must refuse); the reason is
    asked for up to 3 times, as llama.cpp logs from a thread of its own."""
    for _ in range(3):
        res = run_job({"model": str(path)})
        assert not res["ok"]
        if res.get("log_errors"):
            break
    return str(res)


def assert_refused(res: dict, reason: str) -> None:
    """llama.cpp failed to load; where its log was captured, for `reason`
    (xllamacpp's log capture in the child process is not always complete)."""
    assert not res["ok"]
    if res.get("log_errors"):
        assert reason in str(res.get("error")) + str(res["log_errors"]), res["log_errors"]
