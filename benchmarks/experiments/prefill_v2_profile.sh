#!/bin/bash
# #16 step 2, the device runs (H200): Nsight Compute (full set + SASS source counters) of the wgmma
# GEMMs at GLM-5 TP8 T = 4096, the one-warpgroup diagnosis, the per-kernel knob sweeps (TP8,
# EP8) with `measure` (~8 min); the prefill and decode GPU tiers with `tiers` (~8 min): two
# calls, each under the device's 10-minute limit. Usage (device):
#   bash benchmarks/experiments/prefill_v2_profile.sh measure|tiers|occupancy|gemm2|final1|final3|ring|sorted_tw|code_ring|step4|step4_final|tail|step5_final|refresh|step7|step7_final|step7_tk8192|step8_ncu|step8|step8b|step8_final|step9|step9b|step10
# (occupancy, ~2 min: one-warpgroup CTAs, two per SM, swept at TP8 and EP8 T = 1024, 4096;
# gemm2, ~4 min: its winners, GEMM2's one warpgroup and two accumulators at I = 256 over T;
# final1 ~7 min: GPU tiers (prefill, self-check) and the same-run A/B of the shipped change;
# final3 ~5 min: the A/B again (without fused-shared: final1's A/B mapped block_m 128 wrong),
# triton_kernels in the same process, and the regression baseline; ring ~7 min: static_ring1/2
# and block_m1 against the shipped configs over T at TP8 and EP8, ncu, the prefill GPU tier;
# sorted_tw ~6 min: TP8 and EP8 sweeps for GEMM2's time by row weight, with its staged epilogue
# (smem_epi2) and with the L2 code prefetch (l2_prefetch1/2); run `tiers` first: its prefill GPU
# tier checks sorted_tw and both knobs; code_ring ~6 min: GEMM1's code ring against the shipped
# configs at TP8 and EP8, per kernel; step4 ~8 min: the GPU tests of everything step 4 built
# (sorted_tw, smem_epi2, l2_prefetch*, code rings) first, then sorted_tw's TP8 sweep)
# $OUT gets ncu_details.txt, ncu_source.csv.gz, run.log (the short report) and results.tar.gz
# (every JSON and full log), re-packed after each step so a run cut short keeps what it measured.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
step() { echo "== $1 $(date +%T)" | tee -a $OUT/run.log; }
# tier NAME TEST_FILE LIMIT_S [PYTEST_ARGS...]: one GPU tier (e.g. -k EXPR), its log to
# $R/NAME.log, its last lines to run.log.
tier() {
  step $1
  timeout $3 python -m pytest -p no:cacheprovider -q -m gpu $2 "${@:4}" > $R/$1.log 2>&1
  echo rc=$? >> $R/$1.log; tail -3 $R/$1.log >> $OUT/run.log; pack
}
# baseline LIMIT_S: the regression gate's baseline (GLM-5 TP8 / EP8, decode and prefill) saved
# to $R/pb, its last lines to run.log.
baseline() {
  step baseline
  timeout $1 python -m pytest benchmarks -p no:cacheprovider -rs --fp4ext-rounds 10 --benchmark-storage=file://$R/pb \
    --benchmark-columns=min,median,max,rounds --fp4ext-presets glm5-tp8,glm5-ep8 --fp4ext-paths decode,prefill \
    --benchmark-save=h200-glm5 > $R/baseline.log 2>&1; echo rc=$? >> $R/baseline.log
  tail -3 $R/baseline.log >> $OUT/run.log; pack
}
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
  SWEEP_KNOBS="[{'prefetch1': 2}, {'prefetch1': 3}, {'prefetch1': 2, 'prefetch2': 2}, {'block_m': 128, 'stages1': 2, 'prefetch1': 2, 'prefetch2': 2}]" \
  timeout 120 python benchmarks/experiments/prefill_knob_sweep.py > $R/sweep_ep8.log 2>&1
