"""Two ``sass_counts.py`` runs of the same cases side by side (e.g. Triton 3.8 vs 3.6).

    python benchmarks/experiments/sass_compare.py A.json B.json [--out FILE]

Per launch: registers, spill and stack bytes, instructions of the MMA loop and of the kernel, in
A / B, and the largest relative differences. Timings here are taken with the H200's Triton (3.6)
while users compile with 3.8: this says whether the two compilers hand the GPU the same
instruction stream. Static counts, not times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_FIELDS = ("registers", "spill_bytes", "stack_bytes", "mma_loop_instructions", "instructions")


def compare(a: dict, b: dict) -> dict:
    ka = [(r["case"], r["kernel"]) for r in a["rows"]]
    kb = [(r["case"], r["kernel"]) for r in b["rows"]]
    if ka != kb:
        i = next((i for i, (x, y) in enumerate(zip(ka, kb)) if x != y), min(len(ka), len(kb)))
        raise ValueError(
            f"the two runs hold different launches: {len(ka)} vs {len(kb)}, the "
            f"first difference at #{i}: {ka[i : i + 1]} vs {kb[i : i + 1]}"
        )
    if a["cc"] != b["cc"]:
        raise ValueError(
            f"the two runs compiled for different targets: sm_{a['cc']} vs sm_{b['cc']}"
        )
    rows = []
    for ra, rb in zip(a["rows"], b["rows"]):
        row = {"case": ra["case"], "kernel": ra["kernel"]}
        for f in _FIELDS:
            row[f] = [ra[f], rb[f]]
        rows.append(row)

    def worst(field):
        rel = [abs(r[field][0] - r[field][1]) / r[field][1] for r in rows if r[field][1]]
        return max(rel, default=0.0)

    return dict(
        what="sass_compare.py: two sass_counts.py runs, [A, B] per field",
        a=dict(triton=a["triton"], cc=a["cc"], gpu=a.get("gpu")),
        b=dict(triton=b["triton"], cc=b["cc"], gpu=b.get("gpu")),
        max_rel_diff={
            f: round(worst(f), 4) for f in ("registers", "mma_loop_instructions", "instructions")
        },
        spills={
            "a": sum(r["spill_bytes"][0] + r["stack_bytes"][0] for r in rows),
            "b": sum(r["spill_bytes"][1] + r["stack_bytes"][1] for r in rows),
        },
        rows=rows,
    )


def table(doc: dict) -> str:
    a, b = doc["a"]["triton"], doc["b"]["triton"]
    out = [
        f"sm_{doc['a']['cc']} ({doc['a'].get('gpu') or 'H200 configs'}): Triton {a} / {b}",
        "| case | kernel | registers | spill+stack B | MMA loop | total |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        sp = [r["spill_bytes"][i] + r["stack_bytes"][i] for i in (0, 1)]
        out.append(
            f"| {r['case']} | `{r['kernel']}` | {r['registers'][0]} / {r['registers'][1]} | "
            f"{sp[0]} / {sp[1]} | {r['mma_loop_instructions'][0]} / "
            f"{r['mma_loop_instructions'][1]} | {r['instructions'][0]} / {r['instructions'][1]} |"
        )
    m = doc["max_rel_diff"]
    out.append(
        f"largest difference: registers {m['registers']:.1%}, MMA loop "
        f"{m['mma_loop_instructions']:.1%}, kernel {m['instructions']:.1%}"
    )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    doc = compare(json.loads(Path(args.a).read_text()), json.loads(Path(args.b).read_text()))
    doc["files"] = [args.a, args.b]
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
