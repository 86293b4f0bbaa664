"""Render the README's "Measured results" section (markdown) from the committed results JSON.

    python benchmarks/readme_table.py                  # the whole section from benchmarks/results
    python benchmarks/readme_table.py benchmarks/results/decode_h200.json   # decode table only
    python benchmarks/readme_table.py --decode D.json --prefill P.json --baseline B.json [...]

Sources (defaults under ``benchmarks/results``):

* ``--decode``: ``decode_h200.json`` from ``benchmarks/run_decode.py`` (GLM-5 TP8/EP8, T <= 256);
* ``--prefill``: ``prefill_h200_pytest_benchmark.json``, a pytest-benchmark run with
  ``--fp4ext-paths prefill``;
* ``--baseline``: the regression gate's committed pytest-benchmark baseline(s),
  ``pytest-benchmark/<machine>/*.json`` (default: every file there), one table per preset;
* ``--floor``: ``decode_floor_h200.json`` from ``benchmarks/experiments/decode_floor.py`` (the
  decode kernels next to streaming-read and launch floors measured in the same run).

Each section states the date, GPU and versions of its own file. Every number comes from a JSON
file: the README is regenerated from measurements, never typed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {1: 0.5, **{t: 0.7 for t in (2, 4, 8, 16, 32, 64)}, 128: 0.8, 256: 0.8}


def _load(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"readme_table: no results file {path}") from None


def _pct(x) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _table(cols: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---- decode (benchmarks/run_decode.py JSON) ----------------------------------------------------


def decode_table(path) -> str:
    d = _load(path)
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
    rows = []
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
        rows.append(row)
    return head + _table(cols, rows)


def floor_table(path) -> str:
    """Decode kernels vs the floors of ``decode_floor.py``, one row per (shape, T)."""
    d = _load(path)
    meta = d["meta"]
    head = (
        f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, {meta['date']}; "
        f"copy bandwidth measured in the same run: {meta['copy_bandwidth_TBps']:.2f} TB/s; "
        "CUDA-graph replay, weights rotated over 4 layer copies (8 buffers for the one-launch "
        "read).\n\n"
    )
    cols = ["shape", "T", "experts", "bytes floor µs", "read, 1 launch µs",
            "read, 4 launches µs", "2 empty launches µs", "fp4ext µs (GEMM1 + GEMM2)",
            "fp4ext / 1-launch read"]  # fmt: skip
    rows = []
    for r in d["rows"]:
        rows.append([
            r["shape"], str(r["T"]), f"{r['distinct']:.1f}", f"{r['floor']:.1f}",
            f"{r['stream1']:.1f}", f"{r['stream2']:.1f}", f"{r['launch2']:.1f}",
            f"{r['ours']:.1f} ({r['gemm1_us']:.1f} + {r['gemm2_us']:.1f})",
            f"{r['ours'] / r['stream1']:.1f}×",
        ])  # fmt: skip
    return head + _table(cols, rows)


# ---- pytest-benchmark JSON (suite runs: prefill, baseline) -------------------------------------


def _suite_meta(d: dict, what: str) -> str:
    """One line: what, GPU, versions, date, the session's measured rates and the commit."""
    info = d["benchmarks"][0]["extra_info"] if d["benchmarks"] else {}
    v = info.get("versions", {})
    commit = d.get("commit_info") or {}
    cid = commit.get("id") or "unknown"
    rev = "unknown commit" if cid == "unknown" else f"commit {cid[:7]}"
    if commit.get("dirty"):
        rev += " + uncommitted changes"
    return (
        f"{what}: {info.get('gpu', '?')}, torch {v.get('torch', '?')}, Triton "
        f"{v.get('triton', '?')}, CUDA {v.get('cuda', '?')}, Python {v.get('python', '?')}, "
        f"pytest-benchmark {d.get('version', '?')}, {d['datetime'][:19].replace('T', ' ')} UTC, "
        f"{rev}; measured in the same session: copy bandwidth "
        f"{_num(info.get('copy_bandwidth_TBps'), '.2f')} TB/s, bf16 matmul "
        f"{_num(info.get('bf16_matmul_tflops'), '.0f')} TFLOP/s; CUDA-graph replay, weights "
        f"rotated over {info.get('copies', '?')} layer copies."
    )


