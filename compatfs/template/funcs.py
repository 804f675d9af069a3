"""Go's values and template functions as Jinja expressions: a typed value
(`Val`), how Go prints it and tests its truth, and each function Ollama's
templates call (`FUNCS`), refusing (`Refused`) what Go would do differently
from Jinja with the arguments it is given."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .data import List
from .gotemplate import Refused

_ESC = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def lit(s: str) -> str:
    """A Jinja string literal of `s`."""
    return '"' + "".join(_ESC.get(c, c) for c in s) + '"'


@dataclass
class Val:
    expr: str
    type: object
    var: int | None = None  # the slot of the variable it reads, if it is one


def type_name(t) -> str:
    return (
        f"a list of {type_name(t.elem)}"
        if isinstance(t, List)
        else {
            "str": "a string",
            "int": "an integer",
            "bool": "a bool",
            "nil": "nil",
            "any": "a value of Ollama's",
            "mixed": "a value of more than one type",
        }.get(t, f"a {t}")
    )


def printed(v: Val) -> str:
    """The Jinja expression of how Go prints `v`."""
    if v.type == "str":
        return v.expr
    if v.type == "int":
        return f"({v.expr})|string"
    if v.type == "bool":
        return f'("true" if {v.expr} else "false")'
    if v.type == "nil":
        return lit("<no value>")
    raise Refused(f"prints {type_name(v.type)}, which Go formats its own way")


def truth(v: Val) -> str:
    """Jinja's truth of `v`, which is Go's for every type a value here has
    (an empty string, list or zero is false; a struct, a non-empty dict, true)."""
    if v.type == "any":
        raise Refused("tests the truth of a value of Ollama's this translation does not type")
    return f"({v.expr})"


def _basic(args: list[Val], fn: str) -> None:
    kinds = {a.type for a in args}
    if len(kinds) != 1 or not kinds <= {"str", "int", "bool"}:
        raise Refused(
            f"{fn} compares {' and '.join(sorted(type_name(k) for k in kinds))}, which Go refuses or compares its own way"
        )


def _eq(args: list[Val]) -> Val:
    if len(args) < 2:
        raise Refused("eq takes two arguments or more")
    _basic(args, "eq")
    return Val("(" + " or ".join(f"{args[0].expr} == {b.expr}" for b in args[1:]) + ")", "bool")


def _compare(op: str, fn: str):
    def compare(args: list[Val]) -> Val:
        if len(args) != 2:
            raise Refused(f"{fn} takes two arguments")
        _basic(args, fn)
        if args[0].type == "bool" and op != "!=":
            raise Refused(f"{fn} of bools, which Go refuses")
        if args[0].type == "str" and op != "!=":
            raise Refused(f"{fn} of strings, which llama.cpp's Jinja does not order")
        return Val(f"({args[0].expr} {op} {args[1].expr})", "bool")

    return compare


def _logic(fn: str):
    def logic(args: list[Val]) -> Val:
        if not args:
            raise Refused(f"{fn} takes arguments")
        out = args[-1]
        for a in reversed(args[:-1]):  # Go's and/or: the first that decides, else the last
            cond = truth(a) if fn == "or" else f"not {truth(a)}"
            out = Val(f"({a.expr} if {cond} else {out.expr})", a.type if a.type == out.type else "mixed")
        return out

    return logic


def _not(args: list[Val]) -> Val:
    if len(args) != 1:
        raise Refused("not takes one argument")
    return Val(f"(not {truth(args[0])})", "bool")


def _len(args: list[Val]) -> Val:
    if len(args) != 1 or not isinstance(args[0].type, List):
        raise Refused(
            f"len of {type_name(args[0].type) if args else 'nothing'} (only lists: Go counts a string in bytes)"
        )
    return Val(f"({args[0].expr}|length)", "int")


def _slice(args: list[Val]) -> Val:
    if not 2 <= len(args) <= 3 or not isinstance(args[0].type, List) or any(a.type != "int" for a in args[1:]):
        raise Refused("slice of anything but a list by integers (Go slices a string in bytes)")
    end = args[2].expr if len(args) == 3 else ""
    return Val(f"({args[0].expr}[{args[1].expr}:{end}])", args[0].type)


def _index(args: list[Val]) -> Val:
    if len(args) != 2 or not isinstance(args[0].type, List) or args[1].type != "int":
        raise Refused("index of anything but a list by an integer")
    lst = args[0].type
    assert isinstance(lst, List)
    return Val(f"({args[0].expr}[{args[1].expr}])", lst.elem)


def _print(args: list[Val]) -> Val:
    parts: list[str] = []
    for i, a in enumerate(args):  # Go's Sprint: a space between two operands that are not strings
        if i and a.type != "str" and args[i - 1].type != "str":
            parts.append(lit(" "))
        parts.append(printed(a))
    return Val("(" + (" ~ ".join(parts) or lit("")) + ")", "str")


_VERB = re.compile(r"%(.)")


def _printf(args: list[Val]) -> Val:
    if not args or not (args[0].type == "str" and args[0].expr.startswith('"')):
        raise Refused("printf without a constant format")
    fmt = _unlit(args[0].expr)
    parts, rest, pos = [], list(args[1:]), 0
    for m in _VERB.finditer(fmt):
        parts.append(lit(fmt[pos : m.start()]))
        pos = m.end()
        verb = m.group(1)
        if verb == "%":
            parts.append(lit("%"))
            continue
        if not rest:
            raise Refused("printf with fewer arguments than verbs")
        a = rest.pop(0)
        ok = {"s": ("str",), "d": ("int",), "v": ("str", "int", "bool"), "t": ("bool",)}.get(verb, ())
        if a.type not in ok:
            raise Refused(f"printf %{verb} of {type_name(a.type)}")
        parts.append(printed(a))
    parts.append(lit(fmt[pos:]))
    if rest or fmt.endswith("%"):
        raise Refused("printf with more arguments than verbs")
    return Val("(" + " ~ ".join(parts) + ")", "str")


def _unlit(expr: str) -> str:
    back = {v: k for k, v in _ESC.items()}
    return re.sub(r"\\.", lambda m: back[m.group()], expr[1:-1])


def _current_date(args: list[Val]) -> Val:
    return Val('strftime_now("%Y-%m-%d")', "str")


# Go's and Ollama's template functions, as Jinja.  Ollama's `json`,
# `yesterdayDate` and `toTypeScriptType` and Go's `html`, `js`, `urlquery`,
# `call` are not here: a template that calls them is refused.
FUNCS = {
    "eq": _eq,
    "ne": _compare("!=", "ne"),
    "lt": _compare("<", "lt"),
    "le": _compare("<=", "le"),
    "gt": _compare(">", "gt"),
    "ge": _compare(">=", "ge"),
    "and": _logic("and"),
    "or": _logic("or"),
    "not": _not,
    "len": _len,
    "slice": _slice,
    "index": _index,
    "print": _print,
    "printf": _printf,
    "currentDate": _current_date,
}
MESSAGES_ONLY = {"currentDate"}  # Ollama renders the older form's last exchange without its functions
