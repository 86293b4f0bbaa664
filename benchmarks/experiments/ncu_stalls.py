"""Stall reasons per kernel from an Nsight Compute source page: the share of warp-state
samples per reason and the SASS lines holding the most samples, with their main reason.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > source.csv
    python benchmarks/experiments/ncu_stalls.py source.csv [TOP]

Reads the CSV ``ncu`` writes for ``--set full --import-source yes`` reports: one block per kernel,
each starting with a ``"Kernel Name"`` row, then a header row (``Address``, ``Source``, the
sampling columns, ``stall_*`` per reason) and one row per SASS instruction.
"""

import collections
import csv
import sys


def kernels(path):
    """{kernel name: [row dict per SASS line]} of one source-page CSV."""
    out, name, head = {}, None, None
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            name, head = row[1], None
            out[name] = []
        elif row and row[0] == "Address":
            head = row
        elif name and head and len(row) >= len(head) - 1:
            out[name].append(dict(zip(head, row)))
    return out


def report(rows, top):
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    total = collections.Counter()
    for r in rows:
        for c in reasons:
            total[c] += int(r[c] or 0)
    samples = sum(int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows) or 1
    lines = [f"  samples {samples}"]
    lines += [f"  {c:28s} {v:8d} {100 * v / samples:5.1f}%" for c, v in total.most_common(10)]
    hot = sorted(rows, key=lambda r: -int(r["Warp Stall Sampling (All Samples)"] or 0))[:top]
    for r in hot:
        s = int(r["Warp Stall Sampling (All Samples)"] or 0)
        why = max(reasons, key=lambda c: int(r[c] or 0))
        lines.append(
            f"   {r['Address'][-5:]} {100 * s / samples:5.1f}% {why:18s} {r['Source'].strip()[:90]}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    for name, rows in kernels(sys.argv[1]).items():
        print(name)
        print(report(rows, top))