grep -A30 "bf16 matmul" $R/sweep_ep8.log >> $OUT/run.log; pack
fi
if [ "$1" = occupancy ]; then
# ncu (measure): 1 CTA/SM (registers), 2 warps per scheduler, 62% of cycles with no eligible warp.
# One warpgroup per CTA (64 weight rows, 4 warps) fits two CTAs per SM; step 1 saw it wrong at 3 stages.
W1="'block_n1': 64, 'warps1': 4"; W2="'block_n2': 64, 'warps2': 4"
COMMON="{$W1, 'stages1': 2}, {$W1, 'stages1': 3}, {$W2}, {$W1, 'stages1': 2, $W2}, {$W1, 'stages1': 2, 'block_m': 32}, {'block_n1': 128, 'warps1': 4, 'stages1': 2, 'block_m': 32}"
step occ_tp8
OUT=$R SWEEP_ONE_WARPGROUP=1 SWEEP_T=1024,4096 SWEEP_NAME=prefill_occupancy_tp8 \
  SWEEP_KNOBS="[$COMMON, {'block_m': 64, 'stages1': 3, 'accs2': 2, 'group_n2': 4}, {$W1, 'stages1': 2, 'block_m': 64, 'accs2': 2, 'group_n2': 4}, {$W1, 'stages1': 2, $W2, 'block_m': 32, 'accs2': 2, 'group_n2': 8}]" \
  timeout 200 python benchmarks/experiments/prefill_knob_sweep.py > $R/occ_tp8.log 2>&1
grep -A40 "bf16 matmul" $R/occ_tp8.log >> $OUT/run.log; pack
step occ_ep8
OUT=$R SWEEP_ONE_WARPGROUP=1 SWEEP_T=1024,4096 SWEEP_PRESET=glm5-ep8 SWEEP_NAME=prefill_occupancy_ep8 \
  SWEEP_KNOBS="[$COMMON, {$W1, 'stages1': 2, 'block_m': 64}, {'prefetch1': 2}, {'prefetch1': 2, 'prefetch2': 2}]" \
  timeout 200 python benchmarks/experiments/prefill_knob_sweep.py > $R/occ_ep8.log 2>&1
grep -A40 "bf16 matmul" $R/occ_ep8.log >> $OUT/run.log; pack
fi
if [ "$1" = gemm2 ]; then
# occupancy's winners were GEMM2 knobs at I = 256: one warpgroup and/or two accumulators, per T.
W2="'block_n2': 64, 'warps2': 4"
K2="[{$W2}, {$W2, 'accs2': 2, 'group_n2': 8}, {$W2, 'accs2': 2, 'group_n2': 4}, {'accs2': 2, 'group_n2': 4}, {'accs2': 2, 'group_n2': 8}]"
step gemm2_tp8
OUT=$R SWEEP_ONE_WARPGROUP=1 SWEEP_T=512,1024,2048,4096,8192 SWEEP_NAME=prefill_gemm2_tp8 SWEEP_KNOBS="$K2" \
  timeout 240 python benchmarks/experiments/prefill_knob_sweep.py > $R/gemm2_tp8.log 2>&1
grep -A40 "bf16 matmul" $R/gemm2_tp8.log >> $OUT/run.log; pack
step gemm2_fused
OUT=$R SWEEP_ONE_WARPGROUP=1 SWEEP_T=1024,4096 SWEEP_PRESET=glm5-tp8-fused-shared SWEEP_NAME=prefill_gemm2_fused SWEEP_KNOBS="$K2" \
  timeout 120 python benchmarks/experiments/prefill_knob_sweep.py > $R/gemm2_fused.log 2>&1
grep -A40 "bf16 matmul" $R/gemm2_fused.log >> $OUT/run.log; pack
fi
if [ "$1" = final1 ]; then
# The shipped change (GEMM2 on one warpgroup with two accumulators at I = 256): GPU tiers of the
# prefill kernels and the self-check (the H200 table moved), then the same-run A/B.
tier tier_prefill tests/test_prefill_kernels.py 200
tier tier_selfcheck tests/test_selfcheck.py 120
step ab
OUT=$R timeout 240 python benchmarks/experiments/prefill_wgmma_ab.py > $R/wgmma_ab.log 2>&1; echo rc=$? >> $R/wgmma_ab.log
grep -A80 "bf16 matmul" $R/wgmma_ab.log | grep -v " v1 \| decode " >> $OUT/run.log; pack
fi
if [ "$1" = final3 ]; then
step ab
OUT=$R AB_PRESETS=glm5-tp8,glm5-ep8,deepseek-r1-nvfp4-tp8 timeout 170 python benchmarks/experiments/prefill_wgmma_ab.py > $R/wgmma_ab.log 2>&1; echo rc=$? >> $R/wgmma_ab.log
grep -A80 "bf16 matmul" $R/wgmma_ab.log | grep -v " decode " >> $OUT/run.log; pack
step peers_tk
timeout 200 bash .peers/tk/device_run.sh --out $R/peers --timeout 100 --Ts 512,1024,4096,8192 > $R/peers_tk.log 2>&1
tail -24 $R/peers_tk.log >> $OUT/run.log; pack
baseline 100
fi
if [ "$1" = ring ]; then
# static_ring1/2 (the ring in separate allocations: no CTA barriers inserted around its refills)
# and GEMM1 on its own 128-token tiles (block_m1) against the shipped configs, GLM-5 TP8 and EP8
# over T; Nsight Compute of the static-ring GEMM1; then the prefill GPU tier (its knob tests run
# both on the fp32 twin).
step ring_tp8
OUT=$R SWEEP_T=512,1024,2048,4096,8192 SWEEP_NAME=prefill_ring_tp8 \
  SWEEP_KNOBS="[{'static_ring1': 1}, {'block_m1': 128, 'stages1': 3}, {'block_m1': 128, 'stages1': 3, 'static_ring1': 1}]" \
  timeout 150 python benchmarks/experiments/prefill_knob_sweep.py > $R/ring_tp8.log 2>&1
