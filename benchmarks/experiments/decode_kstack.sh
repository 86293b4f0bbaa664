#!/bin/bash
# #15 decode step 8, GEMM1 with its K splits on one program's warps (KernelConfig.kstack1) against
# the splits across programs (H200), in one call of the device's 10 minutes:
#   1. SGLang 0.5.23's Marlin NVFP4 MoE next to the shipped table (decode step 7's configs) at
#      GLM-5 TP8 T = 1, 2, 4 in the Marlin harness's own process (.peers carried: ../shared/peers);
#   2. the GPU tests (bit-equal to the splits across programs, the decode tier's family "gluonk");
#   3. `gluon_decode_ab.py --sweep kstack` at GLM-5 TP8, TP8 + fused shared expert and EP8,
#      T = 1, 2, 4 (shipped config vs 8 / 4 / 2 stacked splits at 1-4 warps and 32-128 rows;
#      REPEAT interleaved timings each, per-kernel times of every candidate);
#   4. the picks (pick_table.py: each bucket where a stacked config beat the table's by 3%) as a
#      user table, and Marlin next to fp4ext again with that table (same seeds as step 1).
# Usage (device, repository root): bash benchmarks/experiments/decode_kstack.sh  (~6 min)
# SKIP_MARLIN=1 skips steps 1 and 4's Marlin run; SHAPES, TOKENS, REPEAT override step 3's.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
# On another Hopper card (an H100 when no H200 is lent) the H200's table is the baseline: copied
# under that card's name into a user table directory (the tables are read by device name).
python benchmarks/experiments/table_as_card.py /tmp/h200cfg --unless-h200 >> $OUT/run.log 2>&1
[ -d /tmp/h200cfg ] && export SGLANG_FP4EXT_CONFIG_DIR=/tmp/h200cfg
if [ "${SKIP_MARLIN:-0}" != 1 ]; then
  echo "== marlin shipped $(date +%T)" >> $OUT/run.log
  timeout 120 bash .peers/marlin/device_run.sh --out $R/marlin_shipped --shapes glm5_tp8 \
    --ts ${MARLIN_TS:-1,2,4} --profile-ts '' > $R/marlin_shipped.log 2>&1
  echo rc=$? >> $R/marlin_shipped.log; pack
  python benchmarks/experiments/marlin_rows.py $R/marlin_shipped/marlin_peer.json >> $OUT/run.log 2>&1
fi
echo "== tier_kstack $(date +%T)" >> $OUT/run.log
timeout 180 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py \
  -k "kstack1 or gluonk" > $R/tier_kstack.log 2>&1
echo rc=$? >> $R/tier_kstack.log; tail -3 $R/tier_kstack.log >> $OUT/run.log; pack
echo "== sweep_kstack $(date +%T)" >> $OUT/run.log
OUT=$R timeout 280 python benchmarks/experiments/gluon_decode_ab.py --sweep kstack --v1-table shipped \
  --shapes ${SHAPES:-glm5_tp8,glm5_tp8_shared,glm5_ep8} --tokens ${TOKENS:-1,2,4} \
  --repeat ${REPEAT:-5} --split-all --deadline-s 230 > $R/sweep_kstack.log 2>&1
echo rc=$? >> $R/sweep_kstack.log; pack
python - >> $OUT/run.log 2>&1 <<'PY'
import json
d = json.load(open("/tmp/r/kstack_ab.json"))
print(d["gpu"], d["versions"], "copy", round(d["copy_bw_TBps"], 2), "TB/s")
for r in d["rows"]:
    print(r["shape"], "T", r["T"], "floor", round(r["floor_us"], 1))
    for c in r["configs"]:
        k = c["config"]
        g1 = {n[:20]: round(t, 1) for n, t in c.get("kernels_us", {}).items()}
        print("   kstack1 %d sk1 %d w1 %d bn1 %3d pdl %d" % (k["kstack1"], k["split_k1"], k["warps1"],
              k["block_n1"], k["pdl"]),
              "us %.1f" % c["us"] if "us" in c else c.get("error", "?")[:200],
              "reps", [round(x, 1) for x in c.get("us_reps", [])], g1)
for e in d["errors"]:
    print("error", e)
PY
echo "== pick $(date +%T)" >> $OUT/run.log
python benchmarks/experiments/pick_table.py $R/kstack_ab.json /tmp/pickcfg --knob kstack1 \
  --picks $R/picks.json >> $OUT/run.log 2>&1
cp /tmp/pickcfg/*.json $R/; pack
if [ "${SKIP_MARLIN:-0}" != 1 ]; then
  echo "== marlin picked $(date +%T)" >> $OUT/run.log
  SGLANG_FP4EXT_CONFIG_DIR=/tmp/pickcfg timeout 120 bash .peers/marlin/device_run.sh \
    --out $R/marlin_picked --shapes glm5_tp8 --ts ${MARLIN_TS:-1,2,4} --profile-ts '' \
    > $R/marlin_picked.log 2>&1
  echo rc=$? >> $R/marlin_picked.log; pack
  python benchmarks/experiments/marlin_rows.py $R/marlin_picked/marlin_peer.json >> $OUT/run.log 2>&1
fi
cat $OUT/run.log
