"""Render the generated result tables of the README and docs/performance.md from committed JSON.

    python benchmarks/readme_table.py              # print every generated block
    python benchmarks/readme_table.py --write      # rewrite the blocks in README.md and
    docs/performance.md python benchmarks/readme_table.py --check      # exit 1 if a block there
    differs from its JSON
    python benchmarks/readme_table.py RUN.json     # print one benchmarks/run_decode.py result

Every number in a generated block is read from a file under ``benchmarks/results``; which
files back which table is ``benchmarks/results/manifest.json`` (``figures``), never a path
written here. A block sits between ``<!-- generated: NAME ... -->`` and ``<!-- end generated:
NAME -->``; ``--write`` replaces what is between them and nothing else.

Blocks:

* README ``headline``: per GPU in the manifest's ``headline.gpus``, GLM-5 TP8 and EP8 at the
  manifest's ``headline.T``: fp4ext, SGLang 0.5.23's Marlin and ``triton_kernels`` µs and
  fp4ext's share of the copy bandwidth measured in the same process, plus a line over every T the
  run measured saying where fp4ext is slower than a peer;
* docs/performance.md ``decode-<gpu>``: the same runs at every T, with ratios, local experts,
  accuracy and (where the run has it) the v1 -> v2 A/B; ``prefill``: fp4ext's prefill next to
  ``triton_kernels`` and, in one process, v1 and torch bf16; ``floors``: a plain read of the
  routed experts' bytes; ``baseline``: the regression gate's committed pytest-benchmark baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = RESULTS / "manifest.json"
README = ROOT / "README.md"
PERFORMANCE_MD = ROOT / "docs" / "performance.md"


def start_marker(name: str) -> str:
    return f"<!-- generated: {name} (python benchmarks/readme_table.py --write; do not edit) -->"


def end_marker(name: str) -> str:
    return f"<!-- end generated: {name} -->"


def manifest() -> dict:
    return _load(MANIFEST)


def _res(rel: str) -> Path:
    return RESULTS / rel


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


# ---- decode against the peers (Marlin and triton_kernels harness JSON) -------------------------


class PeerRun:
    """One GPU's decode peer run: Marlin's process (``marlin_peer.json``) and the
    ``triton_kernels`` processes (``tk_peer_glm5_<shape>.json``), each timing fp4ext next to its
    peer on the same inputs; optionally the v1 -> v2 A/B of the same session."""

    def __init__(self, name: str, fig: dict):
        self.name = name
        self.fig = fig
        self.marlin_file = fig["marlin"]
        self.m = _load(_res(fig["marlin"]))
        self.tk_files = fig["tk"]
        self.tks = {s: _load(_res(p)) for s, p in fig["tk"].items()}
        self.tk = {s: {r["T"]: r for r in d["results"]} for s, d in self.tks.items()}
        self.ab = None
        if fig.get("ab"):
            self.ab = {(r["shape"], r["T"]): r for r in _load(_res(fig["ab"]))["rows"]}

    @property
    def gpu(self) -> str:
        return self.m["env"]["gpu"]

    @property
    def date(self) -> str:
        # the Marlin harness records no date; the tk processes of the same call do
        return sorted({d["date"] for d in self.tks.values()})[0]

    def rows(self, Ts=None):
        for r in self.m["rows"]:
            if Ts is None or r["T"] in Ts:
                s = r["shape"].split("_")[1]
                yield s, r, self.tk[s].get(r["T"])

    def caption(self) -> str:
        e = self.m["env"]
        tk_env = next(iter(self.tks.values()))["env"]
        tk_tag = (tk_env.get("triton_kernels") or {}).get("tag", "?")
        bw_tk = ", ".join(f"{self.tks[s]['copy_bw_TBps']:.2f}" for s in self.tks)
        dirs = dict.fromkeys(
            f"`benchmarks/results/{Path(f).parent}/`"
            for f in (self.marlin_file, *self.tk_files.values())
        )
        return (
            f"measured {self.date}: torch {e['torch']}, Triton {e['triton']}, "
            f"SGLang {e['sglang_sources']}'s Marlin NVFP4 MoE, `triton_kernels` {tk_tag}; "
            f"fp4ext on {self.fig['table']}. Copy bandwidth measured in the same processes: "
            f"{self.m['copy_bw_TBps']:.2f} TB/s (Marlin's), {bw_tk} (`triton_kernels`' TP8, EP8). "
            f"CUDA-graph replay over 4 layer copies. Source: {', '.join(dirs)}."
        )

    def misses(self) -> str:
        """Where fp4ext is slower than a peer, over every T of the run (ratio < 1 in the peer's
        own process)."""
        n = 0
        slow_m, slow_t = [], []
        for s, r, t in self.rows():
            n += 1
            if r["marlin_over_fp4ext"] < 1:
                slow_m.append((s, r["T"], r["marlin_over_fp4ext"]))
            if t and t["tk_over_fp4ext"] < 1:
                slow_t.append((s, t["T"], t["tk_over_fp4ext"]))
        ts = sorted({r["T"] for _, r, _ in self.rows()})

        def ratio(x: float) -> str:  # a loss that rounds to 1.00 shows a third decimal
            return f"{x:.2f}×" if round(x, 2) < 1 else f"{x:.3f}×"

        def one(peer, slow):
            if not slow:
                return f"faster than {peer} at all {n}"
            at = ", ".join(f"{s.upper()} T = {T} ({ratio(x)})" for s, T, x in slow)
            return f"faster than {peer} at {n - len(slow)} of {n}, slower at {at}"

        return (
            f"Over every T the run measured (TP8 and EP8, T = {ts[0]}..{ts[-1]}): fp4ext "
            f"{one('Marlin', slow_m)}; {one('`triton_kernels`', slow_t)} "
            "(peer time over fp4ext time, each in its own process)."
        )


def headline_table(run: PeerRun, Ts) -> str:
    cols = ["shape", "T", "fp4ext µs", "Marlin µs", "triton_kernels µs (fp4ext µs in that run)",
            "fp4ext % of copy BW"]  # fmt: skip
    rows = []
    for s, r, t in run.rows(Ts):
        rows.append([
            s.upper(), str(r["T"]), f"{r['fp4ext_us']:.1f}", f"{r['marlin_us']:.1f}",
            f"{t['tk']['us']:.1f} ({t['fp4ext']['us']:.1f})" if t else "-",
            f"{r['fp4ext_pct_bw']:.0f}%",
        ])  # fmt: skip
    return _table(cols, rows)


def headline() -> str:
    """The README's headline: one caption, table and misses line per GPU of the manifest."""
    man = manifest()
    Ts = set(man["headline"]["T"])
    parts, runs = [], []
    for name in man["headline"]["gpus"]:
        run = PeerRun(name, man["figures"][name])
        parts.append(
            f"**{run.gpu}**, {run.caption()}\n\n{headline_table(run, Ts)}\n\n{run.misses()}"
        )
        runs.append(run)
    parts.append(accuracy_line(runs) + " " + prefill_line())
    return "\n\n".join(parts)