grep -A40 "bf16 matmul" $R/ring_tp8.log >> $OUT/run.log; pack
step ring_ep8
OUT=$R SWEEP_T=512,1024,2048,4096,8192 SWEEP_PRESET=glm5-ep8 SWEEP_NAME=prefill_ring_ep8 \
  SWEEP_KNOBS="[{'static_ring1': 1}, {'static_ring1': 1, 'static_ring2': 1}]" \
  timeout 200 python benchmarks/experiments/prefill_knob_sweep.py > $R/ring_ep8.log 2>&1
grep -A40 "bf16 matmul" $R/ring_ep8.log >> $OUT/run.log; pack
step ncu_ring  # did the barrier stalls go (GEMM1, TP8 T = 4096, static ring)?
if [ -n "$NCU" ]; then
  NCU_KNOBS="{'static_ring1': 1}" timeout 200 $NCU --clock-control none -k regex:_wgmma_gemm1 \
    --launch-skip 2 --launch-count 1 --set full --import-source yes -o /tmp/ncu_ring \
    python benchmarks/experiments/ncu_target.py 4096 prefill > $R/ncu_ring_run.log 2>&1
  $NCU -i /tmp/ncu_ring.ncu-rep --page details > $R/ncu_ring_details.txt 2>&1
  $NCU -i /tmp/ncu_ring.ncu-rep --page source --csv --print-source sass > /tmp/ncu_ring_source.csv 2>&1
  python benchmarks/experiments/ncu_stalls.py /tmp/ncu_ring_source.csv 12 > $R/ncu_ring_stalls.txt 2>&1
  grep -E "Duration|Issue Slots Busy|Registers Per" $R/ncu_ring_details.txt >> $OUT/run.log
  head -14 $R/ncu_ring_stalls.txt >> $OUT/run.log
fi
pack
tier tier_prefill tests/test_prefill_kernels.py 200
fi
# sweep NAME SHAPE KNOBS [T_LIST] [LIMIT_S]: the heuristic's config and each knob dict on it,
# GLM-5 SHAPE (tp8, ep8, tp8-fused-shared), T = 1024..8192 by default, one process; its table
# to run.log.
l2_discard() {  # step 10's premise, the bytes alone (~40 s): 453 MB written and read back per
  # column-group chunk from L2, with and without discarding each line after its read
  step l2_discard
  OUT=$R timeout 120 python benchmarks/experiments/l2_discard.py > $R/l2_discard.log 2>&1
  tail -6 $R/l2_discard.log >> $OUT/run.log; pack
}
sweep() {  # sweep NAME SHAPE KNOBS [T_LIST] [LIMIT_S]
  step $1
  OUT=$R SWEEP_T=${4:-1024,2048,4096,8192} SWEEP_PRESET=glm5-$2 SWEEP_NAME=prefill_$1 \
    SWEEP_KNOBS="$3" timeout ${5:-170} python benchmarks/experiments/prefill_knob_sweep.py > $R/$1.log 2>&1
  grep -A40 "bf16 matmul" $R/$1.log >> $OUT/run.log; pack
}
if [ "$1" = step4 ]; then  # the GPU tests of step 4's kernels first, then sorted_tw at TP8 only
tier tier_step4 tests/test_prefill_kernels.py 300 \
  -k "knobs or staged or code_ring or block_codes or vs_reference"
