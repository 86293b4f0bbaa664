#!/bin/bash
# Where the Gluon decode kernels' time goes at small T (H200): Nsight Compute, full set with
# SASS source counters, of GLM-5 TP8 T = 1 and 8 and EP8 T = 2 (the Marlin tie), the shipped
# table's configs, two eager calls' kernels each (ncu_target.py). $OUT gets run.log (speed of
# light, occupancy, stall shares per kernel via ncu_stalls.py), the details pages and source CSVs.
# CASES (default "1:tp8 2:ep8 8:tp8") names other T:shape pairs; the card's own table serves.
# Usage (device, repository root): bash benchmarks/experiments/decode_ncu.sh   # ~4 min
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
CASES=${CASES:-"1:tp8 2:ep8 8:tp8"}  # T:shape pairs
for case in $CASES; do
  set -- ${case/:/ }; name=t$1_$2
  echo "== $name $(date +%T)" >> $OUT/run.log
  timeout 150 $NCU --clock-control none -k regex:'^_(gemm|combine)' --launch-skip 2 --launch-count 2 \
    --set full --import-source yes -o /tmp/ncu_$name python benchmarks/experiments/ncu_target.py $1 $2 \
    > $OUT/ncu_run_$name.log 2>&1
  $NCU -i /tmp/ncu_$name.ncu-rep --page details > $OUT/ncu_details_$name.txt 2>&1
  $NCU -i /tmp/ncu_$name.ncu-rep --page source --csv --print-source sass > /tmp/src_$name.csv 2>&1
  gzip -c /tmp/src_$name.csv > $OUT/ncu_source_$name.csv.gz
  grep -E "^  _|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Ipc|No Eligible|Grid Size|Block Size|Waves" \
    $OUT/ncu_details_$name.txt >> $OUT/run.log
  python benchmarks/experiments/ncu_stalls.py /tmp/src_$name.csv 6 >> $OUT/run.log 2>&1
done
cat $OUT/run.log
