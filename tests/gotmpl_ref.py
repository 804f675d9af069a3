"""The reference the template tests compare with: tests/gotmpl, a Go program
of our own rendering an Ollama template layer with Go's own text/template on
Ollama's data (skips without `go`); the corpus of templates (tests/data/
templates: every form Ollama publishes; tests/data/refused: what is not
translated); the chats they are rendered for; and llama-server's rendering
of a chat template (`/apply-template`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import llamacpp

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "data" / "templates").glob("*.gotmpl"))
REFUSED = sorted((HERE / "data" / "refused").glob("*.gotmpl"))


def go_binary(out_dir: Path) -> Path:
    """tests/gotmpl built into `out_dir` (the test skips without Go)."""
    go = shutil.which("go") or next((p for p in Path("/usr/lib").glob("go-*/bin/go") if p.exists()), None)
    if go is None:
        pytest.skip("Go is not installed (scripts/setup.sh test installs Debian's golang-go)")
    exe = out_dir / "gotmpl"
    env = {**os.environ, "GOCACHE": str(out_dir / "gocache"), "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    subprocess.run(
        [str(go), "build", "-o", str(exe), "."], cwd=HERE / "gotmpl", env=env, check=True, capture_output=True
    )
    return exe


def go_render(exe: Path, template: str, system: str, chat: dict) -> str:
    """What Ollama's prompt for `chat` is (its messages, tools, think) with these layers."""
    doc = {
        "template": template,
        "system": system,
        "messages": chat["messages"],
        "tools": chat.get("tools"),
        "think": chat.get("think"),
    }
    r = subprocess.run([str(exe)], input=json.dumps(doc).encode(), capture_output=True, check=True)
    return r.stdout.decode()


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string", "description": "where"}},
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}},
    },
]


def _m(role: str, content: str, **more) -> dict:
    return {"role": role, "content": content, **more}


CHATS: dict[str, dict] = {
    "user": {"messages": [_m("user", "Hello!")]},
    "system-user": {"messages": [_m("system", "You are terse."), _m("user", "Hi")]},
    "multi-turn": {
        "messages": [_m("user", "Hi"), _m("assistant", "Hello, how can I help?"), _m("user", "Tell me a joke")]
    },
    "system-multi-turn": {
        "messages": [
            _m("system", "Be kind."),
            _m("user", "Hi"),
            _m("assistant", "Hey"),
            _m("user", "Again"),
            _m("assistant", "Sure"),
            _m("user", "Bye"),
        ]
    },
    "two-users": {"messages": [_m("user", "First"), _m("user", "second")]},
    "two-systems": {"messages": [_m("system", "A"), _m("system", "B"), _m("user", "C")]},
    "late-system": {
        "messages": [_m("user", "u1"), _m("assistant", "a1"), _m("system", "now formal"), _m("user", "u2")]
    },
    "text": {"messages": [_m("user", 'Quotes " \\ {{ .System }} {% x %} é 日本 \t tab\r\nline')]},
    "tools": {
        "tools": TOOLS,
        "messages": [
            _m("user", "Weather in Paris?"),
            _m(
                "assistant",
                "",
                tool_calls=[
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            ),
            _m("tool", "sunny", tool_call_id="call_1"),
            _m("user", "Thanks"),
        ],
    },
    "thinking": {
        "messages": [_m("user", "2+2?"), _m("assistant", "4", reasoning_content="add them"), _m("user", "3+3?")]
    },
    "think-on": {"think": True, "messages": [_m("user", "Think")]},
    "think-off": {"think": False, "messages": [_m("user", "Do not think")]},
}


class Server:
    """A stock llama-server on `model` (with `template` as a chat template
    file, if given), stopped by `close`."""

    def __init__(self, model: Path, log: Path, template: Path | None = None, port: int = 0):
        exe = llamacpp.tool("llama-server")
        self.port = port or _free_port()
        args = [str(exe), "-m", str(model), "--port", str(self.port), "-c", "512", "--no-warmup", "-t", "1"]
        if template is not None:
            args += ["--chat-template-file", str(template)]
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server did not come up: {log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)

    def apply(self, chat: dict) -> str:
        msgs = [
            {
                **m,
                "tool_calls": [
                    {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ],
            }
            if "tool_calls" in m
            else m
            for m in chat["messages"]
        ]
        body: dict = {"messages": msgs}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        if chat.get("think") is not None:
            body["chat_template_kwargs"] = {"enable_thinking": chat["think"]}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/apply-template",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["prompt"]

    def close(self) -> None:
        llamacpp.stop(self.proc, self.log)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
