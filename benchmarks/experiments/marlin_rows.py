"""One line per row of a Marlin peer harness result (``marlin_peer.json``): fp4ext's and Marlin's
time, fp4ext's share of the copy bandwidth, Marlin's time over fp4ext's, fp4ext's error.

    python benchmarks/experiments/marlin_rows.py OUT/marlin_peer.json
"""

import json
import sys

d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(
        r["shape"],
        r["T"],
        "fp4ext",
        round(r["fp4ext_us"], 1),
        f"({r['fp4ext_pct_bw']:.0f}% BW)",
        "marlin",
        round(r["marlin_us"], 1),
        "marlin/fp4ext",
        round(r["marlin_over_fp4ext"], 2),
        "rms",
        f"{r['fp4ext_rms_rel']:.2e}",
        "ok",
        r["fp4ext_ok"],
    )
for e in d.get("errors", []):
    print("error", str(e)[:300])
