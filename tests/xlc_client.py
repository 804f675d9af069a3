#!/usr/bin/env python3
"""Run llama.cpp (via xllamacpp, in-process server engine) jobs against GGUF files.

Two entry points:

* CLI: ``python tests/xlc_client.py '<json job>'`` (or ``@/path/to/job.json``) runs ONE job in
  this process and prints exactly one JSON line as the last stdout line:
  ``{"ok": true, "results": [...], ...}`` or ``{"ok": false, "error": "...", ...}``.
  llama.cpp logs go to stderr (never stdout).
* ``run_job(job, timeout=300) -> dict`` runs the CLI in a child process (llama.cpp
  ``GGML_ASSERT`` aborts the whole process) and never raises for a failing model: a crash,
  abort or timeout becomes ``{"ok": False, "error": <last ~40 stderr lines>, "returncode": rc}``.

Job (one JSON object)::

    {"model": "/path/model.gguf",          # required
     "mmproj": "/path/mmproj.gguf",        # optional multimodal projector
     "mmap": true,                         # false -> llama_load_mode NONE (plain read())
     "n_ctx": 1024, "threads": 2, "seed": 42,
     "warmup": false, "embedding": null,   # embedding auto-enabled if an "embed" action exists
     "actions": [...]}                     # empty -> just load the server

Actions (each result carries "op" and "ok"; on failure "error"):

* ``{"op": "complete", "prompt": str | [ids], "n_predict": 16, "n_probs": 0, "extra": {}}``
  greedy raw completion -> text, tokens (generated ids), stop_type ("eos"|"limit"|"word"|"none"),
  stopping_word, finish_reason, tokens_predicted, tokens_evaluated, prompt (as llama.cpp
  detokenized it, special tokens rendered, e.g. leading ``<|begin_of_text|>``), top (if n_probs).
* ``{"op": "chat", "messages": [...], "n_predict": 16, "image_png": true | "<base64 png>",
  "extra": {}}`` -> content, finish_reason, completion_tokens, prompt_tokens, tokens, stop_type,
  prompt (the rendered chat template as tokens detokenized). ``image_png`` true (or any of
  "generate", "<generate-a-small-test-image>") appends a generated 64x64 RGB PNG to the last user
  message as an OpenAI ``image_url`` data URL.
* ``{"op": "embed", "input": str}`` -> dim, first (8 values), norm, prompt_tokens.
* ``{"op": "tokenize", "text": str, "special": true, "add_special": false}`` -> ids, pieces.
  ``special`` = parse special-token text (llama.cpp ``parse_special``), ``add_special`` = add BOS/EOS
  as the model's metadata says. Uses llama.cpp's C API (vocab-only load) through ctypes.
* ``{"op": "detokenize", "ids": [...], "special": true, "remove_special": false}`` -> text
  (llama_detokenize: applies the vocab's clean_spaces etc., unlike the per-token pieces).
* ``{"op": "maps"}`` -> files: the files the process has memory-mapped once the model is loaded.
* ``{"op": "props", "ids": [optional token ids to describe]}`` -> vocab facts from llama.cpp's vocab
  loader: n_vocab, vocab_type, bos/eos/eot/eom/sep/nl/pad/fim ids, add_bos/add_eos, eog_ids
  (every token llama.cpp treats as end-of-generation), token info (text, attr, is_eog,
  is_control) for bos/eos/eot and the requested ids, and the GGUF metadata as llama.cpp reads it.
"""

from __future__ import annotations

import base64
import ctypes
import json
import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
import contextlib

HERE = os.path.abspath(__file__)
LOG_ENV = "XLC_LOG_FILE"
TAIL_LINES = 40
GENERATE_FLAGS = {"generate", "<generate-a-small-test-image>", "<generate>"}


# ----------------------------------------------------------------------------------------------
# helpers usable without xllamacpp
# ----------------------------------------------------------------------------------------------


