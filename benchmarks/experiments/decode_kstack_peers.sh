#!/bin/bash
# #15 decode step 8, on the card at hand (an H100 when no H200 is lent): the self-check fix for
# stacked GEMM1 configs checked on the GPU, then both peers next to fp4ext on a table with the
# stacked configs in it, in one call:
#   1. the self-check's GPU tier (tests/test_selfcheck.py: kstack1 configs pass their check and
#      serve as they are, every shipped config passes, broken families fall back);
#   2. SGLang 0.5.23's Marlin NVFP4 MoE next to fp4ext, GLM-5 TP8 and EP8, T = 1..256;
#   3. OpenAI triton_kernels next to fp4ext, same shapes and T, one process per shape.
# fp4ext runs TABLE (default: decode_v2_step8/run2_h100/picks_table.json, the shipped H200 table
# with the buckets the 2026-12-05 H100 sweep picked), copied under this card's name.
# Usage (device, repository root; .peers carried): bash benchmarks/experiments/decode_kstack_peers.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T)" >> $OUT/run.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
step tier_selfcheck
timeout 200 python -m pytest -p no:cacheprovider -q -m gpu tests/test_selfcheck.py > $R/tier_selfcheck.log 2>&1
echo rc=$? >> $R/tier_selfcheck.log; tail -3 $R/tier_selfcheck.log >> $OUT/run.log; pack
python benchmarks/experiments/table_as_card.py /tmp/cfg \
  --src ${TABLE:-benchmarks/results/decode_v2_step8/run2_h100/picks_table.json} >> $OUT/run.log 2>&1
cp /tmp/cfg/*.json $R/
export SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg
step marlin
timeout 200 bash .peers/marlin/device_run.sh --out $R/marlin --profile-ts '' > $R/marlin.log 2>&1
echo rc=$? >> $R/marlin.log; pack
grep "self-check FAILED" $R/marlin.log | cut -c1-200 >> $OUT/run.log
python benchmarks/experiments/marlin_rows.py $R/marlin/marlin_peer.json >> $OUT/run.log 2>&1
step tk
timeout 240 bash .peers/tk/device_run.sh --out $R/tk --timeout 115 --Ts 1,2,4,8,16,32,64,128,256 \
  > $R/tk.log 2>&1
echo rc=$? >> $R/tk.log; pack
grep -h TIME $R/tk/tk_glm5_*.log | cut -c1-170 >> $OUT/run.log
cp $R/tier_selfcheck.log $OUT/ 2>/dev/null
cat $OUT/run.log