SHAPES=tp8; set -- sorted_tw
fi
if [ "$1" = sorted_tw ]; then
# GEMM2 reading the routing weight by sorted row (sorted_tw, shipped unmeasured after step 3):
# the heuristic's configs timed per kernel; compare their gemm2 us with
# prefill_v2_step3/prefill_ring_{tp8,ep8}_h200.json (the same configs: its {} rows at T <= 1024,
# its static-ring + block_m1 rows above; same script, a day apart). Then step 4's knobs against
# the same configs, same process: GEMM2's staged epilogue (static SASS: 20-33% fewer GEMM2
# instructions, prefill_v2_step4/sass_smem_epi2_sm90.json), the L2 code prefetch two chunks past
# the register queue, both, and the staged epilogue with GEMM2's codes in shared memory (TP8:
# every row block's at the program's start; EP8: the code ring).
for s in ${SHAPES:-tp8 ep8}; do
  K2="{'smem_epi2': 1, 'code_ring2': 1}"
  [ $s = ep8 ] && K2="{'smem_epi2': 1, 'static_ring2': 1, 'code_ring2': 2}"
  sweep sorted_tw_$s $s "[{'smem_epi2': 1}, {'l2_prefetch1': 2, 'l2_prefetch2': 2}, {'smem_epi2': 1, 'l2_prefetch1': 2, 'l2_prefetch2': 2}, $K2]"
done
fi
if [ "$1" = code_ring ]; then
# GEMM1's FP4 codes through the shared-memory code ring (code_ring1, built in step 4, CPU only):
# 2 activation stages with codes 1 or 3 chunks ahead at GEMM1's 128-token tile, and at 64 tokens
# (185 registers where the register queue takes 241); EP8 also with GEMM2's ring. SHAPES=tp8
# or ep8 runs one of the two sweeps.
CR2="{'stages1': 2, 'static_ring1': 1, 'code_ring1': 2}"
CR4="{'stages1': 2, 'static_ring1': 1, 'code_ring1': 4}"
case " ${SHAPES:-tp8 ep8} " in *" tp8 "*)
sweep code_ring_tp8 tp8 "[$CR2, $CR4, {'block_m1': 64, 'stages1': 2, 'static_ring1': 1, 'code_ring1': 4}, {'block_m1': 64, 'stages1': 3, 'static_ring1': 1, 'code_ring1': 3}]" ;; esac
case " ${SHAPES:-tp8 ep8} " in *" ep8 "*)
sweep code_ring_ep8 ep8 "[$CR2, $CR4, {'stages1': 2, 'static_ring1': 1, 'code_ring1': 2, 'static_ring2': 1, 'code_ring2': 2}]" ;; esac
fi
if [ "$1" = step4_final ]; then
# What step 4 shipped (2026-12-03: smem_epi2 and code_ring2 in the heuristic and the H200 table,
# decode pdl 2 at T = 1 with the token GEMM2): the knobs off against on where the sweeps had not
# timed them (TP8 T = 512, the fused shared expert, EP8 from 2048), the prefill GPU tier's
# shipped-config tests and the self-check, then triton_kernels (prefill) and Marlin (decode,
# GLM-5 TP8 T = 1, 2) each in one process with fp4ext (.peers carried). ~9 min.
OFF="{'smem_epi2': 0, 'code_ring2': 0}"
sweep step4_off_tp8 tp8 "[$OFF]" 512,1024 40
sweep step4_off_fused tp8-fused-shared "[$OFF]" 512,1024,2048,4096,8192 70
sweep step4_off_ep8 ep8 "[{'smem_epi2': 0}, {'smem_epi2': 1}]" 2048,4096,8192 50
# the wgmma family's tests on the config a call uses (shipped table or heuristic)
tier tier_prefill tests/test_prefill_kernels.py 130 \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)"
tier tier_selfcheck tests/test_selfcheck.py 70
step tk_prefill
timeout 120 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 55 --Ts 512,1024,4096,8192 > $R/tk_prefill.log 2>&1
grep -h TIME $R/tk_prefill/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
step marlin_t1
timeout 70 bash .peers/marlin/device_run.sh --out $R/marlin_t1 --shapes glm5_tp8 --ts 1,2 > $R/marlin_t1.log 2>&1
grep TIME $R/marlin_t1.log >> $OUT/run.log; pack
fi
# tw_ab (2026-12-03, prefill_v2_step5/prefill_tw_ab_*): GEMM2's routing weight by sorted row
# against through the pair index; by sorted row won and the knob (tw_by_pair2) is gone.
if [ "$1" = tail ]; then
# GEMM1's tail (PrefillConfig.tail1, built 2026-12-03 on the CPU): tiles of 128 + 32 rows at
# 2 stages where the shipped GEMM1 tiles 128 at 3, and 64 + 32 where it tiles 64 or 128; the
# GPU tests of the knob first (the fp32 twin; ragged tails through the fused shared expert's
# 600 rows). Static prediction: TP8 T = 4096 GEMM1 595 us -> ~460-530. ~4 min.
tier tier_tail tests/test_prefill_kernels.py 150 -k knobs_vs_reference
T128="{'tail1': 32, 'stages1': 2}"
T64="{'block_m1': 0, 'tail1': 32, 'stages1': 2}"
sweep tail_tp8 tp8 "[$T128, $T64, {'stages1': 2}, {'block_m1': 0}]"
sweep tail_ep8 ep8 "[$T128, {'tail1': 64, 'stages1': 2}, {'stages1': 2}]"
fi
if [ "$1" = step5_final ]; then
# What step 5 ships: GEMM1's 16-row tail at 3 stages in a launch of its own for the tiles with
# rows past block_m1 (the others run the tail-free kernel), GEMM1 on 64-row tiles at TP8
# T = 2048; EP8 decode bucket 8 with the pairs GEMM2 on 4 warps, one row tile per program. The
# shipped heuristic against no tail (TP8, EP8), the wgmma family's GPU tests on the config a
# call uses, triton_kernels prefill (T = 2048..8192), the fused shared expert's table configs
# against the new heuristic, Marlin decode (GLM-5 EP8 T = 2, 8; T = 8 again with the previous
# table if OLD_TABLE_DIR names it), each peer in one process with fp4ext (.peers carried). ~8 min
# (the 2026-12-03 run gave tk 80 s per shape, which cut TP8 after T = 2048: now 150).
sweep step5_tp8 tp8 "[{'tail1': 0}, {'tail1': 0, 'block_m1': 128}, {'block_m1': 128}]" 2048,4096,8192 70
sweep step5_ep8 ep8 "[{'tail1': 0}]" 2048,4096,8192 50
tier tier_prefill tests/test_prefill_kernels.py 120 \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)"
step tk_prefill
timeout 200 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 150 --Ts 2048,4096,8192 > $R/tk_prefill.log 2>&1
grep -h TIME $R/tk_prefill/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
OLD="{'block_m1': 0, 'static_ring1': 0, 'tail1': 0}"
OLD8="{'block_m': 128, 'stages1': 2, 'block_n2': 128, 'warps2': 8, 'group_n2': 8, 'accs2': 1, 'smem_epi2': 0, 'code_ring2': 0, 'block_m1': 0, 'static_ring1': 0, 'tail1': 0}"
sweep step5_fused tp8-fused-shared "[{'tail1': 0}, $OLD, $OLD8]" 2048,4096,8192 80
step marlin_ep8
timeout 80 bash .peers/marlin/device_run.sh --out $R/marlin_ep8 --shapes glm5_ep8 --ts 2,8 > $R/marlin_ep8.log 2>&1
grep TIME $R/marlin_ep8.log >> $OUT/run.log; pack
if [ -n "$OLD_TABLE_DIR" ]; then
step marlin_ep8_old_table
SGLANG_FP4EXT_CONFIG_DIR=$OLD_TABLE_DIR timeout 70 bash .peers/marlin/device_run.sh --out $R/marlin_ep8_old \
  --shapes glm5_ep8 --ts 8 > $R/marlin_ep8_old.log 2>&1
