"""Print the README's results table (markdown) from a committed results JSON.

    python benchmarks/readme_table.py benchmarks/results/decode_h200.json

Every number comes from the JSON: the README is regenerated from measurements, never typed.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

TARGETS = {1: 0.5, **{t: 0.7 for t in (2, 4, 8, 16, 32, 64)}, 128: 0.8, 256: 0.8}


def decode_table(path: str) -> str:
    d = json.load(open(path))
    meta = d["meta"]
    by_t: dict[int, dict[str, dict]] = defaultdict(dict)
    for r in d["rows"]:
        by_t[r["T"]][r["shape"]] = r
    shapes = sorted({r["shape"] for r in d["rows"]})
    head = (
        f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, {meta['time']}; "
        f"copy bandwidth measured in the same run: {meta['copy_bandwidth_TBps']:.2f} TB/s; "
        f"CUDA-graph replay, weights rotated over {meta['copies']} layer copies.\n\n"
    )
    cols = ["T"]
    for s in shapes:
        cols += [f"{s} µs", f"{s} floor µs", f"{s} % of BW", f"{s} vs torch bf16"]
    cols.append("target % of BW")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for t in sorted(by_t):
        row = [str(t)]
        for s in shapes:
            r = by_t[t].get(s)
            if r is None:
                row += ["-"] * 4
                continue
            frac = r["fraction_of_copy_bw"]
            mark = "" if frac >= TARGETS.get(t, 0) else " ✗"
            row += [
                f"{r['us']:.1f}",
                f"{r['floor_us']:.1f}",
                f"{100 * frac:.0f}%{mark}",
                f"{r['speedup_vs_peer']:.2f}×",
            ]
        row.append(f"{100 * TARGETS.get(t, 0):.0f}%")
        lines.append("| " + " | ".join(row) + " |")
    return head + "\n".join(lines)


if __name__ == "__main__":
    print(decode_table(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/decode_h200.json"))