def _span(xs, fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"


def accuracy_line(runs: list[PeerRun]) -> str:
    """The rms error of fp4ext and of Marlin against the fp32 twin over every point of the runs
    (the Marlin harness checks both on the same inputs)."""
    rows = [r for run in runs for _, r, _ in run.rows()]
    return (
        f"Accuracy in these runs, rms error against the fp32 twin on the same inputs: fp4ext "
        f"{_span([r['fp4ext_rms_rel'] for r in rows], '.1e')}, Marlin "
        f"{_span([r['marlin_rms_rel'] for r in rows], '.1e')}."
    )


def prefill_line() -> str:
    """One sentence over :func:`prefill_rows`: fp4ext's prefill against ``triton_kernels`` and
    torch bf16."""
    rows, ab = prefill_rows()
    tk = [t["tk_over_fp4ext"] for _, _, t, _, _ in rows]
    bf = [b["us"] / v2["us"] for _, _, _, v2, b in rows if v2 and b]
    Ts = sorted({T for _, T, _, _, _ in rows})
    return (
        f"Prefill ({ab['device']}, GLM-5 TP8 and EP8, T = {Ts[0]}..{Ts[-1]}): fp4ext "
        f"{_span(tk, '.2f')}× faster than `triton_kernels` and {_span(bf, '.1f')}× faster than a "
        "torch bf16 grouped-GEMM MoE, each ratio within one process."
    )


def peers_full_table(run: PeerRun) -> str:
    """docs/performance.md: every T of a peer run, with ratios, local experts, the accuracy of
    both sides against the fp32 twin and, where the run has it, the v1 -> v2 A/B."""
    cols = [
        "shape",
        "T",
        "local experts",
        "fp4ext µs (% BW)",
        "Marlin µs",
        "Marlin / fp4ext",
        "fp4ext µs, tk run",
        "triton_kernels µs",
        "tk / fp4ext",
        "rms vs fp32: fp4ext, Marlin",
    ]
    if run.ab is not None:
        cols.append("A/B run: v1 → v2 µs")
    rows = []
    for s, r, t in run.rows():
        row = [
            s.upper(), str(r["T"]), f"{r['distinct_experts']:.2f}",
            f"{r['fp4ext_us']:.1f} ({r['fp4ext_pct_bw']:.0f}%)", f"{r['marlin_us']:.1f}",
            f"{r['marlin_over_fp4ext']:.2f}", _num(t and t["fp4ext"]["us"], ".1f"),
            _num(t and t["tk"]["us"], ".1f"), _num(t and t["tk_over_fp4ext"], ".2f"),
            f"{r['fp4ext_rms_rel']:.1e}, {r['marlin_rms_rel']:.1e}",
        ]  # fmt: skip
        if run.ab is not None:
            a = run.ab.get((r["shape"], r["T"]))
            row.append(
                f"{a['v1']['us']:.1f} → {a['v2_best']['us']:.1f}" if a and a.get("v2_best") else "-"
            )
        rows.append(row)
    return f"{run.gpu}, {run.caption()}\n\n" + _table(cols, rows) + "\n\n" + run.misses()


# ---- prefill against triton_kernels and torch bf16 ---------------------------------------------


def _day(rel: str, pts_file: Path | None = None) -> str:
    return _load(pts_file)["date"] if pts_file else rel


def tk_prefill_points(peers_dir: Path, shape: str) -> dict[int, tuple[dict, str]]:
    """The tk harness's points of one shape, by T, over its files there (``tk_peer_glm5_<shape>
    .json`` and, where a process ran out of time, a second process's ``..._b.json``): each point
    is one process's fp4ext and tk, timed together, with that file's date."""
    pts: dict[int, tuple[dict, str]] = {}
    for f in sorted(peers_dir.glob(f"tk_peer_glm5_{shape}*.json")):
        d = _load(f)
        for r in d["results"]:
            pts.setdefault(r["T"], (r, d["date"]))
    return pts


def prefill_rows():
    """``([(shape, T, tk point, v2 A/B row, torch bf16 A/B row)], A/B file)`` over the prefill
    figure's runs: each T from the first of the manifest's ``tk_dirs`` that timed it on the
    prefill path, with the v1 / v2 / torch bf16 A/B of one process."""
    fig = manifest()["figures"]["prefill_peers_h200"]
    ab = _load(_res(fig["ab"]))
    rows_ab = {(r["preset"].split("-")[1], r["T"], r["name"]): r for r in ab["rows"]}
    out = []
    for s in ("tp8", "ep8"):
        pts: dict[int, tuple[dict, str]] = {}
        for d in fig["tk_dirs"]:
            for T, p in tk_prefill_points(_res(d), s).items():
                pts.setdefault(T, p)
        for T, (t, day) in sorted(pts.items()):
            if t["fp4ext"]["path"] != "prefill":
                continue
            t = dict(t, day=day)
            out.append(
                (s, T, t, rows_ab.get((s, T, "v2 shipped")), rows_ab.get((s, T, "torch bf16")))
            )
    return out, ab


def prefill_table() -> str:
    """fp4ext's prefill next to ``triton_kernels`` (each T's run date shown) and v1, v2 and
    torch bf16 in one process, with v2's share of the bf16 matmul rate measured in that process
    (6 P H I flops per call, P the local (token, expert) pairs)."""
    fig = manifest()["figures"]["prefill_peers_h200"]
    rows, ab = prefill_rows()
    v1s = {(r["preset"].split("-")[1], r["T"]): r for r in ab["rows"] if r["name"] == "v1"}
    cols = ["shape", "T", "fp4ext µs", "triton_kernels µs", "tk / fp4ext", "tk run",
            f"A/B run, {ab['date']}: v1 → v2 µs (v1 / v2)", "torch bf16 µs (bf16 / v2)",
            f"v2 TFLOP/s (% of bf16 mm, {ab['bf16_mm_tflops']:.0f})"]  # fmt: skip
    out = []
    for s, T, t, v2, bf in rows:
        v1 = v1s.get((s, T))
        out.append([
            s.upper(), str(T), f"{t['fp4ext']['us']:.1f}", f"{t['tk']['us']:.1f}",
            f"{t['tk_over_fp4ext']:.2f}", t["day"],
            f"{v1['us']:.0f} → {v2['us']:.0f} ({v1['us'] / v2['us']:.2f})" if v1 and v2 else "-",
            f"{bf['us']:.0f} ({bf['us'] / v2['us']:.2f})" if bf and v2 else "-",
            f"{v2['tflops']:.0f} ({100 * v2['frac_mm']:.0f}%)" if v2 else "-",
        ])  # fmt: skip
    head = (
        f"{ab['device']}, torch {ab['torch']}, Triton {ab['triton']}; CUDA-graph replay over 4 "
        f"layer copies. Sources: {', '.join(f'`{d}/`' for d in fig['tk_dirs'])} "
        f"(`triton_kernels` runs, the first that timed a T), `{fig['ab']}` (A/B run)."
    )
    return head + "\n\n" + _table(cols, out)


# ---- decode floors (benchmarks/experiments/decode_floor.py) ------------------------------------


def floor_table(path=None) -> str:
    """The floors of ``decode_floor.py``, one row per (shape, T): the NVFP4 bytes of the routed
    experts at the copy bandwidth, a streaming kernel reading them in one launch and in four, and
    two empty launches."""
    path = path or _res(manifest()["figures"]["decode_floors_h200"]["path"])
    d = _load(path)
    meta = d["meta"]
    head = (
        f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, {meta['date']}; "
        f"copy bandwidth measured in the same run: {meta['copy_bandwidth_TBps']:.2f} TB/s; "
        "CUDA-graph replay, weights rotated over 4 layer copies (8 buffers for the one-launch "
        f"read). Source: `{Path(path).relative_to(RESULTS)}`.\n\n"
    )
    cols = ["shape", "T", "experts", "bytes floor µs", "read, 1 launch µs",
            "read, 4 launches µs", "2 empty launches µs"]  # fmt: skip
    rows = [
        [r["shape"], str(r["T"]), f"{r['distinct']:.1f}", f"{r['floor']:.1f}",
         f"{r['stream1']:.1f}", f"{r['stream2']:.1f}", f"{r['launch2']:.1f}"]
        for r in d["rows"]
    ]  # fmt: skip
    return head + _table(cols, rows)


# ---- run_decode.py JSON (printed on request, in no document) -----------------------------------

TARGETS = {1: 0.5, **{t: 0.7 for t in (2, 4, 8, 16, 32, 64)}, 128: 0.8, 256: 0.8}


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
    rows = []
    for t in sorted(by_t):
        row = [str(t)]
        for s in shapes:
            r = by_t[t].get(s)
            if r is None:
                row += ["-"] * 4
                continue
            row += [
                f"{r['us']:.1f}",
                f"{r['floor_us']:.1f}",
                f"{100 * r['fraction_of_copy_bw']:.0f}%",
                f"{r['speedup_vs_peer']:.2f}×",
            ]
        rows.append(row)
    return head + _table(cols, rows)


# ---- pytest-benchmark JSON (the regression baseline) -------------------------------------------


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


#: The baseline's T shown in docs/performance.md (every T is in its JSON): each fourth power of
#: two, and the largest.
BASELINE_T = (1, 4, 16, 64, 256, 1024, 4096, 8192)


def suite_tables(path, what: str, tokens=None) -> str:
    """Per preset: fp4ext µs (median per call, CUDA events), floor, % of copy BW, TFLOP/s and its
    fraction of the bf16 matmul rate, speed-up over every peer that ran, peers' µs; at ``tokens``
    (None: every T in the file)."""
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
        for T in sorted(t for t in by_t if tokens is None or t in tokens):
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


def baseline() -> str:
    out = [suite_tables(b, f"`{b.relative_to(RESULTS)}`", BASELINE_T) for b in baseline_files()]
    out.append(
        "µs: median per layer call over the replays (CUDA events); floor: the NVFP4 bytes of the "
        "distinct local experts routed plus activations, at the copy bandwidth measured in the "
        "same session; % of BW: floor over time; vs X: X's time over fp4ext's, same session. "
        f"T = {', '.join(map(str, BASELINE_T))} shown; the file holds every power of two."
    )
    return "\n\n".join(out)


# ---- the blocks and where they go --------------------------------------------------------------


def blocks() -> dict[Path, dict[str, str]]:
    """Every generated block, by document and name."""
    man = manifest()
    perf = {}
    for name in man["headline"]["gpus"]:
        perf[name.replace("_peers_", "-").replace("_", "-")] = peers_full_table(
            PeerRun(name, man["figures"][name])
        )
    perf["prefill"] = prefill_table()
    perf["floors"] = floor_table()
    perf["baseline"] = baseline()
    return {README: {"headline": headline()}, PERFORMANCE_MD: perf}


def replace_block(doc: str, name: str, text: str) -> str:
    """``doc`` with the block ``name`` replaced by ``text`` (markers kept)."""
    start, end = start_marker(name), end_marker(name)
    if doc.count(start) != 1 or doc.count(end) != 1:
        raise SystemExit(f"readme_table: need exactly one {start} and one {end}")
    head, rest = doc.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n\n{text}\n\n{end}{tail}"


def rendered(path: Path, named: dict[str, str], doc: str | None = None) -> str:
    doc = path.read_text() if doc is None else doc
    for name, text in named.items():
        doc = replace_block(doc, name, text)
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_decode_json", nargs="?", help="a benchmarks/run_decode.py JSON: print it")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    g.add_argument("--check", action="store_true", help="exit 1 where a block is stale")
    a = p.parse_args(argv)
    if a.run_decode_json:
        print(decode_table(a.run_decode_json))
        return 0
    stale = []
    for path, named in blocks().items():
        if a.write:
            path.write_text(rendered(path, named))
            print(f"readme_table: wrote {', '.join(named)} into {path.relative_to(ROOT)}")
        elif a.check:
            if rendered(path, named) != path.read_text():
                stale.append(str(path.relative_to(ROOT)))
        else:
            for name, text in named.items():
                print(f"{start_marker(name)}\n\n{text}\n\n{end_marker(name)}\n")
    if stale:
        print(
            f"readme_table: stale generated blocks in {', '.join(stale)}; run "
            "python benchmarks/readme_table.py --write",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