grep TIME $R/marlin_ep8_old.log >> $OUT/run.log; pack
fi
fi
# tail2 (2026-12-03, prefill_v2_step6/prefill_tail2_*): GEMM2's tail, timed at 71bafc5; it lost
# (and was wrong in GEMM1's form at EP8 from T = 4096), and the knob is gone.
if [ "$1" = refresh ]; then
# After step 6 (2026-12-03: tail2 lost, retired): Nsight Compute of the shipped GEMM2 at GLM-5
# TP8 and EP8 T = 4096 (the weak half: 30% / 29% of bf16; stall reasons per SASS line) for
# step 7's design, then the decode peers on today's code in one run each (Marlin TP8 + EP8 and
# triton_kernels, T = 1..256) and the regression baseline. ~7 min.
for s in tp8 ep8; do
  step ncu_gemm2_$s
  if [ -n "$NCU" ]; then
    timeout 100 $NCU --clock-control none -k regex:_wgmma_gemm2 --launch-skip 1 --launch-count 1 \
      --set full --import-source yes -o /tmp/ncu_g2_$s \
      python benchmarks/experiments/ncu_target.py 4096 prefill $s > $R/ncu_gemm2_${s}_run.log 2>&1
    $NCU -i /tmp/ncu_g2_$s.ncu-rep --page details > $R/ncu_gemm2_${s}_details.txt 2>&1
    $NCU -i /tmp/ncu_g2_$s.ncu-rep --page source --csv --print-source sass > /tmp/ncu_g2_$s.csv 2>&1
    gzip -c /tmp/ncu_g2_$s.csv > $R/ncu_gemm2_${s}_source.csv.gz
    python benchmarks/experiments/ncu_stalls.py /tmp/ncu_g2_$s.csv 16 > $R/ncu_gemm2_${s}_stalls.txt 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible|Local" $R/ncu_gemm2_${s}_details.txt >> $OUT/run.log
    head -24 $R/ncu_gemm2_${s}_stalls.txt >> $OUT/run.log
  fi
  pack
