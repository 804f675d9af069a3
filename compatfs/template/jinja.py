"""A parsed Go template as a Jinja macro body over Ollama's data (`data`),
checked as it is emitted: every value has a type, and what Go would do
differently from Jinja with it (format a value other than a string, number,
bool or nil; count or slice a string, which Go does in bytes; compare values
of different kinds; call a function Ollama's templates have and this does
not translate) is `Refused`.

Go's variables live in a namespace (`ns.vN`, one slot per declaration, so a
loop's assignment reaches the variable as in Go); dot is whatever Jinja
expression Go's dot stands for at that point.  Every tag trims the text
around it, and the template's own text is only ever emitted as a string
literal, so llama.cpp's trim_blocks/lstrip_blocks change nothing.

Bounds: a range over the chat's messages or tools inside another range, and
a variable a loop grows from more than its own value, are refused (their
output would grow faster than the chat).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .data import MAPS, STRUCTS, List, Unknown
from .gotemplate import Action, Branch, Const, Dot, Field, Func, Jump, Pipe, Refused, Text

_ESC = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def lit(s: str) -> str:
    """A Jinja string literal of `s`."""
    return '"' + "".join(_ESC.get(c, c) for c in s) + '"'


@dataclass
class Val:
    expr: str
    type: object
    var: int | None = None      # the slot of the variable it reads, if it is one


def _name(t) -> str:
    return f"a list of {_name(t.elem)}" if isinstance(t, List) else {
        "str": "a string", "int": "an integer", "bool": "a bool", "nil": "nil", "any": "a value of Ollama's",
        "mixed": "a value of more than one type"}.get(t, f"a {t}")


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
    raise Refused(f"prints {_name(v.type)}, which Go formats its own way")


def truth(v: Val) -> str:
    """Jinja's truth of `v`, which is Go's for every type a value here has
    (an empty string, list or zero is false; a struct, a non-empty dict, true)."""
    if v.type == "any":
        raise Refused("tests the truth of a value of Ollama's this translation does not type")
    return f"({v.expr})"


def _basic(args: list[Val], fn: str) -> None:
    kinds = {a.type for a in args}
    if len(kinds) != 1 or not kinds <= {"str", "int", "bool"}:
        raise Refused(f"{fn} compares {' and '.join(sorted(_name(k) for k in kinds))}, "
                      "which Go refuses or compares its own way")


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
        for a in reversed(args[:-1]):      # Go's and/or: the first that decides, else the last
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
        raise Refused(f"len of {_name(args[0].type) if args else 'nothing'} (only lists: Go counts a string in bytes)")
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
    for i, a in enumerate(args):       # Go's Sprint: a space between two operands that are not strings
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
        parts.append(lit(fmt[pos:m.start()]))
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
            raise Refused(f"printf %{verb} of {_name(a.type)}")
        parts.append(printed(a))
    parts.append(lit(fmt[pos:]))
    if rest or fmt.endswith("%"):
        raise Refused("printf with more arguments than verbs")
    return Val("(" + " ~ ".join(parts) + ")", "str")


def _unlit(expr: str) -> str:
    back = {v: k for k, v in _ESC.items()}
    return re.sub(r'\\.', lambda m: back[m.group()], expr[1:-1])


def _current_date(args: list[Val]) -> Val:
    return Val('strftime_now("%Y-%m-%d")', "str")


# Go's and Ollama's template functions, as Jinja.  Ollama's `json`,
# `yesterdayDate` and `toTypeScriptType` and Go's `html`, `js`, `urlquery`,
# `call` are not here: a template that calls them is refused.
FUNCS = {
    "eq": _eq, "ne": _compare("!=", "ne"), "lt": _compare("<", "lt"), "le": _compare("<=", "le"),
    "gt": _compare(">", "gt"), "ge": _compare(">=", "ge"), "and": _logic("and"), "or": _logic("or"), "not": _not,
    "len": _len, "slice": _slice, "index": _index, "print": _print, "printf": _printf,
    "currentDate": _current_date,
}
_MESSAGES_ONLY = {"currentDate"}    # Ollama renders the older form's last exchange without its functions


@dataclass
class _Scope:
    names: dict[str, int] = field(default_factory=dict)


def _jumps(node) -> bool:
    """Whether `node` may break or continue the range it is in."""
    if isinstance(node, Jump):
        return True
    if isinstance(node, Branch):
        return any(_jumps(n) for n in (node.body if node.kind != "range" else []) + (node.orelse or []))
    return False


class Emitter:
    """Emits one Go template's tree as Jinja statements over `root` (a struct
    name of `data.STRUCTS`) held in the Jinja variable `R`."""

    def __init__(self, root: str, legacy: bool, grown: set[int] | None = None):
        self.root, self.legacy = root, legacy
        self.out: list[str] = []
        self.scopes: list[_Scope] = [_Scope()]
        self.types: dict[int, object] = {}
        self.slots = 0
        self.loops: list[int] = []           # the slot count when each enclosing range began
        self.rooted_loop = False
        self.loop_assigned: set[int] = set()  # outer variables a loop assigns
        self.grown = grown or set()           # (from a first pass) the same
        self.tainted: set[int] = set()        # variables a loop gives what grows with it
        self.jumps: list[int] = []           # each enclosing range's break/continue flags (ns.bN, ns.cN)
        self.flags: list[int] = []           # every range's flags

    # -- values --------------------------------------------------------------
    def field(self, base: Val, names: tuple[str, ...]) -> Val:
        v = base
        for n in names:
            t = v.type
            if not isinstance(t, str) or t not in STRUCTS:
                raise Refused(f"the field .{n} of {_name(t)}")
            fields = STRUCTS[t]
            if n not in fields:
                if t in MAPS:
                    v = Val("none", "nil")
                    continue
                raise Refused(f"Ollama's {t} has no field .{n}")
            known = fields[n]
            if isinstance(known, Unknown):
                raise Refused(f"uses .{n}, but {known.why}")
            v = Val(f'{v.expr}["{n}"]', fields[n])
        return v

    def lookup(self, var: str) -> int:
        for s in reversed(self.scopes):
            if var in s.names:
                return s.names[var]
        raise Refused(f"the variable {var} is not declared")

    def operand(self, node, dot: Val) -> Val:
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Const):
            if isinstance(node.value, bool):
                return Val("true" if node.value else "false", "bool")
            if isinstance(node.value, int):
                return Val(str(node.value), "int")
            if node.value is None:
                raise Refused("nil as a value")
            return Val(lit(node.value), "str")
        if isinstance(node, Field):
            if node.var is None:
                return self.field(dot, node.names)
            if node.var == "$":
                return self.field(Val("R", self.root), node.names)
            slot = self.lookup(node.var)
            return self.field(Val(f"ns.v{slot}", self.types[slot], slot), node.names)
        if isinstance(node, Pipe):
            if node.decl:
                raise Refused("a declaration inside ( )")
            return self.pipe(node, dot)
        if isinstance(node, Func):
            return self.call(node.name, [])
        raise Refused(f"unexpected {node!r}")

    def call(self, name: str, args: list[Val]) -> Val:
        fn = FUNCS.get(name)
        if fn is None or (self.legacy and name in _MESSAGES_ONLY):
            raise Refused(f"calls {name}, which is not translated")
        return fn(args)

    def pipe(self, pipe: Pipe, dot: Val) -> Val:
        value: Val | None = None
        for cmd in pipe.cmds:
            head, rest = cmd[0], cmd[1:]
            if isinstance(head, Func):
                args = [self.operand(a, dot) for a in rest] + ([value] if value is not None else [])
                value = self.call(head.name, args)
            else:
                if rest or value is not None:
                    raise Refused("arguments given to a value that is not a function")
                value = self.operand(head, dot)
        assert value is not None
        return value

    def reads(self, node, dot: Val) -> list[int]:
        """The variable slots a pipeline's operands read (dot's too, where dot is one)."""
        if isinstance(node, Pipe):
            return [s for cmd in node.cmds for a in cmd for s in self.reads(a, dot)]
        if isinstance(node, Field) and node.var not in (None, "$"):
            return [self.lookup(node.var)]
        if isinstance(node, Dot) and dot.var is not None:
            return [dot.var]
        return []

    def carry(self, slot: int, pipe: Pipe, dot: Val) -> None:
        """Inside a range: `slot` takes the value of `pipe`.  A variable that
        grows with the loop (an outer one the loop assigns) may take its own
        value once and nothing else that grows with it; a variable given what
        grows grows too."""
        if not self.loops:
            return
        hot = [s for s in self.reads(pipe, dot) if s in self.grown or s in self.tainted]
        if slot < self.loops[-1]:
            self.loop_assigned.add(slot)
            if len(hot) > 1 or any(s != slot for s in hot):
                raise Refused("a loop assigns a variable from more than its own value: "
                              "its output could grow without bound")
        elif hot:
            self.tainted.add(slot)

    # -- statements ------------------------------------------------------------
    def declare(self, name: str, t) -> int:
        if name == "$":
            raise Refused("$ cannot be declared")
        slot = self.slots
        self.slots += 1
        self.scopes[-1].names[name] = slot
        self.types[slot] = t
        return slot

    def set_var(self, pipe: Pipe, v: Val, dot: Val) -> int:
        name = pipe.decl[0]
        if not pipe.assign:
            slot = self.declare(name, v.type)
        else:
            slot = self.lookup(name)
            if self.types[slot] != v.type:
                raise Refused(f"{name} is given {_name(v.type)} after {_name(self.types[slot])}")
        self.carry(slot, pipe, dot)
        self.out.append(f"{{%- set ns.v{slot} = {v.expr} -%}}")
        return slot

    def nodes(self, nodes: list, dot: Val) -> None:
        guards = 0
        for n in nodes:
            if isinstance(n, Text):
                self.out.append(f"{{{{- {lit(n.text)} -}}}}")
            elif isinstance(n, Action):
                v = self.pipe(n.pipe, dot)
                if n.pipe.decl:
                    self.set_var(n.pipe, v, dot)
                else:
                    self.out.append(f"{{{{- {printed(v)} -}}}}")
            elif isinstance(n, Jump):
                if not self.loops:
                    raise Refused(f"{{{{ {n.kind} }}}} outside a range")
                flag = self.jumps[-1]
                self.out.append(f"{{%- set ns.{'b' if n.kind == 'break' else 'c'}{flag} = true -%}}")
            elif isinstance(n, Branch):
                self.branch(n, dot)
            if self.loops and _jumps(n):     # what follows runs only if the loop goes on
                flag = self.jumps[-1]
                self.out.append(f"{{%- if not (ns.b{flag} or ns.c{flag}) -%}}")
                guards += 1
        self.out += ["{%- endif -%}"] * guards

    def block(self, nodes: list, dot: Val) -> None:
        self.scopes.append(_Scope())
        self.nodes(nodes, dot)
        self.scopes.pop()

    def branch(self, b: Branch, dot: Val) -> None:
        self.scopes.append(_Scope())     # what the pipeline declares lasts to the branch's end
        if b.kind == "range":
            self.range(b, dot)
        else:
            v = self.pipe(b.pipe, dot)
            if b.pipe.decl:
                if len(b.pipe.decl) != 1:
                    raise Refused(f"{b.kind} declares one variable at most")
                slot = self.set_var(b.pipe, v, dot)
                v = Val(f"ns.v{slot}", v.type, slot)
            elif b.kind == "with":
                slot = self.slots
                self.slots += 1
                self.carry(slot, b.pipe, dot)
                self.out.append(f"{{%- set ns.v{slot} = {v.expr} -%}}")
                v = Val(f"ns.v{slot}", v.type, slot)
            self.out.append(f"{{%- if {truth(v)} -%}}")
            self.block(b.body, v if b.kind == "with" else dot)
            if b.orelse is not None:
                self.out.append("{%- else -%}")
                self.block(b.orelse, dot)
            self.out.append("{%- endif -%}")
        self.scopes.pop()

    def range(self, b: Branch, dot: Val) -> None:
        over = self.pipe(b.pipe, dot)
        t = over.type
        if not isinstance(t, List):
            raise Refused(f"ranges over {_name(t)} (only lists are translated)")
        if t.rooted and self.loops:
            raise Refused("ranges over the chat inside another range: its output could grow without bound")
        it = f"it{self.slots}"
        self.slots += 1
        self.out.append(f"{{%- if ({over.expr})|length > 0 -%}}")
        jumps = any(_jumps(n) for n in b.body)
        if jumps:       # (Jinja's own break and continue lose what the iteration printed in llama.cpp)
            self.out.append(f"{{%- set ns.b{self.slots} = false -%}}")
        self.out.append(f"{{%- for {it} in {over.expr} -%}}")
        if jumps:
            self.out.append(f"{{%- if not ns.b{self.slots} -%}}{{%- set ns.c{self.slots} = false -%}}")
        self.jumps.append(self.slots)
        self.flags.append(self.slots)
        self.slots += 1
        self.loops.append(self.slots)
        self.scopes.append(_Scope())
        elem = Val(it, t.elem)
        if len(b.pipe.decl) == 2:
            i = self.declare(b.pipe.decl[0], "int")
            e = self.declare(b.pipe.decl[1], t.elem)
            self.out.append(f"{{%- set ns.v{i} = loop.index0 -%}}{{%- set ns.v{e} = {it} -%}}")
        elif len(b.pipe.decl) == 1:
            if b.pipe.assign:
                raise Refused("range assigns to a variable rather than declaring it")
            e = self.declare(b.pipe.decl[0], t.elem)
            self.out.append(f"{{%- set ns.v{e} = {it} -%}}")
        self.nodes(b.body, elem)
        self.scopes.pop()
        self.loops.pop()
        self.jumps.pop()
        if jumps:
            self.out.append("{%- endif -%}")
        self.out.append("{%- endfor -%}")
        if b.orelse is not None:
            self.out.append("{%- else -%}")
            self.block(b.orelse, dot)
        self.out.append("{%- endif -%}")


def macro(name: str, nodes: list, root: str, legacy: bool) -> str:
    """The Jinja macro `name(R)` that renders `nodes` over the data `R`."""
    first = Emitter(root, legacy)
    first.nodes(nodes, Val("R", root))
    e = Emitter(root, legacy, first.loop_assigned)     # again, knowing which variables loops grow
    e.nodes(nodes, Val("R", root))
    slots = ", ".join([f"v{i}=none" for i in range(e.slots)] + [f"b{i}=false, c{i}=false" for i in e.flags]) or "v=none"
    return (f"{{%- macro {name}(R) -%}}\n{{%- set ns = namespace({slots}) -%}}\n"
            + "\n".join(e.out) + "\n{%- endmacro -%}\n")
