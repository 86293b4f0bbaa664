#!/bin/bash
# #16 step 2, the device runs (H200): Nsight Compute (full set + SASS source counters) of the wgmma
# GEMMs at GLM-5 TP8 T = 4096, the one-warpgroup diagnosis, the per-kernel knob sweeps (TP8,
# EP8) with `measure` (~8 min); the prefill and decode GPU tiers with `tiers` (~8 min): two
# calls, each under the device's 10-minute limit. Usage (device):
#   bash benchmarks/experiments/prefill_v2_profile.sh measure|tiers
# $OUT gets ncu_details.txt, ncu_source.csv.gz, run.log (the short report) and results.tar.gz
# (every JSON and full log), re-packed after each step so a run cut short keeps what it measured.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T)" | tee -a $OUT/run.log; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
if [ "$1" = measure ]; then
step ncu
if [ -n "$NCU" ]; then
  timeout 240 $NCU --clock-control none -k regex:_wgmma_gemm --launch-skip 4 --launch-count 2 \
    --set full --import-source yes -o /tmp/ncu_tp8_4096 \
    python benchmarks/experiments/ncu_target.py 4096 prefill > $R/ncu_run.log 2>&1
  $NCU -i /tmp/ncu_tp8_4096.ncu-rep --page details > $OUT/ncu_details.txt 2>&1
  $NCU -i /tmp/ncu_tp8_4096.ncu-rep --page source --csv --print-source sass > /tmp/ncu_source.csv 2>&1
  gzip -c /tmp/ncu_source.csv > $OUT/ncu_source.csv.gz
  grep -E "^  _wgmma|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issued Ipc|No Eligible" $OUT/ncu_details.txt >> $OUT/run.log
else
  echo "no ncu" >> $OUT/run.log
fi
pack
step one_warpgroup
OUT=$R timeout 120 python benchmarks/experiments/wgmma_one_warpgroup.py >> $OUT/run.log 2>&1; pack
step sweep_tp8
OUT=$R timeout 240 python benchmarks/experiments/prefill_knob_sweep.py > $R/sweep_tp8.log 2>&1
grep -A30 "bf16 matmul" $R/sweep_tp8.log >> $OUT/run.log; pack
step sweep_ep8
OUT=$R SWEEP_PRESET=glm5-ep8 SWEEP_NAME=prefill_knob_sweep_ep8 \
  SWEEP_KNOBS="[dict(prefetch1=2), dict(prefetch1=3), dict(prefetch1=2, prefetch2=2), dict(block_m=128, stages1=2, prefetch1=2, prefetch2=2)]" \
  timeout 120 python benchmarks/experiments/prefill_knob_sweep.py > $R/sweep_ep8.log 2>&1
grep -A30 "bf16 matmul" $R/sweep_ep8.log >> $OUT/run.log; pack
fi
if [ "$1" = tiers ]; then
step tier_prefill
timeout 200 python -m pytest -p no:cacheprovider -q -m gpu tests/test_prefill_kernels.py > $R/tier_prefill.log 2>&1; echo rc=$? >> $R/tier_prefill.log
tail -3 $R/tier_prefill.log >> $OUT/run.log; pack
step tier_decode
timeout 280 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py > $R/tier_decode.log 2>&1; echo rc=$? >> $R/tier_decode.log
tail -3 $R/tier_decode.log >> $OUT/run.log; pack
fi
cat $OUT/run.log
