#!/bin/bash
# #15 closing measurements, part 1: one device call that adapts to the card that came. On an
# H200: the shipped table re-tuned with every candidate, then SGLang's Marlin and triton_kernels
# next to fp4ext on it (decode_step9_confirm.sh PARTS="glm5 peers"; .peers carried). Elsewhere
# (an H100): the split_t-beside GPU test and the GLM-5 tune (--quick) that confirms the
# heuristic's picks. Part 2: decode_close_part2.sh.
# Usage (device, repository root): bash benchmarks/experiments/decode_close_part1.sh
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) LIMIT=585 PARTS="glm5 peers" bash benchmarks/experiments/decode_step9_confirm.sh ;;
  *)
    export PYTHONPATH=.
    timeout 150 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py \
      -k split_t_beside > $OUT/split_t_beside.log 2>&1; echo rc=$? >> $OUT/split_t_beside.log
    tail -3 $OUT/split_t_beside.log
    LIMIT=420 PARTS="glm5" bash benchmarks/experiments/decode_step9_confirm.sh ;;
esac
