"""Share of a GPU's instruction issue slots the decode K loops need to keep up with its memory.

    python benchmarks/experiments/issue_share.py SASS_JSON ... [--out FILE]

Each SASS_JSON is a ``sass_counts.py`` output (one compute capability). For every GEMM kernel
with an MMA loop, one loop iteration is one 256-deep K chunk of the ``BN / warps`` weight rows a
warp owns, so it issues ``loop`` warp instructions for ``256 * BN / warps`` weights. At a memory
bandwidth ``BW`` a GPU streams ``BW / 0.5625`` NVFP4 weights a second (half a byte of code and one
e4m3 scale per 16), so the loops need ``BW / 0.5625 * loop / weights`` warp instructions a second,
against the ``SMs x 4 schedulers x clock`` a GPU can issue (one per scheduler and cycle). A share
near or above 1 means the loop's instruction stream, not DRAM, sets the time; well below, the
instruction count is not the limit.

GPUs: the H200 and H100 with the copy bandwidth measured on them (committed peer runs) and the SM
clock nvidia-smi reported there; the RTX PRO 6000 (both editions) with the spec table's
bandwidth and boost clock (``hardware_table.py``, labelled spec); the B200, whose clock the table
does not source, with the clock at which the loops would need every issue slot. Static counts,
not times.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from sglang_fp4ext import hardware

BYTES_PER_WEIGHT = 0.5 + 1 / 16  # FP4 code + one e4m3 block scale per 16

RESULTS = Path(__file__).resolve().parent.parent / "results"
#: Measured cards: (name, cc, SMs, the peer run whose process measured copy bandwidth, a run log
#: whose first nvidia-smi line gives the max SM clock).
MEASURED = [
    ("H200", 90, 132, "peers_marlin_h200/marlin_peer.json", "prefill_group_combine/run_h200.log"),
    (
        "H100 80GB HBM3",
        90,
        132,
        "decode_kstack_h100/run4_h100_tuned/marlin_peer.json",
        "decode_issue_rate/run1_h100_diag/diag.log",
    ),
]


def _measured(name, cc, sms, bw_file, clock_log):
    bw = json.loads((RESULTS / bw_file).read_text())["copy_bw_TBps"] * 1e12
    # nvidia-smi's "name, current SM clock, max SM clock, power" row
    clock = float(re.search(r", \d+ MHz, (\d+) MHz", (RESULTS / clock_log).read_text())[1]) * 1e6
    return (
        name,
        cc,
        bw,
        sms,
        clock,
        f"copy bandwidth measured in {bw_file}; max SM clock (nvidia-smi) in {clock_log}",
    )


#: (name, compute capability, bandwidth B/s, SMs, clock Hz, source)
GPUS = [_measured(*m) for m in MEASURED]
for _key, _cc in (("rtx-pro-6000-ws", 120), ("rtx-pro-6000-maxq", 120), ("b200", 100)):
    _s = hardware.spec_by_key(_key)
    _clk = _s.boost_clock_mhz * 1e6 if _s.boost_clock_mhz else None
    GPUS.append(
        (
            _s.name,
            _cc,
            _s.mem_bandwidth_gbs * 1e9,
            _s.sms,
            _clk,
            f"spec table ({_key}): bandwidth and boost clock, not measured"
            + ("" if _clk else "; no sourced clock: the clock at which the share is 1"),
        )
    )


def loop_rates(doc: dict) -> list[dict]:
    """Warp instructions per weight of each MMA loop in one sass_counts document."""
    out = []
    for r in doc["rows"]:
        bn, loop = r["constexprs"].get("BN"), r["mma_loop_instructions"]
        if not loop or not isinstance(bn, int):
            continue  # no MMA loop found (or no row tile): nothing to rate
        weights = 256 * bn // r["warps"]
        out.append(
            dict(
                case=r["case"],
                kernel=r["kernel"],
                BN=bn,
                BT=r["constexprs"].get("BT"),
                warps=r["warps"],
                loop=loop,
                weights=weights,
                per_weight=loop / weights,
            )
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", nargs="+", help="sass_counts.py JSON files")
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args(argv)
    docs = {json.loads(Path(p).read_text())["cc"]: json.loads(Path(p).read_text()) for p in a.sass}
    rows = []
    for name, cc, bw, sms, clock, src in GPUS:
        if cc not in docs:
            continue
        for lr in loop_rates(docs[cc]):
            need = bw / BYTES_PER_WEIGHT * lr["per_weight"]
            row = dict(lr, gpu=name, cc=cc, bandwidth_Bps=bw, source=src)
            if clock:
                row.update(issue_per_s=sms * 4 * clock, share=need / (sms * 4 * clock))
                what = f"needs {row['share']:5.1%} of issue slots"
            else:
                row.update(clock_at_share_1_Hz=need / (sms * 4))
                what = f"needs every issue slot below {row['clock_at_share_1_Hz'] / 1e9:.2f} GHz"
            rows.append(row)
            print(
                f"{name:34} sm_{cc} {lr['case']:8} {lr['kernel']:10} {lr['loop']:5} instr / "
                f"{lr['weights']:5} weights = {lr['per_weight']:.4f}; {what}",
                file=sys.stderr,
            )
    doc = dict(
        what="issue share of the decode K loops at memory bandwidth "
        "(benchmarks/experiments/issue_share.py)",
        triton={cc: d["triton"] for cc, d in docs.items()},
        rows=rows,
    )
    text = json.dumps(doc, indent=1)
    Path(a.out).write_text(text + "\n") if a.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