def make_png(width: int = 64, height: int = 64) -> bytes:
    """A small deterministic RGB gradient PNG written with zlib + struct (no PIL needed)."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")  # filter type 0
        for x in range(width):
            row += bytes(((x * 255) // max(width - 1, 1), (y * 255) // max(height - 1, 1), ((x + y) * 4) & 0xFF))
        rows.append(bytes(row))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


def _error_lines(log: str) -> list[str]:
    """llama.cpp error-level lines, asserts and aborts from a log text."""
    out = []
    for line in log.splitlines():
        s = line.strip()
        if not s:
            continue
        if (
            " E " in s
            or "GGML_ASSERT" in s
            or "error" in s.lower()
            or "failed" in s.lower()
            or "terminate called" in s
            or "what():" in s
            or "Traceback" in s
        ):
            out.append(s)
    return out


def _tail(log: str, n: int = TAIL_LINES) -> str:
    lines = [l for l in log.splitlines() if l.strip()]
    return "\n".join(lines[-n:])


# ----------------------------------------------------------------------------------------------
# llama.cpp C API through ctypes (vocabulary facts and tokenization)
# ----------------------------------------------------------------------------------------------


class _ModelParams(ctypes.Structure):
    # llama_model_params is 80 bytes in b11549; a larger buffer is harmless both as the sret
    # return of llama_model_default_params and as the (only, stack-passed) by-value argument.
    _fields_ = [("raw", ctypes.c_ubyte * 256)]


# b11549: llama_model_default_params bytes 0x48.. = vocab_only, ..., verified empirically
# (vocab-only load gives n_embd 0 and loads files whose tensors are broken).
_VOCAB_ONLY_OFFSET = 0x48
_KNOWN_DEFAULT_HEAD = bytes.fromhex(
    "00000000000000000000000000000000ffffffff01000000ffffffff0100000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000010000000000"
)


class Vocab:
    """Vocab-only load of a GGUF through llama.cpp's own loader."""

    def __init__(self, path: str):
        import xllamacpp  # noqa: F401  (loads the shared object)

        d = os.path.dirname(xllamacpp.__file__)
        so_name = [f for f in os.listdir(d) if f.startswith("xllamacpp") and f.endswith(".so")][0]
        lib = ctypes.CDLL(os.path.join(d, so_name))
        self.lib = lib
        vp, i32 = ctypes.c_void_p, ctypes.c_int32
        lib.llama_backend_init.restype = None
        lib.llama_backend_init.argtypes = []
        lib.llama_model_default_params.restype = _ModelParams
        lib.llama_model_default_params.argtypes = []
        lib.llama_model_load_from_file.restype = vp
        lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, _ModelParams]
        lib.llama_model_free.restype = None
        lib.llama_model_free.argtypes = [vp]
        lib.llama_model_get_vocab.restype = vp
        lib.llama_model_get_vocab.argtypes = [vp]
        lib.llama_model_n_embd.restype = i32
        lib.llama_model_n_embd.argtypes = [vp]
        for name in (
            "n_tokens",
            "type",
            "bos",
            "eos",
            "eot",
            "sep",
            "nl",
            "pad",
            "cls",
            "fim_pre",
            "fim_suf",
            "fim_mid",
            "fim_pad",
            "fim_rep",
            "fim_sep",
        ):
            f = getattr(lib, "llama_vocab_" + name)
            f.restype, f.argtypes = i32, [vp]
        for name in ("get_add_bos", "get_add_eos"):
            f = getattr(lib, "llama_vocab_" + name)
            f.restype, f.argtypes = ctypes.c_bool, [vp]
        for name in ("is_eog", "is_control"):
            f = getattr(lib, "llama_vocab_" + name)
            f.restype, f.argtypes = ctypes.c_bool, [vp, i32]
        lib.llama_vocab_get_attr.restype, lib.llama_vocab_get_attr.argtypes = i32, [vp, i32]
        lib.llama_vocab_get_text.restype = ctypes.c_char_p
        lib.llama_vocab_get_text.argtypes = [vp, i32]
        lib.llama_tokenize.restype = i32
        lib.llama_tokenize.argtypes = [vp, ctypes.c_char_p, i32, ctypes.POINTER(i32), i32, ctypes.c_bool, ctypes.c_bool]
        lib.llama_detokenize.restype = i32
        lib.llama_detokenize.argtypes = [
            vp,
            ctypes.POINTER(i32),
            i32,
            ctypes.c_char_p,
            i32,
            ctypes.c_bool,
            ctypes.c_bool,
        ]
        lib.llama_token_to_piece.restype = i32
        lib.llama_token_to_piece.argtypes = [vp, i32, ctypes.c_char_p, i32, i32, ctypes.c_bool]
        lib.llama_model_meta_count.restype, lib.llama_model_meta_count.argtypes = i32, [vp]
        lib.llama_model_meta_key_by_index.restype = i32
        lib.llama_model_meta_key_by_index.argtypes = [vp, i32, ctypes.c_char_p, ctypes.c_size_t]
        lib.llama_model_meta_val_str_by_index.restype = i32
        lib.llama_model_meta_val_str_by_index.argtypes = [vp, i32, ctypes.c_char_p, ctypes.c_size_t]

        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        raw = bytes(params.raw[: len(_KNOWN_DEFAULT_HEAD)])
        # 0x24..0x28 and 0x4e..0x50 are struct padding (uninitialised)
        self.vocab_only = all(
            raw[i] == _KNOWN_DEFAULT_HEAD[i] for i in range(len(raw)) if not (0x24 <= i < 0x28 or i >= 0x4E)
        )
        if self.vocab_only:
            params.raw[_VOCAB_ONLY_OFFSET] = 1
        self.model = lib.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama_model_load_from_file (vocab_only={self.vocab_only}) failed for {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)

    # -- queries ---------------------------------------------------------------------------
    def text(self, tid: int) -> str | None:
        if tid < 0 or tid >= self.n_vocab:
            return None
        t = self.lib.llama_vocab_get_text(self.vocab, tid)
        return None if t is None else t.decode("utf-8", "replace")

    @property
    def n_vocab(self) -> int:
        return self.lib.llama_vocab_n_tokens(self.vocab)

    def token_info(self, tid: int) -> dict:
        if tid < 0 or tid >= self.n_vocab:
            return {"id": tid, "valid": False}
        return {
            "id": tid,
            "text": self.text(tid),
            "attr": self.lib.llama_vocab_get_attr(self.vocab, tid),
            "is_eog": bool(self.lib.llama_vocab_is_eog(self.vocab, tid)),
            "is_control": bool(self.lib.llama_vocab_is_control(self.vocab, tid)),
        }

    def piece(self, tid: int, special: bool = True) -> str:
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_token_to_piece(self.vocab, tid, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab, tid, buf, -n, 0, special)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        arr = (ctypes.c_int32 * n_max)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), arr, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            arr = (ctypes.c_int32 * n_max)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), arr, n_max, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n})")
        return list(arr[:n])

    def detokenize(self, ids, remove_special: bool, unparse_special: bool) -> str:
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
        if n < 0:
            cap = -n
            buf = ctypes.create_string_buffer(cap)
            n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def metadata(self, max_len: int = 300) -> dict:
        out = {}
        kbuf = ctypes.create_string_buffer(1024)
        vbuf = ctypes.create_string_buffer(4096)
        for i in range(self.lib.llama_model_meta_count(self.model)):
            if self.lib.llama_model_meta_key_by_index(self.model, i, kbuf, 1024) < 0:
                continue
            n = self.lib.llama_model_meta_val_str_by_index(self.model, i, vbuf, 4096)
            val = vbuf.value.decode("utf-8", "replace") if n >= 0 else None
            if val is not None and len(val) > max_len:
                val = val[:max_len] + "..."
            out[kbuf.value.decode("utf-8", "replace")] = val
        return out

    def props(self, ids=()) -> dict:
        lib, v = self.lib, self.vocab
        n = self.n_vocab
        special = {
            name: getattr(lib, "llama_vocab_" + name)(v)
            for name in (
                "bos",
                "eos",
                "eot",
                "sep",
                "nl",
                "pad",
                "cls",
                "fim_pre",
                "fim_suf",
                "fim_mid",
                "fim_pad",
                "fim_rep",
                "fim_sep",
            )
        }
        eog = [i for i in range(n) if lib.llama_vocab_is_eog(v, i)]
        control = sum(1 for i in range(n) if lib.llama_vocab_is_control(v, i))
        info_ids = sorted(
            {t for t in list(special.values()) + list(eog[:32]) + list(ids) if isinstance(t, int) and t >= 0}
        )
        return {
            "n_vocab": n,
            "vocab_type": lib.llama_vocab_type(v),
            "vocab_only_load": self.vocab_only,
            **{k + "_id": val for k, val in special.items()},
            "add_bos": bool(lib.llama_vocab_get_add_bos(v)),
            "add_eos": bool(lib.llama_vocab_get_add_eos(v)),
            "eog_ids": eog[:64],
            "n_eog": len(eog),
            "n_control": control,
            "tokens": {str(t): self.token_info(t) for t in info_ids},
            "metadata": self.metadata(),
        }


