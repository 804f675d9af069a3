"""What a vision model served through the mount must do in llama.cpp."""
from xlc_client import run_job

DESCRIBE = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}


def assert_completes_and_sees(model: str, mmproj: str) -> None:
    """A completion generates; a chat with a small image answers, and its
    prompt is longer than the same chat's without the image (the projector ran)."""
    res = run_job({"model": model, "mmproj": mmproj, "actions": [
        {"op": "complete", "prompt": "hello", "n_predict": 4},
        {**DESCRIBE, "image_png": True},
    ]})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["tokens_predicted"] > 0
    assert chat["completion_tokens"] > 0
    text_only = run_job({"model": model, "actions": [DESCRIBE]})
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
