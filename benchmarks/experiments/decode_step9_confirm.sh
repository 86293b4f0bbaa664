#!/bin/bash
# #15 decode step 9 on the card at hand, one call (~9 min): the heuristic's measured forms
# (decode_config._measured_forms) checked and timed where no table applies, and on an H200 the
# shipped table re-tuned with the step 7-8 candidates (stacked GEMM1, side-by-side slots), then
# the peers on it.
#   1. GPU tier: the other-shape tests (DeepSeek-R1 TP8, Qwen3-30B-A3B: the heuristic's configs
#      as served, every family) and the stacked-GEMM1 tests.
#   2. GLM-5 TP8, TP8 + fused shared, EP8, buckets 1..256 (prefill candidates from 128): on an
#      H200 the full candidate list against the shipped table's entries (incumbents); elsewhere
#      --quick (the card's table was tuned with these candidates: the heuristic's gap is the
#      point). Each bucket's log holds heuristic_over_best.
#   3. On an H200, time permitting: SGLang's Marlin and triton_kernels next to fp4ext on the
#      re-tuned table (.peers carried; TABLE= a table from an earlier call instead).
#   4. The heuristic where no table is shipped: DeepSeek-R1 TP8 and Qwen3-30B-A3B, full lists.
#   hot (not in the default): GLM-5 TP8 + shared T = 32 / 64, the full candidate list (GEMM1's
#      split_t beside the token GEMM2 among them) against the card's table.
# PARTS (default "tier glm5 peers heur") picks the steps and their order; a step past LIMIT
# (560 s) is cut by its timeout, and what it wrote still comes back in $OUT/results.tar.gz.
# Usage (device, repository root): bash benchmarks/experiments/decode_step9_confirm.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}
source benchmarks/experiments/device_steps.sh
mkdir -p /tmp/cfg /tmp/scratch
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
h200=0; case "$card" in *H200*) h200=1;; esac

part_tier() {
step gpu_tier
timeout $(cap 170) python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py \
  -k "other_shapes or kstack1" > $R/gpu_tier.log 2>&1
echo rc=$? >> $R/gpu_tier.log; grep "passed\|failed\|rc=" $R/gpu_tier.log | tail -3 >> $OUT/run.log
pack
}

part_glm5() {
step tune_glm5
if [ $h200 = 1 ]; then q=""; b=${BUDGET:-200}; else q="--quick"; b=90; fi
timeout $(cap 280) python -m sglang_fp4ext tune --preset glm5-tp8,glm5-tp8-fused-shared,glm5-ep8 $q \
  --buckets 1,2,4,8,16,32,64,128,256 --decode-max 256 --prefill-min 128 --budget-s $b \
  --out /tmp/cfg --log $R/tune_glm5.json > $R/tune_glm5.log 2>&1
echo rc=$? >> $R/tune_glm5.log
grep "tune \|heuristic vs\|rc=" $R/tune_glm5.log | sed 's/check rms_rel.*ok; //' | cut -c1-200 \
  >> $OUT/run.log
cp /tmp/cfg/*.json $R/ 2>/dev/null; pack
}

part_hot() {  # the fused shared expert's GEMM1 split_t beside the token GEMM2 (new candidate)
step tune_hot
timeout $(cap 90) python -m sglang_fp4ext tune --preset glm5-tp8-fused-shared --buckets 32,64 \
  --decode-max 256 --prefill-min 512 --budget-s 40 --out /tmp/cfg_hot \
  --log $R/tune_hot.json > $R/tune_hot.log 2>&1
echo rc=$? >> $R/tune_hot.log; grep "tune \|rc=" $R/tune_hot.log | cut -c1-200 >> $OUT/run.log
pack
}

part_peers() {
if [ $h200 = 1 ] && [ -d .peers ] && [ "$(left)" -gt 150 ]; then
  [ -n "${TABLE:-}" ] && cp "$TABLE" /tmp/cfg/  # a re-tuned table from an earlier call
  export SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg
  step marlin
  timeout 70 bash .peers/marlin/device_run.sh --out $R/marlin --profile-ts '' > $R/marlin.log 2>&1
  echo rc=$? >> $R/marlin.log; pack
  python benchmarks/experiments/marlin_rows.py $R/marlin/marlin_peer.json >> $OUT/run.log 2>&1
  step tk
  timeout $(( $(left) - 10 )) bash .peers/tk/device_run.sh --out $R/tk --timeout 80 \
    --Ts 1,2,4,8,16,32,64,128,256 > $R/tk.log 2>&1
  echo rc=$? >> $R/tk.log; pack
  grep -h TIME $R/tk/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log
fi
}

part_heur() {
step heuristic
for s in "dsr1_tp8:--preset deepseek-r1-nvfp4-tp8" "qwen3_30b:--E 128 --H 2048 --I 768 --top-k 8"; do
  timeout $(cap 200) python -m sglang_fp4ext tune ${s#*:} --buckets 1,2,4,8,16,32,64,128,256 \
    --decode-max 256 --prefill-min 512 --budget-s ${HBUDGET:-110} --out /tmp/scratch \
    --log $R/tune_${s%%:*}.json > $R/tune_${s%%:*}.log 2>&1
  echo rc=$? >> $R/tune_${s%%:*}.log
  grep "tune \|heuristic vs\|rc=" $R/tune_${s%%:*}.log | sed 's/check rms_rel.*ok; //' \
    | cut -c1-160 >> $OUT/run.log
  pack
done
}

for p in ${PARTS:-tier glm5 peers heur}; do part_$p; done
step done
cat $OUT/run.log