# ----------------------------------------------------------------------------------------------
# the in-process job runner
# ----------------------------------------------------------------------------------------------


def _greedy(job: dict) -> dict:
    return {
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": int(job.get("seed", 42)),
        "repeat_penalty": 1.0,
    }


def _resp_error(r) -> str | None:
    if not isinstance(r, dict):
        return f"unexpected response type {type(r).__name__}"
    if "error" in r:
        e = r["error"]
        return e.get("message", json.dumps(e)) if isinstance(e, dict) else str(e)
    if r.get("code") and r.get("message") and "choices" not in r and "data" not in r:
        return str(r["message"])
    return None


def _top_from_logprobs(choice: dict):
    lp = (choice or {}).get("logprobs") or {}
    content = lp.get("content") if isinstance(lp, dict) else None
    if not content:
        return None
    return [
        [
            {"id": c.get("id"), "token": c.get("token"), "logprob": c.get("logprob")}
            for c in (entry.get("top_logprobs") or [])
        ]
        for entry in content
    ]


def _with_extras(out: dict, choice: dict, action: dict, response: dict) -> dict:
    """`out` plus the top log-probabilities, and the raw response when asked."""
    top = _top_from_logprobs(choice)
    if top is not None:
        out["top"] = top
    if action.get("raw"):
        out["raw"] = response
    return out


