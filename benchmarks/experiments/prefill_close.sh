#!/bin/bash
# #16 closing measurements on an H200, one device call (.peers carried for `tk`):
#   tier      the prefill GPU tier of the wgmma family as shipped (fp32 twin at T = 512-8192,
#             TP8 / EP8 / fused shared expert, graph replay bit-equal to eager, determinism,
#             adversarial routings, the shapes without a table) and the self-check tier
#   ab        v1 (tl.dot), v2 as shipped and the torch bf16 peer in one process, GLM-5 TP8 and
#             EP8, T = 512-8192 (prefill_wgmma_ab.py, AB_SHIPPED=1)
#   tk        OpenAI's triton_kernels next to fp4ext, same Ts, one process per shape
# The regression baseline (decode and prefill paths) is decode_close_part2.sh's `baseline` step.
# PARTS (default "tier ab tk") picks the steps and their order; LIMIT (default 585 s).
# Usage (device, repository root): bash benchmarks/experiments/prefill_close.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
PACK=prefill_close
source benchmarks/experiments/device_steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
TS=${TS:-512,1024,2048,4096,8192}

part_tier() {
step prefill_tier
timeout $(cap 150) python -m pytest -p no:cacheprovider -q -m gpu tests/test_prefill_kernels.py \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)" \
  > $R/gpu_tier_prefill.log 2>&1
echo rc=$? >> $R/gpu_tier_prefill.log; grep "passed\|failed\|rc=" $R/gpu_tier_prefill.log | tail -2 >> $OUT/run.log
timeout $(cap 90) python -m pytest -p no:cacheprovider -q -m gpu tests/test_selfcheck.py \
  > $R/gpu_tier_selfcheck.log 2>&1
echo rc=$? >> $R/gpu_tier_selfcheck.log; grep "passed\|failed\|rc=" $R/gpu_tier_selfcheck.log | tail -2 >> $OUT/run.log
pack
}

part_ab() {
step ab_v1_v2_bf16
OUT=$R AB_SHIPPED=1 AB_T=$TS AB_PRESETS=glm5-tp8,glm5-ep8 AB_NAME=prefill_close_ab \
  timeout $(cap 220) python benchmarks/experiments/prefill_wgmma_ab.py > $R/ab.log 2>&1
echo rc=$? >> $R/ab.log; sed -n '/bf16 matmul/,$p' $R/ab.log >> $OUT/run.log; pack
}

part_tk() {
if [ -d .peers ]; then
  step tk
  timeout $(cap 240) bash .peers/tk/device_run.sh --out $R/tk --timeout 110 --Ts $TS > $R/tk.log 2>&1
  echo rc=$? >> $R/tk.log; grep -h TIME $R/tk/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
else
  echo "tk: no .peers folder (carry it)" >> $OUT/run.log
fi
}

for p in ${PARTS:-tier ab tk}; do part_$p; done
step done
cat $OUT/run.log
