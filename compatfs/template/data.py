"""Ollama's template data, as types the translation checks a template
against, and as the Jinja that builds it from what llama.cpp passes a chat
template (`messages`, `tools`, `enable_thinking`).

Types: "str", "int", "bool", "nil" (Go's nil: what a missing key of the
data gives), "any" (a value whose Go formatting or comparison the
translation does not reproduce: nothing may be done with it), "mixed" (of
more than one type: only tested for truth), `List(elem, rooted)` (rooted: a
list of the whole chat, which a loop inside another loop may not range over)
and a struct's name.  A struct is a dict in Jinja, its keys Go's field names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unknown:
    """A field whose value llama.cpp does not give: using it is refused, for `why`."""

    why: str


_THINK_SET = Unknown("llama.cpp does not tell whether a request set thinking")
_THINK_LEVEL = Unknown("llama.cpp does not pass Ollama's thinking level")


@dataclass(frozen=True)
class List:
    elem: object
    rooted: bool = False


# Struct -> field -> type.  "root" is the data of the Messages form, "legacy"
# that of the older Prompt/Response form: Go maps, whose missing keys are nil.
STRUCTS: dict[str, dict[str, object]] = {
    "root": {
        "System": "str",
        "Messages": List("message", True),
        "Tools": List("tool", True),
        "Response": "str",
        "Think": "bool",
        "ThinkLevel": _THINK_LEVEL,
        "IsThinkSet": _THINK_SET,
    },
    "legacy": {
        "System": "str",
        "Prompt": "str",
        "Response": "str",
        "Think": "bool",
        "ThinkLevel": _THINK_LEVEL,
        "IsThinkSet": _THINK_SET,
    },
    "message": {
        "Role": "str",
        "Content": "str",
        "Thinking": "str",
        "Images": "any",
        "ToolCalls": List("toolcall"),
        "ToolName": "str",
        "ToolCallID": "str",
    },
    "toolcall": {"ID": "str", "Function": "callfunction"},
    "callfunction": {"Index": "any", "Name": "str", "Arguments": "any"},
    "tool": {"Type": "str", "Items": "any", "Function": "toolfunction"},
    "toolfunction": {"Name": "str", "Description": "str", "Parameters": "parameters"},
    "parameters": {"Type": "str", "Defs": "any", "Items": "any", "Required": List("str"), "Properties": "any"},
}
MAPS = ("root", "legacy")  # Go maps: a missing key is nil, not an error


def _s(expr: str) -> str:
    """`expr` where it is a string, else ""."""
    return f'({expr} if {expr} is defined and {expr} is string else "")'


# The chat as Ollama collates it (`C.done`: consecutive messages of one role
# but "tool" joined with a blank line; `C.sys`: every system message), after
# the model's system layer (SYSTEM, a Jinja string) is put first where the
# chat does not open with a system message; and its tools (`K.tools`).
PROLOGUE = """\
{%- set C = namespace(done=[], cur=none, sys=[]) -%}
{%- set chat = messages if messages is defined and messages is not none else [] -%}
{%- if SYSTEM != "" and chat|length > 0 and chat[0].role != "system" -%}
{%- set chat = [{"role": "system", "content": SYSTEM}] + chat -%}
{%- endif -%}
{%- for m in chat -%}
{%- set content = CONTENT -%}
{%- if m.role == "system" -%}{%- set C.sys = C.sys + [content] -%}{%- endif -%}
{%- if C.cur is not none and C.cur.Role == m.role and m.role != "tool" -%}
{%- set C.cur = {"Role": C.cur.Role, "Content": C.cur.Content ~ "\\n\\n" ~ content, "Thinking": C.cur.Thinking, \
"Images": [], "ToolCalls": C.cur.ToolCalls, "ToolName": C.cur.ToolName, "ToolCallID": C.cur.ToolCallID} -%}
{%- else -%}
{%- if C.cur is not none -%}{%- set C.done = C.done + [C.cur] -%}{%- endif -%}
{%- set T = namespace(calls=[]) -%}
{%- if m.tool_calls is defined and m.tool_calls is not none and m.tool_calls is not string -%}
{%- for tc in m.tool_calls -%}
{%- set T.calls = T.calls + [{"ID": CALL_ID, "Function": {"Index": 0, "Name": CALL_NAME, \
"Arguments": tc.function.arguments}}] -%}
{%- endfor -%}
{%- endif -%}
{%- set C.cur = {"Role": m.role, "Content": content, "Thinking": THINKING, "Images": [], "ToolCalls": T.calls, \
"ToolName": TOOL_NAME, "ToolCallID": CALL_FOR} -%}
{%- endif -%}
{%- endfor -%}
{%- if C.cur is not none -%}{%- set C.done = C.done + [C.cur] -%}{%- endif -%}
{%- set K = namespace(tools=[]) -%}
{%- if tools is defined and tools is not none and tools is not string -%}
{%- for t in tools -%}
{%- set f = t.function if t.function is defined and t.function is mapping else {} -%}
{%- set p = f.parameters if f.parameters is defined and f.parameters is mapping else {} -%}
{%- set K.tools = K.tools + [{"Type": TOOL_TYPE, "Items": none, "Function": {"Name": FN_NAME, \
"Description": FN_DESC, "Parameters": {"Type": P_TYPE, "Defs": none, "Items": none, \
"Required": (p.required if p.required is defined and p.required is not none else []), "Properties": none}}}] -%}
{%- endfor -%}
{%- endif -%}
""".replace("\\\n", "")
for _name, _expr in {
    "CONTENT": "m.content",
    "THINKING": "m.reasoning_content",
    "TOOL_NAME": "m.name",
    "CALL_FOR": "m.tool_call_id",
    "CALL_ID": "tc.id",
    "CALL_NAME": "tc.function.name",
    "TOOL_TYPE": "t.type",
    "FN_NAME": "f.name",
    "FN_DESC": "f.description",
    "P_TYPE": "p.type",
}.items():
    PROLOGUE = PROLOGUE.replace(_name, _s(_expr))

# Ollama's `think` as llama.cpp's `enable_thinking` (set by a request's
# chat_template_kwargs or llama-server's reasoning switch).
# llama-server passes it always (false unless the request or the template's
# own detection of thinking turns it on, as Ollama turns `think` on for a
# model whose template thinks), so whether a request set it (Ollama's
# `.IsThinkSet`) or a level (`.ThinkLevel`) is not known: a template that
# asks is refused.
THINK = "(enable_thinking is defined and enable_thinking is true)"
