"""A user table from a decode sweep (``gluon_decode_ab.py --sweep ...`` JSON): this card's shipped
table (or ``--src``) with every bucket where a candidate that sets ``--knob`` beat the row's first
config (the table's own) by ``--margin`` replaced by that candidate, written under this card's
name into DIR (``SGLANG_FP4EXT_CONFIG_DIR=DIR`` then uses it). A candidate counts only when it ran
and its error against the fp32 twin is below 3e-3 rms_rel with no non-finite value. Prints one line
a pick; ``--picks FILE`` also writes them as JSON.

    python benchmarks/experiments/pick_table.py AB.json DIR --knob kstack1 [--picks FILE]
"""

import argparse
import json
import os

from sglang_fp4ext.moe.config import _file_name, table_path

# gluon_decode_ab.py's shape names -> table shape keys
KEYS = {"glm5_tp8": "E=256,H=6144,I=256,top_k=8", "glm5_tp8_shared": "E=257,H=6144,I=256,top_k=9",
        "glm5_ep8": "E=32,H=6144,I=2048,top_k=8"}

ap = argparse.ArgumentParser()
ap.add_argument("ab")
ap.add_argument("dir")
ap.add_argument("--knob", required=True)
ap.add_argument("--src", default=None, help="base table (default: the shipped one of the AB's GPU, "
                "else the H200's)")
ap.add_argument("--margin", type=float, default=0.97)
ap.add_argument("--picks", default=None)
a = ap.parse_args()
d = json.load(open(a.ab))
src = a.src or table_path(d["gpu"])
if not os.path.exists(src):
    src = table_path("NVIDIA H200")
tab = json.load(open(src))
tab["device_name"] = d["gpu"]
picks = []
for r in d["rows"]:
    base = r["configs"][0]
    ok = [c for c in r["configs"][1:] if c["config"].get(a.knob) and "us" in c
          and c["rms_rel"] < 3e-3 and not c["nonfinite"]]
    if not ok or "us" not in base or r["shape"] not in KEYS:
        continue
    best = min(ok, key=lambda c: c["us"])
    if best["us"] < a.margin * base["us"]:
        tab["shapes"][KEYS[r["shape"]]][str(r["T"])] = {"path": "decode", "config": best["config"]}
        picks.append(dict(shape=r["shape"], T=r["T"], base_us=base["us"], us=best["us"],
                          base_reps=base["us_reps"], reps=best["us_reps"], config=best["config"]))
os.makedirs(a.dir, exist_ok=True)
json.dump(tab, open(os.path.join(a.dir, _file_name(d["gpu"])), "w"), indent=1)
if a.picks:
    json.dump(picks, open(a.picks, "w"), indent=1)
print(f"base {src}; {len(picks)} pick(s) into {a.dir}")
for p in picks:
    c = p["config"]
    print("pick", p["shape"], p["T"], round(p["base_us"], 1), "->", round(p["us"], 1),
          " ".join(f"{k} {c[k]}" for k in (a.knob, "split_k1", "warps1", "block_n1", "pdl")))
