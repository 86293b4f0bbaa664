#!/bin/bash
# #15, the decode heuristic where no table is shipped: against the best config `fp4ext tune`
# finds (target: within 1.25x at every T in 1..256). Usage (device, repository root):
#   bash benchmarks/experiments/decode_heuristic.sh     # ~7 min
# DeepSeek-R1 TP8 (E=256, H=7168, I=256) and Qwen3-30B-A3B (E=128, H=2048, I=768, one GPU),
# decode buckets 1..256, the full candidate list, written to a scratch table (the shipped and user
# tables are untouched). Each bucket's log holds `heuristic_over_best` (the heuristic's time over
# the fastest candidate timed: a lower bound where the budget cut the list short, which the log's
# `skipped_for_budget` says). $OUT gets run.log and the two tune logs.
export PYTHONPATH=. PYTHONUNBUFFERED=1
B=1,2,4,8,16,32,64,128,256
TUNE="python -m sglang_fp4ext tune --buckets $B --decode-max 256 --prefill-min 512 --budget-s 170 --out /tmp/scratch_table"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
echo "== dsr1 $(date +%T)" >> $OUT/run.log
timeout 280 $TUNE --preset deepseek-r1-nvfp4-tp8 --log $OUT/tune_dsr1_tp8.json >> $OUT/run.log 2>&1
echo "rc=$?" >> $OUT/run.log
echo "== qwen3 $(date +%T)" >> $OUT/run.log
timeout 280 $TUNE --E 128 --H 2048 --I 768 --top-k 8 --log $OUT/tune_qwen3_30b.json >> $OUT/run.log 2>&1
echo "rc=$?" >> $OUT/run.log
grep -E "T=|heuristic vs" $OUT/run.log | sed 's/ (.*timed.*//' | tail -25
