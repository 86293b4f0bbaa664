#!/bin/bash
# #15 decode step 7: SGLang 0.5.23's Marlin NVFP4 MoE next to fp4ext at GLM-5 TP8 T = 1, 2, 4
# (H200), in the Marlin harness's own process (../shared/peers, copied to .peers and carried),
# twice with the same seeds (same weights and routings): "before", a user table equal to the
# shipped one with the buckets step 7 changed set back to the configs they replaced
# (decode_v2_step7/slots_ab_h200.json, each picked row's baseline), then the shipped table.
# Usage (device, repository root): bash benchmarks/experiments/decode_slots_peers.sh  (~1.5 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R /tmp/before
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
python - <<'PY'
import json
from sglang_fp4ext.moe.config import table_path
d = json.load(open("benchmarks/results/decode_v2_step7/slots_ab_h200.json"))
picks = json.load(open("benchmarks/results/decode_v2_step7/picks_h200.json"))
src = table_path(d["gpu"])
tab = json.load(open(src))
key = "E=256,H=6144,I=256,top_k=8"
for p in picks:
    row = next(r for r in d["rows"] if (r["shape"], r["T"]) == (p["shape"], p["T"]))
    tab["shapes"][key][str(p["T"])] = {"path": "decode", "config": row["configs"][0]["config"]}
json.dump(tab, open("/tmp/before/" + src.name, "w"), indent=1)
PY
for mode in before shipped; do
  echo "== marlin $mode $(date +%T)" >> $OUT/run.log
  if [ $mode = before ]; then export SGLANG_FP4EXT_CONFIG_DIR=/tmp/before; else unset SGLANG_FP4EXT_CONFIG_DIR; fi
  timeout 150 bash .peers/marlin/device_run.sh --out $R/marlin_$mode --shapes glm5_tp8 \
    --ts ${TS:-1,2,4} --profile-ts '' > $R/marlin_$mode.log 2>&1; echo rc=$? >> $R/marlin_$mode.log; pack
  python benchmarks/experiments/marlin_rows.py $R/marlin_$mode/marlin_peer.json >> $OUT/run.log 2>&1
done
cat $OUT/run.log
