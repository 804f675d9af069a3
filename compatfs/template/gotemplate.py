"""Go's `text/template` syntax, as Ollama's template layers use it, parsed
into a small tree: text, actions (pipelines of commands), `if`/`range`/`with`
with their `else` (and `else if`/`else with`), `break`/`continue`, `$`
variables declared (`:=`) and assigned (`=`), comments and the trim markers
`{{- ` and ` -}}`.  What Go has and this subset does not (`define`,
`template`, `block`, chained fields on a parenthesised pipeline, character
and floating-point constants) is a `Refused` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


# What Ollama's templates nest is a few levels; the Jinja a deeper one makes
# would nest as deep in llama.cpp's parser.
MAX_DEPTH = 64


class Refused(ValueError):
    """A template that is not translated: the one-line reason why."""


# -- the tree ------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """`.A.B` (on dot) or `$x.A.B` (`var` the variable, "$" the data)."""

    names: tuple[str, ...]
    var: str | None = None


@dataclass(frozen=True)
class Dot:
    pass


@dataclass(frozen=True)
class Func:
    name: str


@dataclass(frozen=True)
class Const:
    value: str | int | bool | None  # None: Go's `nil`


@dataclass
class Pipe:
    """`decl := cmd | cmd ...` (`assign`: `=` rather than `:=`); each
    command a list of operands, the first one the function or value."""

    decl: list[str] = field(default_factory=list)
    assign: bool = False
    cmds: list[list] = field(default_factory=list)


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipe: Pipe


@dataclass
class Branch:
    """`if`, `range` or `with` (`kind`): `body` when the pipe holds, else `orelse`."""

    kind: str
    pipe: Pipe
    body: list
    orelse: list | None = None


@dataclass
class Jump:
    kind: str  # "break" or "continue"


# -- lexing ------------------------------------------------------------------

_SPACE = " \t\r\n"
_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n]+)
  | (?P<decl>:=)
  | (?P<op>[=|(),])
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?P<num>[-+]?(?:0[xXoObB])?[0-9][0-9a-fA-F_.eEpP+-]*)
  | (?P<var>\$[A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z_0-9]*)+)
  | (?P<dot>\.)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _go_string(lit: str) -> str:
    """The value of a Go interpreted string literal (quotes included)."""
    out, i, body = [], 0, lit[1:-1]
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2 : i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise Refused(f"the string {lit} has a bad escape")
            if e == "x" and int(digits, 16) > 0x7F:
                raise Refused(f"the string {lit} holds a byte that is not UTF-8 text")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        else:
            raise Refused(f"the string {lit} has an escape this translation does not take (\\{e})")
    return "".join(out)


def _tokens(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise Refused(f"unexpected {src[pos : pos + 10]!r} in an action")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def _actions(src: str) -> list[tuple[str, str]]:
    """The template as ("text", text) and ("action", inside of the braces),
    trim markers applied and comments dropped."""
    items: list[tuple[str, str]] = []
    pos = 0
    while True:
        start = src.find("{{", pos)
        text = src[pos:] if start < 0 else src[pos:start]
        if items and items[-1][0] == "trim":
            items.pop()
            text = text.lstrip(_SPACE)
        if start < 0:
            items.append(("text", text))
            break
        inner = start + 2
        if src.startswith("-", inner) and inner + 1 < len(src) and src[inner + 1] in _SPACE:
            text = text.rstrip(_SPACE)
            inner += 2
        items.append(("text", text))
        end, body = _action_end(src, inner)
        trim = end - 2 >= inner and src[end - 1] == "-" and src[end - 2] in _SPACE
        if trim:
            body = src[inner : end - 1]
        if body.startswith("/*"):  # a comment: right after the delimiter, to right before it
            if not (body.endswith("*/") or trim and body[:-1].endswith("*/")) or len(body) < 4:
                raise Refused("a comment that does not end with */ right before }}")
        elif body.lstrip(_SPACE).startswith("/*"):
            raise Refused("a comment that does not start right after {{")
        else:
            items.append(("action", body))
        if trim:
            items.append(("trim", ""))
        pos = end + 2
    return [(k, v) for k, v in items if k != "text" or v]


def _action_end(src: str, pos: int) -> tuple[int, str]:
    """Where the action starting at `pos` ends (the index of its `}}`), skipping strings."""
    i = pos
    while i < len(src):
        if src.startswith("}}", i):
            return i, src[pos:i]
        c = src[i]
        if c in "\"'`":
            close = src.find(c, i + 1) if c == "`" else _quote_end(src, i)
            if close < 0:
                raise Refused("a string in an action does not end")
            i = close + 1
            continue
        if src.startswith("/*", i):
            close = src.find("*/", i + 2)
            if close < 0:
                raise Refused("a comment does not end")
            i = close + 2
            continue
        i += 1
    raise Refused("an action does not end with }}")


def _quote_end(src: str, i: int) -> int:
    q, j = src[i], i + 1
    while j < len(src):
        if src[j] == "\\":
            j += 2
            continue
        if src[j] == q:
            return j
        if src[j] == "\n":
            return -1
        j += 1
    return -1


# -- parsing -------------------------------------------------------------------


class _Parser:
    def __init__(self, items: list[tuple[str, str]]):
        self.items, self.i, self.depth = items, 0, 0

    def until(self, ends: tuple[str, ...]) -> tuple[list, str, list[tuple[str, str]]]:
        """Nodes up to an action whose first word is in `ends`: (nodes, that
        word, the rest of its tokens); ("", []) at the end of the template."""
        nodes: list = []
        while self.i < len(self.items):
            kind, body = self.items[self.i]
            self.i += 1
            if kind == "text":
                nodes.append(Text(body))
                continue
            toks = _tokens(body)
            if not toks:
                raise Refused("an empty action {{ }}")
            word = toks[0][1] if toks[0][0] == "ident" else ""
            if word in ends:
                return nodes, word, toks[1:]
            if word in ("if", "range", "with"):
                nodes.append(self.branch(word, toks[1:]))
            elif word in ("break", "continue"):
                if len(toks) != 1:
                    raise Refused(f"{{{{ {word} }}}} takes nothing")
                nodes.append(Jump(word))
            elif word in ("end", "else"):
                raise Refused(f"an unexpected {{{{ {word} }}}}")
            elif word in ("define", "template", "block"):
                raise Refused(f"a template with {{{{ {word} }}}} is not translated")
            else:
                nodes.append(Action(_pipe(toks)))
        if ends:
            raise Refused("a template whose if, range or with has no {{ end }}")
        return nodes, "", []

    def branch(self, kind: str, toks: list) -> Branch:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Refused(f"the template nests if, range and with more than {MAX_DEPTH} deep")
        try:
            return self._branch(kind, toks)
        finally:
            self.depth -= 1

    def _branch(self, kind: str, toks: list) -> Branch:
        pipe = _pipe(toks, allow_two=kind == "range")
        body, word, rest = self.until(("else", "end"))
        orelse = None
        if word == "else":
            if rest:
                sub = rest[0][1] if rest[0][0] == "ident" else ""
                if sub not in ("if", "with"):
                    raise Refused("an {{ else }} followed by something other than if or with")
                return Branch(kind, pipe, body, [self.branch(sub, rest[1:])])
            orelse, word, rest = self.until(("end",))
            if rest:
                raise Refused("{{ end }} takes nothing")
        elif rest:
            raise Refused("{{ end }} takes nothing")
        return Branch(kind, pipe, body, orelse)


def _pipe(toks: list[tuple[str, str]], allow_two: bool = False) -> Pipe:
    pipe = Pipe()
    # A declaration: `$x :=`, `$x =`, or (range) `$i, $e :=`.
    for n in (4, 2) if allow_two else (2,):
        head = toks[:n]
        if n == 4 and len(toks) > 4 and [k for k, _ in head] == ["var", "op", "var", "decl"] and head[1][1] == ",":
            pipe.decl, toks = [head[0][1], head[2][1]], toks[4:]
            break
        if n == 2 and len(toks) > 2 and toks[0][0] == "var" and (toks[1][0] == "decl" or toks[1][1] == "="):
            if "." in toks[0][1]:
                raise Refused(f"{toks[0][1]} cannot be declared")
            pipe.decl, pipe.assign, toks = [toks[0][1]], toks[1][1] == "=", toks[2:]
            break
    pos, pipe.cmds = _commands(toks, 0, pipe.cmds)
    if pos != len(toks):
        raise Refused(f"unexpected {toks[pos][1]!r} in an action")
    if not pipe.cmds:
        raise Refused("an action with no command")
    return pipe


def _commands(toks: list, pos: int, cmds: list, depth: int = 0) -> tuple[int, list]:
    if depth > MAX_DEPTH:
        raise Refused(f"the template nests ( ) more than {MAX_DEPTH} deep")
    cmd: list = []
    while pos < len(toks):
        kind, text = toks[pos]
        if text == ")" and kind == "op":
            break
        if text == "|" and kind == "op":
            if not cmd:
                raise Refused("a pipeline with an empty command")
            cmds.append(cmd)
            cmd = []
            pos += 1
            continue
        if text == "(" and kind == "op":
            sub = Pipe()
            pos, sub.cmds = _commands(toks, pos + 1, [], depth + 1)
            if pos >= len(toks) or toks[pos][1] != ")":
                raise Refused("a ( without its )")
            if not sub.cmds:
                raise Refused("an empty ( )")
            pos += 1
            if pos < len(toks) and toks[pos][0] == "field":
                raise Refused("a field of a parenthesised pipeline is not translated")
            cmd.append(sub)
            continue
        cmd.append(_operand(kind, text))
        pos += 1
    if cmd:
        cmds.append(cmd)
    elif cmds:
        raise Refused("a pipeline ending in |")
    return pos, cmds


def _operand(kind: str, text: str):
    if kind == "field":
        return Field(tuple(text[1:].split(".")))
    if kind == "var":
        name, *names = text.split(".")
        return Field(tuple(names), name)
    if kind == "dot":
        return Dot()
    if kind == "str":
        return Const(_go_string(text))
    if kind == "raw":
        return Const(text[1:-1].replace("\r", ""))
    if kind == "num":
        if not re.fullmatch(r"[0-9]+", text) or (len(text) > 1 and text[0] == "0"):
            raise Refused(f"the number {text} is not translated (decimal integers only)")
        return Const(int(text))
    if kind == "ident":
        if text in ("true", "false"):
            return Const(text == "true")
        if text == "nil":
            return Const(None)
        if text in ("if", "range", "with", "else", "end", "break", "continue", "define", "template", "block"):
            raise Refused(f"{text} where a value belongs")
        return Func(text)
    if kind == "char":
        raise Refused(f"the character constant {text} is not translated")
    raise Refused(f"unexpected {text!r} in an action")


def parse(src: str) -> list:
    """The tree of a Go template (Refused when it is not in the subset)."""
    nodes, _, _ = _Parser(_actions(src)).until(())
    return nodes
