#!/bin/bash
# #15 closing measurements, part 2, on an H200, after part 1 (decode_close_part1.sh) re-tuned the table
# (copied into sglang_fp4ext/moe/configs/ before this call), one call:
#   ab        v1 (tl.dot, benchmarks/results/NVIDIA_H200_v1_table.json) vs v2 (the shipped table),
#             GLM-5 TP8 and EP8, T = 1..256, same process (gluon_decode_ab.py --sweep table)
#   baseline  the pytest-benchmark regression baseline (GLM-5 TP8 + EP8, decode + prefill paths,
#             the torch bf16 peer), then the gate against it
#   tier      the GPU tier of the decode path and the self-check (every shipped config)
# PARTS (default "ab baseline tier") picks the steps and their order; LIMIT (default 585 s).
# Usage (device, repository root): bash benchmarks/experiments/decode_close_part2.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
source benchmarks/experiments/device_steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log

part_ab() {
step ab_v1_v2
timeout $(cap 170) python benchmarks/experiments/gluon_decode_ab.py --sweep table \
  --v1-table benchmarks/results/NVIDIA_H200_v1_table.json \
  --v2-table sglang_fp4ext/moe/configs/NVIDIA_H200.json --shapes glm5_tp8,glm5_ep8 \
  --deadline-s 140 --out $R > $R/ab.log 2>&1
echo rc=$? >> $R/ab.log; grep "T=\|rc=" $R/ab.log >> $OUT/run.log; pack
}

part_baseline() {
step baseline
B="python -m pytest benchmarks -p no:cacheprovider -rs --fp4ext-rounds 10 \
  --benchmark-storage=file://$R/pb --benchmark-columns=min,median,max,rounds"
timeout $(cap 170) $B --fp4ext-presets glm5-tp8,glm5-ep8 --fp4ext-paths decode,prefill \
  --benchmark-save=h200-glm5 > $R/baseline.log 2>&1
echo rc=$? >> $R/baseline.log; tail -3 $R/baseline.log >> $OUT/run.log; pack
step gate
timeout $(cap 50) $B --fp4ext-presets glm5-tp8,glm5-ep8 --fp4ext-tokens 1,8,64,512,4096 \
  -k fp4ext-decode --benchmark-compare=0001 --benchmark-compare-fail=min:5% \
  --benchmark-json=$R/gate_normal.json > $R/gate.log 2>&1
echo rc=$? >> $R/gate.log; tail -2 $R/gate.log >> $OUT/run.log; pack
}

part_tier() {  # the decode tests over 4 pytest-xdist workers on the one GPU (compiles dominate)
step gpu_tier
timeout $(cap 400) python -m pytest -p no:cacheprovider -q -m gpu -n ${WORKERS:-4} \
  tests/test_decode_gpu.py > $R/gpu_tier.log 2>&1
echo rc=$? >> $R/gpu_tier.log; grep "passed\|failed\|rc=" $R/gpu_tier.log | tail -3 >> $OUT/run.log
timeout $(cap 150) python -m pytest -p no:cacheprovider -q -m gpu tests/test_selfcheck.py -s \
  > $R/gpu_tier_selfcheck.log 2>&1
echo rc=$? >> $R/gpu_tier_selfcheck.log
grep "passed\|failed\|self-check \|rc=" $R/gpu_tier_selfcheck.log | tail -4 >> $OUT/run.log
pack
}

for p in ${PARTS:-ab baseline tier}; do part_$p; done
step done
cat $OUT/run.log