done
step marlin
timeout 90 bash .peers/marlin/device_run.sh --out $R/marlin > $R/marlin.log 2>&1
grep "^TIME\|copy bandwidth" $R/marlin.log | cut -c1-170 >> $OUT/run.log; pack
step tk_decode
timeout 260 bash .peers/tk/device_run.sh --out $R/tk_decode --timeout 125 --Ts 1,2,4,8,16,32,64,128,256 > $R/tk_decode.log 2>&1
grep -h TIME $R/tk_decode/tk_glm5_*.log | cut -c1-170 >> $OUT/run.log; pack
baseline 110
fi
if [ "$1" = step7 ]; then
# Step 7 (built 2026-12-03 from refresh's Nsight Compute of GEMM2): the routing weight applied
# in GEMM1's epilogue (tw1: GEMM2 loses a per-column load, its multiplies and, at EP8, its
# 200-256 B of spills) and GEMM2's alpha loaded a block ahead, pair rows once per program
# (hoist2: 15% of TP8 GEMM2's samples waited on the alpha load). GPU tests of both knobs against
# the fp32 twin; the wgmma family's shipped-config tests on a table with both on (TABLE7);
# the sweeps against the shipped configs; triton_kernels prefill on that table. Predictions
# (static SASS: TP8 GEMM2 5,056 -> 4,400 instructions, EP8 stack 200 -> 0 B): GEMM2 TP8
# T = 4096 462 -> 380-420 us, EP8 444 -> 370-420 us; GEMM1 +0-2%. ~9 min.
TABLE7=/tmp/table7; mkdir -p $TABLE7
python - <<'PY'
import json
d = json.load(open("sglang_fp4ext/moe/configs/NVIDIA_H200.json"))
for buckets in d["shapes"].values():
    for e in buckets.values():
        c = e["config"]
        if c.get("kernels") == "wgmma":
            c["tw1"] = 1
            c["hoist2"] = int(c.get("accs2") == 2)
json.dump(d, open("/tmp/table7/NVIDIA_H200.json", "w"), indent=1)
PY
tier tier_step7_knobs tests/test_prefill_kernels.py 120 \
  -k "knobs_vs_reference and (600-17 or 600-18 or 600-19 or 4096-17 or 4096-18 or 4096-19)"
SGLANG_FP4EXT_CONFIG_DIR=$TABLE7 tier tier_step7_shipped tests/test_prefill_kernels.py 110 \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)"
sweep step7_tp8 tp8 "[{'tw1': 1}, {'hoist2': 1}, {'tw1': 1, 'hoist2': 1}]" 1024,2048,4096,8192 100
sweep step7_ep8 ep8 "[{'tw1': 1}]" 1024,2048,4096,8192 60
step tk_prefill_table7
SGLANG_FP4EXT_CONFIG_DIR=$TABLE7 timeout 150 bash .peers/tk/device_run.sh --out $R/tk_prefill7 --timeout 72 \
  --Ts 2048,4096,8192 > $R/tk_prefill7.log 2>&1
