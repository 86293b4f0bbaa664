#!/bin/bash
# A decode table for the card at hand (an H100 when no H200 is lent), then both peers on it, in
# one call:
#   1. TABLE (default: decode_kstack_h100/run2_h100/picks_table.json: the H200's table with the
#      buckets 1-4 the 2026-12-05 H100 sweep picked) copied under this card's name as a user
#      table; `fp4ext tune` re-times GLM-5 TP8 and EP8 decode buckets BUCKETS (default 8..256)
#      on it (each bucket's table entry, the incumbent, always timed; a candidate replaces it
#      only when faster);
#   2. SGLang 0.5.23's Marlin NVFP4 MoE and OpenAI triton_kernels next to fp4ext on the result,
#      GLM-5 TP8 and EP8, T = 1..256 (every fp4ext config passes the first-use self-check there).
# TIER=1 first runs the self-check's GPU tier (every config of this card's shipped table checked
# on it); TUNE=0 skips step 1's tuning (the peers on TABLE as it is); PRESETS, BUCKETS,
# PREFILL_MIN (prefill candidates from that bucket), BUDGET override the tuner's.
# Usage (device, repository root; .peers carried): bash benchmarks/experiments/decode_card_table.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T)" >> $OUT/run.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
if [ "${TIER:-0}" = 1 ]; then
  step tier_selfcheck
  timeout 200 python -m pytest -p no:cacheprovider -q -m gpu tests/test_selfcheck.py -s \
    > $R/tier_selfcheck.log 2>&1
  echo rc=$? >> $R/tier_selfcheck.log; grep "passed\|failed\|self-check \|rc=" $R/tier_selfcheck.log >> $OUT/run.log; pack
fi
python benchmarks/experiments/table_as_card.py /tmp/cfg \
  --src ${TABLE:-benchmarks/results/decode_kstack_h100/run2_h100/picks_table.json} >> $OUT/run.log 2>&1
export SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg
if [ "${TUNE:-1}" = 1 ]; then
step tune
timeout ${TUNE_LIMIT:-400} python -m sglang_fp4ext tune --preset ${PRESETS:-glm5-tp8,glm5-ep8} \
  --buckets ${BUCKETS:-8,16,32,64,128,256} --decode-max 256 --prefill-min ${PREFILL_MIN:-512} \
  --budget-s ${BUDGET:-300} --out /tmp/cfg --log $R/tune_log.json > $R/tune.log 2>&1
echo rc=$? >> $R/tune.log; grep "tune \|rc=" $R/tune.log | cut -c1-230 >> $OUT/run.log
fi
cp /tmp/cfg/*.json $R/; pack
step marlin
timeout 150 bash .peers/marlin/device_run.sh --out $R/marlin --profile-ts '' > $R/marlin.log 2>&1
echo rc=$? >> $R/marlin.log; pack
grep "self-check FAILED" $R/marlin.log | cut -c1-200 >> $OUT/run.log
python benchmarks/experiments/marlin_rows.py $R/marlin/marlin_peer.json >> $OUT/run.log 2>&1
step tk
timeout 200 bash .peers/tk/device_run.sh --out $R/tk --timeout 95 --Ts 1,2,4,8,16,32,64,128,256 \
  > $R/tk.log 2>&1
echo rc=$? >> $R/tk.log; pack
grep -h "self-check FAILED" $R/tk/tk_glm5_*.log | cut -c1-200 >> $OUT/run.log
grep -h TIME $R/tk/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log
cat $OUT/run.log
