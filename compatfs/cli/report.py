"""`compatfs inspect`: what a translation changes, as a report."""
from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as DT
from gguf import Keys

from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..format.values import Value
from ..view.opcache import OpCache
from ..sources.base import SourceError
from ..sources.choose import open_source
from ..view.catalog import build_view, classify, translation_enabled
from ..names import MMPROJ_FILE


def resolve_target(target: str, source: str | None, clip: bool) -> Path:
    """A FILE path, or the name of a folder of the source (a model, or an
    Ollama blob by digest), to the GGUF it means: the folder's projector
    GGUF with `clip` where it has one, else its model GGUF."""
    if Path(target).is_file():
        return Path(target)
    src = open_source(source)
    name = src.name(target)
    listing = src.scan()
    folder = listing.folders.get(name)
    if folder is None:
        why = listing.skipped.get(name)
        raise SourceError(f"no model {name} in {src.root}" + (f" ({why})" if why else ""))
    return folder.projector if clip and folder.projector else folder.model


def _show(v: Value) -> object:
    etype = v.element_type
    if etype is not None:
        return f"[{etype.name} x {v.count}]"
    value = v.decode()
    return value if not isinstance(value, str) or len(value) <= 60 else value[:57] + "..."


def _type_name(dtype: DT | int) -> str:
    return dtype.name if isinstance(dtype, DT) else f"ggml type {dtype}"


def describe(path: Path, kind: str) -> dict:
    """The translation of the `kind` view of the GGUF at `path`, as plain data."""
    src = SourceGGUF(path)
    info = classify(src, translation_enabled())
    tr = info.clip if kind == MMPROJ_FILE else info.text
    try:
        view = build_view(info, kind, OpCache())
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    after = src.architecture
    added: dict[str, object] = {}
    changed: dict[str, dict[str, object]] = {}
    removed: list[str] = []
    renamed: dict[str, str] = {}
    hidden: list[str] = []
    ops: dict[str, dict[str, object]] = {}
    if view.spec is not None:
        kvs = dict(view.spec.kvs)
        arch = kvs.get(Keys.General.ARCHITECTURE)
        after = arch.decode() if arch else None
        for key, v in kvs.items():
            old = src.kvs.get(key)
            if old is None:
                added[key] = _show(v)
            elif old.vtype != v.vtype or bytes(old.payload) != bytes(v.payload):
                changed[key] = {"before": _show(old), "after": _show(v)}
        removed = [k for k in src.kvs if k not in kvs]
        used: set[str] = set()
        for t in view.spec.tensors:
            if t.op is not None:
                used.update(i.name for i in t.op.inputs)
                ops[t.name] = {"op": t.op.description, "shape": list(t.shape), "dtype": _type_name(t.dtype),
                               "bytes": t.nbytes}
            elif t.source is not None:
                used.add(t.source.name)
                if t.source.name != t.name:
                    renamed[t.source.name] = t.name
                if t.nbytes != t.source.nbytes:
                    ops[t.name] = {"op": f"rows of {t.source.name}", "shape": list(t.shape),
                                   "dtype": _type_name(t.dtype), "bytes": t.nbytes}
        hidden = [n for n in src.tensors if n not in used]
    return {"file": str(path), "view": kind, "handler": tr.name if tr else None,
            "detected_by": tr.detect.text if tr else None,
            "architecture": {"before": src.architecture, "after": after},
            "size": {"blob": src.size, "view": view.size},
            "kv": {"added": added, "changed": changed, "removed": removed},
            "tensors": {"renamed": renamed, "hidden": hidden, "ops": ops}}


def format_report(r: dict) -> str:
    lines = [f"{r['file']} as {r['view']}",
             f"  handler:      {r['handler'] or 'none (served unchanged)'}"]
    if r["detected_by"]:
        lines.append(f"  detected by:  {r['detected_by']}")
    a = r["architecture"]
    lines.append(f"  architecture: {a['before']} -> {a['after']}")
    lines.append(f"  size:         {r['size']['blob']} bytes blob, {r['size']['view']} bytes view")
    kv, ts = r["kv"], r["tensors"]
    for key, v in kv["added"].items():
        lines.append(f"  + {key} = {v!r}")
    for key, v in kv["changed"].items():
        lines.append(f"  ~ {key}: {v['before']!r} -> {v['after']!r}")
    for key in kv["removed"]:
        lines.append(f"  - {key}")
    for old, new in ts["renamed"].items():
        lines.append(f"  tensor {old} -> {new}")
    for name, op in ts["ops"].items():
        lines.append(f"  tensor {name} = {op['op']} {op['dtype']} {op['shape']} ({op['bytes']} bytes)")
    if ts["hidden"]:
        lines.append(f"  hidden tensors ({len(ts['hidden'])}): " + ", ".join(ts["hidden"][:8])
                     + (" ..." if len(ts["hidden"]) > 8 else ""))
    return "\n".join(lines)
