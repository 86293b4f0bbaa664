#!/bin/bash
# The one-launch decode against the same tiles on two launches, GLM-5 TP8 T = 1 (eager, the
# card's clocks): Nsight Compute details and stall shares per kernel (ncu_stalls.py), then each
# program's phase times (coop_phases.py). Usage (device, repository root): bash this file.
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
C="CoopDecodeConfig(split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32, prefetch2=0)"
for form in ${FORMS:-coop two}; do
  cfg="$C"; [ $form = two ] && cfg="$C.two_launch()"
  NCU_DECODE="$cfg" timeout 150 $NCU --clock-control none -k regex:'^_(coop|gemm)' \
    --launch-skip 2 --launch-count 2 --set full --import-source yes -o /tmp/ncu_$form \
    python benchmarks/experiments/ncu_target.py 1 > $OUT/ncu_run_$form.log 2>&1
  $NCU -i /tmp/ncu_$form.ncu-rep --page details > $OUT/ncu_details_$form.txt 2>&1
  $NCU -i /tmp/ncu_$form.ncu-rep --page source --csv --print-source sass > /tmp/src_$form.csv 2>&1
  gzip -c /tmp/src_$form.csv > $OUT/ncu_source_$form.csv.gz
  echo "== $form" >> $OUT/run.log
  grep -E "^  _|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Ipc|No Eligible|Grid Size|Block Size|Local" \
    $OUT/ncu_details_$form.txt >> $OUT/run.log
  python benchmarks/experiments/ncu_stalls.py /tmp/src_$form.csv 8 >> $OUT/run.log 2>&1
done
timeout 100 python benchmarks/experiments/coop_phases.py --out $OUT >> $OUT/run.log 2>&1
cat $OUT/run.log
