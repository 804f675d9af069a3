"""An Ollama template layer (and system layer) as one Jinja chat template
that renders each chat as Ollama renders it:

- the model's system layer is the chat's first message where the chat does
  not open with a system message, and its messages layer (a Modelfile's
  MESSAGEs) follows it, before the chat's own messages;
- consecutive messages of one role (but tool results) are one, joined by a
  blank line, and `.System` is every system message joined so;
- a template that names `.Messages` (its fields or variables, in any case) is
  rendered once over the chat; any other is rendered once per exchange
  (system, prompt, response: a system message after a prompt or response,
  or a user message after a response, starts the next), the last exchange
  only up to the template's first `.Response` action (a template without
  `.Response` gains `{{ .Response }}` at its end).

Anything else of a template, or of Go's rendering, that the translation does
not reproduce exactly is refused, with the reason in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .data import PROLOGUE, THINK
from .gotemplate import Action, Branch, Field, Pipe, Refused, parse
from .funcs import lit
from .jinja import macro

MAX_TEMPLATE = 64 << 10  # bytes; Ollama's templates take a few KB
MAX_SYSTEM = 256 << 10
MAX_MESSAGES = 256 << 10
# The roles a Modelfile's MESSAGE may have.
MESSAGE_ROLES = ("system", "user", "assistant")

# Where the chat gains the model's messages layer: after the system layer's
# message, before the chat's own (as Ollama's chat handler joins them), in
# every chat that has messages.
_SYSTEM_FIRST = """\
{%- if SYSTEM != "" and chat|length > 0 and chat[0].role != "system" -%}
{%- set chat = [{"role": "system", "content": SYSTEM}] + chat -%}
{%- endif -%}
"""
_WITH_MESSAGES = """\
{%- if chat|length > 0 -%}
{%- set chat = ([{"role": "system", "content": SYSTEM}] if SYSTEM != "" and chat[0].role != "system" else []) \
+ MESSAGES + chat -%}
{%- endif -%}
""".replace("\\\n", "")


@dataclass(frozen=True)
class ChatTemplate:
    """The Jinja translation (None: none), or why there is none."""

    jinja: str | None = None
    reason: str | None = None


def names(nodes: list) -> set[str]:
    """The field and variable names the pipelines of `nodes` mention, lower case
    (what decides the template's form)."""
    out: set[str] = set()

    def operand(a) -> None:
        if isinstance(a, Field):
            out.update(n.lower() for n in ((a.var,) if a.var else ()) + a.names)
        elif isinstance(a, Pipe):
            pipe(a)

    def pipe(p: Pipe) -> None:
        for cmd in p.cmds:
            for a in cmd:
                operand(a)

    def walk(ns: list) -> None:
        for n in ns:
            if isinstance(n, Action):
                pipe(n.pipe)
            elif isinstance(n, Branch):
                pipe(n.pipe)
                walk(n.body)
                walk(n.orelse or [])

    walk(nodes)
    return out


def up_to_response(nodes: list) -> list:
    """`nodes` up to and including the first action argument `.Response`
    (later arguments and commands of that action, and everything after, go;
    an action left with an empty command goes whole), as Ollama cuts a
    template for the last exchange."""
    cut = False

    def pipe(p: Pipe) -> Pipe | None:
        nonlocal cut
        cmds = []
        for cmd in p.cmds:
            args: list = []
            for a in cmd:
                if cut:
                    break
                if isinstance(a, Field) and a.var is None and "Response" in a.names:
                    cut = True
                    args.append(a)
                elif isinstance(a, Pipe):
                    q = pipe(a)
                    if q is not None:
                        args.append(q)
                else:
                    args.append(a)
            if not args:
                return None
            cmds.append(args)
        return Pipe(p.decl, p.assign, cmds)

    def walk(ns: list) -> list:
        out: list = []
        for n in ns:
            if cut:
                break
            if isinstance(n, Action):
                p = pipe(n.pipe)
                if p is not None:
                    out.append(Action(p))
            elif isinstance(n, Branch):
                body = walk(n.body)
                if n.orelse is not None and cut:
                    raise Refused("an else follows the .Response of its branch (Ollama fails to render it)")
                out.append(Branch(n.kind, n.pipe, body, walk(n.orelse) if n.orelse is not None else None))
            else:
                out.append(n)
        return out

    return walk(nodes)


def _think(used: set[str]) -> str:
    return '"Think": ' + (THINK if "think" in used else "false")


_LEGACY = """\
{%- set L = namespace(system="", prompt="", response="") -%}
{%- for m in C.done -%}
{%- if (m.Role == "system" and (L.prompt != "" or L.response != "")) or (m.Role == "user" and L.response != "") -%}
{{- exchange(DATA) -}}
{%- set L.system = "" -%}{%- set L.prompt = "" -%}{%- set L.response = "" -%}
{%- endif -%}
{%- if m.Role == "system" -%}{%- set L.system = m.Content -%}
{%- elif m.Role == "user" -%}{%- set L.prompt = m.Content -%}
{%- elif m.Role == "assistant" -%}{%- set L.response = m.Content -%}
{%- endif -%}
{%- endfor -%}
{{- last(DATA) -}}
"""


def _jinja(template: str, system: str, messages: list[tuple[str, str]]) -> str:
    nodes = parse(template)
    used = names(nodes)
    sys_lit = lit(system)
    head = PROLOGUE.replace("SYSTEM", sys_lit)
    if messages:  # (each part filled on its own: no text of a layer is read as a placeholder)
        listed = ", ".join(f'{{"role": {lit(role)}, "content": {lit(content)}}}' for role, content in messages)
        before, after = _WITH_MESSAGES.split("MESSAGES")
        with_them = before.replace("SYSTEM", sys_lit) + f"[{listed}]" + after.replace("SYSTEM", sys_lit)
        pre, _, post = PROLOGUE.partition(_SYSTEM_FIRST)
        head = pre.replace("SYSTEM", sys_lit) + with_them + post.replace("SYSTEM", sys_lit)
    if "messages" in used:
        call = (
            '{%- set S = C.sys|join("\\n\\n") -%}\n'
            f'{{{{- ollama({{"System": S, "Messages": C.done, "Tools": K.tools, "Response": "", {_think(used)}}}) -}}}}\n'
        )
        return head + macro("ollama", nodes, "root", False) + call
    if "response" not in used:
        nodes = nodes + [Action(Pipe(cmds=[[Field(("Response",))]]))]
    data = f'{{"System": L.system, "Prompt": L.prompt, "Response": L.response, {_think(used)}}}'
    return (
        head
        + macro("exchange", nodes, "legacy", True)
        + macro("last", up_to_response(nodes), "legacy", True)
        + _LEGACY.replace("DATA", data)
    )


def parse_messages(layer: bytes) -> list[tuple[str, str]]:
    """The (role, content) of each message of a messages layer (a Modelfile's
    MESSAGEs, as Ollama stores them: a JSON list of {"role", "content"});
    ValueError saying why it cannot be used."""
    if len(layer) > MAX_MESSAGES:
        raise ValueError(f"the messages layer is {len(layer)} bytes, more than the {MAX_MESSAGES} taken")
    try:
        doc = json.loads(layer)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"the messages layer is not JSON ({e})") from None
    if not isinstance(doc, list):
        raise ValueError("the messages layer is not a list of messages")
    out = []
    for m in doc:
        if not isinstance(m, dict) or m.get("role") not in MESSAGE_ROLES or not isinstance(m.get("content"), str):
            raise ValueError("a message of the messages layer is not a role (system, user or assistant) and a text")
        if any(v not in (None, "", [], {}) for k, v in m.items() if k not in ("role", "content")):
            raise ValueError("a message of the messages layer has more than a role and a text")
        out.append((m["role"], m["content"]))
    return out


def translate(template: bytes, system: bytes = b"", messages: list[tuple[str, str]] | None = None) -> ChatTemplate:
    """The Jinja chat template of a template layer (and the model's system
    layer, and the (role, content) of its messages layer: `parse_messages`),
    or why there is none."""
    listed = messages or []
    if len(template) > MAX_TEMPLATE:
        return ChatTemplate(reason=f"the template is {len(template)} bytes, more than the {MAX_TEMPLATE} translated")
    if len(system) > MAX_SYSTEM:
        return ChatTemplate(reason=f"the system message is {len(system)} bytes, more than the {MAX_SYSTEM} taken")
    try:
        text, sys_text = template.decode("utf-8"), system.decode("utf-8")
    except UnicodeDecodeError:
        return ChatTemplate(reason="the template or system message is not UTF-8 text")
    try:
        return ChatTemplate(jinja=_jinja(text, sys_text, listed))
    except Refused as e:
        return ChatTemplate(reason=str(e))
    except RecursionError:
        return ChatTemplate(reason="the template nests too deeply")
