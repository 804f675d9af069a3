"""`compatfs ls` and `compatfs inspect`: what each model's files are, whether
stock llama.cpp loads them, and how each Modelfile layer is applied, as a
table or as JSON."""

from __future__ import annotations

import json

from . import CliError
from .locate import model_tree, open_named


def cmd_ls(args) -> int:
    from ..errors import GGUFError
    from ..router.layers import account
    from ..tree import Tree
    from ..view.catalog import BlobViews, translation_enabled

    store = open_named(args.source)
    views = BlobViews(translate=translation_enabled(args.no_translate))
    tree = Tree(store, views)
    snap = tree.snapshot()
    rows = []
    models = snap.models
    for name in sorted(models):
        listing = tree.lookup(name)
        if not isinstance(listing, list):  # removed from the store since the snapshot
            continue
        d = models[name]
        try:
            summary = views.summary(d.model)
            clip_summary = views.summary(d.projector) if d.projector else summary
            # A refused view (its handler failed) is the row's error, as an unreadable blob is.
            error = (
                summary.error
                or clip_summary.error
                or summary.model_error
                or (clip_summary.mmproj_error if "mmproj.gguf" in listing else None)
            )
            if error:
                raise GGUFError(error)
            clip = clip_summary.clip or ("-" if "mmproj.gguf" not in listing else "unchanged")
            rows.append(
                {
                    "name": name,
                    "files": listing,
                    "text": summary.text or "-",
                    "clip": clip,
                    **_llama_cpp_verdict(tree, name),
                    "params": _params(tree, name),
                    "layers": account(tree, snap, name).as_dict(),
                }
            )
        except GGUFError as e:
            rows.append({"name": name, "files": listing, "error": str(e)})
    left_out = [{"name": n, "reason": r} for n, r in sorted(snap.listing.skipped.items())]
    if args.json:
        print(json.dumps({"source": str(store.root), "models": rows, "left_out": left_out}, indent=2))
        return 0
    table = [["NAME", "FILES", "TEXT", "CLIP", "LAYERS", "LLAMA.CPP"]]
    for r in rows:
        files = " ".join(r["files"])
        if "error" in r:
            table.append([r["name"], files, f"error: {r['error']}"])
        else:
            applied = r["layers"]["applied"]
            names = ",".join(dict.fromkeys(a["layer"] for a in applied)) or "-"
            table.append([r["name"], files, r["text"], r["clip"], names, r["llama_cpp"]])
            # What is not applied first (one line each, saying why), then how each layer is.
            table += [["", f"  {note}"] for note in r["layers"]["not_applied"]]
            table += [["", f"  {a['layer']}: {a['how']}"] for a in applied]
    table += [[r["name"], f"left out: {r['reason']}"] for r in left_out]
    print("\n".join(_aligned(table)))
    return 0


def _aligned(table: list[list[str]]) -> list[str]:
    """Rows of cells in columns as wide as their widest cell (a row's last
    cell runs on, whatever its length; a short row's last cell too)."""
    widths: dict[int, int] = {}
    for row in table:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths.get(i, 0), len(cell))
    return ["  ".join([*(c.ljust(widths[i]) for i, c in enumerate(row[:-1])), row[-1]]).rstrip() for row in table]


def _params(tree, name: str) -> dict:
    """`ls`'s account of the model's params layer: the general.sampling.* keys
    its model.gguf carries, and what was left out and why."""
    from ..view.sampling import of_layer

    ref = tree.lookup(f"{name}/model.gguf")
    if getattr(ref, "params", None) is None:
        return {"in_model_gguf": [], "notes": []}
    s = of_layer(ref.params)
    return {"in_model_gguf": [k for k, _ in s.kvs] if tree.views.translate else [], "notes": list(s.notes)}


def _llama_cpp_verdict(tree, name: str) -> dict:
    """`ls`'s verdict: whether stock llama.cpp loads the model's files, and how."""
    from ..router.models import model_files
    from .verdict import model_verdict, summary

    verdicts = model_verdict(tree.views, model_files(tree, name)[1])
    return {"llama_cpp": summary(verdicts), "loads": {f: v.as_dict() for f, v in verdicts.items()}}


def cmd_inspect(args) -> int:
    from .report import describe, format_report, resolve_target

    try:
        report = describe(resolve_target(args.target, lambda: model_tree(args.source), args.clip))
    except FileNotFoundError as e:  # --clip of a blob without a projector view
        raise CliError(str(e)) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