grep -h TIME $R/tk_prefill7/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
sweep step7_fused tp8-fused-shared "[{'tw1': 1, 'hoist2': 1}]" 2048,4096,8192 45
fi
if [ "$1" = step7_final ]; then
# What step 7 ships (tw1 everywhere, hoist2 at I = 256, heuristic and H200 table): the wgmma
# family's shipped-config GPU tests (the heuristic's shapes too) and the self-check, then
# triton_kernels prefill where step7's run was cut (TP8 4096 / 8192, EP8 8192: the same
# configs), then the regression baseline. ~5 min.
tier tier_prefill tests/test_prefill_kernels.py 110 \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)"
tier tier_selfcheck tests/test_selfcheck.py 70
step tk_prefill
timeout 100 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 95 --shapes glm5_tp8 --Ts 4096,8192 > $R/tk_prefill_tp8.log 2>&1
timeout 100 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 95 --shapes glm5_ep8 --Ts 8192 > $R/tk_prefill_ep8.log 2>&1
grep -h TIME $R/tk_prefill/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
baseline 90
fi
if [ "$1" = step7_tk8192 ]; then
# The triton_kernels point step7_final's deadline cut (TP8 T = 8192, shipped configs), and EP8's
# GEMM2 on the static ring now that tw1 took its spills (step 7's Nsight Compute: 26% of its
# samples on the run-time ring's barriers). ~2 min.
step tk_prefill_8192
timeout 110 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 105 --shapes glm5_tp8 --Ts 8192 > $R/tk_prefill_tp8.log 2>&1
grep -h TIME $R/tk_prefill/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
sweep ring2_ep8 ep8 "[{'static_ring2': 1}]" 4096,8192 50
fi
if [ "$1" = step8_ncu ]; then
# After step 7 (2026-12-03): Nsight Compute of the shipped GEMM1 (both launches: the tail-free
# tiles and the 16-row tail's) and GEMM2 at GLM-5 TP8 T = 4096 (54% / 35% of bf16 in step 7's
# sweep), GEMM1 at EP8; then triton_kernels prefill at T = 512 / 1024 on the step-7 configs
# (the README's rows there are step 4's). ~6 min.
ncu_one() {  # ncu_one NAME KERNEL_REGEX SKIP COUNT ARGS...
  step ncu_$1
  [ -z "$NCU" ] && { echo "no ncu" >> $OUT/run.log; return; }
  timeout 120 $NCU --clock-control none -k regex:$2 --launch-skip $3 --launch-count $4 \
    --set full --import-source yes -o /tmp/ncu_$1 \
    python benchmarks/experiments/ncu_target.py "${@:5}" > $R/ncu_$1_run.log 2>&1
  $NCU -i /tmp/ncu_$1.ncu-rep --page details > $R/ncu_$1_details.txt 2>&1
  $NCU -i /tmp/ncu_$1.ncu-rep --page source --csv --print-source sass > /tmp/ncu_$1.csv 2>&1
  gzip -c /tmp/ncu_$1.csv > $R/ncu_$1_source.csv.gz
  python benchmarks/experiments/ncu_stalls.py /tmp/ncu_$1.csv 24 > $R/ncu_$1_stalls.txt 2>&1
  grep -E "^  _wgmma|Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Registers Per|No Eligible|Local" $R/ncu_$1_details.txt >> $OUT/run.log
  head -30 $R/ncu_$1_stalls.txt >> $OUT/run.log
  pack
}
ncu_one gemm1_tp8 _wgmma_gemm1 2 2 4096 prefill
ncu_one gemm2_tp8 _wgmma_gemm2 1 1 4096 prefill
ncu_one gemm1_ep8 _wgmma_gemm1 2 2 4096 prefill ep8
step tk_prefill_small
timeout 230 bash .peers/tk/device_run.sh --out $R/tk_prefill --timeout 110 --Ts 512,1024 > $R/tk_prefill.log 2>&1
grep -h TIME $R/tk_prefill/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
fi
if [ "$1" = step8 ]; then
# Step 8 (built 2026-12-03 from step8_ncu): GEMM2 at I = 256 on M tiles of msub2 sub-tiles that
# share each decoded row block (TP8 T = 4096: 2-3 tiles of 64 rows per expert, each decoding
# its expert's GEMM2 weights: decode ~ MMA per block, 39% issue, 35% of bf16). GPU tests of the knob
# against the fp32 twin (three configs at T = 600 / 4096 through the fused shared expert, the
# ragged last program), then the sweeps against the heuristic's configs. Prediction: TP8 GEMM2
# T = 4096 370 -> 230-300 us. ~8 min.
tier tier_msub2 tests/test_prefill_kernels.py 200 \
  -k "knobs_vs_reference and (600-20 or 600-21 or 600-22 or 4096-20 or 4096-21 or 4096-22) or ragged_last_program and 3]"
