#!/usr/bin/env python3
"""The long fuzz run: tens of thousands of mutated headers through everything
the mount does with a blob (compatfs.testing.fuzz), with a summary.

    .venv/bin/python scripts/fuzz.py [--mode bytes|structure] [--cases 20000] [--seed 1] [--findings DIR]

`--mode bytes` mutates the files' bytes; `--mode structure` edits their
parsed headers at the keys and tensors the claiming handlers' tables name
(duplicates, values of another type, NaN and huge numbers, nested and empty
arrays, unknown ggml types, odd shapes, overlaps, order).  Every case must
be served or refused with GGUFError within the time and memory bounds; a
case that is not (a finding) is written to DIR (default
.cache/fuzz-findings) as a .gguf file to turn into a regression test.
Exit status 1 when there are findings.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compatfs.testing import fuzz  # noqa: E402

SHARED = ROOT.parent / "shared" / "fixtures" / "ollama"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("bytes", "structure"), default="bytes")
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--findings", type=Path, default=ROOT / ".cache" / "fuzz-findings")
    ap.add_argument("--max-seconds", type=float, default=2.0, help="per case")
    ap.add_argument("--max-mb", type=int, default=64, help="peak Python allocation per case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        extra = sorted(SHARED.glob("*.gguf")) if SHARED.is_dir() else []
        seeds = fuzz.seed_blobs(tmp, extra)
        t0 = time.perf_counter()
        summary = fuzz.run(seeds, args.cases, args.seed, tmp, args.max_seconds, args.max_mb << 20, mode=args.mode)
        wall = time.perf_counter() - t0
        findings = summary.findings
    print(f"{len(summary.outcomes)} {args.mode} cases from {len(seeds)} seed blobs in {wall:.0f} s")
    for result, n in summary.by_result.most_common():
        print(f"  {result:<16} {n}")
    refused = {}
    for o in summary.outcomes:
        if o.result == "refused":
            reason = o.message.split(": ", 1)[-1].split(" (")[0][:60]
            refused[reason] = refused.get(reason, 0) + 1
    print("most common refusals:")
    for reason, n in sorted(refused.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:6}  {reason}")
    s, h = summary.slowest, summary.hungriest
    print(f"slowest case: {s.seconds * 1000:.0f} ms ({s.seed_blob}, {s.mutation}, {s.result})")
    print(f"peak memory of a case: {h.peak_bytes / 2**20:.1f} MiB ({h.seed_blob}, {h.mutation}, {h.result})")
    for o in findings:
        print(f"FINDING case {o.case}: {o.seed_blob}, {o.mutation}: {o.result}: {o.message[:200]}")
    if findings:
        args.findings.mkdir(parents=True, exist_ok=True)
        for o in findings:
            (args.findings / f"{args.mode}-{args.seed}-{o.case}-{o.seed_blob}.gguf").write_bytes(o.blob)
        print(f"(each finding's blob is in {args.findings}; the same --mode and --seed reproduce the run)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
