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

from dataclasses import dataclass, field

from .data import MAPS, STRUCTS, List, Unknown
from .funcs import FUNCS, MESSAGES_ONLY, Val, lit, printed, truth, type_name
from .gotemplate import Action, Branch, Const, Dot, Field, Func, Jump, Pipe, Refused, Text


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
        self.loops: list[int] = []  # the slot count when each enclosing range began
        self.rooted_loop = False
        self.loop_assigned: set[int] = set()  # outer variables a loop assigns
        self.grown = grown or set()  # (from a first pass) the same
        self.tainted: set[int] = set()  # variables a loop gives what grows with it
        self.jumps: list[int] = []  # each enclosing range's break/continue flags (ns.bN, ns.cN)
        self.flags: list[int] = []  # every range's flags

    # -- values --------------------------------------------------------------
    def field(self, base: Val, names: tuple[str, ...]) -> Val:
        v = base
        for n in names:
            t = v.type
            if not isinstance(t, str) or t not in STRUCTS:
                raise Refused(f"the field .{n} of {type_name(t)}")
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
        if fn is None or (self.legacy and name in MESSAGES_ONLY):
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
                raise Refused(
                    "a loop assigns a variable from more than its own value: its output could grow without bound"
                )
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
                raise Refused(f"{name} is given {type_name(v.type)} after {type_name(self.types[slot])}")
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
            if self.loops and _jumps(n):  # what follows runs only if the loop goes on
                flag = self.jumps[-1]
                self.out.append(f"{{%- if not (ns.b{flag} or ns.c{flag}) -%}}")
                guards += 1
        self.out += ["{%- endif -%}"] * guards

    def block(self, nodes: list, dot: Val) -> None:
        self.scopes.append(_Scope())
        self.nodes(nodes, dot)
        self.scopes.pop()

    def branch(self, b: Branch, dot: Val) -> None:
        self.scopes.append(_Scope())  # what the pipeline declares lasts to the branch's end
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
            raise Refused(f"ranges over {type_name(t)} (only lists are translated)")
        if t.rooted and self.loops:
            raise Refused("ranges over the chat inside another range: its output could grow without bound")
        it = f"it{self.slots}"
        self.slots += 1
        self.out.append(f"{{%- if ({over.expr})|length > 0 -%}}")
        jumps = any(_jumps(n) for n in b.body)
        if jumps:  # (Jinja's own break and continue lose what the iteration printed in llama.cpp)
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
    e = Emitter(root, legacy, first.loop_assigned)  # again, knowing which variables loops grow
    e.nodes(nodes, Val("R", root))
    slots = ", ".join([f"v{i}=none" for i in range(e.slots)] + [f"b{i}=false, c{i}=false" for i in e.flags]) or "v=none"
    return (
        f"{{%- macro {name}(R) -%}}\n{{%- set ns = namespace({slots}) -%}}\n"
        + "\n".join(e.out)
        + "\n{%- endmacro -%}\n"
    )