sweep step8_tp8 tp8 "[{'msub2': 3}, {'msub2': 2, 'group_n2': 4}, {'msub2': 3, 'group_n2': 4}, {'block_m': 32, 'msub2': 4, 'group_n2': 4}]" 4096,8192,2048,1024 230
sweep step8_fused tp8-fused-shared "[{'msub2': 3}, {'msub2': 3, 'group_n2': 4}]" 4096,8192,2048 90
fi
if [ "$1" = step8b ]; then
# step8's sweep: msub2 = 3 lost (GEMM2 T = 4096 368 -> 608 us) where its shared memory leaves
# one 4-warp CTA per SM (172 KB; the shipped config 106 KB runs two), msub2 = 2 on 4 blocks
# (102 KB) tied at 4096 and won 7% at 8192. Here msub2 on two warpgroups (BN = 128: one CTA of
# 8 warps sharing the sub-tiles' activations), msub2 = 2 / 4 blocks again and 4 blocks alone
# (the control for T <= 4096, whose base has 8). GPU test of the two-warpgroup form first. ~6 min.
tier tier_msub2_wg2 tests/test_prefill_kernels.py 120 -k "knobs_vs_reference and (600-23 or 4096-23)"
W2="'block_n2': 128, 'warps2': 8"
sweep step8b_tp8 tp8 "[{$W2, 'msub2': 3, 'group_n2': 2}, {$W2, 'msub2': 3, 'group_n2': 4}, {$W2, 'msub2': 2, 'group_n2': 4}, {'msub2': 2, 'group_n2': 4}, {'group_n2': 4}]" 4096,8192,2048 250
fi
if [ "$1" = step8_final ]; then
# What step 8 ships (msub2=2 on 4 GEMM2 blocks where an expert expects >= 2 x block_m rows at
# I = 256: GLM-5 TP8 and TP8 + fused shared T = 4096 / 8192 in the H200 table, the heuristic
# everywhere): the wgmma family's shipped-config GPU tests and the self-check, the change off
# against on (TP8 a third process, the fused shared expert and DeepSeek-R1 TP8, heuristic-only,
# first timed here), then the regression baseline. ~8 min.
tier tier_prefill tests/test_prefill_kernels.py 130 \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)"
tier tier_selfcheck tests/test_selfcheck.py 70
OFF="[{'msub2': 1, 'group_n2': 8}]"
sweep step8_off_tp8 tp8 "$OFF" 4096,8192 60
sweep step8_off_fused tp8-fused-shared "$OFF" 4096,8192 60
step step8_off_dsr1
OUT=$R SWEEP_T=4096,8192 SWEEP_PRESET=deepseek-r1-nvfp4-tp8 SWEEP_NAME=prefill_step8_off_dsr1 \
  SWEEP_KNOBS="$OFF" timeout 70 python benchmarks/experiments/prefill_knob_sweep.py > $R/step8_off_dsr1.log 2>&1
grep -A40 "bf16 matmul" $R/step8_off_dsr1.log >> $OUT/run.log; pack
baseline 110
fi
if [ "$1" = step9 ]; then
# Step 9, the top-k combine in GEMM2 (combine="fused") against the shipped configs' separate
# combine pass: TP8 and EP8 at T = 4096 / 8192 (each row checked against the fp32 twin and
# against the shipped config's output bit for bit), then its GPU tests. ~4 min.
FUSED="[{'combine': 'fused'}]"
sweep step9_tp8 tp8 "$FUSED" 4096,8192 60
sweep step9_ep8 ep8 "$FUSED" 4096,8192 60
tier tier_fused tests/test_prefill_kernels.py 100 -k "fused_combine"
fi
if [ "$1" = step9b ]; then
# Step 9's loss taken apart: the fused combine against GEMM2's grid in the fused order alone
# (the combine a pass of its own) and the fused combine without the GPU-scope fence, on the
# tail with unrolled slot loops (written after step9's run); then its GPU tests and the L2
# discard experiment. ~4 min.
DIAG="[{'combine': 'fused'}, {'combine': 'fused', '_fused_mode': 'order_only'}, {'combine': 'fused', '_fused_mode': 'no_fence'}]"
sweep step9b_tp8 tp8 "$DIAG" 4096,8192 70
sweep step9b_ep8 ep8 "$DIAG" 4096 50
tier tier_fused_b tests/test_prefill_kernels.py 100 -k "combine_in_gemm2 and fused"
l2_discard
fi
if [ "$1" = step10 ]; then
# Step 10: the combine as work items in GEMM2's grid (combine="group"), its GPU tests first
# (bit-equal to the ordered combine: 3 GEMM2 forms, GLM-5 + adversarial routings), then the
# shipped configs against it with and without the L2 discard, and against GEMM2's grid in the
# fused order with the pass of its own (step 9b's order_only), TP8 and EP8; then the L2
# discard experiment. ~6 min.
tier tier_group tests/test_prefill_kernels.py 150 -k "combine_in_gemm2 and group or group_combine"
G10="[{'combine': 'group'}, {'combine': 'group', '_group_mode': 'keep'}, {'combine': 'fused', '_fused_mode': 'order_only'}]"
sweep step10_tp8 tp8 "$G10" 4096,8192 80
sweep step10_ep8 ep8 "$G10" 4096,8192 70
l2_discard
fi
if [ "$1" = tiers ]; then
tier tier_prefill tests/test_prefill_kernels.py 200
tier tier_decode tests/test_decode_gpu.py 280
fi
cat $OUT/run.log
