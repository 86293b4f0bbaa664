#!/bin/bash
# #15 decode v2 step 3, the device runs (H200): programmatic dependent launch (KernelConfig.pdl).
# Usage (device, repository root):
#   bash benchmarks/experiments/decode_pdl.sh measure   # ~8 min: PDL GPU tests, the pdl sweep
#        over T = 1..256 at GLM-5 TP8 / EP8 / TP8 fused shared and two untabled shapes, with and
#        without a kernel between layers (--separate), the self-check tier (prefill table moved)
#   bash benchmarks/experiments/decode_pdl.sh repeat    # ~8 min: the table's and the heuristic's
#        configs without and with PDL, 5 interleaved timings each (GLM-5, T <= 16 and 128), the
#        self-check and decode GPU tiers
#   bash benchmarks/experiments/decode_pdl.sh final     # ~6 min, .peers carried: Marlin and
#        triton_kernels decode peers and tk prefill peers, each in one process with fp4ext
#   bash benchmarks/experiments/decode_pdl.sh t1        # ~2 min, .peers carried: T = 1 without and
#        with PDL back to back (5 interleaved timings), Marlin at GLM-5 TP8 T = 1, 2
#   bash benchmarks/experiments/decode_pdl.sh trigger   # ~9 min (next session): pdl 0 / 1 / 2 and
#        the token GEMM2's L2 prefetch, back to back and with a kernel between layers, 3
#        interleaved timings, then the PDL and L2-prefetch GPU tests
# $OUT gets run.log (the short report) and results.tar.gz (every JSON and full log), re-packed
# after each step so a run cut short keeps what it measured.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T)" | tee -a $OUT/run.log; }
tier() {  # tier NAME LIMIT_S PYTEST_ARGS...: one GPU tier, its log to $R/NAME.log, tail to run.log
  step $1; local n=$1 lim=$2; shift 2
  timeout $lim python -m pytest -p no:cacheprovider -q -m gpu "$@" > $R/$n.log 2>&1; echo rc=$? >> $R/$n.log
  tail -3 $R/$n.log >> $OUT/run.log; pack
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
SH=glm5_tp8,glm5_ep8,glm5_tp8_shared,dsr1_tp8,qwen3_30b
if [ "$1" = measure ]; then
tier tier_pdl 150 tests/test_decode_gpu.py -k "pdl or gluonp"
step sweep
timeout 170 python benchmarks/experiments/gluon_decode_ab.py --sweep pdl --v1-table shipped \
  --shapes $SH --out $R --deadline-s 140 > $R/pdl_ab.log 2>&1
grep -A60 "copy BW" $R/pdl_ab.log >> $OUT/run.log; pack
step sweep_separate
timeout 170 python benchmarks/experiments/gluon_decode_ab.py --sweep pdl --v1-table shipped \
  --shapes $SH --out $R --deadline-s 140 --separate > $R/pdl_ab_separate.log 2>&1
grep -A60 "copy BW" $R/pdl_ab_separate.log >> $OUT/run.log; pack
tier tier_selfcheck 100 tests/test_selfcheck.py
fi
if [ "$1" = repeat ]; then
step sweep_repeat  # table / heuristic, each without and with PDL, 5 interleaved timings each
timeout 225 python benchmarks/experiments/gluon_decode_ab.py --sweep pdl --v1-table shipped \
  --shapes glm5_tp8,glm5_ep8,glm5_tp8_shared --tokens 1,2,4,8,16,128 --repeat 5 --separate \
  --out $R --deadline-s 200 > $R/pdl_repeat.log 2>&1
grep -A30 "copy BW" $R/pdl_repeat.log >> $OUT/run.log; pack
tier tier_selfcheck 100 tests/test_selfcheck.py
tier tier_decode 260 tests/test_decode_gpu.py
fi
if [ "$1" = final ]; then
step marlin
timeout 200 bash .peers/marlin/device_run.sh --out $R/marlin --shapes glm5_tp8,glm5_ep8 > $R/marlin.log 2>&1
tail -30 $R/marlin.log >> $OUT/run.log; pack
step tk_decode
timeout 150 bash .peers/tk/device_run.sh --out $R/tk --timeout 70 --Ts 1,2,4,8,16,32,64,128,256 > $R/tk.log 2>&1
tail -30 $R/tk.log >> $OUT/run.log; pack
step tk_prefill
timeout 150 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 70 --Ts 512,1024,4096,8192 > $R/tk_prefill.log 2>&1
tail -24 $R/tk_prefill.log >> $OUT/run.log; pack
fi
if [ "$1" = t1 ]; then  # T = 1 back to back (as the peer harnesses time), then Marlin at TP8 T = 1, 2
step t1_repeat
timeout 120 python benchmarks/experiments/gluon_decode_ab.py --sweep pdl --v1-table shipped \
  --shapes glm5_tp8,glm5_tp8_shared,glm5_ep8,dsr1_tp8,qwen3_30b --tokens 1 --repeat 5 \
  --out $R > $R/pdl_t1.log 2>&1
grep -A12 "copy BW" $R/pdl_t1.log >> $OUT/run.log; pack
step marlin_t1
timeout 80 bash .peers/marlin/device_run.sh --out $R/marlin_t1 --shapes glm5_tp8 --ts 1,2 > $R/marlin_t1.log 2>&1
grep TIME $R/marlin_t1.log >> $OUT/run.log; pack
fi
if [ "$1" = trigger ]; then  # PDL 1 (trigger at once) vs 2 (GEMM1 after its K loops, others at
# exit), and the token GEMM2's L2 prefetch without PDL (l2_prefetch)
for sep in ${SEPS-"" --separate}; do  # SEPS=--separate: only with a kernel between layers
  tag=trigger${sep:+_separate}
  step $tag
  timeout 200 python benchmarks/experiments/gluon_decode_ab.py --sweep pdl --pdl 0,1,2 --l2-prefetch \
    --v1-table shipped --shapes glm5_tp8,glm5_ep8,glm5_tp8_shared,qwen3_30b --tokens 1,2,4,8,16,64 \
    --repeat 3 $sep --out $R/$tag --deadline-s 170 > $R/$tag.log 2>&1
  grep -A30 "copy BW" $R/$tag.log >> $OUT/run.log; pack
done
tier tier_pdl 150 tests/test_decode_gpu.py -k "pdl or gluonp or l2_prefetch"
fi
cat $OUT/run.log
