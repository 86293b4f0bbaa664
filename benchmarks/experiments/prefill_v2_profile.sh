#!/bin/bash
# #16 step 2, device run 1: Nsight Compute (full set + SASS source counters) of the wgmma GEMMs at
# GLM-5 TP8 T = 4096, the per-kernel knob sweeps (TP8, EP8), then the decode and prefill GPU tiers.
# Usage (device): bash benchmarks/experiments/prefill_v2_profile.sh  (writes under $OUT)
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 240 $NCU --clock-control none -k regex:_wgmma_gemm --launch-skip 4 --launch-count 2 \
    --set full --import-source yes -o /tmp/ncu_tp8_4096 \
    python benchmarks/experiments/ncu_target.py 4096 prefill > $OUT/ncu_run.log 2>&1
  $NCU -i /tmp/ncu_tp8_4096.ncu-rep --page details > $OUT/ncu_details.txt 2>&1
  $NCU -i /tmp/ncu_tp8_4096.ncu-rep --page source --csv --print-source sass > $OUT/ncu_source.csv 2>&1
  gzip -k $OUT/ncu_source.csv; rm -f $OUT/ncu_source.csv
  ls -la $OUT
else
  echo "no ncu" > $OUT/ncu_run.log
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/sweep.log
timeout 240 python benchmarks/experiments/prefill_knob_sweep.py >> $OUT/sweep.log 2>&1
SWEEP_PRESET=glm5-ep8 SWEEP_NAME=prefill_knob_sweep_ep8 SWEEP_KNOBS="[dict(prefetch1=2), dict(prefetch1=3), dict(prefetch1=2, prefetch2=2), dict(block_m=128, stages1=2, prefetch1=2, prefetch2=2)]" timeout 120 python benchmarks/experiments/prefill_knob_sweep.py >> $OUT/sweep.log 2>&1
timeout 150 python -m pytest -p no:cacheprovider -q -m gpu tests/test_prefill_kernels.py > $OUT/tier_prefill.log 2>&1; echo rc=$? >> $OUT/tier_prefill.log
timeout 280 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py > $OUT/tier_decode.log 2>&1; echo rc=$? >> $OUT/tier_decode.log
tail -3 $OUT/tier_prefill.log $OUT/tier_decode.log
grep -A30 "bf16 matmul" $OUT/sweep.log