class JobRunner:
    def __init__(self, job: dict):
        self.job = job
        self.server = None
        self.server_error = None
        self.vocab = None

    # -- lazily built engines --------------------------------------------------------------
    def get_server(self):
        if self.server is not None:
            return self.server
        if self.server_error is not None:  # do not retry a failed load for every action
            raise self.server_error
        try:
            self.server = self._make_server()
        except Exception as e:
            self.server_error = e
            raise
        return self.server

    def _make_server(self):
        import xllamacpp as xlc

        job = self.job
        p = xlc.CommonParams()
        p.model.path = job["model"]
        if job.get("mmproj"):
            p.mmproj.path = job["mmproj"]
        p.n_ctx = int(job.get("n_ctx", 1024))
        p.n_predict = int(job.get("n_predict", 32))
        threads = int(job.get("threads", 2))
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.n_parallel = 1
        p.warmup = bool(job.get("warmup", False))
        p.fit_params = False  # otherwise the model is loaded twice just to size buffers
        p.n_gpu_layers = 0
        lm = job.get("load_mode")
        if lm:
            p.load_mode = getattr(xlc.llama_load_mode, "LLAMA_LOAD_MODE_" + str(lm).upper())
        else:
            p.load_mode = (
                xlc.llama_load_mode.LLAMA_LOAD_MODE_MMAP
                if job.get("mmap", True)
                else xlc.llama_load_mode.LLAMA_LOAD_MODE_NONE
            )
        emb = job.get("embedding")
        if emb is None:
            emb = any(a.get("op") == "embed" for a in job.get("actions", []))
        p.embedding = bool(emb)
        if job.get("pooling"):
            p.pooling_type = getattr(xlc.llama_pooling_type, "LLAMA_POOLING_TYPE_" + str(job["pooling"]).upper())
        p.sampling.temp = 0.0
        p.sampling.top_k = 1
        p.sampling.seed = int(job.get("seed", 42))
        if "jinja" in job:
            p.use_jinja = bool(job["jinja"])
        if job.get("chat_template"):
            p.chat_template = job["chat_template"]
        return xlc.Server(p)  # RuntimeError("Failed to init server...") on load failure

    def get_vocab(self) -> Vocab:
        if self.vocab is None:
            self.vocab = Vocab(self.job["model"])
        return self.vocab

    # -- actions ---------------------------------------------------------------------------
    def op_load(self, a):
        self.get_server()
        return {}

    def op_complete(self, a):
        srv = self.get_server()
        req = {
            "prompt": a["prompt"],
            "n_predict": int(a.get("n_predict", 16)),
            "return_tokens": True,
            "verbose": True,
            "cache_prompt": False,
            **_greedy(self.job),
        }
        if a.get("n_probs"):
            req["n_probs"] = int(a["n_probs"])
        req.update(a.get("extra") or {})
        r = srv.handle_completions(req)
        err = _resp_error(r)
        if err:
            return {"ok": False, "error": err}
        ch = (r.get("choices") or [{}])[0]
        vb = r.get("__verbose") or {}
        out = {
            "text": ch.get("text", vb.get("content")),
            "finish_reason": ch.get("finish_reason"),
            "tokens": vb.get("tokens"),
            "stop_type": vb.get("stop_type"),
            "stopping_word": vb.get("stopping_word"),
            "tokens_predicted": vb.get("tokens_predicted"),
            "tokens_evaluated": vb.get("tokens_evaluated"),
            "prompt": vb.get("prompt"),
            "usage": r.get("usage"),
        }
        return _with_extras(out, ch, a, r)

    def op_chat(self, a):
        srv = self.get_server()
        messages = json.loads(json.dumps(a["messages"]))
        img = a.get("image_png")
        if img:
            if img is True or (isinstance(img, str) and img in GENERATE_FLAGS):
                size = int(a.get("image_size", 64))
                b64 = base64.b64encode(make_png(size, size)).decode()
            else:
                b64 = img
            part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}
            users = [m for m in messages if m.get("role") == "user"]
            if not users:
                messages.append({"role": "user", "content": []})
                users = messages[-1:]
            m = users[-1]
            if isinstance(m.get("content"), str):
                m["content"] = [{"type": "text", "text": m["content"]}]
            m.setdefault("content", []).append(part)
        req = {
            "messages": messages,
            "max_tokens": int(a.get("n_predict", 16)),
            "return_tokens": True,
            "verbose": True,
            "cache_prompt": False,
            **_greedy(self.job),
        }
        if a.get("n_probs"):
            req["logprobs"] = True
            req["top_logprobs"] = int(a["n_probs"])
        req.update(a.get("extra") or {})
        r = srv.handle_chat_completions(req)
        err = _resp_error(r)
        if err:
            return {"ok": False, "error": err}
        ch = (r.get("choices") or [{}])[0]
        msg = ch.get("message") or {}
        vb = r.get("__verbose") or {}
        usage = r.get("usage") or {}
        out = {
            "content": msg.get("content"),
            "finish_reason": ch.get("finish_reason"),
            "completion_tokens": usage.get("completion_tokens"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "tokens": vb.get("tokens"),
            "stop_type": vb.get("stop_type"),
            "stopping_word": vb.get("stopping_word"),
            "prompt": vb.get("prompt"),
        }
        if msg.get("reasoning_content"):
            out["reasoning_content"] = msg["reasoning_content"]
        return _with_extras(out, ch, a, r)

    def op_embed(self, a):
        srv = self.get_server()
        req = {"input": a["input"], "encoding_format": "float"}
        req.update(a.get("extra") or {})
        r = srv.handle_embeddings(req)
        err = _resp_error(r)
        if err:
            return {"ok": False, "error": err}
        vec = r["data"][0]["embedding"]
        if vec and isinstance(vec[0], list):  # pooling none: one vector per token
            vec = vec[-1]
        n = int(a.get("n_first", 8))
        return {
            "dim": len(vec),
            "first": vec[:n],
            "norm": math.sqrt(sum(x * x for x in vec)),
            "prompt_tokens": (r.get("usage") or {}).get("prompt_tokens"),
            **({"vector": vec} if a.get("full") else {}),
        }

    def op_tokenize(self, a):
        v = self.get_vocab()
        ids = v.tokenize(a["text"], bool(a.get("add_special", False)), bool(a.get("special", True)))
        return {"ids": ids, "pieces": [v.piece(i, True) for i in ids]}

    def op_detokenize(self, a):
        v = self.get_vocab()
        return {
            "text": v.detokenize(
                [int(i) for i in a["ids"]], bool(a.get("remove_special", False)), bool(a.get("special", True))
            )
        }

    def op_props(self, a):
        return self.get_vocab().props(a.get("ids") or ())

    def op_maps(self, a):
        """Files this process has memory-mapped (after the model is loaded)."""
        self.get_server()
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
        return {"files": sorted(p for p in paths if p.startswith("/"))}

    def run(self) -> dict:
        actions = self.job.get("actions") or [{"op": "load"}]
        results = []
        for a in actions:
            op = a.get("op")
            fn = getattr(self, "op_" + str(op), None)
            if fn is None:
                res = {"ok": False, "error": f"unknown op {op!r}"}
            else:
                try:
                    res = fn(a)
                    res.setdefault("ok", True)
                except Exception as e:  # load failures surface here as RuntimeError
                    res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            results.append({"op": op, **res})
        bad = [r for r in results if not r.get("ok")]
        out = {"ok": not bad, "results": results}
        if bad:
            out["error"] = "{}: {}".format(bad[0]["op"], bad[0].get("error"))
        return out


def _settle(log_path: str, quiet: float = 0.3, limit: float = 5.0) -> None:
    """llama.cpp logs from a thread of its own: wait until the log file has
    stopped growing for `quiet` seconds (at most `limit`), so that the reason
    for a failure is in it when it is read."""
    deadline, last, still = time.monotonic() + limit, -1, 0.0
    while time.monotonic() < deadline and still < quiet:
        try:
            size = os.path.getsize(log_path)
        except OSError:
            return
        still = still + 0.05 if size == last else 0.0
        last = size
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb backtrace on GGML_ASSERT
    if len(argv) != 2:
        print(json.dumps({"ok": False, "error": "usage: xlc_client.py '<json job>' | @job.json"}))
        return 2
    # llama.cpp logs -> a regular file (survives an abort), copied back to stderr at the end
    # unless run_job asked for the file via $XLC_LOG_FILE.
    log_path = os.environ.get(LOG_ENV)
    own_log = not log_path
    if own_log:
        fd, log_path = tempfile.mkstemp(prefix="xlc_client.", suffix=".log")
        os.close(fd)
    sys.stderr.flush()
    orig_err = os.dup(2)
    lfd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if own_log:
        os.write(orig_err, (f"xlc_client: llama.cpp log -> {log_path}\n").encode())
    os.dup2(lfd, 2)
    os.close(lfd)
    try:
        arg = argv[1]
        if arg.startswith("@"):
            with open(arg[1:]) as f:
                arg = f.read()
        job = json.loads(arg)
        if not isinstance(job, dict) or not job.get("model"):
            raise ValueError("job must be a JSON object with a 'model' path")
        out = JobRunner(job).run()
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stderr.flush()
    if not out.get("ok"):
        _settle(log_path)
    try:
        with open(log_path, errors="replace") as f:
            log = f.read()
    except OSError:
        log = ""
    if not out.get("ok"):
        errs = _error_lines(log)
        out["log_errors"] = errs[-20:]
        # make the top-level error self-explanatory (e.g. "unknown model architecture: 'x'")
        if errs and "Failed to init server" in str(out.get("error", "")):
            specific = [
                l
                for l in errs
                if "error loading model" in l or "GGML_ASSERT" in l or "Failed to load CLIP" in l or "error:" in l
            ]
            out["error"] = "{} | {}".format(out["error"], " | ".join((specific or errs)[-3:]))
    if own_log:
        os.write(orig_err, log.encode("utf-8", "replace"))
        os.unlink(log_path)
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    # skip interpreter/C++ teardown (server threads); the result is already printed
    os._exit(0 if out.get("ok") else 1)


# ----------------------------------------------------------------------------------------------
# the subprocess wrapper
# ----------------------------------------------------------------------------------------------


def run_job(job: dict, timeout: float = 300) -> dict:
    """Run one job in a child process; never raises for a failing model."""
    tmpdir = tempfile.mkdtemp(prefix="xlc_job.")
    log_path = os.path.join(tmpdir, "stderr.log")
    job_arg = json.dumps(job)
    if len(job_arg) > 100_000:  # keep argv below MAX_ARG_STRLEN
        jp = os.path.join(tmpdir, "job.json")
        with open(jp, "w") as f:
            f.write(job_arg)
        job_arg = "@" + jp
    env = dict(os.environ, GGML_NO_BACKTRACE="1", **{LOG_ENV: log_path})
    proc = subprocess.Popen(
        [sys.executable, HERE, job_arg],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmpdir,
        env=env,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        stdout, stderr = proc.communicate()
    rc = proc.returncode
    try:
        with open(log_path, errors="replace") as f:
            log = f.read()
    except OSError:
        log = ""
    log += stderr.decode("utf-8", "replace")
    for p in os.listdir(tmpdir):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(tmpdir, p))
    with contextlib.suppress(OSError):
        os.rmdir(tmpdir)

    result = None
    if not timed_out:
        for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                except ValueError:
                    result = None
                break
    if isinstance(result, dict) and "ok" in result:
        result.setdefault("returncode", rc)
        return result
    tail = _tail(log)
    err = f"timeout after {timeout}s\n{tail}" if timed_out else tail or f"no output (returncode {rc})"
    out = {"ok": False, "error": err, "returncode": rc, "log_errors": _error_lines(log)[-20:]}
    if rc is not None and rc < 0:
        try:
            out["signal"] = signal.Signals(-rc).name
        except ValueError:
            out["signal"] = -rc
    if timed_out:
        out["timeout"] = True
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv))
