#!/bin/bash
# #15 decode step 8, confirmation: the step-8 candidate table (benchmarks/results/decode_v2_step8/
# NVIDIA_H200.json: the shipped table with GEMM1's K splits stacked in the buckets the H100 sweep
# picked) against the shipped table, in one call:
#   1. SGLang 0.5.23's Marlin NVFP4 MoE next to fp4ext at GLM-5 TP8 T = 1, 2, 4 in the Marlin
#      harness's own process, with the shipped table, then with the candidate table (same seeds);
#   2. `gluon_decode_ab.py --sweep table`: each differing bucket's two configs, REPEAT (5)
#      interleaved timings, per-kernel times.
# On a card other than the H200 both tables are used under that card's name.
# Usage (device, repository root; .peers carried): bash benchmarks/experiments/decode_kstack_confirm.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
python benchmarks/experiments/table_as_card.py /tmp/cfg_shipped >> $OUT/run.log 2>&1
python benchmarks/experiments/table_as_card.py /tmp/cfg_step8 \
  --src benchmarks/results/decode_v2_step8/NVIDIA_H200.json >> $OUT/run.log 2>&1
for mode in shipped step8; do
  echo "== marlin $mode $(date +%T)" >> $OUT/run.log
  SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg_$mode timeout 110 bash .peers/marlin/device_run.sh \
    --out $R/marlin_$mode --shapes glm5_tp8 --ts 1,2,4 --profile-ts '' > $R/marlin_$mode.log 2>&1
  echo rc=$? >> $R/marlin_$mode.log; pack
  python benchmarks/experiments/marlin_rows.py $R/marlin_$mode/marlin_peer.json >> $OUT/run.log 2>&1
done
echo "== sweep_table $(date +%T)" >> $OUT/run.log
SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg_shipped OUT=$R timeout 250 python \
  benchmarks/experiments/gluon_decode_ab.py --sweep table --v1-table shipped \
  --v2-table /tmp/cfg_step8/$(ls /tmp/cfg_step8) --shapes glm5_tp8,glm5_tp8_shared,glm5_ep8 \
  --tokens 1,2,4 --repeat ${REPEAT:-5} --split-all --deadline-s 200 > $R/sweep_table.log 2>&1
echo rc=$? >> $R/sweep_table.log; pack
python - >> $OUT/run.log 2>&1 <<'PY'
import json
d = json.load(open("/tmp/r/table_ab.json"))
print(d["gpu"], d["versions"]["triton"], "copy", round(d["copy_bw_TBps"], 2), "TB/s")
for r in d["rows"]:
    for c in r["configs"]:
        k = c["config"]
        ks = {n[:18]: round(t, 1) for n, t in c.get("kernels_us", {}).items()}
        print(r["shape"], r["T"], "kstack1 %d sk1 %d w1 %d bn1 %d" % (k["kstack1"], k["split_k1"],
              k["warps1"], k["block_n1"]), "us %.1f" % c["us"] if "us" in c else c.get("error"),
              "reps", [round(x, 1) for x in c.get("us_reps", [])], ks)
for e in d["errors"]:
    print("error", e)
PY
cat $OUT/run.log