def _by_case(d: dict) -> dict[str, dict[int, dict[str, dict]]]:
    """preset -> T -> impl -> extra_info."""
    out: dict[str, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for b in d["benchmarks"]:
        e = b["extra_info"]
        out[e["preset"]][e["T"]][e["impl"]] = e
    return out


def _speedup(e: dict, peer: str) -> float | None:
    s = (e.get("speedup_vs") or {}).get(peer)
    if s is None and peer == "torch-bf16":
        s = e.get("speedup_vs_torch_peer")
    return s


def suite_tables(path, what: str) -> str:
    """Per preset: fp4ext µs (median per call, CUDA events), floor, % of copy BW, TFLOP/s and its
    fraction of the bf16 matmul rate, speed-up over every peer that ran, peers' µs."""
    from sglang_fp4ext.bench.peers import SGLANG_PEERS

    d = _load(path)
    ran = sorted({b["extra_info"]["impl"] for b in d["benchmarks"]})
    absent = [p for p in SGLANG_PEERS if p not in ran]
    meta = _suite_meta(d, what) + f" Implementations timed: {', '.join(ran)}."
    if absent:
        meta += (
            f" Not in this file (skipped in that session, reason in its log): {', '.join(absent)}."
        )
    parts = [meta]
    for preset, by_t in _by_case(d).items():
        impls = {i for t in by_t.values() for i in t}
        ours = sorted(i for i in impls if i.startswith("fp4ext-"))
        peers = sorted(i for i in impls if not i.startswith("fp4ext-"))
        cols = ["T"]
        for o in ours:
            cols += [f"{o} µs", "floor µs", "% of BW", "TFLOP/s (% of bf16 mm)"]
            cols += [f"vs {p}" for p in peers]
        cols += [f"{p} µs" for p in peers]
        rows = []
        for T in sorted(by_t):
            row = [str(T)]
            for o in ours:
                e = by_t[T].get(o)
                if e is None:
                    row += ["-"] * (4 + len(peers))
                    continue
                tf = f"{e['tflops']:.1f} ({_pct(e.get('fraction_of_bf16_matmul'))})"
                row += [f"{e['us']:.1f}", _num(e.get("floor_us"), ".1f")]
                row += [_pct(e.get("fraction_of_copy_bw")), tf]
                row += [_num(_speedup(e, p), ".2f") + "×" if _speedup(e, p) else "-" for p in peers]
            row += [_num(by_t[T].get(p, {}).get("us"), ".1f") for p in peers]
            rows.append(row)
        parts.append(f"**{preset}**\n\n" + _table(cols, rows))
    return "\n\n".join(parts)


def baseline_files(root: Path = RESULTS / "pytest-benchmark") -> list[Path]:
    return sorted(root.glob("*/*.json"))


def section(decode, prefill, baselines, floor=None) -> str:
    out = ["<!-- generated by: python benchmarks/readme_table.py; do not edit by hand -->"]
    if decode:
        out.append("**Decode path** (`benchmarks/run_decode.py`)\n\n" + decode_table(decode))
    if floor:
        out.append(
            "**Decode floors** (`benchmarks/experiments/decode_floor.py`): the same bytes read by "
            "a plain streaming kernel, in one launch or four (the routed experts' w13 and w2 codes "
            "and scale codes), and two empty launches, next to fp4ext\n\n" + floor_table(floor)
        )
    for b in baselines:
        out.append(suite_tables(b, f"**Regression-gate baseline** (`{Path(b).name}`)"))
    if prefill:
        out.append(
            suite_tables(prefill, "**Prefill path** (`pytest benchmarks --fp4ext-paths prefill`)")
        )
    out.append(
        "µs: median per layer call over the replays (CUDA events); floor: the NVFP4 bytes of the "
        "distinct local experts routed plus activations, at the copy bandwidth measured in the "
        "same session; % of BW: floor over time; vs X: X's time over fp4ext's, same session."
    )
    return "\n\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("decode_only", nargs="?", help="a decode JSON: print only its table")
    p.add_argument("--decode", default=str(RESULTS / "decode_h200.json"))
    p.add_argument("--prefill", default=str(RESULTS / "prefill_h200_pytest_benchmark.json"))
    p.add_argument("--baseline", action="append", help="pytest-benchmark JSON (repeatable)")
    p.add_argument("--floor", default=str(RESULTS / "decode_floor_h200.json"))
    a = p.parse_args(argv)
    if a.decode_only:
        print(decode_table(a.decode_only))
        return 0
    baselines = a.baseline if a.baseline is not None else baseline_files()
    print(section(a.decode, a.prefill, baselines, a.floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
