"""`compatfs inspect`: what the file a user opens holds beside its blob, as a
report: the translation of the blob's view and, for a model folder's
model.gguf, what the model's own layers add (its params layer's sampling
defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as DT
from gguf import Keys

from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..format.values import Value
from ..view.opcache import OpCache
from ..sources.base import SourceError
from ..tree import FileRef, Tree
from ..view.catalog import build_view, classify, translation_enabled
from ..names import MMPROJ_FILE, MODEL_FILE


@dataclass(frozen=True)
class Target:
    """The GGUF `inspect` describes: `path` (a file, or the blob behind a
    folder's file), the view `kind`, the KVs the folder's own layers add to
    it, and the file as a user opens it (`shown`)."""

    path: Path
    kind: str
    adds: tuple = ()
    shown: str = ""


def resolve_target(target: str, tree_of, clip: bool) -> Target:
    """A FILE path, or the name of a folder of the source (a model, or an
    Ollama blob by digest), to what it means: the folder's mmproj.gguf with
    `clip`, else its model.gguf, with what the model's layers add to it.
    `tree_of()` gives the `Tree` of the source (only asked for a name)."""
    kind = MMPROJ_FILE if clip else MODEL_FILE
    if Path(target).is_file():
        return Target(Path(target), kind, shown=target)
    tree: Tree = tree_of()
    name = tree.source.name(target)
    snap = tree.snapshot()
    if name not in snap.listing.folders:
        why = snap.listing.skipped.get(name)
        raise SourceError(f"no model {name} in {tree.source.root}" + (f" ({why})" if why else ""))
    ref = tree.lookup(f"{name}/{kind}")
    if not isinstance(ref, FileRef):
        raise FileNotFoundError(f"{name} has no projector view (no {kind})")
    return Target(ref.blob, kind, tree.views.sampling_kvs(kind, ref.params), f"{name}/{kind}")


def _show(v: Value) -> object:
    etype = v.element_type
    if etype is not None:
        return f"[{etype.name} x {v.count}]"
    value = v.decode()
    return value if not isinstance(value, str) or len(value) <= 60 else value[:57] + "..."


def _type_name(dtype: DT | int) -> str:
    return dtype.name if isinstance(dtype, DT) else f"ggml type {dtype}"


def describe(target: Target) -> dict:
    """What the file `target` means holds beside its GGUF, as plain data."""
    path, kind = target.path, target.kind
    src = SourceGGUF(path)
    info = classify(src, translation_enabled())
    tr = info.clip if kind == MMPROJ_FILE else info.text
    try:
        view = build_view(info, kind, OpCache(), target.adds)
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
                ops[t.name] = {
                    "op": t.op.description,
                    "shape": list(t.shape),
                    "dtype": _type_name(t.dtype),
                    "bytes": t.nbytes,
                }
            elif t.source is not None:
                used.add(t.source.name)
                if t.source.name != t.name:
                    renamed[t.source.name] = t.name
                if t.nbytes != t.source.nbytes:
                    ops[t.name] = {
                        "op": f"rows of {t.source.name}",
                        "shape": list(t.shape),
                        "dtype": _type_name(t.dtype),
                        "bytes": t.nbytes,
                    }
        hidden = [n for n in src.tensors if n not in used]
    return {
        "file": target.shown or str(path),
        "gguf": str(path),
        "view": kind,
        "layers_add": [key for key, _ in target.adds],
        "handler": tr.name if tr else None,
        "detected_by": tr.detect.text if tr else None,
        "architecture": {"before": src.architecture, "after": after},
        "size": {"blob": src.size, "view": view.size},
        "kv": {"added": added, "changed": changed, "removed": removed},
        "tensors": {"renamed": renamed, "hidden": hidden, "ops": ops},
    }


def format_report(r: dict) -> str:
    lines = [r["file"] if r["file"] != r["gguf"] else f"{r['file']} as {r['view']}"]
    if r["file"] != r["gguf"]:
        lines.append(f"  blob:         {r['gguf']}")
    unchanged = "none (served unchanged)" if not r["layers_add"] else "none (the blob's own keys and tensors)"
    lines.append(f"  handler:      {r['handler'] or unchanged}")
    if r["layers_add"]:
        lines.append(f"  its layers add: {', '.join(r['layers_add'])}")
    if r["detected_by"]:
        lines.append(f"  detected by:  {r['detected_by']}")
    a = r["architecture"]
    lines.append(f"  architecture: {a['before']} -> {a['after']}")
    lines.append(f"  size:         {r['size']['view']} bytes (the blob: {r['size']['blob']})")
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
        lines.append(
            f"  hidden tensors ({len(ts['hidden'])}): "
            + ", ".join(ts["hidden"][:8])
            + (" ..." if len(ts["hidden"]) > 8 else "")
        )
    return "\n".join(lines)
